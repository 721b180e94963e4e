"""The work of every kernel and its basis: shapes first, then recorded copy sizes, then sizes.

Contract: per kernel, its FLOPs and bytes from the launching op's shapes
(:mod:`~analyzer.analyses.roofline.by_shapes`), for memcpy / memset the bytes the trace records
(``[[copy]]``), for GEMM roles and MoE experts without shapes the model's sizes
(:mod:`~analyzer.analyses.roofline.by_sizes`); otherwise null, and ``uncounted`` says why
(:data:`~analyzer.analyses.roofline.work.UNCOUNTED`). rocprof's ``<barrier packet>``
pseudo-dispatches (rule ``MEM600``) are queue waits, not work: they never get numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses.roofline.by_shapes import shape_work
from analyzer.analyses.roofline.by_sizes import MODEL_STAGES, model_work, sizes_per_input
from analyzer.analyses.roofline.formulas import Tables
from analyzer.analyses.roofline.work import REASON_CODE, REASONS, Work
from analyzer.knowledge import architectures
from analyzer.knowledge.kernel_rules import BARRIER_RULE_ID
from analyzer.knowledge.work_ops import WorkOps
from analyzer.tables import launches
from analyzer.tables.dictionaries import DICT_STRING, dict_isin, filled, objects


def kernel_work(
    kernels: pa.Table,
    host_ops: pa.Table,
    model: architectures.ModelArch | None,
    world_size: int = 1,
    tables: Tables | None = None,
    join: launches.OpJoin | None = None,
) -> Work:
    """Per kernel: its numbers and their basis (see the module contract)."""
    tables = tables or Tables.load()
    n = kernels.num_rows
    w = Work(
        np.full(n, np.nan),
        np.full(n, np.nan),
        filled(n, "none"),
        filled(n, "bf16"),
        None,
    )
    reason = np.zeros(n, np.int8)  # codes of REASONS
    kind = kernels["kind"]
    is_kernel = pc.equal(kind, "kernel").fill_null(False).to_numpy(zero_copy_only=False)
    is_copy = pc.is_in(kind, pa.array(["memcpy", "memset"])).fill_null(False).to_numpy(zero_copy_only=False)
    barrier = barrier_rows(kernels)
    # 1. shapes: the numbers of each launching op go to its longest kernel
    join = join if join is not None else launches.OpJoin.of(kernels, host_ops)
    found = join.found
    covered = np.zeros(n, bool)
    if found is not None:
        ops, pos = found
        p = pc.fill_null(pos, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        reason[p >= 0] = REASON_CODE["op"]  # has a launching op: decided below
        covered = shape_work(kernels, host_ops, ops, p, is_kernel & ~barrier, tables, w, reason)
    # 2. memcpy / memset: the bytes the trace records
    _copy_work(kernels, is_copy, tables.work, w, reason)
    # 3. sizes (--model, else found in the trace) for GEMM roles and experts without shapes
    # sizes are looked for only where a kernel needs them (or --model is to be checked against them)
    wanting = (
        dict_isin(kernels["stage"], list(MODEL_STAGES)) & (w.source == "none") & ~covered
        if "stage" in kernels.column_names
        else np.zeros(n, bool)
    )
    sizes, warnings, w.found = (
        sizes_per_input(
            kernels, host_ops, objects(kernels["stage"]), model, world_size, tables, wanting, join
        )
        if "stage" in kernels.column_names and (model is not None or wanting.any())
        else ({}, [], {})
    )
    w.warnings.extend(warnings)
    for t, (label, ws) in sizes.items():
        mine = kernels["trace_id"].to_numpy(zero_copy_only=False) == t if t >= 0 else np.ones(n, bool)
        model_work(
            kernels,
            ws,
            ws.tp,
            w.flops,
            w.bytes,
            w.source,
            skip=covered | ~mine,
            label=label,
            dtype=w.dtype,
            work=tables.work,
        )
        w.sizes[str(t)] = ws.describe()
    # 4. why the rest has no numbers
    w.uncounted = _why_uncounted(kernels, w, reason, covered, barrier, sizes)
    return w


def _copy_work(kernels: pa.Table, is_copy: np.ndarray, work: WorkOps, w: Work, reason: np.ndarray) -> None:
    """memcpy / memset activities: the bytes the trace records, as ``[[copy]]`` counts them."""
    if "bytes_recorded" not in kernels.column_names:
        return
    rows = np.flatnonzero(is_copy)
    if not len(rows):
        return
    rec = kernels["bytes_recorded"].take(pa.array(rows)).to_numpy(zero_copy_only=False).astype(np.float64)
    names = objects(kernels["name"].take(pa.array(rows)))
    uniq, at = np.unique(names.astype(str), return_inverse=True)
    moved = np.array([work.moved(str(u)) or np.nan for u in uniq.tolist()], np.float64)[at.reshape(-1)]
    unknown = np.isnan(rec) | (rec < 0)
    reason[rows[unknown]] = REASON_CODE["not_work"]
    ok = ~unknown & ~np.isnan(moved)
    rows = rows[ok]
    w.flops[rows], w.bytes[rows] = 0.0, rec[ok] * moved[ok]
    w.dtype[rows], w.source[rows] = "bf16", "shapes"
    reason[rows] = REASON_CODE[""]


def _why_uncounted(
    kernels: pa.Table,
    w: Work,
    reason: np.ndarray,
    covered: np.ndarray,
    barrier: np.ndarray,
    sizes: dict[int, Any],
) -> pa.DictionaryArray:
    """Per kernel without numbers, why (:data:`UNCOUNTED`); null where it has numbers."""
    n = kernels.num_rows
    out = np.zeros(n, np.int8)  # codes of REASONS; 0: null
    unc = np.isnan(w.flops) & np.isnan(w.bytes)
    tokens = (
        kernels["tokens"].to_numpy(zero_copy_only=False).astype(np.float64)
        if "tokens" in kernels.column_names
        else np.full(n, np.nan)
    )
    trace = kernels["trace_id"].to_numpy(zero_copy_only=False).astype(np.int64)
    out[unc & barrier] = REASON_CODE["not_work"]
    out[unc & ~barrier & covered] = REASON_CODE["helper"]
    rest = unc & ~barrier & ~covered
    quiet = (reason == REASON_CODE[""]) | (reason == REASON_CODE["op"])  # nothing said about the op's shapes
    plain = quiet | (reason == REASON_CODE["no_shapes"])
    staged = "stage" in kernels.column_names
    by_sizes = rest & plain & (dict_isin(kernels["stage"], list(MODEL_STAGES)) if staged else False)
    has = np.isin(trace, list(sizes)) | (-1 in sizes)
    lm_head = dict_isin(kernels["stage"], ["lm_head_gemm"]) if staged else np.zeros(n, bool)
    decode = dict_isin(kernels["phase"], ["decode"]) if "phase" in kernels.column_names else np.zeros(n, bool)
    # an LM head outside decode: sizes would not count it either (the rows it scores are unknown)
    rows_unknown = np.isnan(tokens) | (lm_head & ~decode)
    out[by_sizes & (has | (lm_head & ~decode)) & rows_unknown] = REASON_CODE["no_tokens"]
    out[by_sizes & has & ~rows_unknown] = REASON_CODE["no_shapes"]
    out[by_sizes & ~has & ~(lm_head & ~decode)] = REASON_CODE["no_sizes"]
    other = rest & ~by_sizes
    said = other & ~quiet
    out[said] = reason[said]
    out[other & ~said] = REASON_CODE["no_shapes"]
    labels = pa.array(list(REASONS), pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(out.astype(np.int32), mask=out == 0), labels).cast(
        DICT_STRING
    )


def barrier_rows(kernels: pa.Table) -> np.ndarray:
    """The rows that are rocprof ``<barrier packet>`` pseudo-dispatches (their own rule id)."""
    if "rule_id" not in kernels.column_names:
        return np.zeros(kernels.num_rows, bool)
    return dict_isin(kernels["rule_id"], [BARRIER_RULE_ID])
