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

from analyzer.analyses.walk.registry import GEMM_STAGES, KNOWLEDGE

CONVOLUTION_GEMM = KNOWLEDGE.code_of("convolution-gemm")
CONV_OPS = frozenset(KNOWLEDGE.set_of("depthwise_conv_ops"))


def mark_convolution_gemms(
    seq: np.ndarray, stage: list[str], op_names: Sequence[str | None], why: Any
) -> int:
    """STR072 over one segment (kernel rows); returns the kernels relabelled."""
    done = 0
    for r in seq.tolist():
        if op_names[r] in CONV_OPS and stage[r] in GEMM_STAGES:
            stage[r] = "elementwise"
            why[r] = CONVOLUTION_GEMM
            done += 1
    return done


SHORT_CONVOLUTION = KNOWLEDGE.code_of("short-convolution")
_GEMMS = GEMM_STAGES | {"moe_expert_gemm", "moe_gate_gemm", "lm_head_gemm"}
_STOP = frozenset({"norm", "flash_attention", "paged_attention", "linear_attention", "embedding", "sampling"})


def _depthwise(dims: Any) -> bool:
    """A convolution's weight ``[channels, 1, ...]`` (input 1): one filter per channel."""
    w = dims[1] if dims and len(dims) > 1 else None
    return isinstance(w, list) and len(w) >= 3 and w[1] == 1


def mark_short_convolutions(
    seq: np.ndarray,
    stage: list[str],
    op_names: Sequence[str | None],
    op_dims: Any,
    why: Any,
    placed: frozenset[int],
) -> int:
    """STR073 (after the walk) over one segment; returns the kernels relabelled. A depthwise
    convolution the walk placed by position only (``placed``: the region rules' codes) right after
    a projection: the kernels from that projection to the next GEMM, norm or attention kernel are a
    short convolution on the projection's output (Inkling's on its keys and values), a token
    mixer's core: ``linear_attention``."""
    rows = seq.tolist()
    n, done, end = len(rows), 0, -1
    for p, r in enumerate(rows):
        if (
            p <= end
            or op_names[r] not in CONV_OPS
            or int(why[r]) not in placed
            or not _depthwise(op_dims.get(r))
        ):
            continue
        a = p - 1
        while a >= 0 and int(why[rows[a]]) in placed | {0} and stage[rows[a]] not in _GEMMS:
            a -= 1
        if a < 0 or stage[rows[a]] not in GEMM_STAGES:
            continue  # no projection right before it
        b = p + 1
        while b < n and stage[rows[b]] not in _GEMMS and stage[rows[b]] not in _STOP:
            b += 1
        for q in range(a + 1, b):
            x = rows[q]
            if int(why[x]) in placed and stage[x] not in ("memcpy", "memset"):
                stage[x] = "linear_attention"
                why[x] = SHORT_CONVOLUTION
                done += 1
        end = b - 1
    return done
