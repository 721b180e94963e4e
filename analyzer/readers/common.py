"""What the SQL and CSV readers (rocprof, rocpd, nsys) share: CSV tables with forgiving headers,
integer cells, kernel rows filled one activity at a time, trace assembly, read-only SQLite."""

from __future__ import annotations

import csv
import io
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from analyzer import readers
from analyzer.errors import InputError
from analyzer.model import (
    ANNOTATION_SCHEMA,
    HOST_OP_SCHEMA,
    KERNEL_SCHEMA,
    InputMeta,
    Trace,
    table_from_columns,
)
from analyzer.readers import gz

SQLITE_MAGIC = b"SQLite format 3\x00"


# ---------------------------------------------------------------------------------------------
# CSV and cells


class CsvTable:
    """A CSV file's rows with case-insensitive column lookup; truncated rows are an InputError.

    Column keys are the header names lower-cased and trimmed; ``squash`` also drops inner spaces
    (``Total Time (ns)`` -> ``totaltime(ns)``), which absorbs nsys' spelling changes.
    """

    def __init__(self, path: Path, text: str, header_at: int = 0, squash: bool = False) -> None:
        lines = io.StringIO(text)
        for _ in range(header_at):
            lines.readline()
        reader = csv.reader(lines)
        header = next(reader, None)
        if not header:
            raise InputError(f"{path}: empty CSV file")
        self.path = path
        keys = [c.strip().strip('"').strip().lower() for c in header]
        self.index = {(k.replace(" ", "") if squash else k): i for i, k in enumerate(keys)}
        self.rows = self._rows(reader, len(header), header_at + 2)

    def _rows(self, reader: Iterable[list[str]], width: int, first_line: int) -> list[list[str]]:
        rows = []
        for lineno, row in enumerate(reader, first_line):
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) < width:
                raise InputError(
                    f"{self.path}: truncated CSV (line {lineno} has {len(row)} of {width} fields)"
                )
            rows.append(row)
        return rows

    def has(self, *names: str) -> bool:
        return any(n in self.index for n in names)

    def require(self, *names: str) -> None:
        missing = [n for n in names if n not in self.index]
        if missing:
            raise InputError(f"{self.path}: missing column(s) {', '.join(missing)}")

    def column(self, *names: str) -> list[str | None]:
        """Values of the first of ``names`` present (all None when none is)."""
        for n in names:
            i = self.index.get(n)
            if i is not None:
                return [r[i] for r in self.rows]
        return [None] * len(self.rows)

    def ints(self, *names: str) -> list[int | None]:
        return [to_int(v, self.path) for v in self.column(*names)]


def read_bytes(path: Path) -> bytes:
    """A file's bytes, gzip undone."""
    with open(path, "rb") as f:
        raw = f.read()
    return gz.decompress(raw) if raw[:2] == gz.MAGIC else raw


def read_text(path: Path) -> str:
    return read_bytes(path).decode("utf-8-sig")


def to_int(value: Any, path: Path | str = "") -> int | None:
    """An integer from a CSV/JSON cell ("" and None -> None; "12.0" -> 12)."""
    if value is None or isinstance(value, int):
        return value
    s = str(value).strip().strip('"')
    if not s:
        return None
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return int(float(s))
    except ValueError:
        raise InputError(f"{path}: not a number: {s[:40]!r}") from None


def blocks(grid: int | None, group: int | None) -> int | None:
    """Work-groups along one axis from work-items: ceil(grid / group)."""
    if grid is None or not group:
        return None
    return -(-grid // group)


def dense_ids(values: Sequence[Any]) -> list[int | None]:
    """Map recorded ids to 0..n-1 in sorted order of the distinct ids (None stays None)."""
    order = {v: i for i, v in enumerate(sorted({v for v in values if v is not None}))}
    return [None if v is None else order[v] for v in values]


# ---------------------------------------------------------------------------------------------
# Rows, tables, the trace


_KERNEL_FIELDS = (
    "name",
    "kind",
    "start_ns",
    "dur_ns",
    "device",
    "stream",
    "correlation",
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
    "registers",
    "shared_mem",
    "launch_op_id",
    "graph_launch",
    "count",
    "aggregate",
    "bytes_recorded",
    "launch_api",
)
_DEFAULTS = {
    "kind": "kernel",
    "graph_launch": False,
    "count": 1,
    "aggregate": False,
    "device": 0,
}


class KernelRows:
    """Column lists of the kernels table, filled one GPU activity at a time."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {f: [] for f in _KERNEL_FIELDS}

    def __len__(self) -> int:
        return len(self.cols["name"])

    def add(self, **values: Any) -> None:
        for f in _KERNEL_FIELDS:
            v = values.get(f)
            self.cols[f].append(_DEFAULTS.get(f) if v is None else v)

    def extend(self, columns: dict[str, Sequence[Any]]) -> None:
        """Append whole columns at once (absent ones take their defaults)."""
        n = len(next(iter(columns.values()))) if columns else 0
        for f in _KERNEL_FIELDS:
            v = columns.get(f)
            if v is None:
                self.cols[f].extend([_DEFAULTS.get(f)] * n)
            else:
                d = _DEFAULTS.get(f)
                self.cols[f].extend(v if d is None else [d if x is None else x for x in v])

    def densify(self, field: str) -> None:
        """Replace recorded ids (queue handles, (guid, id) pairs) by small ints in sorted order."""
        self.cols[field] = dense_ids(self.cols[field])

    def table(self) -> pa.Table:
        cols: dict[str, Any] = dict(self.cols)
        n = len(self)
        cols["trace_id"] = pa.array([0] * n, pa.int16())
        cols["rank"] = pa.array([0] * n, pa.int16())
        names = pa.array(cols["name"], pa.string()).dictionary_encode()
        cols["name"] = names
        cols["norm_name"] = names
        return table_from_columns(cols, KERNEL_SCHEMA)


def annotation_table(ann: dict[str, list[Any]] | None, side: str = "cpu") -> pa.Table:
    if not ann or not ann.get("name"):
        return ANNOTATION_SCHEMA.empty_table()
    n = len(ann["name"])
    cols = dict(ann, trace_id=[0] * n, rank=[0] * n, side=[side] * n)
    return table_from_columns(cols, ANNOTATION_SCHEMA)


def host_op_table(ops: dict[str, list[Any]] | None) -> pa.Table:
    if not ops or not ops.get("name"):
        return HOST_OP_SCHEMA.empty_table()
    n = len(ops["name"])
    return table_from_columns(dict(ops, trace_id=[0] * n, rank=[0] * n), HOST_OP_SCHEMA)


def build_trace(
    path: Path,
    fmt: str,
    rows: KernelRows,
    *,
    annotations: dict[str, list[Any]] | None = None,
    host_ops: dict[str, list[Any]] | None = None,
    meta: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
    reader_version: str,
    sha_path: Path | None = None,
) -> Trace:
    """Assemble and validate a one-input Trace; no GPU activity at all is an InputError."""
    if not len(rows):
        raise InputError(f"{path}: no GPU activity recorded")
    info = InputMeta(
        path=str(path),
        sha256=readers.file_sha256(sha_path or path),
        format=fmt,
        reader_version=reader_version,
        **(meta or {}),
    )
    trace = Trace(
        kernels=rows.table(),
        host_ops=host_op_table(host_ops),
        annotations=annotation_table(annotations),
        inputs=[info],
        warnings=list(warnings or []),
    )
    trace.validate()
    return trace


def connect_ro(path: Path) -> sqlite3.Connection:
    """Open a SQLite file read-only (never creates or modifies it)."""
    uri = Path(path).resolve().as_uri().replace("file://", "file:", 1)
    return sqlite3.connect(f"{uri}?mode=ro", uri=True)


def sqlite_objects(path: Path) -> set[str]:
    """Names of the tables and views in a SQLite file (empty when it cannot be read)."""
    try:
        con = connect_ro(path)
    except sqlite3.Error:
        return set()
    try:
        rows = con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")
        return {r[0] for r in rows}
    except sqlite3.Error:
        return set()
    finally:
        con.close()


def table_columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
