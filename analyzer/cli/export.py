"""``export``: write the analysed kernels table (README.md, "Output columns") as CSV or Parquet, or the whole
run as a classified trace for Perfetto UI / chrome://tracing (docs/report.md)."""

from __future__ import annotations

import contextlib
from typing import Any

import click

from analyzer.cli.common import make_options, run_analysis, shared_options
from analyzer.errors import UsageError
from analyzer.output import write_report
from analyzer.report import TABLES


@click.command()
@shared_options
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="kernels.csv, kernels.parquet or trace.perfetto.json (format from the extension).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(TABLES.names)),
    help="Output format instead of the one the extension names.",
)
def export(
    traces: tuple[str, ...],
    rules: tuple[str, ...],
    gpu: str | None,
    model: str | None,
    settings: tuple[str, ...],
    output: str,
    fmt: str | None,
) -> int:
    """Write the kernels table of TRACE... with every analysis column (stage, phase, roofline ...),
    or with -o NAME.perfetto.json (or --format perfetto) the run as one trace for Perfetto UI: every
    GPU activity with its stage, category, provider, phase, step, layer, rule id and stage rule in
    args, plus step and layer tracks. Kineto inputs keep their own events byte for byte."""
    if fmt is not None:
        spec = TABLES.get(fmt)
        named = TABLES.for_path(output)
        if named is not None and named.name != spec.name:  # e.g. CSV written into a .parquet file
            raise UsageError(
                f"{output}: --format {fmt} does not match the extension, which names {named.name} "
                f"(use a {' or '.join(spec.extensions)} name, or leave --format out)"
            )
    else:
        found = TABLES.for_path(output)
        if found is None or not output.endswith(found.extensions):  # the extension in lower case, as always
            raise UsageError(
                f"{output}: the output must end in {' or '.join(TABLES.extensions)} (or give --format)"
            )
        spec = found
    analysis = run_analysis(traces, make_options(rules, gpu, model, settings))
    table = analysis.kernels
    if spec.name != "perfetto":
        write_report(spec.create(), table, output)
        click.echo(f"wrote {table.num_rows:,} rows to {output}", err=True)
        return 0
    from analyzer.readers import kineto_raw
    from analyzer.report.perfetto import ExportInput, PerfettoExport

    with contextlib.ExitStack() as stack:
        inputs = []
        for meta in analysis.trace.inputs:
            events: Any = None
            if meta.format == "kineto":  # the input's own events, streamed while the file is written
                events = stack.enter_context(kineto_raw.open_events(meta.path))
            inputs.append(ExportInput(meta.trace_id, meta.rank, meta.format, meta.path, events))
        write_report(spec.create(), PerfettoExport(table, analysis.steps, inputs), output)
    click.echo(f"wrote {table.num_rows:,} GPU activities of {len(inputs)} input(s) to {output}", err=True)
    return 0
