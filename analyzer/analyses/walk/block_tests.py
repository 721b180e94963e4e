"""Tests the layer walk asks about the kernels around one GEMM op: what comes after it (a block, the
forward's end), whether an expert block's combine came before it, whether it opens a norm's gate;
and whether a kernel before a QKV GEMM is no norm's tail.

Contract: pure functions of the walk's kernel sequence and look-ahead; they decide nothing and
change nothing (the grammar applies their answers as its named rules).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.analyses.walk.positions import widens_activation
from analyzer.analyses.walk.registry import _V, ATTENTION, GENERIC
from analyzer.analyses.walk.roles import _FORWARD_END
from analyzer.analyses.walk.sequence import KernelSequence

_COMBINE_OPS = _V("expert_combine_ops")
_TOKEN_GATHER_OPS = _V("token_gather_ops")
_GATE_OPS = _V("gate_activation_ops")
_SCALE_OPS = _V("scale_ops")
_CAST_OPS = _V("cast_ops")
_GATE_TAIL = frozenset((*GENERIC, "activation"))


def after_combine(ks: KernelSequence, lo: int, p: int) -> bool:
    """Between positions ``lo`` and ``p`` (a GEMM op's first kernel) an experts' combine put their
    outputs back in token order (``expert_combine_ops``) and no tokens were gathered after it."""
    ops = ks.op_names
    last = next((i for i in range(p - 1, lo - 1, -1) if ops[ks.rows[i]] in _COMBINE_OPS), None)
    return last is not None and not any(ops[ks.rows[i]] in _TOKEN_GATHER_OPS for i in range(last + 1, p))


def block_follows(ahead: Any, k: int) -> bool:
    """After GEMM op ``k`` comes an attention or token mixer, or the forward's end (the last layer's
    block output, then the final norm: RWKV's receptance)."""
    follow = ahead.follow[k]
    return follow in ATTENTION or (follow in _FORWARD_END and bool(ahead.norm_ahead[k]))


def before_norm_tail(ks: KernelSequence, q: int, span: np.ndarray) -> bool:
    """Position ``q`` (right before a QKV GEMM, or before another such kernel) is no norm's tail: a
    mixer span's own generic work or a copy into a wider float."""
    return bool(span[q] and ks.stage[ks.rows[q]] == "linear_attention") or widens_activation(
        ks.copies.widen, ks.inputs, ks.rows[q]
    )


def norm_gate(ks: KernelSequence, ahead: Any, k: int, gemm_kn: Any = None) -> range | None:
    """Where GEMM op ``k`` (right after a norm) opens a norm's gate, the positions of the gate's
    tail (up to its multiply and the cast back after it); else None. A gate: only activations
    between GEMM op ``k`` and the next one, then before the GEMM op after that a gate activation
    (``gate_activation_ops``) and a multiply after it, no norm, only generic kernels and
    activations; with recorded shapes ``k`` narrows the hidden size and the next one widens it back
    (a low-rank bottleneck: AXK2's gated RMSNorm)."""
    first, last = ahead.op_first, ahead.op_last
    if k + 1 >= len(first):
        return None
    between = range(int(last[k]) + 1, int(first[k + 1]))
    st, rows = ks.stage, ks.rows
    if not between or any(st[rows[i]] != "activation" for i in between):
        return None
    tail = range(int(last[k + 1]) + 1, int(first[k + 2]) if k + 2 < len(first) else ks.n)
    ops = [ks.op_names[rows[i]] for i in tail]
    act = next((j for j, o in enumerate(ops) if o in _GATE_OPS), None)
    if act is None:
        return None
    mul = next((j for j in range(act + 1, len(ops)) if ops[j] in _SCALE_OPS), None)
    if mul is None:
        return None
    if any(ks.normish[i] or st[rows[i]] not in _GATE_TAIL for i in tail):
        return None
    if gemm_kn is not None:
        a, b = gemm_kn(rows[int(first[k])]), gemm_kn(rows[int(first[k + 1])])
        if a and b and not (a[1] < a[0] and tuple(b) == (a[1], a[0])):
            return None
    # the tail ends at the gate's multiply and the cast back right after it (what follows is the
    # next block's: a router's input casts)
    at = tail.start + mul
    end = at + 2 if at + 1 < tail.stop and ks.op_names[rows[at + 1]] in _CAST_OPS else at + 1
    return range(tail.start, end)


def side_block(ks: KernelSequence, ahead: Any, k: int) -> bool:
    """Whether GEMM op ``k`` opens a side block: attention (or the forward's end) follows, but first an
    activation, the next GEMM op (before any norm) and a norm after that one, before any other GEMM."""
    follow = ahead.follow[k]
    if not (
        (follow in ATTENTION or follow in _FORWARD_END)
        and ahead.gemm_ahead[k]
        and k + 1 < len(ahead.op_first)
    ):
        return False
    nxt = int(ahead.op_first[k + 1])
    return (
        ahead.norm_ahead[k + 1]
        and not ahead.gemm_ahead[k + 1]
        and any(ks.st[q] == "activation" for q in range(int(ahead.op_last[k]) + 1, nxt))
    )


def narrowing(gemm_kn: Any, r: int, th: Any) -> bool:
    """Whether the GEMM op at kernel row ``r`` has a recorded N at most ``narrow_head_ratio`` of its
    K: far narrower than any vocabulary, a tensor-parallel rank's vocabulary shard included."""
    kn = gemm_kn(r) if gemm_kn is not None else None
    return kn is not None and kn[1] <= th.narrow_head_ratio * kn[0]
