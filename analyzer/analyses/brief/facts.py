"""What one input's host ops say that the brief needs, read while they are still held (an input step).

Contract: :func:`input_facts` is a pure function of one input's kernels (with their final stages),
its host ops and the kernel -> launching-op join. It returns plain JSON values (they travel from a
rank worker in its meta) and reads each distinct op shape once, never a kernel at a time (the
kernels' stages are read as the column's dictionary codes, no per-kernel string):

* ``sizes``: the model's sizes the recorded shapes show (:func:`analyzer.analyses.shape_roles.found_sizes`,
  HF config key names; those the roofline already found are handed in, not found again), null
  without an embedding lookup with shapes;
* ``qkv``: the distinct (K, N) weight shapes of the QKV projections with their op counts (a K and a V
  projection narrower than the Q projection are the KV heads a GQA model keeps in its cache);
* ``ops``: per stage of interest (GEMM roles, attention, the KV-cache store), the launching ops by
  name with their activation and weight dtypes, the destination shape of a cache write, and their
  kernel counts.

Nothing is inferred here: the brief (:mod:`analyzer.analyses.brief`) weighs these facts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.analyses import shape_roles
from analyzer.knowledge.attention_ops import AttentionOps
from analyzer.knowledge.taxonomy import ALL_GEMM_STAGES, ATTENTION_KERNEL_STAGES
from analyzer.knowledge.work_ops import WorkOps
from analyzer.tables.dictionaries import dict_strings, objects
from analyzer.tables.launches import OpJoin, distinct_op_shapes, joined, op_values

KV_STORE = "kv_cache_store"
STAGES = (*ALL_GEMM_STAGES, *ATTENTION_KERNEL_STAGES, KV_STORE)


_FIND = object()  # input_facts' ``found`` when the sizes are to be found here


def input_facts(
    kernels: pa.Table,
    host_ops: pa.Table,
    attention: AttentionOps,
    work: WorkOps,
    trace: int | None = None,
    join: OpJoin | None = None,
    found: shape_roles.ModelDims | None | object = _FIND,
) -> dict[str, Any]:
    """The facts of input ``trace`` (None: the tables hold one input); ``found``: the sizes an
    earlier step found in its shapes (None: none), left out to find them here."""
    out: dict[str, Any] = {"sizes": None, "qkv": [], "ops": {}}
    if host_ops.num_rows == 0 or "input_dims" not in host_ops.column_names:
        return out
    if found is _FIND:
        stage = objects(kernels["stage"])  # one shared str per stage, not one per kernel
        found = shape_roles.found_sizes(kernels, host_ops, stage, attention, work, trace, join)
    if isinstance(found, shape_roles.ModelDims):
        out["sizes"] = {
            **found.as_dict(),
            "value_head_dim": found.value_head_dim,
            "lm_head_out": found.lm_head_out,
        }
    got = joined(kernels, host_ops, join)
    if got is None:
        return out
    ops, pos = got
    code = _stage_codes(kernels["stage"])
    mask = code >= 0
    if trace is not None:
        mask &= kernels["trace_id"].to_numpy(zero_copy_only=False) == trace
    rows = np.flatnonzero(mask)
    del mask
    if not len(rows):
        return out
    at = pos.take(pa.array(rows))
    valid = at.is_valid().to_numpy(zero_copy_only=False)
    rows = rows[valid]
    if not len(rows):
        return out
    op_rows = (
        ops["row"]
        .take(at.filter(pa.array(valid)))
        .to_numpy(zero_copy_only=False)
        .astype(np.int64, copy=False)
    )
    del at, valid
    names, first, inverse = distinct_op_shapes(host_ops, op_rows, code[rows])
    stage_of = code[rows[first]]  # each group's stage: the per-kernel arrays go before the op count
    del code, rows
    kernels_per = np.bincount(inverse, minlength=len(first))
    # ops, not kernels, per group: a split-K GEMM launches two kernels for one op
    # one int per (group, op): a 1-D unique (np.unique(axis=1) sorts rows as bytes, far slower)
    uniq_ops = _distinct_pairs(inverse, op_rows) // (int(op_rows.max()) + 1) if len(op_rows) else inverse
    ops_per = np.bincount(uniq_ops, minlength=len(first))
    values = op_values(host_ops, ("input_dims", "input_types"), op_rows[first])
    merged, qkv = _merged_groups(names, values, stage_of, kernels_per, ops_per, attention, work)
    for (st, nm, act, weight, dest, front), (k, n) in sorted(
        merged.items(), key=lambda kv: (kv[0][0], -kv[1][0], kv[0][1])
    ):
        row = {"op": nm, "dtype": act, "weight_dtype": weight, "dest": dest, "kernels": k, "ops": n}
        if front:
            row["attention_op"] = True  # an attention front end (rules/attention_ops.toml): q, k, v inputs
        out["ops"].setdefault(st, []).append(row)
    out["qkv"] = [[k, n, c] for (k, n), c in sorted(qkv.items())]
    return out


def _merged_groups(
    names: Any,
    values: Any,
    stage_of: np.ndarray,
    kernels_per: np.ndarray,
    ops_per: np.ndarray,
    attention: AttentionOps,
    work: WorkOps,
) -> tuple[dict[Any, list[int]], dict[tuple[int, int], int]]:
    """The distinct (op, shapes) groups merged by (stage, op, activation / weight dtype, KV store
    destination, attention front end) into [kernels, ops]; and the QKV GEMMs' (K, N) -> ops."""
    merged: dict[Any, list[int]] = {}
    qkv: dict[tuple[int, int], int] = {}
    for g, (nm, (d, ty)) in enumerate(zip(names, values, strict=True)):
        st = STAGES[int(stage_of[g])]
        act = weight = dest = None
        gemm = work.gemm(nm, d) if st in ALL_GEMM_STAGES else None
        if gemm is not None:
            op, gd = gemm
            act, weight = _type(ty, op.a), _type(ty, op.b)
            if st == "qkv_gemm" and not op.grouped:
                qkv[(gd.k, gd.n)] = qkv.get((gd.k, gd.n), 0) + int(ops_per[g])
        elif st == KV_STORE:
            act = _type(ty, 0)
            dest = "x".join(map(str, d[0])) if d and d[0] else None
        else:
            act = _type(ty, 0)
            weight = _type(ty, 1) if st in ATTENTION_KERNEL_STAGES else None
        front = bool(nm) and attention.layout(nm) is not None and st in ATTENTION_KERNEL_STAGES
        key = (st, nm or "?", act, weight, dest, front)
        merged.setdefault(key, [0, 0])
        merged[key][0] += int(kernels_per[g])
        merged[key][1] += int(ops_per[g])
    return merged, qkv


def _distinct_pairs(inverse: np.ndarray, op_rows: np.ndarray) -> np.ndarray:
    """``np.unique`` of one int per (group, op row), sorted in place (no copy for the sort)."""
    pair = inverse.astype(np.int64) * (int(op_rows.max()) + 1)
    pair += op_rows
    pair.sort()
    return pair[np.concatenate(([True], pair[1:] != pair[:-1]))] if len(pair) > 1 else pair


def _stage_codes(column: Any) -> np.ndarray:
    """Each kernel's index into :data:`STAGES` (-1: another stage), from the column's dictionary:
    one lookup per distinct stage."""
    codes = dict_strings(column)
    index = {s: i for i, s in enumerate(STAGES)}
    table = np.array([index.get(s, -1) for s in codes.dictionary.to_pylist()] + [-1], np.int8)
    return table[codes.indices.fill_null(len(table) - 1).to_numpy(zero_copy_only=False)]


_NOT_DTYPES = ("", "Scalar", "ScalarList", "TensorList", "GenericList", "Device", "None")


def _type(types: list[str] | None, i: int) -> str | None:
    """Input ``i``'s recorded type when it is a tensor's dtype (a tensor list or scalar is none)."""
    if not types or i >= len(types) or types[i] in _NOT_DTYPES:
        return None
    return str(types[i])
