"""Kernel-table reporters: the analysed kernels table (README.md, "Output columns") as CSV or Parquet.

Each writes a ``pyarrow.Table`` to a binary stream it is handed; the columns and rows are the
table's own (CSV decodes dictionary columns to plain strings, Parquet keeps them).
"""

from __future__ import annotations

from typing import IO, ClassVar

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq


def plain_columns(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded to plain strings (CSV has no dictionaries)."""
    cols = []
    for c in table.columns:
        cols.append(c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c)
    return pa.Table.from_arrays(cols, names=table.column_names)


class CsvReporter:
    name: ClassVar[str] = "csv"
    extensions: ClassVar[tuple[str, ...]] = (".csv",)
    binary: ClassVar[bool] = True

    def render(self, data: pa.Table, stream: IO[bytes]) -> None:
        pacsv.write_csv(plain_columns(data), stream)


class ParquetReporter:
    name: ClassVar[str] = "parquet"
    extensions: ClassVar[tuple[str, ...]] = (".parquet",)
    binary: ClassVar[bool] = True

    def render(self, data: pa.Table, stream: IO[bytes]) -> None:
        pq.write_table(data, stream)
