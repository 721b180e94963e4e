"""Rules that assume a mixture-of-experts block: top-k candidates, routers found by their top-k
(STR005), the expert block's dispatch, combine, shared-expert gate and GLU product.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.analyses.walk.positions import _is_add
from analyzer.analyses.walk.registry import (
    _ID,
    _V,
    GEMM_STAGES,
    GENERIC,
    KNOWLEDGE,
    MOE_BLOCK,
    MOE_ROUTER,
    SAMPLING_LIKE,
)
from analyzer.knowledge.taxonomy import MEMORY_STAGES
from analyzer.tables.dictionaries import dict_isin
from analyzer.tables.positions import row_array

MOE_SHARED_GATE = _ID("moe-shared-gate")


MOE_GLU_PRODUCT = _ID("moe-glu-product")


# what follows a router's top-k and still computes the routing weights (gather, renormalise, scale)
_ROUTING_TAIL_OPS = _V("routing_tail_ops")
_SCALE_OPS = _V("scale_ops")
_FLOOR_OPS, _DIVISION_OPS = _V("routing_floor_ops"), _V("division_ops")


def _in_routing_tail(op_names: Sequence[str | None], rows: Sequence[int], q: int, nxt: int) -> bool:
    """Whether position ``q`` continues a router's top-k tail: a tail op, or a clamp right before a
    division (the floor of the top-k weights' sum they are divided by)."""
    op = op_names[rows[q]]
    if op in _ROUTING_TAIL_OPS:
        return True
    return op in _FLOOR_OPS and q + 1 < nxt and op_names[rows[q + 1]] in _DIVISION_OPS


_CAST_OPS = _V("cast_ops")
_MOE_BLOCK_OPS = _V("region_ops_moe")  # an expert block's own ops (STR025's index writes among them)
_REDUCE_OPS = _V("reduce_ops")  # a composed norm's mean: the add right after it is its epsilon


_ROUTING_PARTS = _V("routing_parts")


_TOPK_OPS = _V("topk_ops")


_TOPK_WORDS = KNOWLEDGE.words("topk_words")


def topk_candidates(norm: Any, op_column: pa.Array) -> np.ndarray:
    """Per kernel row: launched by ``aten::topk``, or without a launching op (``op_column``: the
    launching op's name, null: none) and named like a top-k (tested once per distinct op and
    name); :func:`_mark_routers` looks at these only."""
    out = dict_isin(op_column, list(_TOPK_OPS))
    names = norm if isinstance(norm, list) else list(norm)
    none = np.flatnonzero(op_column.is_null().to_numpy(zero_copy_only=False))
    memo: dict[str, bool] = {}
    for r in none.tolist():
        nm = names[r]
        hit = memo.get(nm)
        if hit is None:
            hit = memo[nm] = any(w in nm.lower() for w in _TOPK_WORDS)
        out[r] = hit
    return out


def _is_topk(stage: str, name: str, op: str | None) -> bool:
    """A router's ``torch.topk`` (a sort or argsort is dispatch, or sampling)."""
    if op is not None:
        return op in _TOPK_OPS
    return stage in SAMPLING_LIKE and any(w in name.lower() for w in _TOPK_WORDS)


def _mark_routers(
    rows: list[int],
    st: list[str],
    stage: list[str],
    norm: list[str],
    op_names: Sequence[str | None],
    ops: tuple[np.ndarray, np.ndarray],
    hard: np.ndarray,
    experts: np.ndarray,
    topk_rows: np.ndarray,
    why: Any,
) -> bool:
    """MoE routers: a GEMM whose output goes to a top-k that more GEMMs follow within the block.

    A router GEMM is followed, before any other GEMM, norm, attention or embedding kernel, by a
    top-k (``aten::topk`` / a top-k or sort kernel); after the top-k another GEMM (the experts) comes
    before any norm, attention or embedding kernel. The LM head's top-k sampling fails the second
    test: the next forward's embedding or input norm comes first. The router GEMM becomes
    ``moe_gate_gemm``; its softmax / sigmoid, top-k and the routing-weight arithmetic right after
    the last top-k become ``moe_topk``. Returns whether any router was found.
    """
    n = len(rows)
    topk = [q for q in np.flatnonzero(topk_rows[row_array(rows)]).tolist() if st[q] in _ROUTING_PARTS]
    topk = [q for q in topk if _is_topk(st[q], norm[rows[q]], op_names[rows[q]])]
    op_first, op_last = ops
    if not topk or not len(op_first):
        return False
    expert_at = np.flatnonzero(experts)  # expert GEMMs a rule named (fused MoE kernels)
    blocks = np.flatnonzero(hard)
    tk = np.asarray(topk, np.int64)
    # per candidate, at once: the last GEMM op before it, the next GEMM (dense or a named expert
    # GEMM) after it, and whether a norm / attention / embedding lies between that op and the next
    k = np.searchsorted(op_first, tk) - 1
    ok = k >= 0
    kk = np.maximum(k, 0)
    a_all, b_all = op_first[kk], op_last[kk]
    ok &= b_all < tk  # not inside a GEMM op
    nxt_dense = np.where(kk + 1 < len(op_first), op_first[np.minimum(kk + 1, len(op_first) - 1)], n)
    e = np.searchsorted(expert_at, tk)
    nxt_expert = expert_at[np.minimum(e, len(expert_at) - 1)] if len(expert_at) else np.full(len(tk), n)
    nxt_all = np.minimum(nxt_dense, np.where(e < len(expert_at), nxt_expert, n))
    ok &= nxt_all < n
    j = np.searchsorted(blocks, b_all + 1)
    blocked = (
        (j < len(blocks)) & (blocks[np.minimum(j, len(blocks) - 1)] < nxt_all)
        if len(blocks)
        else np.zeros(len(tk), bool)
    )
    ok &= ~blocked
    found = False
    done = -1
    for i in np.flatnonzero(ok).tolist():
        t = topk[i]
        if t <= done:
            continue
        a, b, nxt = int(a_all[i]), int(b_all[i]), int(nxt_all[i])
        if any(st[q] not in _ROUTING_PARTS and st[q] not in ("memcpy", "memset") for q in range(b + 1, t)):
            continue
        for q in range(a, b + 1):
            if st[q] in GEMM_STAGES:
                stage[rows[q]] = "moe_gate_gemm"
                why[rows[q]] = MOE_ROUTER
        last = topk[bisect.bisect_left(topk, nxt) - 1]  # the last top-k before the experts
        end = last + 1
        while end < nxt and st[end] in _ROUTING_PARTS and _in_routing_tail(op_names, rows, end, nxt):
            end += 1
        for q in range(b + 1, end):
            if st[q] in _ROUTING_PARTS:
                stage[rows[q]] = "moe_topk"
                why[rows[q]] = MOE_ROUTER
        done = nxt
        found = True
    return found


def _label_moe_block(
    rows: list[int],
    run: list[int],
    lo: int,
    hi: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
) -> None:
    """Expert block: dispatch before the last expert GEMM, combine after it, then residual + norm (a
    post-norm block: norm, then the residual add). A sort or scan the names call sampling before the
    last expert GEMM sorts the tokens by expert (AFMoE's argsort, a histogram's cumulative sum):
    dispatch too. Multiplies by a scalar right before the residual add (``inputs``: recorded
    shapes) scale the residual or the block's output (MiniMax's alpha and beta): generic."""
    gemms = [i for i in range(lo, hi) if stage[rows[i]] == "moe_expert_gemm"]
    last = gemms[-1] if gemms else lo - 1
    for i in range(lo, last):
        if stage[rows[i]] == "sampling":
            stage[rows[i]] = "moe_sort"
            why[rows[i]] = MOE_BLOCK
    # the residual add is the last add before the next norm (an earlier one combines the routed
    # and shared experts' outputs); an activation after the last expert GEMM (Qwen2-MoE's sigmoid of
    # the shared-expert gate) weighs the combination
    first_norm = next((i for i in range(last + 1, hi) if stage[rows[i]] == "norm"), None)
    adds = [
        i
        for i in run
        if last < i < (first_norm if first_norm is not None else -1) and _is_add(rows[i], op_names)
    ]
    add = adds[-1] if adds else None
    # a parallel block (the router right after the O projection: attention and experts read one
    # normed input) adds both branches to the residual: its last two adds are residual adds
    residual = set(adds[-2:]) if len(adds) > 1 and _parallel_block(rows, lo, stage, op_names) else {add}
    # post-norm (OLMo's, FlexOlmo's): no add before the norm; the norm of the experts' output (from
    # its leading cast) comes first, then the residual add: the first add after it but the norm's
    # own epsilon add (right after its mean)
    post_norm = post_add = None
    if add is None and first_norm is not None:
        after = (i for i in run if i > first_norm and _is_add(rows[i], op_names))
        post_add = next((i for i in after if op_names[rows[i - 1]] not in _REDUCE_OPS), None)
        if post_add is not None:
            post_norm = first_norm
            if first_norm - 1 > last and op_names[rows[first_norm - 1]] in _CAST_OPS:
                post_norm -= 1
    scaled = _residual_scaling(rows, add, last, op_names, inputs) if add is not None else set()
    gate = False
    for i in range(last + 1, first_norm if first_norm is not None else hi):
        if stage[rows[i]] == "activation":
            stage[rows[i]] = "moe_accumulate"
            why[rows[i]] = MOE_SHARED_GATE
            gate = True
    if gate:  # the GEMM before that activation is the gate's (hidden -> 1), not an expert's
        g = last
        while g >= lo and stage[rows[g]] == "moe_expert_gemm":
            stage[rows[g]] = "moe_gate_gemm"
            why[rows[g]] = MOE_SHARED_GATE
            g -= 1
    for i in run:
        if i < last and _glu_product(rows, i, lo, stage):
            stage[rows[i]] = "activation"  # act(gate) * up between an expert's two GEMMs
            why[rows[i]] = MOE_GLU_PRODUCT
            continue
        if i < last:
            stage[rows[i]] = "moe_sort"
        elif post_norm is not None and post_add is not None and i >= post_norm:
            stage[rows[i]] = "residual_add" if i == post_add else "norm"
        elif i in scaled:
            stage[rows[i]] = "elementwise"
        elif i in residual:
            stage[rows[i]] = "residual_add"
        elif add is None or i < add:
            stage[rows[i]] = "moe_accumulate"
        else:
            stage[rows[i]] = "norm"
        why[rows[i]] = MOE_BLOCK


def _parallel_block(rows: list[int], lo: int, stage: list[str], op_names: Sequence[str | None]) -> bool:
    """The expert block whose first expert GEMM is at ``lo`` follows its layer's O projection with
    only its router's and dispatch's kernels (and copies) between: no norm and no add, so no
    residual add before it (Cohere's parallel attention and MoE)."""
    k = lo - 1
    while k >= 0 and (
        stage[rows[k]].startswith("moe_")
        or stage[rows[k]] in MEMORY_STAGES
        or (stage[rows[k]] in GENERIC and not _is_add(rows[k], op_names))
    ):
        k -= 1
    return k >= 0 and stage[rows[k]] == "o_gemm"


def _residual_scaling(
    rows: list[int],
    add: int,
    last: int,
    op_names: Sequence[str | None],
    inputs: Callable[[int], list[list[int]] | None] | None,
) -> set[int]:
    """The positions right before the residual add at ``add`` (after the last expert GEMM at
    ``last``) of multiplies by a scalar (a zero-dimensional second operand)."""
    found: set[int] = set()
    i = add - 1
    while i > last and inputs is not None and op_names[rows[i]] in _SCALE_OPS:
        got = inputs(rows[i])
        if not got or len(got) < 2 or got[1] != []:
            break
        found.add(i)
        i -= 1
    return found


def _glu_product(rows: list[int], i: int, lo: int, stage: list[str]) -> bool:
    """Position i is a gated MLP's product ``act(gate) * up``, right before the down projection's
    GEMM: the two kernels before it are the activation and a GEMM (gate, act, up or gate, up, act)."""
    if i - 2 < lo or i + 1 >= len(rows) or stage[rows[i + 1]] not in _EXPERT_OR_DENSE_GEMM:
        return False
    a, b = stage[rows[i - 1]], stage[rows[i - 2]]
    return (a == "activation" and b in _EXPERT_OR_DENSE_GEMM) or (
        b == "activation" and a in _EXPERT_OR_DENSE_GEMM
    )


_EXPERT_OR_DENSE_GEMM = GEMM_STAGES | {"moe_expert_gemm"}


def expert_block_writes(ks: Any, region_of: list[str]) -> list[int]:
    """STR025: the positions of index writes the op hints called a KV-cache store inside an expert
    block (``index_copy_`` putting the experts' outputs back in token order): no attention reads a
    cache there, so they are generic again and the block labels them (its combine)."""
    at = [
        q
        for q in np.flatnonzero(ks.stages(("kv_cache_store",))).tolist()
        if region_of[q] == "moe_experts" and ks.op_names[ks.rows[q]] in _MOE_BLOCK_OPS
    ]
    if at:
        d = ks.decide()
        for q in at:
            d.stage[ks.rows[q]] = "elementwise"
        ks.apply(d)
    return at
