"""The rotary embedding's table (STR061): the small GEMM whose result feeds the cos / sin kernels.

Contract: a pass before the layer walk over one device's kernels in launch order; it labels kernels
``rope`` and changes nothing else. HF's ``*RotaryEmbedding.forward`` multiplies ``inv_freq`` by the
positions with a float32 matmul, concatenates the halves and takes cos and sin. Where the model runs
its rotary module inside the layers (ModernBERT's global and local tables, Moshi's), that GEMM sits
where the walk looks for the layer's projections and would be read as one. A batched GEMM op's
kernel (``batched_gemm_ops``: the matmul of the expanded frequencies by the positions; a layer's
projection is a linear) whose reduction is one long where its shape was recorded (an outer
product), followed across at most ``rotary_table_reach`` generic kernels (the cat) by a cos or sin
kernel (``rotary_trig_ops``), is RoPE's, with up to ``rope_module_lead`` copies before it (the frequencies' and positions' float casts),
and LongRoPE's max of the positions with the + 1 right after it (``rope_longest_position_ops``)
before those; memory transfers between them keep their stage and the generic kernels between it and the cos / sin; the
region defaults and STR024 take the rest of the module. (A projection right before a model's own
cos / sin code is a linear, not an outer product: it stays a projection.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.registry import _V, GEMM_STAGES, GENERIC, KNOWLEDGE

ROTARY_TABLE = KNOWLEDGE.code_of("rotary-table")
_GEMM_OPS = _V("linear_gemm_ops") | _V("batched_gemm_ops")
_TABLE_OPS = _V("batched_gemm_ops")
_COPY_OPS = _V("copy_ops")
_LONGEST = KNOWLEDGE.words("rope_longest_position_ops")  # (the max, the add), in their order
_MEMORY = frozenset(("memcpy", "memset"))


def mark_rotary_tables(
    seg: np.ndarray,
    stage: Any,
    op_names: Sequence[str | None],
    trig: np.ndarray,
    why: Any,
    th: Any,
    gemm_kn: Callable[[int], tuple[int, int] | None] | None = None,
) -> int:
    """Label each rotary table's GEMM, its lead copies and the kernels up to its cos / sin ``rope``
    (``trig``: per kernel row, launched by a cos / sin op; ``gemm_kn``: a GEMM kernel row's (K, N)
    where its op's shapes were recorded); returns how many kernels it labelled."""
    at = np.flatnonzero(trig[seg])
    if not len(at):
        return 0

    def row(i: int) -> int:  # a few positions per table: no list of the whole segment
        return int(seg[i])

    reach, lead = int(th.rotary_table_reach), int(th.rope_module_lead)
    marked, done = 0, -1
    for p in at.tolist():
        if p <= done:
            continue  # the table's second trig kernel (sin after cos)
        g = p - 1
        while g >= 0 and p - g <= reach and stage[row(g)] in GENERIC and op_names[row(g)] not in _GEMM_OPS:
            g -= 1
        if (
            g < 0
            or p - g > reach + 1
            or op_names[row(g)] not in _TABLE_OPS
            or stage[row(g)] not in GEMM_STAGES
        ):
            continue
        kn = gemm_kn(row(g)) if gemm_kn is not None else None
        if kn is not None and kn[0] != 1:
            continue  # a product over a hidden dimension: no outer product of frequencies and positions
        a, taken, i = g, 0, g - 1
        while i >= 0 and taken < lead:  # the module's own work before it; transfers keep their stage
            if stage[row(i)] in _MEMORY:
                i -= 1
                continue
            op = op_names[row(i)]
            if stage[row(i)] not in GENERIC or not (op in _COPY_OPS or op == _LONGEST[1]):
                break
            if op == _LONGEST[1]:  # LongRoPE's max + 1 of the positions: the add right after the max
                if i == 0 or op_names[row(i - 1)] != _LONGEST[0] or stage[row(i - 1)] not in GENERIC:
                    break
                a, i = i - 1, i - 2  # (besides the copies the lead counts)
                continue
            a, taken, i = i, taken + 1, i - 1
        for i in range(a, p):
            r = row(i)
            if i == g or stage[r] in GENERIC:
                stage[r] = "rope"
                why[r] = ROTARY_TABLE
                marked += 1
        done = p
    return marked
