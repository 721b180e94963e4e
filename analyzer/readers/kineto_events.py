"""Decoded Kineto events -> Arrow columns, one chunk at a time: GPU activities, host ops (cpu_ops and
launch calls, in file order) and annotations.

Contract: :func:`chunk_tables` gives the same tables for the same events wherever the chunks were
cut; the Python objects of a chunk die with it (:class:`TableBuilder` keeps only the tables).
:mod:`analyzer.readers.kineto` turns the collected tables into the model.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.errors import InputError
from analyzer.readers.kineto_scan import CompleteEvent, Event, EventArgs
from analyzer.tables.dictionaries import dict_strings

_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_HOST_CATS = {"cpu_op": "cpu_op", "cuda_runtime": "runtime", "cuda_driver": "driver"}
_ANN_CATS = {"user_annotation": "cpu", "gpu_user_annotation": "gpu"}
_KNOWN_CATS = (
    frozenset(_GPU_CATS)
    | frozenset(_HOST_CATS)
    | frozenset(_ANN_CATS)
    | frozenset(
        {
            "python_function",
            "cuda_sync",
            "overhead",
            "Trace",
            "cpu_instant_event",
            "ac2g",
            "fwdbwd",
            "cuda_event",
        }
    )
)
_EMPTY_ARGS = EventArgs()
_NO_DIMS = (None, None, None)


class TableBuilder:
    """Accumulates Arrow tables chunk by chunk; the Python objects of a chunk die with it."""

    def __init__(self) -> None:
        self.kernels: list[pa.Table] = []
        self.host: list[pa.Table] = []
        self.ann: list[pa.Table] = []
        self.meta: dict[str, Any] = {}

    def add(self, events: list[Any]) -> None:
        self.add_tables(*chunk_tables(events))

    def add_tables(self, k: pa.Table | None, h: pa.Table | None, a: pa.Table | None) -> None:
        for parts, t in ((self.kernels, k), (self.host, h), (self.ann, a)):
            if t is not None and t.num_rows:
                parts.append(t)


# cpu_ops that only make views, allocate or read metadata: they never launch GPU work, so no kernel
# can name them; skipping them before column building saves a third of the host rows of a trace.
_NEVER_LAUNCH = frozenset(
    {
        "aten::as_strided",
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::transpose",
        "aten::t",
        "aten::permute",
        "aten::expand",
        "aten::slice",
        "aten::select",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::narrow",
        "aten::split",
        "aten::chunk",
        "aten::unbind",
        "aten::detach",
        "aten::alias",
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::result_type",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::lift_fresh",
        "aten::set_",
    }
)


def chunk_tables(events: list[Any]) -> tuple[pa.Table | None, pa.Table | None, pa.Table | None]:
    """Decoded events of one chunk -> (gpu, host, annotation) tables in file order; None where a
    kind is absent. cpu_ops and launch calls are built apart (they need different columns), then
    interleaved back into file order, so the tables never depend on where chunks were cut."""
    gpu: list[Any] = []
    ops: list[Any] = []
    calls: list[Any] = []
    ann: list[Any] = []
    op_at: list[int] = []
    call_at: list[int] = []
    to_gpu, to_op, to_call, to_ann = gpu.append, ops.append, calls.append, ann.append
    gpu_cats, ann_cats, skip = _GPU_CATS, _ANN_CATS, _NEVER_LAUNCH
    for i, e in enumerate(events):
        t = type(e)
        if t is not CompleteEvent and (t is not Event or e.ph != "X"):
            continue
        c = e.cat
        if c == "cpu_op":
            if e.name not in skip:
                to_op(e)
                op_at.append(i)
        elif c in gpu_cats:
            to_gpu(e)
        elif c == "cuda_runtime" or c == "cuda_driver":
            to_call(e)
            call_at.append(i)
        elif c in ann_cats:
            to_ann(e)
        elif c and c not in _KNOWN_CATS and c.lower() in gpu_cats:
            # early Kineto capitalised categories ("Kernel", "Memcpy" ...)
            to_gpu(e)
    host = None
    if ops and calls:
        both = pa.concat_tables([_op_table(ops), _call_table(calls)], promote_options="default")
        host = both.take(pa.array(np.argsort(np.array(op_at + call_at), kind="stable")))
    elif ops:
        host = _op_table(ops)
    elif calls:
        host = _call_table(calls)
    return (
        _gpu_table(gpu) if gpu else None,
        host,
        _ann_table(ann) if ann else None,
    )


def _int(v: Any) -> int | None:
    """An integer field that may be written as a string or float; None when it is not a number."""
    if type(v) is int:
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                return None
            return int(f) if f.is_integer() else None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _ints(values: list[Any]) -> pa.Array:
    """int64 column; the C fast path handles ints and None, strings and floats take the slow one."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        out = [v if type(v) is int else _int(v) for v in values]
        return pa.array([v if v is None or -(2**63) <= v < 2**63 else None for v in out], pa.int64())


def _num(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return np.nan
    return np.nan


class EventValueError(InputError):
    """A GPU event's ts or dur that is not a usable number (the reader adds the file's path)."""


MAX_US = 9e15  # int64 nanoseconds hold about ±9.2e15 microseconds


def _us_to_ns(values: list[Any], field: str | None = None) -> pa.Array:
    """Microseconds as int64 nanoseconds; null where a value is missing or unusable. With ``field``
    (a GPU event's required ts or dur) a present but unusable value is an :class:`EventValueError`."""
    try:
        arr = pa.array(values, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        arr = np.array([_num(v) for v in values], dtype=np.float64)
    mask = ~np.isfinite(arr) | (np.abs(arr) > MAX_US)
    if field is not None and mask.any():
        _raise_unusable(values, np.flatnonzero(mask), field)
    ns = np.rint(arr * 1000.0)
    ns[mask] = 0
    return pa.array(ns.astype(np.int64), mask=mask)


def _raise_unusable(values: list[Any], rows: np.ndarray, field: str) -> None:
    for i in rows.tolist():
        v = values[i]
        if v is None:
            continue  # missing: reported as such once the tables are joined
        try:
            number = float(v)
        except (TypeError, ValueError, OverflowError):
            raise EventValueError(f"GPU event {field} {v!r} is not a number") from None
        if number != number:  # NaN
            raise EventValueError(f"GPU event {field} {v!r} is not a number")
        raise EventValueError(
            f"GPU event {field} {number:g} us is out of range (times are int64 nanoseconds: "
            f"at most ±{MAX_US:g} us)"
        )


def _gpu_table(evs: list[Event]) -> pa.Table:
    name, cat, ts, dur, pid, tid = [], [], [], [], [], []
    dev, stream, corr, ext, regs, smem, nbytes, grid, block = [], [], [], [], [], [], [], [], []
    cats, empty = _GPU_CATS, _EMPTY_ARGS
    for e in evs:
        name.append(e.name)
        c = e.cat
        cat.append(cats.get(c) or cats.get((c or "").lower()))
        ts.append(e.ts)
        dur.append(e.dur)
        pid.append(e.pid)
        tid.append(e.tid)
        a = e.args or empty
        dev.append(a.device)
        stream.append(a.stream)
        corr.append(a.correlation)
        ext.append(a.external_id)
        regs.append(a.registers)
        smem.append(a.shared_memory)
        nbytes.append(a.nbytes)
        grid.append(a.grid)
        block.append(a.block)
    cols: dict[str, Any] = {
        "name": dict_strings(name),
        "cat": dict_strings(cat),
        "ts": _us_to_ns(ts, "ts"),
        "dur": _us_to_ns(dur, "dur"),
        "pid": _ints(pid),
        "tid": _ints(tid),
        "device": _ints(dev),
        "stream": _ints(stream),
        "correlation": _ints(corr),
        "external_id": _ints(ext),
        "registers": _ints(regs),
        "shared_mem": _ints(smem),
        "bytes": _ints(nbytes),
    }
    for field, vals in (("grid", grid), ("block", block)):
        for ax, col in zip("xyz", _dims3(vals), strict=True):
            cols[f"{field}_{ax}"] = col
    return pa.table(cols)


def _dims3(vals: list[list[int] | None]) -> list[pa.Array]:
    """x, y, z columns of grid/block triples (missing entries, and lists of another length, null)."""
    try:
        lists = pa.array(vals, pa.list_(pa.int64()))  # in C; values beyond int64 take the slow way
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return _dims3_slow(vals)
    if lists.values.null_count:
        return _dims3_slow(vals)
    starts = lists.offsets.to_numpy()[:-1]
    ok = pc.fill_null(pc.equal(pc.list_value_length(lists), 3), False).to_numpy(zero_copy_only=False)
    values = np.append(lists.values.to_numpy(zero_copy_only=False), np.zeros(3, np.int64))
    at = np.where(ok, starts, len(values) - 3)  # a missing triple reads zeros, masked
    return [pa.array(values[at + i], mask=~ok) for i in range(3)]


def _dims3_slow(vals: list[Any]) -> list[pa.Array]:
    flat = [v for d in vals for v in (d if d is not None and len(d) == 3 else _NO_DIMS)]
    arr = _ints(flat).to_numpy(zero_copy_only=False)  # float64 with NaN where null
    if arr.dtype.kind == "f":
        return [_float_to_int(arr[i::3]) for i in range(3)]
    return [pa.array(arr[i::3]) for i in range(3)]


def _float_to_int(a: np.ndarray) -> pa.Array:
    mask = np.isnan(a)
    return pa.array(np.where(mask, 0, a).astype(np.int64), mask=mask)


_LINES = msgspec.json.Encoder()


def _dict_raw(values: list[msgspec.Raw]) -> pa.DictionaryArray:
    """Raw JSON fragments dictionary-encoded (an absent one is null). msgspec writes them out as
    lines in one call, which beats copying each fragment to ``bytes`` in Python by far."""
    blob = _LINES.encode_lines(values)
    parts = blob.split(b"\n")
    parts.pop()  # after the last newline
    if len(parts) != len(values):  # a fragment that spans lines: copy one by one
        parts = [bytes(v) for v in values]
    arr = pa.array(parts, pa.binary())
    arr = pc.if_else(pc.equal(pc.binary_length(arr), 0), pa.scalar(None, pa.binary()), arr)
    return arr.dictionary_encode()


def _op_table(evs: list[Event]) -> pa.Table:
    name, ts, dur, tid, ext, dims, types = [], [], [], [], [], [], []
    empty = _EMPTY_ARGS
    for e in evs:
        name.append(e.name)
        ts.append(e.ts)
        dur.append(e.dur)
        tid.append(e.tid)
        a = e.args or empty
        ext.append(a.external_id)
        dims.append(a.input_dims)
        types.append(a.input_type)
    n = len(evs)
    return pa.table(
        {
            "name": dict_strings(name),
            "category": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["cpu_op"])),
            "ts": _us_to_ns(ts),
            "dur": _us_to_ns(dur),
            "tid": _ints(tid),
            "external_id": _ints(ext),
            "correlation": pa.nulls(n, pa.int64()),
            # shapes repeat every layer and step: dictionary-encoded they cost 4 bytes a row
            "dims_raw": _dict_raw(dims),
            "types_raw": _dict_raw(types),
        }
    )


def _call_table(evs: list[Event]) -> pa.Table:
    name, cat, ts, dur, tid, ext, corr, pid = [], [], [], [], [], [], [], []
    cats, empty = _HOST_CATS, _EMPTY_ARGS
    for e in evs:
        name.append(e.name)
        cat.append(cats[e.cat])
        ts.append(e.ts)
        dur.append(e.dur)
        tid.append(e.tid)
        pid.append(e.pid)
        a = e.args or empty
        ext.append(a.external_id)
        corr.append(a.correlation)
    n = len(evs)
    none = pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], pa.binary()))
    return pa.table(
        {
            "name": dict_strings(name),
            "category": dict_strings(cat),
            "ts": _us_to_ns(ts),
            "dur": _us_to_ns(dur),
            "tid": _ints(tid),
            "external_id": _ints(ext),
            "correlation": _ints(corr),
            # the launching process: with the clock base and session id, which profile this is
            "pid": _ints(pid),
            "dims_raw": none,
            "types_raw": none,
        }
    )


def _ann_table(evs: list[Event]) -> pa.Table:
    return pa.table(
        {
            "name": dict_strings([e.name or "" for e in evs]),
            "side": dict_strings([_ANN_CATS[e.cat or ""] for e in evs]),
            "ts": _us_to_ns([e.ts for e in evs]),
            "dur": _us_to_ns([e.dur for e in evs]),
        }
    )
