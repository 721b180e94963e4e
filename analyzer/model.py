"""The canonical trace model: Arrow tables every reader produces and every analysis consumes.

A :class:`Trace` holds three tables (``kernels``, ``host_ops``, ``annotations``) with the columns
of :data:`KERNEL_SCHEMA`, :data:`HOST_OP_SCHEMA` and :data:`ANNOTATION_SCHEMA` (README.md, "Output
columns", lists the kernels' for users) and one :class:`InputMeta` per input file. Readers build
it, ``Trace.validate()`` checks types, units and invariants, and :func:`concat_traces` joins several
inputs into one run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.errors import InputError

# GPU activity kinds (the ``kind`` column).
KINDS = ("kernel", "memcpy", "memset")

KERNEL_SCHEMA = pa.schema(
    [
        ("trace_id", pa.int16()),
        ("rank", pa.int16()),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("norm_name", pa.dictionary(pa.int32(), pa.string())),
        ("kind", pa.string()),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("device", pa.int16()),
        ("stream", pa.int64()),
        ("correlation", pa.int64()),
        ("grid_x", pa.int32()),
        ("grid_y", pa.int32()),
        ("grid_z", pa.int32()),
        ("block_x", pa.int32()),
        ("block_y", pa.int32()),
        ("block_z", pa.int32()),
        ("registers", pa.int32()),
        ("shared_mem", pa.int32()),
        ("launch_op_id", pa.int64()),
        ("graph_launch", pa.bool_()),
        ("count", pa.int64()),
        ("aggregate", pa.bool_()),
        # Reader extensions (README.md, "Output columns"): bytes moved by a memcpy/memset
        # as recorded, and the name of the runtime/driver call that launched the activity.
        ("bytes_recorded", pa.int64()),
        ("launch_api", pa.dictionary(pa.int32(), pa.string())),
    ]
)

HOST_OP_SCHEMA = pa.schema(
    [
        ("trace_id", pa.int16()),
        ("rank", pa.int16()),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("external_id", pa.int64()),
        ("input_dims", pa.list_(pa.list_(pa.int64()))),
        ("input_types", pa.list_(pa.string())),
        # Extensions: which kind of host event (cpu_op, runtime, driver), its thread, for
        # runtime/driver calls the launch correlation id, and an id shared by the ops of one trace
        # whose recorded shapes and dtypes are identical (null when unknown).
        ("category", pa.dictionary(pa.int32(), pa.string())),
        ("tid", pa.int64()),
        ("correlation", pa.int64()),
        ("shape_id", pa.int64()),
    ]
)

ANNOTATION_SCHEMA = pa.schema(
    [
        ("trace_id", pa.int16()),
        ("rank", pa.int16()),
        ("name", pa.string()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("side", pa.string()),
    ]
)

HOST_CATEGORIES = ("cpu_op", "runtime", "driver")


@dataclasses.dataclass
class InputMeta:
    """What one input file says about itself: its format, GPU, rank and world size, versions."""

    trace_id: int = 0
    path: str = ""
    sha256: str = ""
    format: str = ""
    reader_version: str = ""
    rank: int = 0
    world_size: int = 1
    gpu_name: str | None = None
    arch: str | None = None
    sm_count: int | None = None
    total_memory: int | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    devices: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Trace:
    """Canonical tables of one or more inputs analysed as one run."""

    kernels: pa.Table
    host_ops: pa.Table
    annotations: pa.Table
    inputs: list[InputMeta]
    warnings: list[str] = dataclasses.field(default_factory=list)

    def validate(self) -> None:
        """Raise :class:`InputError` when a table breaks the model's types or invariants."""
        _check_schema("kernels", self.kernels, KERNEL_SCHEMA)
        _check_schema("host_ops", self.host_ops, HOST_OP_SCHEMA)
        _check_schema("annotations", self.annotations, ANNOTATION_SCHEMA)
        k = self.kernels
        if k.num_rows:
            if pc.any(pc.less(k["dur_ns"], 0)).as_py():
                raise InputError("kernels: negative duration")
            if k["dur_ns"].null_count:
                raise InputError("kernels: missing duration")
            kinds = set(pc.unique(k["kind"]).to_pylist())
            if not kinds <= set(KINDS):
                raise InputError(f"kernels: unknown kind(s) {sorted(kinds - set(KINDS))}")
            not_agg = pc.invert(k["aggregate"])
            if pc.any(pc.and_(not_agg, pc.is_null(k["start_ns"]))).as_py():
                raise InputError("kernels: a timed row has no start")
            if pc.any(pc.less(k["count"], 1)).as_py():
                raise InputError("kernels: count below 1")
            ids = {m.trace_id for m in self.inputs}
            seen = set(pc.unique(k["trace_id"]).to_pylist())
            if not seen <= ids:
                raise InputError(f"kernels: trace_id(s) {sorted(seen - ids)} have no input")
        h = self.host_ops
        if h.num_rows and pc.any(pc.less(h["dur_ns"], 0)).as_py():
            raise InputError("host_ops: negative duration")
        a = self.annotations
        if a.num_rows and pc.any(pc.less(a["end_ns"], a["start_ns"])).as_py():
            raise InputError("annotations: end before start")

    @property
    def kernel_ns(self) -> int:
        return int(pc.sum(self.kernels["dur_ns"]).as_py() or 0) if self.kernels.num_rows else 0


def _check_schema(label: str, table: pa.Table, schema: pa.Schema) -> None:
    for f in schema:
        if f.name not in table.column_names:
            raise InputError(f"{label}: missing column {f.name!r}")
        t = table.schema.field(f.name).type
        if t != f.type:
            raise InputError(f"{label}: column {f.name!r} is {t}, expected {f.type}")


def table_from_columns(columns: dict[str, Any], schema: pa.Schema) -> pa.Table:
    """Build a table with ``schema`` from Python sequences or Arrow arrays; absent columns are null."""
    n = None
    for v in columns.values():
        n = len(v)
        break
    n = n or 0
    arrays = []
    for f in schema:
        v = columns.get(f.name)
        if v is None:
            arrays.append(pa.nulls(n, f.type))
            continue
        if isinstance(v, pa.ChunkedArray):
            v = v.combine_chunks()
        if isinstance(v, pa.Array):
            arrays.append(v if v.type == f.type else v.cast(f.type))
        elif pa.types.is_dictionary(f.type):
            arrays.append(pa.array(v, pa.string()).dictionary_encode().cast(f.type))
        else:
            arrays.append(pa.array(v, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def unify(tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    """Concatenate tables of one schema, unifying their dictionaries (a column all null in one
    table takes the type it has in the others)."""
    tables = [t for t in tables if t.num_rows] or [schema.empty_table()]
    return pa.concat_tables(tables, promote_options="default").unify_dictionaries().combine_chunks()


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as Arrow IPC stream bytes: how tables cross a process boundary (never a pickle)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_table(data: bytes) -> pa.Table:
    """The table of :func:`ipc_bytes` (a view of ``data``, no copy)."""
    with pa.ipc.open_stream(pa.py_buffer(data)) as r:
        return r.read_all()


def concat_traces(traces: Sequence[Trace]) -> Trace:
    """Join several inputs into one run, renumbering ``trace_id`` in order (README.md, "Commands": several inputs)."""
    traces = [with_trace_id(t, i) for i, t in enumerate(traces)]
    return Trace(
        kernels=unify([t.kernels for t in traces], KERNEL_SCHEMA),
        host_ops=unify([t.host_ops for t in traces], HOST_OP_SCHEMA),
        annotations=unify([t.annotations for t in traces], ANNOTATION_SCHEMA),
        inputs=[m for t in traces for m in t.inputs],
        warnings=[w for t in traces for w in t.warnings],
    )


def with_trace_id(trace: Trace, trace_id: int) -> Trace:
    """``trace`` as input ``trace_id`` of a run (its tables and inputs renumbered)."""
    return dataclasses.replace(
        trace,
        kernels=_with_trace_id(trace.kernels, trace_id),
        host_ops=_with_trace_id(trace.host_ops, trace_id),
        annotations=_with_trace_id(trace.annotations, trace_id),
        inputs=[dataclasses.replace(m, trace_id=trace_id) for m in trace.inputs],
    )


def _with_trace_id(table: pa.Table, trace_id: int) -> pa.Table:
    idx = table.schema.get_field_index("trace_id")
    col = pa.array(np.full(table.num_rows, trace_id, np.int16))
    return table.set_column(idx, "trace_id", col)
