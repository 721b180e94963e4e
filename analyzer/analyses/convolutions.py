"""Convolution GEMMs (STR072): a GEMM-named kernel launched by a convolution op is the convolution's
own work (an implicit-GEMM convolution: cuDNN's cutlass kernels), not a linear projection.

Contract: a pure pass over one segment of kernels in launch order, before the layer walk and after
the token mixers' spans (STR052 places a mixer's depthwise convolution itself). A kernel whose stage
a name rule made a GEMM stage and whose launching op is a convolution op (``depthwise_conv_ops``,
whatever its filter's shape) becomes ``elementwise``: the walk then opens no layer and takes no
projection at it, and its region's default places it (inside an attention, the attention module's
own work). It changes stages only.

Short convolutions (STR073) run after the walk: a depthwise convolution the walk placed by position
only, right after a projection, with the kernels up to the next GEMM, norm or attention kernel, is a
short convolution on that projection's output (a token mixer's core inside an attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from analyzer.analyses.mixers import CONV_OPS, depthwise
from analyzer.analyses.walk.registry import ATTENTION, GEMM_STAGES, KNOWLEDGE
from analyzer.knowledge.taxonomy import ALL_GEMM_STAGES, MEMORY_STAGES

CONVOLUTION_GEMM = KNOWLEDGE.code_of("convolution-gemm")
SHORT_CONVOLUTION = KNOWLEDGE.code_of("short-convolution")
_GEMMS = frozenset(ALL_GEMM_STAGES)
_STOP = ATTENTION | {"norm", "embedding", "sampling"}  # the short convolution's end, besides a GEMM
_MEMORY = frozenset(MEMORY_STAGES)


def mark_convolution_gemms(
    seq: np.ndarray, stage: list[str], op_names: Sequence[str | None], why: Any
) -> int:
    """STR072 over kernel rows ``seq`` (the caller passes those a convolution op launched); returns
    the kernels relabelled."""
    done = 0
    for r in seq.tolist():
        if op_names[r] in CONV_OPS and stage[r] in GEMM_STAGES:
            stage[r] = "elementwise"
            why[r] = CONVOLUTION_GEMM
            done += 1
    return done


def mark_short_convolutions(
    seq: np.ndarray,
    stage: list[str],
    op_names: Sequence[str | None],
    op_dims: Any,
    why: Any,
    placed: frozenset[int],
    convs: np.ndarray | None = None,
) -> int:
    """STR073 (after the walk) over one segment; returns the kernels relabelled. A depthwise
    convolution the walk placed by position only (``placed``: the region rules' codes) right after
    a projection (only kernels placed by position, or by no rule, between them): the kernels from
    that projection to the next GEMM, norm or attention kernel are a short convolution on the
    projection's output (Inkling's on its keys and values), a token mixer's core:
    ``linear_attention``. ``convs`` (per kernel row, optional): the kernels a convolution op
    launched, the only ones tried."""
    rows = seq.tolist()
    n, done, end = len(rows), 0, -1
    between = placed | {0}  # placed by position, or by no rule at all
    tried = np.flatnonzero(convs[seq]).tolist() if convs is not None else range(n)
    for p in tried:
        r = rows[p]
        if (
            p <= end
            or op_names[r] not in CONV_OPS
            or int(why[r]) not in placed
            or not depthwise(op_dims.get(r))
        ):
            continue
        a = p - 1
        while a >= 0 and int(why[rows[a]]) in between and stage[rows[a]] not in _GEMMS:
            a -= 1
        if a < 0 or stage[rows[a]] not in GEMM_STAGES:
            continue  # no projection right before it
        b = p + 1
        while b < n and stage[rows[b]] not in _GEMMS and stage[rows[b]] not in _STOP:
            b += 1
        for q in range(a + 1, b):
            x = rows[q]
            if int(why[x]) in placed and stage[x] not in _MEMORY:
                stage[x] = "linear_attention"
                why[x] = SHORT_CONVOLUTION
                done += 1
        end = b - 1
    return done
