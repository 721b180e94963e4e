"""Rules that assume eager framework ops (ATen kernels launched one op at a time): attention composed
of matmul / softmax / matmul (STR002-STR003), an FP8 / int8 activation quantization (STR049), a lone
``pow`` (not a norm), reductions, output-row gathers, and composed norms: their learned shape, the
q / k norms inside the attention input, fused norms around a sandwich's residual add.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.analyses.walk.positions import (
    _cluster_bounds,
    _fused_norm,
    _is_add,
    _is_cast,
    _is_reduce,
    _norm_like,
    _norm_windows,
)
from analyzer.analyses.walk.registry import (
    _ADD_OPS,
    _ID,
    _V,
    COMPOSED_ATTENTION,
    DEFAULT_THRESHOLDS,
    GEMM_STAGES,
    GENERIC,
    KNOWLEDGE,
    LONE_POW,
    OUTPUT_ROWS,
)
from analyzer.knowledge.structure_rules import Thresholds
from analyzer.tables.dictionaries import dict_isin, dict_where

_SOFTMAX_OPS = _V("softmax_ops")


# ops that end the stretch of work before a composed attention: the KV-cache write (and a paged
# cache's gathers of it), RoPE's final add
_BEFORE_ATTENTION_STOP = _V("attention_front_stop_ops")
_LINEAR_OPS = _V("linear_gemm_ops")  # a linear layer's GEMM: never one of attention's two products


_KV_WRITE_WORDS = KNOWLEDGE.words("kv_write_words")


_SOFTMAX_WORDS = KNOWLEDGE.words("softmax_words")


# generic work inside a composed attention; activation: the tanh of Gemma-2's logit softcapping
_COMPOSED_PARTS = _V("composed_attention_parts")


COMPOSED = _ID("composed-attention")


INNER_NORMS = _ID("inner-norms")


QK_NORM_INPUT = _ID("qk-norm-input-copy")


ACTIVATION_QUANTIZE = _ID("activation-quantize")


_QUANT_GEMM_OPS = frozenset(_V("quantized_gemm_ops"))


_QUANT_START_OPS = frozenset(_V("quantize_start_ops"))


_QUANT_CHAIN_OPS = frozenset(_V("quantize_chain_ops"))


_QUANT_PARTS = frozenset(_V("quantize_parts"))


_SOFTMAX_STAGES = ("sampling", "elementwise")  # a softmax the names left generic or gave the sampler


def _softmax_name(name: str) -> bool:
    """A softmax kernel's name (the forward's: a backward pass is no attention)."""
    return any(w in name.lower() for w in _SOFTMAX_WORDS) and "backward" not in name


def _is_softmax(stage: str, name: str) -> bool:
    """A softmax kernel the names left generic or gave to the sampler."""
    return stage in _SOFTMAX_STAGES and _softmax_name(name)


def mark_activation_quantize(
    seq: np.ndarray, stage: list[str], op_names: list[str | None], launch: np.ndarray, why: Any
) -> int:
    """STR049: right before a quantized GEMM op (``quantized_gemm_ops``: FP8 ``_scaled_mm``, int8
    ``_int_mm`` ...), the generic kernels of its input's quantization (launched by
    ``quantize_chain_ops``: absolute max, scale, clamp, cast) from the first absolute-max / max op
    on (``quantize_start_ops``) are ``quantize``, not the region they sit in. Without such a start
    (no absolute max: a cast alone) nothing changes. Returns the kernels relabelled."""
    rows = seq.tolist()
    done = 0
    for p, r in enumerate(rows):
        if op_names[r] not in _QUANT_GEMM_OPS or (p and launch[rows[p - 1]] == launch[r]):
            continue  # not the first kernel of a quantized GEMM op
        q = p - 1
        start = -1
        while q >= 0 and op_names[rows[q]] in _QUANT_CHAIN_OPS and stage[rows[q]] in _QUANT_PARTS:
            if op_names[rows[q]] in _QUANT_START_OPS:
                start = q
            q -= 1
        for k in range(start, p) if start >= 0 else ():
            stage[rows[k]] = "quantize"
            why[rows[k]] = ACTIVATION_QUANTIZE
            done += 1
    return done


def compose_attention(
    seq: np.ndarray,
    stage: list[str],
    norm: list[str],
    op_names: Sequence[str | None],
    launch: np.ndarray,
    softmax: np.ndarray | None = None,
    why: Any = None,
) -> int:
    """Attention that the framework composes from GEMMs and generic kernels is attention.

    HF eager attention and the math SDPA backend run ``matmul(q, k^T)`` -> scale / mask add ->
    softmax -> (dropout) -> ``matmul(p, v)``: a softmax between two GEMM ops with only generic
    kernels in between. That stretch, the generic work before it back to the KV-cache write (repeat_kv
    copies, the math backend's scaling and causal mask) and the copies after it up to the next GEMM
    (the output transpose) take the attention stage; its GEMMs are never projections. A softmax after
    the LM head (no GEMM follows before a norm or an embedding) stays the sampler's. Returns how many
    attentions were found.

    ``softmax`` (optional, per kernel row): the softmax kernels, found once per distinct name and op
    by the caller. Only the stretches around them are looked at, so a trace without composed
    attention costs one pass over those rows. ``why`` (per kernel row, optional): the id of the rule
    that set each kernel's stage, kept up to date here (as in every relabelling below).
    """
    why = {} if why is None else why
    rows = seq.tolist()
    if softmax is None:
        softmax = np.zeros(max(rows, default=-1) + 1, bool)
        for r in rows:
            softmax[r] = _is_softmax(stage[r], norm[r]) or op_names[r] in _SOFTMAX_OPS
    soft = np.flatnonzero(softmax[seq]).tolist()
    if not soft:
        return 0
    comp = _Composition(rows, stage, norm, op_names, launch, softmax)
    found = 0
    done = -1
    for s in soft:
        span = comp.span(s, done)
        if span is None:
            continue
        lo, hi = span
        for q in range(lo, hi + 1):
            if stage[rows[q]] not in ("memcpy", "memset"):
                stage[rows[q]] = COMPOSED_ATTENTION
                why[rows[q]] = COMPOSED
        done = hi
        found += 1
    return found


class _Composition:
    """The positions of one device's kernels as :func:`compose_attention` reads them: per (stage,
    name), once, whether a kernel is a GEMM, a part of a composed attention, norm-like or a KV-write
    name."""

    def __init__(
        self,
        rows: list[int],
        stage: list[str],
        norm: list[str],
        op_names: Sequence[str | None],
        launch: np.ndarray,
        softmax: np.ndarray,
    ) -> None:
        self.rows, self.stage, self.norm, self.op_names = rows, stage, norm, op_names
        self.launch, self.softmax = launch, softmax
        self.memo: dict[tuple[str, str], tuple[bool, bool, bool, bool]] = {}

    def kind(self, q: int) -> tuple[bool, bool, bool, bool]:
        """(GEMM, generic part, norm-like, KV-write name) of position q."""
        r = self.rows[q]
        key = (self.stage[r], self.norm[r])
        got = self.memo.get(key)
        if got is None:
            st, nm = key
            got = self.memo[key] = (st in GEMM_STAGES, st in _COMPOSED_PARTS, _norm_like(st, nm),
                                    any(w in nm for w in _KV_WRITE_WORDS))  # fmt: skip
        return got

    def clean(self, q: int) -> bool:
        g = self.kind(q)
        return (g[1] or bool(self.softmax[self.rows[q]])) and not g[2]

    def joins(self, q: int) -> bool:
        """Position q continues the GEMM op at q - 1 (same launching op, or a split-K reduce)."""
        lv, pv = self.launch[self.rows[q]], self.launch[self.rows[q - 1]]
        return bool(lv == pv) or _is_reduce(self.norm[self.rows[q]])

    def span(self, s: int, done: int) -> tuple[int, int] | None:
        """The positions of the attention around the softmax at ``s`` (none before ``done``): the GEMM
        ops on each side with only clean kernels between, the generic work before back to the
        KV-cache write, the copies after up to an add; None when ``s`` is no such softmax."""
        n, kind, clean = len(self.rows), self.kind, self.clean
        if s <= done or not clean(s):
            return None
        a1 = s - 1  # the GEMM op before: only clean kernels between it and the softmax
        while a1 >= 0 and not kind(a1)[0] and clean(a1):
            a1 -= 1
        if a1 < 0 or not kind(a1)[0]:
            return None
        b0 = s + 1  # the GEMM op after, the same way
        while b0 < n and not kind(b0)[0] and clean(b0):
            b0 += 1
        if b0 >= n or not kind(b0)[0]:
            return None  # a norm, an embedding, a routing kernel ... first: not one attention
        if self.op_names[self.rows[a1]] in _LINEAR_OPS or self.op_names[self.rows[b0]] in _LINEAR_OPS:
            return None  # a linear layer's GEMM (a router's, before its softmax): no attention's product
        lo = a1
        while lo - 1 >= 0 and kind(lo - 1)[0] and self.joins(lo):
            lo -= 1
        hi = b0
        while hi + 1 < n and kind(hi + 1)[0] and self.joins(hi + 1):
            hi += 1
        while lo - 1 > done and kind(lo - 1)[1] and not kind(lo - 1)[2]:
            op = self.op_names[self.rows[lo - 1]]
            if (op in _BEFORE_ATTENTION_STOP) if op is not None else kind(lo - 1)[3]:
                break
            lo -= 1
        while hi + 1 < n and clean(hi + 1) and self.op_names[self.rows[hi + 1]] not in _ADD_OPS:
            if self.op_names[self.rows[hi + 1]] is None and kind(hi + 1)[3]:
                break
            hi += 1
        return lo, hi


def softmax_rows(norm_names: Any, op_column: pa.Array, stage: list[str]) -> np.ndarray:
    """Per kernel row: a softmax kernel (by its name, once per distinct name) or one launched by a
    softmax op (``op_column``: the launching op's name per row); the candidates
    :func:`compose_attention` looks around."""
    out = dict_where(norm_names, _softmax_name)
    for r in np.flatnonzero(out).tolist():
        out[r] = stage[r] in _SOFTMAX_STAGES
    return out | dict_isin(op_column, list(_SOFTMAX_OPS))


_REDUCE_OPS = _V("reduce_ops")


_MEAN_WORDS = KNOWLEDGE.words("mean_words")


def reduction_rows(norm_names: Any, op_column: pa.Array) -> np.ndarray:
    """Per kernel row: a reduction, by its launching op (``op_column``) or a mean kernel's name
    (tested once per distinct op and name)."""
    return dict_where(norm_names, lambda x: any(w in x for w in _MEAN_WORDS)) | dict_isin(
        op_column, list(_REDUCE_OPS)
    )


def _demote_output_row_gathers(
    rows: list[int],
    stage: list[str],
    lookup: np.ndarray,
    attention: np.ndarray,
    op_first: np.ndarray,
    normish: np.ndarray,
    why: Any,
) -> int:
    """STR047: an embedding lookup (by name) whose attention comes right before it, with one GEMM op
    (the O projection) and no norm between, selects rows of the layer's hidden states (llama.cpp
    keeps only the rows whose logits are computed, ``inp_out_ids``, in the last layer after its
    attention); it opens no forward and takes its region's stage. A forward's own lookup comes
    after the previous forward's norms and MLP, never right after an O projection. Returns the
    kernels relabelled (``lookup`` / ``attention`` / ``normish``: per position)."""
    emb = np.flatnonzero(lookup)
    att = np.flatnonzero(attention)
    if not len(emb) or not len(att):
        return 0
    norm_count = np.concatenate([[0], np.cumsum(normish)])
    last_att = np.searchsorted(att, emb) - 1
    done = 0
    for e, j in zip(emb.tolist(), last_att.tolist(), strict=True):
        if j < 0:
            continue
        a = int(att[j])
        ops = int(np.searchsorted(op_first, e) - np.searchsorted(op_first, a + 1))
        if ops == 1 and norm_count[e] == norm_count[a + 1]:
            stage[rows[e]] = "elementwise"
            why[rows[e]] = OUTPUT_ROWS
            done += 1
    return done


def _demote_lone_pow(
    rows: list[int], stage: list[str], is_pow: np.ndarray, is_reduce: np.ndarray, why: Any
) -> int:
    """``aten::pow`` (``is_pow``, per position) is a norm's square only when a reduction (the mean,
    ``is_reduce``) follows within two kernels; elsewhere (GELU-tanh's ``x ** 3``) it is generic work
    that the region labels."""
    n = len(rows)
    pows = np.flatnonzero(is_pow)
    reduced = np.zeros(len(pows), bool)
    for step in (1, 2):
        at = pows + step
        inside = at < n
        reduced[inside] |= is_reduce[at[inside]]
    demoted = 0
    for q in pows[~reduced].tolist():
        if stage[rows[q]] == "norm":
            stage[rows[q]] = "elementwise"
            why[rows[q]] = LONE_POW
            demoted += 1
    return demoted


_NORM_OPS = _V("norm_ops")


def _norm_shape(
    rows: list[int],
    norm: Sequence[str],
    op_names: Sequence[str | None],
    normish: np.ndarray,
    was_generic: np.ndarray,
    qkv_l: list[int],
    th: Thresholds = DEFAULT_THRESHOLDS,
    stage: Sequence[str] = (),
) -> dict[str, tuple[int, int]] | None:
    """(lead, tail) of each composed norm of the model, learned from the layers' input norms.

    A norm composed of ATen kernels (cast, pow, mean, add eps, rsqrt, mul, cast, mul by the weight)
    shows only some of its kernels as norm-like. The input norm of a layer ends at its QKV GEMM: the
    generic kernels between its last norm-like kernel and that GEMM are its tail, a cast right
    before its first norm-like kernel its lead. Keyed by the name of the norm's first norm-like
    kernel (an eager norm and a compiled one differ); None when no input norm is found.
    ``qkv_l``: the positions where a run of QKV GEMMs begins, in order. A fused norm (one kernel by
    name) followed by more than ``max_norm_tail`` kernels, each generic or a token mixer's
    (``stage``: STR052's token shift), before the GEMM is a whole norm: tail 0 (STR041).
    """
    n = len(rows)
    if not qkv_l:
        return None
    seen: dict[str, tuple[list[int], list[int]]] = {}
    first, last = (
        np.asarray(x, np.int64) for x in _cluster_bounds(np.flatnonzero(normish), int(th.norm_cluster_gap))
    )
    qkv = np.asarray(qkv_l, np.int64)
    k = np.searchsorted(qkv, last)
    nxt = np.where(k < len(qkv), qkv[np.minimum(k, len(qkv) - 1)], n)
    tail = nxt - last - 1
    # only generic kernels between the cluster and the GEMM (none when the GEMM comes right after)
    other = np.concatenate([[0], np.cumsum(~was_generic)])
    only_generic = other[np.maximum(nxt, last + 1)] == other[last + 1]
    short = (tail <= th.max_norm_tail) & only_generic
    # a fused norm (one kernel by name) is the whole norm: a long run of generic kernels after it, or
    # of a token mixer's (STR052's token shift), is the block's own input work; its tail is none
    # (only the clusters with no short tail are looked at: the names of a few kernels)
    whole = np.zeros(len(first), bool)
    for k in np.flatnonzero(~short).tolist():
        whole[k] = first[k] == last[k] and _fused_norm(norm[rows[int(first[k])]])
    for k in np.flatnonzero(whole).tolist():
        whole[k] = bool(stage) and all(
            was_generic[i] or stage[rows[i]] == "linear_attention" for i in range(last[k] + 1, nxt[k])
        )
    ok = short | whole
    tail = np.where(whole, 0, tail)
    cast_before = (first > 0) & was_generic[np.maximum(first - 1, 0)]
    for c0, t, c, g in zip(
        first[ok].tolist(), tail[ok].tolist(), cast_before[ok].tolist(), nxt[ok].tolist(), strict=True
    ):
        leads, tails = seen.setdefault(norm[rows[c0]], ([], []))
        # a post-norm layer's residual add comes between its norm and the next GEMM: no norm's
        tails.append(t - 1 if t > 0 and _is_add(rows[g - 1], op_names) else t)
        leads.append(int(c and _is_cast(rows[c0 - 1], norm, op_names)))
    if not seen:
        return None
    return {k: (int(np.bincount(lv).argmax()), int(np.bincount(tv).argmax())) for k, (lv, tv) in seen.items()}


def _label_inner_norms(
    rows: Sequence[int],  # one device's kernels in time order (:func:`row_sequence`)
    stage: list[str],
    attn_in: np.ndarray,
    normish: np.ndarray,
    was_generic: np.ndarray,
    shape: dict[str, tuple[int, int]] | None,
    norm: Sequence[str] = (),
    why: Any = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
    op_names: Sequence[str | None] = (),
) -> None:
    """Norms inside the attention input (Qwen3 / OLMo-2 / Gemma-3 q/k norms) are norms, not RoPE:
    the learned norm shape (:func:`_norm_shape`) is applied to the norm clusters found between the
    QKV GEMM and attention; a copy right before a q / k norm kernel that the learned shape does not
    cover is that norm's input (STR046). ``attn_in``: per position, in that region."""
    why = {} if why is None else why
    n = len(rows)
    inner = attn_in & normish
    if not inner.any():
        return
    if shape is not None:
        bounds = _cluster_bounds(np.flatnonzero(inner), int(th.norm_cluster_gap))
        for q in sorted(_norm_windows(bounds, 0, n, shape, rows, norm)):
            if attn_in[q] and was_generic[q] and stage[rows[q]] in ("rope", *GENERIC):
                stage[rows[q]] = "norm"
                why[rows[q]] = INNER_NORMS
    if op_names:
        # the contiguous copy of the q or k slice right before its norm kernel is the norm's input
        for c in np.flatnonzero(inner).tolist():
            q = c - 1
            if (
                q >= 0
                and attn_in[q]
                and was_generic[q]
                and not normish[q]
                and stage[rows[q]] in ("rope", *GENERIC)
                and _is_cast(rows[q], norm, op_names)
            ):
                stage[rows[q]] = "norm"
                why[rows[q]] = QK_NORM_INPUT


def _between_fused_norms(
    rows: list[int], i: int, lo: int, hi: int, norm: Sequence[str], op_names: Sequence[str | None]
) -> bool:
    """An add right between two fused norm kernels (one kernel each: Liger's, vLLM's) is the
    residual add of a sandwich, not a composed norm's epsilon add."""

    def fused(j: int) -> bool:
        return lo <= j < hi and _fused_norm(norm[rows[j]])

    return _is_add(rows[i], op_names) and fused(i - 1) and fused(i + 1)


def _has_norm_signal(
    rows: list[int], run: list[int], op_names: Sequence[str | None], stage: list[str], lo: int, hi: int
) -> bool:
    if any(stage[rows[i]] == "norm" for i in range(lo, hi)):
        return True
    ops = {op_names[rows[i]] for i in run}
    return bool(ops & _NORM_OPS)
