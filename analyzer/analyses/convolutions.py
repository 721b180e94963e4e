"""Convolution GEMMs (STR072): a GEMM-named kernel launched by a convolution op is the convolution's
own work (an implicit-GEMM convolution: cuDNN's cutlass kernels), not a linear projection.

Contract: a pure pass over one segment of kernels in launch order, before the layer walk and after
the token mixers' spans (STR052 places a mixer's depthwise convolution itself). A kernel whose stage
a name rule made a GEMM stage and whose launching op is a convolution op (``depthwise_conv_ops``,
whatever its filter's shape) becomes ``elementwise``: the walk then opens no layer and takes no
projection at it, and its region's default places it (inside an attention, the attention module's
own work). It changes stages only.
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
