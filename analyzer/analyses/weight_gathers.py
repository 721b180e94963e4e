"""Expert-weight gathers (STR050): an indexing of an experts module's stacked weights, not routing.

Contract: a pure pass over one segment of kernels in launch order (one thread of one device), run
before the layer walk. A generic kernel launched by a gather op (``weight_gather_ops``) whose source
tensor is stacked matrices (rank >= 3: ``[experts, out, in]``) and whose gathered matrices are an
operand of the next batched GEMM op (``batched_gemm_ops``: same trailing two sizes, either order,
within ``weight_gather_window`` kernels), after a router's top-k (at most ``expert_gather_reach``
kernels back), moved the experts' weights for that GEMM: stage ``moe_expert_gemm`` (the expert
work it feeds; ``rules/taxonomy.toml`` notes why), never ``moe_sort``. Token gathers (a ``[tokens,
hidden]`` source) and gathers no batched GEMM reads keep their stage. So does a gather of stacked
bias vectors (a rank-2 ``[experts, N]`` source: GPT-OSS's ``gate_up_proj_bias[expert_ids]``) before
a grouped GEMM op over ``[experts, K, N]`` matrices, or right after a gather of ``[experts, K, N]``
weights (the per-token path gathers both with one index): the bias it adds to that GEMM's output is
the experts' too. Needs recorded shapes; without them nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.registry import GENERIC, KNOWLEDGE

WEIGHT_GATHER_OPS = frozenset(KNOWLEDGE.set_of("weight_gather_ops"))
BATCHED_GEMM_OPS = frozenset(KNOWLEDGE.set_of("batched_gemm_ops"))
# a grouped GEMM reads the stacked weights themselves ([experts, K, N]); a bmm may read a per-token
# gather of them, whose first size is the routed rows'
_GROUPED_OPS = frozenset(op for op in BATCHED_GEMM_OPS if "grouped" in op)
EXPERT_WEIGHT_GATHER = KNOWLEDGE.code_of("expert-weight-gather")
# what a gather kernel may carry by name before this pass (a gather is generic work, or a routing
# stage where a rule guessed so by its name)
_MAY_BE = GENERIC | frozenset(KNOWLEDGE.set_of("routing_parts"))


def _matrices(dims: Any) -> tuple[int, int] | None:
    """The trailing two sizes of the gather's source when it is stacked matrices (rank >= 3)."""
    if not dims or not isinstance(dims[0], list) or len(dims[0]) < 3:
        return None
    a, b = dims[0][-2], dims[0][-1]
    return (a, b) if isinstance(a, int) and isinstance(b, int) else None


def _reads(dims: Any, mat: tuple[int, int]) -> bool:
    """Whether a batched GEMM op's inputs hold a rank >= 3 operand of those matrices."""
    want = {mat, mat[::-1]}
    return any(isinstance(t, list) and len(t) >= 3 and tuple(t[-2:]) in want for t in dims or ())


def _biases(dims: Any) -> tuple[int, int] | None:
    """(experts, N) of the gather's source when it is stacked bias vectors (rank 2)."""
    if not dims or not isinstance(dims[0], list) or len(dims[0]) != 2:
        return None
    e, n = dims[0]
    return (e, n) if isinstance(e, int) and isinstance(n, int) else None


def _adds_to(dims: Any, bias: tuple[int, int] | None) -> bool:
    """Whether a batched GEMM op's inputs hold stacked matrices ``[experts, K, N]`` whose experts
    and outputs are the stacked biases' (the bias is added to that GEMM's output)."""
    if bias is None:
        return False
    return any(
        isinstance(t, list) and len(t) >= 3 and t[0] == bias[0] and t[-1] == bias[1] for t in dims or ()
    )


def has_stacked_gathers(op_names: Sequence[str | None], op_dims: Mapping[int, Any]) -> bool:
    """Whether a gather op read stacked matrices (a rank >= 3 source, recorded shapes)."""
    return any(op_names[r] in WEIGHT_GATHER_OPS and _matrices(d) is not None for r, d in op_dims.items())


def mark_expert_weight_gathers(
    seq: np.ndarray,
    stage: list[str],
    op_names: Sequence[str | None],
    op_dims: Mapping[int, Any],
    topk: np.ndarray,
    why: Any,
    th: Any,
) -> int:
    """STR050 over one segment (kernel rows in launch order); returns the kernels relabelled."""
    rows = seq.tolist()
    window, reach = int(th.weight_gather_window), int(th.expert_gather_reach)
    last_topk = -(10**9)
    done = 0
    last: tuple[int, tuple[int, int] | None] = (
        -(10**9),
        None,
    )  # the last weight gather found: its position and (experts, N)
    for p, r in enumerate(rows):
        if topk[r]:
            last_topk = p
            continue
        if op_names[r] not in WEIGHT_GATHER_OPS or stage[r] not in _MAY_BE or p - last_topk > reach:
            continue
        dims = op_dims.get(r)
        mat, bias = _matrices(dims), _biases(dims)
        if mat is None and bias is None:
            continue
        if bias is not None and p - last[0] <= window and last[1] == bias:
            hit = True  # the bias of the experts whose weights were just gathered (same index)
        else:
            gemm = next((q for q in rows[p + 1 : p + 1 + window] if op_names[q] in BATCHED_GEMM_OPS), None)
            hit = gemm is not None and (
                _reads(op_dims.get(gemm), mat)
                if mat is not None
                else op_names[gemm] in _GROUPED_OPS and _adds_to(op_dims.get(gemm), bias)
            )
        if hit:
            stage[r] = "moe_expert_gemm"
            why[r] = EXPERT_WEIGHT_GATHER
            done += 1
            if mat is not None:
                last = (p, (dims[0][0], dims[0][-1]))
    return done
