"""The work of kernels whose launching op recorded its shapes (``flops_source = shapes``).

Contract: the numbers of each launching op (:func:`analyzer.analyses.roofline.formulas.read_op`, read
once per distinct op shape) go to its longest kernel; its other kernels are helpers, not new work,
and keep null numbers, except a split-K reduce, which reads the fp32 partials and writes C. A gather
whose rows are taken by a later op is read with that op's shapes (searched among the next
:data:`CONSUMER_WINDOW` ops). GEMMs running an attention stage count the pairs of the causal
convention. Where the shapes give no numbers, the op's kernels get the reason (:data:`UNCOUNTED`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from analyzer.analyses.roofline.formulas import OpWork, Tables, composed_causal_share, consumer_rows, read_op
from analyzer.analyses.roofline.splitk import MIN_SPLIT, PARTIAL_BYTES, split_of, splitk_reduce_mask
from analyzer.analyses.roofline.work import REASON_CODE, Work
from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES
from analyzer.tables import launches
from analyzer.tables.dictionaries import dict_isin, filled

# attention kernels whose GEMMs follow the causal convention (composed attention); linear
# attention / state-space mixers have no causal score matrix
_SOFTMAX_ATTENTION = frozenset(s for s in ATTENTION_KERNEL_STAGES if s != "linear_attention")
CONSUMER_WINDOW = 16  # ops after a gather searched for the one taking the gathered rows (work_ops.toml)


def shape_work(
    kernels: pa.Table,
    host_ops: pa.Table,
    ops: pa.Table,
    p: np.ndarray,
    can_lead: np.ndarray,
    tables: Tables,
    w: Work,
    reason: np.ndarray,
) -> np.ndarray:
    """Numbers of every launching op with shapes on its longest kernel; returns the op's other
    (helper) kernels. ``reason`` gets, per lead kernel, what the op's shapes could not say."""
    n = kernels.num_rows
    lead = _lead_kernels(kernels, p, can_lead)
    if not len(lead):
        return np.zeros(n, bool)
    op_rows = ops["row"].take(pa.array(p[lead])).to_numpy(zero_copy_only=False).astype(np.int64)
    group_names, gfirst, inv = launches.distinct_op_shapes(host_ops, op_rows)
    groups = _ShapeGroups.read(host_ops, group_names, op_rows[gfirst], tables)
    del group_names, gfirst
    # gathers whose rows the op after them takes: read one by one (a few per layer)
    need = np.flatnonzero(groups.consumer[inv])
    per_f, per_b, per_dt = _consumer_work(host_ops, op_rows[need], tables)
    del op_rows
    ok = groups.ok[inv]
    ok[need] = ~np.isnan(per_b)
    # the lead kernels with numbers only: their group's, a consumer's its own
    at = np.flatnonzero(ok)
    g = inv[at]
    fl, by, dt = groups.flops[g], groups.bytes[g], groups.dtype[g]
    mine = np.searchsorted(at, need[ok[need]])
    fl[mine], by[mine], dt[mine] = per_f[ok[need]], per_b[ok[need]], per_dt[ok[need]]
    rows = lead[at]
    if "stage" in kernels.column_names:
        attention = dict_isin(kernels["stage"], list(_SOFTMAX_ATTENTION))[rows]
        fl = np.where(attention, fl * groups.share[g], fl)
    del at, g
    w.flops[rows], w.bytes[rows] = fl, by
    w.dtype[rows] = dt
    w.source[rows] = "shapes"
    reason[rows] = REASON_CODE[""]
    del rows, fl, by, dt
    bad = np.flatnonzero(~ok)
    why = groups.reason[inv[bad]].astype(np.int8)
    why[np.searchsorted(bad, need[~ok[need]])] = REASON_CODE["output_unknown"]
    bad = lead[bad]
    reason[bad] = why
    op_reason = np.zeros(ops.num_rows, np.int8)
    op_reason[p[bad]] = why
    del bad, why
    rest = np.flatnonzero((p >= 0) & (reason == REASON_CODE["op"]))
    reason[rest] = op_reason[p[rest]]  # the op's other kernels: what its shapes could not say
    return _helpers_of_measured_ops(
        kernels, host_ops, ops, p, lead, w.flops, w.bytes, w.source, w.dtype, tables
    )


def _lead_kernels(kernels: pa.Table, p: np.ndarray, can_lead: np.ndarray) -> np.ndarray:
    """The kernel each launching op's numbers go to: its longest that may lead (one per op)."""
    dur = kernels["dur_ns"].to_numpy(zero_copy_only=False)
    cand = np.flatnonzero((p >= 0) & can_lead)
    order = cand[np.argsort(-dur[cand], kind="stable")]
    del cand
    # per op (in op order), its first kernel in ``order``
    ops = p[order]
    first = np.full(int(ops.max(initial=-1)) + 1, len(ops), np.int64)
    np.minimum.at(first, ops, np.arange(len(ops)))
    return order[first[first < len(ops)]]


@dataclasses.dataclass
class _ShapeGroups:
    """Per distinct op shape (name, dims, types): its numbers, or why none, read once."""

    flops: np.ndarray
    bytes: np.ndarray
    dtype: np.ndarray
    ok: np.ndarray
    consumer: np.ndarray  # a gather whose rows are read from the op after it (one lookup per op)
    share: np.ndarray  # the causal share of a GEMM group where it runs an attention (composed)
    reason: np.ndarray  # codes of REASONS where no numbers

    @classmethod
    def read(cls, host_ops: pa.Table, names: list[Any], at: np.ndarray, tables: Tables) -> _ShapeGroups:
        """The groups of op ``names``, each's shapes read from host-op row ``at``."""
        dims = host_ops["input_dims"].take(pa.array(at)).to_pylist()
        types = host_ops["input_types"].take(pa.array(at)).to_pylist()
        # ops whose rows are read from the op after them: one lookup per op, not per shape
        consumer_ops = {nm for g in tables.work.gathers if g.select == "consumer" for nm in g.names}
        per_group: list[Any] = []
        memo: dict[bytes, Any] = {}
        for nm, d, ty in zip(names, dims, types, strict=True):
            if nm is None or d is None:
                per_group.append(None)
                continue
            if nm in consumer_ops:
                per_group.append("consumer")
                continue
            key = orjson.dumps((nm, d, ty))
            if key not in memo:
                memo[key] = read_op(nm, d, ty, tables)
            per_group.append(memo[key])
        ng = len(names)
        got = cls(
            np.full(ng, np.nan), np.full(ng, np.nan), filled(ng, "bf16"), np.zeros(ng, bool),
            np.zeros(ng, bool), np.ones(ng), np.zeros(ng, np.int8),
        )  # fmt: skip
        for g, (nm, r) in enumerate(zip(names, per_group, strict=True)):
            if isinstance(r, OpWork):
                got.flops[g], got.bytes[g], got.dtype[g], got.ok[g] = r.flops, r.bytes, r.dtype, True
                if tables.work.is_gemm(nm):
                    got.share[g] = composed_causal_share(tables.work.gemm(nm, dims[g]))
            elif r == "consumer":
                got.consumer[g] = True
            else:
                got.reason[g] = REASON_CODE[_no_count_reason(nm or "", dims[g], tables)]
        return got


def _consumer_work(
    host_ops: pa.Table, op_rows: np.ndarray, tables: Tables
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flops, bytes, dtype) per host-op row of ``op_rows``, gathers whose rows the op after them
    takes: read with the shapes of the first of the next :data:`CONSUMER_WINDOW` ops that takes the
    rows (one lookup per op: a few per layer); NaN where none does."""
    per_op_f, per_op_b = np.full(len(op_rows), np.nan), np.full(len(op_rows), np.nan)
    per_op_dt = filled(len(op_rows), "bf16")
    if not len(op_rows):
        return per_op_f, per_op_b, per_op_dt
    nxt = launches.following_ops(host_ops, op_rows, CONSUMER_WINDOW)
    for i, follow in enumerate(nxt):
        r = int(op_rows[i])
        nm = str(host_ops["name"][r])
        d, ty = host_ops["input_dims"][r].as_py(), host_ops["input_types"][r].as_py()
        table = d[0] if d else None
        for f in follow.tolist():
            cons = host_ops["input_dims"][f].as_py()
            if table and consumer_rows(table, cons) is not None:
                got = read_op(nm, d, ty, tables, consumer=cons)
                if got is not None:
                    per_op_f[i], per_op_b[i], per_op_dt[i] = got.flops, got.bytes, got.dtype
                break
    return per_op_f, per_op_b, per_op_dt


def _no_count_reason(name: str, dims: Any, tables: Tables) -> str:
    if not dims:
        return "no_shapes"
    if tables.work.gather(name) is not None or tables.work.kind(name) == "unsized":
        return "output_unknown"
    lay = tables.attention.layout(name)
    if tables.work.is_gemm(name) or (lay is not None and not lay.composed):
        return "shapes_unreadable"
    return "no_formula"


def _helpers_of_measured_ops(
    kernels: pa.Table,
    host_ops: pa.Table,
    ops: pa.Table,
    p: np.ndarray,
    lead: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
    source: list[str],
    dtype: list[str],
    tables: Tables | None = None,
) -> np.ndarray:
    """The kernels whose launching op was measured from its shapes (its work is already counted on
    the op's longest kernel). A split-K reduce among them gets the reduce's own numbers: the op's
    M x N partials read ``split`` times and C written once."""
    measured = np.zeros(ops.num_rows, bool)
    done = np.asarray(source, object)[lead] == "shapes"
    measured[p[lead[done]]] = True
    covered = (p >= 0) & measured[np.maximum(p, 0)]
    covered[lead[done]] = False
    red = np.flatnonzero(covered & splitk_reduce_mask(kernels) & np.isnan(nbytes))
    if len(red):
        lead_of = np.full(ops.num_rows, -1, np.int64)
        lead_of[p[lead]] = lead
        partner = lead_of[p[red]]
        split = np.fmax(split_of(kernels, red), split_of(kernels, partner))
        at = ops["row"].take(pa.array(p[red])).to_numpy(zero_copy_only=False).astype(np.int64)
        sp = np.where(np.isnan(split) | (split < MIN_SPLIT), float(MIN_SPLIT), split)
        fp32 = np.array([j >= 0 and dtype[j] == "fp32" for j in partner.tolist()], bool)
        out_bytes = np.where(fp32, 4.0, 2.0)  # C in the GEMM's dtype
        # the op's M x N read once per distinct op shape (it repeats in every layer and step)
        group_names, first, inverse = launches.distinct_op_shapes(host_ops, at)
        dims = host_ops["input_dims"].take(pa.array(at[first])).to_pylist()
        mn = np.full(len(first), np.nan)
        work = (tables or Tables.load()).work
        for u, (nm, d) in enumerate(zip(group_names, dims, strict=True)):
            g = work.gemm(nm, d)
            if g is not None:
                mn[u] = g[1].batch * g[1].m * g[1].n
        work_mn = mn[inverse]
        ok = ~np.isnan(work_mn)
        rows_ok = red[ok]
        flops[rows_ok] = 0.0  # a reduce's additions are the GEMM's (see reduce_work)
        nbytes[rows_ok] = sp[ok] * work_mn[ok] * PARTIAL_BYTES + work_mn[ok] * out_bytes[ok]
        for i in rows_ok.tolist():
            dtype[i], source[i] = "fp32", "shapes"
    return covered
