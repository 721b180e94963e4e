"""Which host op launched each kernel: the innermost cpu_op of the kernel's external id (a table join).

Classification (op hints, the attention front end, operand facts), the GEMM roles and sizes from
shapes, the phase split and the roofline (op shapes) all read the same join: the pipeline makes it
once per analysis (:meth:`OpJoin.of`) and hands it to each; a function called without it computes it
(:func:`launching_op_rows`, pure). :func:`launch_calls`
picks the runtime/driver calls that carry a launch correlation id; the readers use it too, so this
module imports pandas only inside the functions that need it (the readers load no pandas).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.tables import lookup
from analyzer.tables.dictionaries import dict_isin, dict_strings

__all__ = [
    "distinct_op_shapes",
    "op_values",
    "enclosing_op",
    "following_ops",
    "launch_calls",
    "launch_times",
    "joined",
    "launching_op_rows",
    "OpJoin",
    "split_launch_calls",
    "take_launch_calls",
]


def launch_calls(host_ops: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the runtime/driver calls that carry a launch correlation id."""
    calls = host_ops.select(list(dict.fromkeys([*columns, "correlation"])))
    is_call = pa.array(dict_isin(host_ops["category"], ["runtime", "driver"]))
    return calls.filter(pc.and_(is_call, pc.is_valid(calls["correlation"]))).select(list(columns))


def launching_op_rows(kernels: pa.Table, host_ops: pa.Table) -> tuple[pa.Table, pa.Array] | None:
    """The cpu_ops that launched kernels (innermost per external id) and, per kernel, the row
    of its op in that table (null when none); None without host ops or launch ids."""
    if host_ops.num_rows == 0 or kernels["launch_op_id"].null_count == kernels.num_rows:
        return None
    return _launching_op_rows(kernels, host_ops)


@dataclass(frozen=True)
class OpJoin:
    """The kernel -> launching-op join of one analysis (:func:`launching_op_rows`), made once: the
    kernels' rows and launch ids do not change between the steps that read it."""

    found: tuple[pa.Table, pa.Array] | None

    @classmethod
    def of(cls, kernels: pa.Table, host_ops: pa.Table) -> OpJoin:
        return cls(launching_op_rows(kernels, host_ops))


def joined(kernels: pa.Table, host_ops: pa.Table, join: OpJoin | None) -> tuple[pa.Table, pa.Array] | None:
    """The join as ``join`` holds it, or computed now where the caller has none."""
    return join.found if join is not None else launching_op_rows(kernels, host_ops)


def _launching_op_rows(kernels: pa.Table, host_ops: pa.Table) -> tuple[pa.Table, pa.Array] | None:
    wanted = lookup.unique(kernels["launch_op_id"])
    mask = dict_isin(host_ops["category"], ["cpu_op"]) & lookup.isin(host_ops["external_id"], wanted)
    rows = pa.array(np.flatnonzero(mask))
    if len(rows) == 0:
        return None
    # several ops share an external id when nested: the innermost is the latest to start. Order and
    # deduplicate on the key columns alone, then take the surviving rows of the full table once.
    start = host_ops["start_ns"].take(rows)
    order = pc.array_sort_indices(start.combine_chunks(), order="descending")
    rows = rows.take(order)
    op_keys = lookup.pair(host_ops["trace_id"].take(rows), host_ops["external_id"].take(rows))
    first = lookup.index_in(op_keys, op_keys)  # first occurrence = latest start
    keep = pc.equal(first, pa.array(np.arange(len(rows)), pa.int32()))
    rows = rows.filter(keep)
    # the key columns only (the shape lists stay in host_ops: ``row`` points there), so that the
    # memo holds a few bytes per launching op
    ops = host_ops.select(["trace_id", "name", "shape_id"]).take(rows).append_column("row", rows)
    kkeys = lookup.pair(kernels["trace_id"], kernels["launch_op_id"])
    return ops, lookup.index_in(kkeys, op_keys.filter(keep))


def distinct_op_shapes(
    host_ops: pa.Table, op_rows: np.ndarray, *extra: np.ndarray
) -> tuple[list[str | None], np.ndarray, np.ndarray]:
    """Group the host-op rows ``op_rows`` whose reading from their recorded shapes is the same:
    one input, one op name, one shape id (and one value of each ``extra`` per-row key). Shape ids
    are those of one input, so the input is part of the key; a row without a shape id is a group
    of its own. Returns the op name of each group, the index into ``op_rows`` of each group's first
    row and each row's group: the analyses read every distinct shape once (the same projection or
    attention call repeats in every layer and step)."""
    op_rows = np.asarray(op_rows, np.int64)
    if not len(op_rows):
        return [], np.empty(0, np.int64), np.empty(0, np.int64)
    take = pa.array(op_rows)
    names = dict_strings(host_ops["name"].take(take))
    code = names.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    sid = host_ops["shape_id"].take(take).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    trace = host_ops["trace_id"].take(take).to_numpy(zero_copy_only=False)
    del take
    # the groups are numbered in the order of their keys, the first row of each found in one pass
    inverse = _dense_key([trace, code, _shape_rank(sid), *(np.asarray(x, np.int64) for x in extra)])
    del trace, sid
    first = np.full(int(inverse.max()) + 1, len(inverse), np.int64)
    np.minimum.at(first, inverse, np.arange(len(inverse)))
    dictionary = names.dictionary.to_pylist()
    return [dictionary[c] if c >= 0 else None for c in code[first].tolist()], first, inverse


VALUE_BLOCK = 1 << 12  # host-op values read as Python objects this many rows at a time


def op_values(host_ops: pa.Table, columns: Sequence[str], rows: np.ndarray) -> Iterator[tuple[Any, ...]]:
    """The values of ``columns`` (e.g. the recorded shapes) of the host-op ``rows``, one tuple per
    row in order, read a block at a time: a trace whose shapes change every step has millions of
    distinct ones, nested lists of ints as Python objects."""
    for lo in range(0, len(rows), VALUE_BLOCK):
        at = pa.array(rows[lo : lo + VALUE_BLOCK])
        yield from zip(*(host_ops[c].take(at).to_pylist() for c in columns), strict=True)


def _shape_rank(sid: np.ndarray) -> np.ndarray:
    """The rank of each row's shape id, a row without one (-1) a rank of its own: those first, the
    last row lowest (as if its id were ``-2 - row``), then the ids in order."""
    lone = sid < 0
    n_lone = int(lone.sum())
    if not n_lone:
        return _rank(sid)
    rank = np.empty(len(sid), np.int64)
    rank[lone] = np.arange(n_lone - 1, -1, -1)
    rank[~lone] = _rank(sid[~lone]) + n_lone
    return rank


def _rank(values: np.ndarray) -> np.ndarray:
    """Each value's position among the distinct values, in order (``np.unique``'s inverse): by a
    hash table of the distinct values, so a column of few values costs a few bytes per row, where
    a sort costs five arrays of its length."""
    import pandas as pd  # here, not at the top: the readers import this module for launch_calls

    return pd.factorize(values, sort=True)[0].astype(np.int64, copy=False)


def _dense_key(columns: list[np.ndarray]) -> np.ndarray:
    """One int64 per row that is equal exactly where every column is, numbered 0.. in the order of
    the columns' values: the columns ranked and combined two at a time (``np.unique(axis=1)`` sorts
    the rows as bytes, several times slower on millions of rows), never overflowing."""
    key = _rank(columns[0])
    for col in columns[1:]:
        rank = _rank(col)
        key *= int(rank.max(initial=0)) + 1
        key += rank
        del rank
        key = _rank(key)
    return key


def inside_ops(host_ops: pa.Table, op_rows: np.ndarray, outer: Sequence[str]) -> np.ndarray:
    """Per op row of ``op_rows``: whether a cpu_op named in ``outer`` on the same thread encloses it
    (or it is one)."""
    outer_rows = np.flatnonzero(
        dict_isin(host_ops["name"], list(outer)) & dict_isin(host_ops["category"], ["cpu_op"])
    )
    return enclosing_op(host_ops, outer_rows, op_rows) >= 0


def enclosing_op(host_ops: pa.Table, outer_rows: np.ndarray, op_rows: np.ndarray) -> np.ndarray:
    """Per op of ``op_rows``: the position in ``outer_rows`` of the host op that encloses it on
    the same thread (the latest to start at or before it, ending at or after it; an op encloses
    itself), else -1. Host ops nest by time on their thread."""
    out = np.full(len(op_rows), -1, np.int64)
    if not len(outer_rows) or not len(op_rows):
        return out

    def cols(rows: np.ndarray) -> tuple[np.ndarray, ...]:
        take = pa.array(rows)
        return tuple(host_ops[c].take(take).to_numpy(zero_copy_only=False).astype(np.int64)
                     for c in ("trace_id", "tid", "start_ns", "dur_ns"))  # fmt: skip

    ot, oh, os_, od = cols(outer_rows)
    qt, qh, qs, qd = cols(op_rows)
    # one sorted key per (input, thread) and start: group number * span + start offset
    thread = np.concatenate([ot, qt]) * (1 << 32) + (np.concatenate([oh, qh]) & 0xFFFFFFFF)
    import pandas as pd  # here, not at the top: the readers import this module for launch_calls

    inv = pd.factorize(thread)[0].astype(np.int64)
    base = min(int(os_.min()), int(qs.min()))
    span = max(int(os_.max()), int(qs.max())) - base + 1
    okey = inv[: len(outer_rows)] * span + (os_ - base)
    qkey = inv[len(outer_rows) :] * span + (qs - base)
    order = np.argsort(okey, kind="stable")
    okey, oend, ogroup = okey[order], (os_ + od)[order], inv[: len(outer_rows)][order]
    j = np.searchsorted(okey, qkey, side="right") - 1  # the latest outer op starting at or before
    jj = np.where(j >= 0, j, 0)
    hit = (j >= 0) & (ogroup[jj] == inv[len(outer_rows) :]) & (oend[jj] >= qs + qd)
    out[hit] = order[jj[hit]]
    return out


def following_ops(host_ops: pa.Table, op_rows: np.ndarray, n: int) -> list[np.ndarray]:
    """Per op of ``op_rows``: the rows of the next ``n`` cpu_ops on its thread (same input and
    ``tid``) that start at or after it ends, in start order (fewer at the thread's end)."""
    out: list[np.ndarray] = [np.empty(0, np.int64) for _ in range(len(op_rows))]
    if not len(op_rows) or host_ops.num_rows == 0:
        return out
    op_rows = np.asarray(op_rows, np.int64)
    take = pa.array(op_rows)
    qt = host_ops["trace_id"].take(take).to_numpy(zero_copy_only=False).astype(np.int64)
    qh = host_ops["tid"].take(take).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    qe = (host_ops["start_ns"].take(take).fill_null(0).to_numpy(zero_copy_only=False)
          + host_ops["dur_ns"].take(take).fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64)  # fmt: skip
    threads = set(zip(qt.tolist(), qh.tolist(), strict=True))
    cand = np.flatnonzero(dict_isin(host_ops["category"], ["cpu_op"]))
    ct = host_ops["trace_id"].take(pa.array(cand)).to_numpy(zero_copy_only=False).astype(np.int64)
    ch = host_ops["tid"].take(pa.array(cand)).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    cs = (
        host_ops["start_ns"].take(pa.array(cand)).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    )
    for t, h in threads:
        on = np.flatnonzero((ct == t) & (ch == h))
        order = on[np.argsort(cs[on], kind="stable")]
        starts, rows = cs[order], cand[order]
        for i in np.flatnonzero((qt == t) & (qh == h)).tolist():
            j = int(np.searchsorted(starts, qe[i], side="left"))
            out[i] = rows[j : j + n]
    return out


def split_launch_calls(host_ops: pa.Table) -> tuple[pa.Table, pa.Table] | None:
    """The host ops without their runtime / driver calls, and the calls' ``trace_id``,
    ``correlation`` and ``start_ns``: all that the launch-time join (:func:`launch_times`) reads of
    them. The calls are about half the host rows of a trace; held apart, three of their twelve
    columns stay until the phases are split. None where there is no call or no cpu_op to keep."""
    host_ops, calls = take_launch_calls([host_ops])
    return None if calls is None else (host_ops, calls)


def take_launch_calls(parts: list[pa.Table]) -> tuple[pa.Table, pa.Table | None]:
    """:func:`split_launch_calls` of the one table in ``parts``, which it consumes: each column of
    the host ops is let go once its rows are filtered, so the host ops are not in memory twice (where
    nothing else holds them). The calls are None (and the host ops those given) where there is no
    call or no cpu_op to keep."""
    host_ops = parts.pop()
    is_call = dict_isin(host_ops["category"], ["runtime", "driver"])
    if not is_call.any() or is_call.all():
        return host_ops, None
    calls = launch_calls(host_ops, ["trace_id", "correlation", "start_ns"])
    keep = pa.array(~is_call)
    del is_call
    schema = host_ops.schema
    columns = []
    for name in schema.names:
        columns.append(host_ops.column(name).filter(keep))
        host_ops = host_ops.drop_columns([name])
    return pa.Table.from_arrays(columns, schema=schema), calls


def launch_times(
    kernels: pa.Table, host_ops: pa.Table, calls: pa.Table | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Start of the runtime/driver call that launched each kernel (kernel start when unknown), and
    whether that call was found. ``calls``: :func:`split_launch_calls`'s, else read from ``host_ops``."""
    start = kernels["start_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if calls is None and host_ops.num_rows:
        calls = launch_calls(host_ops, ["trace_id", "correlation", "start_ns"])
    if calls is None or calls.num_rows == 0:
        return start.copy(), np.zeros(len(start), bool)
    pos = lookup.index_in(  # the first call of each (trace, correlation)
        lookup.pair(kernels["trace_id"], kernels["correlation"]),
        lookup.pair(calls["trace_id"], calls["correlation"]),
    )
    call_start = pc.take(calls["start_ns"], pos)
    found = call_start.is_valid().to_numpy(zero_copy_only=False)
    ts = np.where(found, call_start.fill_null(0).to_numpy(zero_copy_only=False), start).astype(np.int64)
    return ts, found
