"""``baseline``: save the per-step times of a run as the reference the ``gate`` compares against."""

from __future__ import annotations

import sys

import click

from analyzer.cli.common import make_options, run_analysis, shared_options
from analyzer.output import write_report
from analyzer.report.json_report import JsonReporter

# a baseline as stable, diffable JSON (sorted by construction, two-space indent, string keys only)
BASELINE_JSON = JsonReporter(non_str_keys=False)


@click.command("baseline")
@shared_options
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Where to write the baseline JSON ('-' for stdout), e.g. fixtures/NAME/baseline.json.",
)
@click.option(
    "--top-share",
    default=0.95,
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True),
    help="Keep the kernel groups that cover this share of each phase's time by name; the rest as hashes.",
)
def command(
    traces: tuple[str, ...],
    rules: tuple[str, ...],
    gpu: str | None,
    model: str | None,
    settings: tuple[str, ...],
    output: str,
    top_share: float,
) -> int:
    """Analyse TRACE... as one run and write its baseline for `llm-kernel-map gate`.

    The baseline keeps, per phase, stage (phase x stage) and top kernel group, the per-step median
    and mean kernel time (and per token where token counts are known), the step-time distribution,
    the inputs' sha256, the rules' sha256 and what must match for a comparison (GPU, layers seen,
    GEMM roles, ranks, tokens and batch per step). Commit it next to the fixture trace.
    """
    from analyzer.results.baseline import build_baseline  # pyarrow: loads after memory.configure

    analysis = run_analysis(traces, make_options(rules, gpu, model, settings))
    obj = build_baseline(analysis, top_share=top_share)
    if output == "-":
        BASELINE_JSON.render(obj, sys.stdout.buffer)
        sys.stdout.flush()
    else:
        write_report(BASELINE_JSON, obj, output)
    parts = [f"{p} {e['steps']} step{'s' if e['steps'] != 1 else ''}" for p, e in obj["phases"].items()]
    n_stages, n_groups = len(obj["stages"]), len(obj["groups"])
    click.echo(
        f"wrote {output if output != '-' else 'baseline'}: {', '.join(parts) or 'no steps'}; "
        f"{n_stages} stage rows, {n_groups} kernel groups",
        err=True,
    )
    return 0


for _param in command.params:
    if _param.name == "traces":
        _param.metavar = "TRACE..."
