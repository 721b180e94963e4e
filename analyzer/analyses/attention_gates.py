"""Attention gates computed from a projection: an output gate (STR054), a sigmoid of a gate
projection multiplied into the attention's output before the O projection (Qwen3-Next's and
Qwen3.5's gated attention, OLMo hybrids), and an input gate (STR065), an activation chain on a
projection inside the attention's input (Doge's dynamic mask); neither is an MLP activation nor the
attention kernel's own work.

Contract: pure passes over one segment of kernels in launch order, after the layer walk; they change
stages only. Output gate: between a softmax attention kernel and the O GEMM that follows it (no
other GEMM op between), a kernel launched by a gate activation op (``gate_activation_ops``) and the
first multiply (``scale_ops``) after it. Input gate: where a composed attention (STR002) begins
right after a GEMM op, its kernels up to the last one launched by an input gate op
(``attention_input_gate_ops``) before its first GEMM. Both take ``elementwise``, the stage the
attention module's own arithmetic has. Without host ops nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.registry import ATTENTION, GEMM_STAGES, KNOWLEDGE, REGION_RULE_CODES

OUTPUT_GATE = KNOWLEDGE.code_of("attention-output-gate")
INPUT_GATE = KNOWLEDGE.code_of("attention-input-gate")
COMPOSED = KNOWLEDGE.code_of("composed-attention")
INPUT_GATE_OPS = frozenset(KNOWLEDGE.set_of("attention_input_gate_ops"))
GEMM_OPS = frozenset(KNOWLEDGE.set_of("linear_gemm_ops")) | frozenset(KNOWLEDGE.set_of("batched_gemm_ops"))
GATE_OPS = frozenset(KNOWLEDGE.set_of("gate_activation_ops"))
SCALE_OPS = frozenset(KNOWLEDGE.set_of("scale_ops"))
_SOFTMAX = ATTENTION - {"linear_attention"}


def mark_output_gates(
    seq: np.ndarray, stage: list[str], op_names: Sequence[str | None], why: Any, copies: Any = None
) -> int:
    """STR054 over one segment (kernel rows in launch order); returns the kernels relabelled.
    ``copies`` (optional, :class:`~analyzer.analyses.walk.sequence.CopyFacts`): a copy into a wider
    float right before the gate activation is the gate's input cast to fp32, and then a copy back
    into a 16-bit float right after its multiply casts the gated output back: both the gate's."""
    rows = seq.tolist()
    done = 0
    attn = -1  # the position of the last softmax attention kernel with no GEMM op after it
    for p, r in enumerate(rows):
        s = stage[r]
        if s in _SOFTMAX and int(why[r]) not in REGION_RULE_CODES:  # by evidence, not a region's default
            attn = p
        elif s in GEMM_STAGES:
            if s == "o_gemm" and attn >= 0:
                done += _label(rows, attn, p, stage, op_names, why, copies)
            attn = -1
    return done


def _label(
    rows: list[int],
    attn: int,
    o_gemm: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    copies: Any = None,
) -> int:
    done = 0
    p = attn + 1
    while p < o_gemm:
        if op_names[rows[p]] in GATE_OPS:
            mul = next((q for q in range(p + 1, o_gemm) if op_names[rows[q]] in SCALE_OPS), None)
            gate = [p, mul]
            widen = copies.widen if copies is not None else None
            if widen is not None and mul is not None and p - 1 > attn and widen[rows[p - 1]]:
                # the gate computed in fp32 (AXK2: sigmoid(gate.float()), cast back after the multiply)
                gate.append(p - 1)
                narrow = copies.narrow
                if mul + 1 < o_gemm and narrow is not None and narrow[rows[mul + 1]]:
                    gate.append(mul + 1)
            for q in gate:
                # (a gate the region's default already made elementwise is still the gate's)
                if q is not None and (
                    stage[rows[q]] != "elementwise" or int(why[rows[q]]) in REGION_RULE_CODES
                ):
                    stage[rows[q]] = "elementwise"
                    why[rows[q]] = OUTPUT_GATE
                    done += 1
            p = o_gemm if mul is None else mul
        p += 1
    return done


def mark_input_gates(
    seq: np.ndarray, stage: list[str], op_names: Sequence[str | None], why: Any, codes: np.ndarray
) -> int:
    """STR065 over one segment (kernel rows in launch order); ``codes``: the rule code of each of its
    kernels (by position) before this pass (the composed attentions are found from them at once).
    Returns the kernels relabelled."""
    comp = codes == COMPOSED
    firsts = np.flatnonzero(comp[1:] & ~comp[:-1]) + 1  # a composed attention's first kernel
    rows = seq.tolist() if len(firsts) else []
    done = 0
    for p in firsts.tolist():
        if stage[rows[p - 1]] not in GEMM_STAGES:
            continue  # not right after a GEMM op (its front reached the KV-cache write)
        last = -1
        q = p
        # up to the attention's first GEMM op (its QK^T matmul, staged attention by STR002)
        while q < len(rows) and comp[q] and op_names[rows[q]] not in GEMM_OPS:
            if op_names[rows[q]] in INPUT_GATE_OPS:
                last = q
            q += 1
        for k in range(p, last + 1):
            stage[rows[k]] = "elementwise"
            why[rows[k]] = INPUT_GATE
            done += 1
    return done
