"""Expert-weight gathers (STR050): an indexing of an experts module's stacked weights, not routing.

Contract: a pure pass over one segment of kernels in launch order (one thread of one device), run
before the layer walk. A generic kernel launched by a gather op (``weight_gather_ops``) whose source
tensor is stacked matrices (rank >= 3: ``[experts, out, in]``) and whose gathered matrices are an
operand of the next batched GEMM op (``batched_gemm_ops``: same trailing two sizes, either order,
within ``weight_gather_window`` kernels), after a router's top-k (at most ``expert_gather_reach``
kernels back), moved the experts' weights for that GEMM: stage ``moe_expert_gemm`` (the expert
work it feeds; ``rules/taxonomy.toml`` notes why), never ``moe_sort``. Token gathers (a ``[tokens,
hidden]`` source) and gathers no batched GEMM reads keep their stage. Needs recorded shapes; without
them nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.registry import GENERIC, KNOWLEDGE

WEIGHT_GATHER_OPS = frozenset(KNOWLEDGE.set_of("weight_gather_ops"))
BATCHED_GEMM_OPS = frozenset(KNOWLEDGE.set_of("batched_gemm_ops"))
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
    for p, r in enumerate(rows):
        if topk[r]:
            last_topk = p
            continue
        if op_names[r] not in WEIGHT_GATHER_OPS or stage[r] not in _MAY_BE or p - last_topk > reach:
            continue
        mat = _matrices(op_dims.get(r))
        if mat is None:
            continue
        for q in rows[p + 1 : p + 1 + window]:
            if op_names[q] in BATCHED_GEMM_OPS:
                if _reads(op_dims.get(q), mat):
                    stage[r] = "moe_expert_gemm"
                    why[r] = EXPERT_WEIGHT_GATHER
                    done += 1
                break
    return done
