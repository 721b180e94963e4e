"""``export``: write the analysed kernels table (DESIGN §2 columns) as CSV or Parquet."""

from __future__ import annotations

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from analyzer.cli.common import make_options, run_analysis, shared_options
from analyzer.cli.output import output_file
from analyzer.errors import UsageError


def plain_columns(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded to plain strings (CSV has no dictionaries)."""
    cols = []
    for c in table.columns:
        cols.append(c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c)
    return pa.Table.from_arrays(cols, names=table.column_names)


@click.command()
@shared_options
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="kernels.csv or kernels.parquet (format from the extension).",
)
def export(
    traces: tuple[str, ...],
    rules: tuple[str, ...],
    gpu: str | None,
    model: str | None,
    settings: tuple[str, ...],
    output: str,
) -> int:
    """Write the kernels table of TRACE... with every analysis column (stage, phase, roofline ...)."""
    if not output.endswith((".csv", ".parquet")):
        raise UsageError(f"{output}: the output must end in .csv or .parquet")
    analysis = run_analysis(traces, make_options(rules, gpu, model, settings))
    table = analysis.kernels
    if output.endswith(".csv"):
        with output_file(output, "wb") as f:
            pacsv.write_csv(plain_columns(table), f)
    else:
        with output_file(output, "wb") as f:
            pq.write_table(table, f)
    click.echo(f"wrote {table.num_rows:,} rows to {output}", err=True)
    return 0
