"""Rules that assume one framework's model code (Hugging Face decoders): what runs before the first
layer (the embedding's scale, position ids, the rotary module, layer 0's input norm), an
embedding projection, a host-input boundary, sampling ops before the layers, the prologue of the
next layer.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.positions import _cluster_bounds, _fused_norm, numel, widens_activation
from analyzer.analyses.walk.registry import (
    _COPY_OPS,
    _ID,
    _V,
    DEFAULT_THRESHOLDS,
    GEMM_STAGES,
    GENERIC,
    MIXER_SPAN,
)
from analyzer.knowledge.structure_rules import Thresholds

EMBEDDING_PROJECTION = _ID("embedding-projection")


PRE_LAYER_SAMPLING = _ID("pre-layer-sampling")


EMBEDDING_SCALE = _ID("embedding-scale")


POSITION_IDS = _ID("position-ids")


FIRST_NORM = _ID("first-norm")


ROTARY_MODULE = _ID("rotary-module")


_SCALE_OPS = _V("scale_ops")


_CAST_OPS = _V("cast_ops")


def _label_embedding_scale(
    rows: list[int], stage: list[str], op_names: Sequence[str | None], marks: list[int], why: Any
) -> None:
    """A scaled embedding (Gemma: the looked-up rows times sqrt(hidden)): the multiply launched right
    after the lookup (a cast of the scale before it) is the embedding's."""
    for q in [q for q in marks if stage[rows[q]] == "embedding"]:
        k = q + 1
        while k < len(rows) and op_names[rows[k]] in _CAST_OPS and stage[rows[k]] in GENERIC:
            k += 1
        if k < len(rows) and op_names[rows[k]] in _SCALE_OPS and stage[rows[k]] in GENERIC:
            for j in range(q + 1, k + 1):
                stage[rows[j]] = "embedding"
                why[rows[j]] = EMBEDDING_SCALE


_INDEX_OPS = _V("index_ops")


def _label_position_ids(
    rows: list[int], stage: list[str], op_names: Sequence[str | None], marks: list[int], why: Any
) -> None:
    """A second lookup before the first layer (learned positions after the tokens: OPT) computes its
    indices right before it: the adds right before that lookup (position ids plus an offset) are
    the embedding's, when only generic work and copies ran since the first lookup."""
    lookups = [q for q in marks if stage[rows[q]] == "embedding"]
    for p, q in zip(lookups, lookups[1:], strict=False):
        if q - p < 2 or not all(stage[rows[i]] in _PRE_WORK for i in range(p + 1, q)):
            continue
        k = q - 1
        while k > p and op_names[rows[k]] in _INDEX_OPS and stage[rows[k]] in GENERIC:
            stage[rows[k]] = "embedding"
            why[rows[k]] = POSITION_IDS
            k -= 1


_PRE_WORK = _V("pre_layer_work")


def _demote_sampling_before_layers(
    rows: list[int], stage: list[str], region_of: list[str], marks: list[int], why: Any
) -> None:
    """Between a forward's embedding and its first layer nothing samples a token: a cumsum of the
    position ids, the sort of a flex block mask there is generic work (its name or op says
    ``sampling`` only because samplers use the same kernels)."""
    last_emb = -1
    for q in marks:  # the positions of sampling and embedding kernels (and others, skipped)
        r = rows[q]
        if stage[r] == "embedding":
            last_emb = q
        elif (
            stage[r] == "sampling"
            and region_of[q] == "pre"
            and last_emb >= 0
            and region_of[last_emb] == "pre"
        ):
            # the same "pre" run: no other region between the embedding and here
            if all(x == "pre" for x in region_of[last_emb:q]):
                stage[r] = "elementwise"
                why[r] = PRE_LAYER_SAMPLING


def _demote_embedding_projection(
    rows: list[int],
    stage: list[str],
    region_of: list[str],
    layer_of: list[int],
    op_first: np.ndarray,
    op_last: np.ndarray,
    opened: list[int],
    why: Any,
) -> None:
    """A GEMM that opened a forward as its first layer's first projection (``opened``: the GEMM op
    indices) whose layer then runs one QKV GEMM op more than the other layers do is the embeddings'
    own projection (OPT-350m's project_in, before the learned positions are added): role-free,
    before the first layer, and the work up to the next projection with it. The other layers are
    those of softmax attention (a hybrid's mixer layers run other projections)."""
    if not opened:
        return
    first = op_first.tolist()
    runs: dict[int, int] = {}  # first op of a run of QKV GEMM ops of one layer -> ops in the run
    head = -1
    for k, q in enumerate(first):
        if stage[rows[q]] != "qkv_gemm":
            head = -1
            continue
        if head >= 0 and layer_of[q] == layer_of[first[head]]:
            runs[head] += 1
        else:
            head = k
            runs[k] = 1
    firsts = set(opened)
    # a token mixer's layers run their own projections (STR052): compared only with attention layers
    counts = Counter(v for k, v in runs.items() if k not in firsts and int(why[rows[first[k]]]) != MIXER_SPAN)
    if not counts:
        return
    usual = counts.most_common(1)[0][0]
    for k in opened:
        if runs.get(k) != usual + 1 or k + 1 >= len(first) or int(why[rows[first[k]]]) == MIXER_SPAN:
            continue  # (a mixer's projections, STR052's, are no embedding projection)
        for q in range(first[k], first[k + 1]):
            if stage[rows[q]] == "qkv_gemm" and q <= int(op_last[k]):
                stage[rows[q]] = "gemm"
                why[rows[q]] = EMBEDDING_PROJECTION
            region_of[q] = "pre"
            layer_of[q] = -1


def _host_input_boundaries(
    transfer: np.ndarray, lookup: np.ndarray, op_last: np.ndarray, normish: np.ndarray
) -> np.ndarray:
    """STR048: per position, the first kernel of a run of memory transfers that ends a forward. Where
    the device runs no embedding lookup (the engine embeds the tokens on the host), a run of
    transfers right after a GEMM op and right before a norm is the engine handing the step's output
    to the host and uploading the next step's inputs: the GEMM is the LM head, the norm opens the
    next forward. ``transfer`` / ``lookup`` / ``normish``: per position; ``op_last``: each GEMM op's
    last position."""
    n = len(transfer)
    out = np.zeros(n, bool)
    if lookup.any() or not transfer.any() or not len(op_last):
        return out
    edges = np.diff(np.concatenate([[0], transfer.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)  # runs [start, end)
    gemm_end = np.zeros(n, bool)
    gemm_end[op_last] = True
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if a > 0 and b < n and gemm_end[a - 1] and normish[b]:
            out[a] = True
    return out


def _label_first_norm(
    rows: list[int],
    run: list[int],
    lo: int,
    hi: int,
    stage: list[str],
    norm: Sequence[str],
    op_names: Sequence[str | None],
    why: Any,
    th: Thresholds = DEFAULT_THRESHOLDS,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
    widen: np.ndarray | None = None,
) -> None:
    """Before the first layer: the generic kernels of each norm there (the input norm of layer 0,
    and an embedding's own norm before it), each run of norm kernels (at most ``norm_cluster_gap``
    apart) on its own. ``inputs`` (kernel row -> its op's input dims, on demand): a cast after a
    fused norm kernel that copies another number of elements than the norm read is not its cast
    back (an attention mask's).

    A norm composed of ATen kernels (pow, mean, rsqrt, mul) opens with one cast to fp32 and its
    generic kernels reach up to the next norm (``max_norm_tail`` of them at most) or, for the last
    norm, up to layer 0's projections; a fused norm kernel has no prologue and no tail but its casts
    back (Bloom's ALiBi slopes and mask after its embedding LayerNorm are not the norm's). A
    composed norm's tail ends before a copy into a wider float (``widen``, per kernel row: the
    residual cast to fp32 after layer 0's input norm, Mamba's).
    """
    norms = [i for i in range(lo, hi) if stage[rows[i]] == "norm"]
    if not norms:
        return
    firsts, lasts = _cluster_bounds(np.asarray(norms, np.int64), int(th.norm_cluster_gap))
    spans = []
    for k, (a, b) in enumerate(zip(firsts, lasts, strict=True)):
        start = a
        if not _fused(norm, rows[a]) and a - 1 >= lo and stage[rows[a - 1]] in GENERIC:
            start -= 1
        if _fused(norm, rows[b]):
            end = b + 1
            while (
                end < hi
                and op_names[rows[end]] in _CAST_OPS
                and stage[rows[end]] in GENERIC
                and _same_elements(inputs, rows[b], rows[end])
            ):
                end += 1
        else:
            end = hi if k == len(firsts) - 1 else min(b + 1 + int(th.max_norm_tail), firsts[k + 1])
            if widen is not None:
                end = next((i for i in range(b + 1, end) if widens_activation(widen, inputs, rows[i])), end)
        spans.append((start, end))
    starts = [a for a, _ in spans]
    for i in run:
        k = bisect.bisect_right(starts, i) - 1
        if k >= 0 and i < spans[k][1] and stage[rows[i]] in GENERIC:
            stage[rows[i]] = "norm"
            why[rows[i]] = FIRST_NORM


def _same_elements(inputs: Callable[[int], list[list[int]] | None] | None, a: int, b: int) -> bool:
    """Whether kernel rows ``a`` and ``b``'s ops read first inputs of as many elements (unknown
    shapes: True)."""
    x, y = (inputs(a), inputs(b)) if inputs is not None else (None, None)
    if not x or not y or not x[0] or not y[0]:
        return True
    return numel(x[0]) == numel(y[0])


def _fused(norm: Sequence[str], r: int) -> bool:
    """Kernel row ``r`` is a fused norm kernel, by its name's words."""
    return bool(norm) and _fused_norm(norm[r])


def _label_rotary_module(
    rows: list[int],
    lo: int,
    hi: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> None:
    """Before the first layer: the rotary module (HF ``*RotaryEmbedding.forward``) multiplies
    ``inv_freq`` by the positions (a small GEMM), concatenates the halves and takes cos and sin
    (scaled, cast). The GEMM whose result feeds cos/sin and the generic kernels around them are RoPE."""
    ropes = [i for i in range(lo, hi) if stage[rows[i]] == "rope"]
    if not ropes:
        return
    a, b = ropes[0], ropes[-1]
    g = a - 1
    while g >= lo and stage[rows[g]] in GENERIC and op_names[rows[g]] not in _COPY_OPS:
        g -= 1
    if g >= lo and stage[rows[g]] in GEMM_STAGES:
        a = g
        while g >= lo and stage[rows[g]] in GEMM_STAGES:
            g -= 1
        for _ in range(int(th.rope_module_lead)):
            if (
                g >= lo
                and stage[rows[g]] in GENERIC
                and (op_names[rows[g]] is None or op_names[rows[g]] in _COPY_OPS)
            ):
                a = g
                g -= 1
    z = b + 1
    while z < hi and stage[rows[z]] in GENERIC:
        z += 1
    for i in range(a, z):
        if stage[rows[i]] in GENERIC or stage[rows[i]] in GEMM_STAGES:
            stage[rows[i]] = "rope"
            why[rows[i]] = ROTARY_MODULE


def _shift_prologue_to_next_layer(
    rows: list[int],
    stage: list[str],
    layer_of: list[int],
    qkv_starts: list[int],
    gates: np.ndarray | None = None,
) -> int:
    """Norm kernels that precede a layer's QKV GEMM belong to that layer, not the previous one
    (``qkv_starts``: the positions where a run of QKV GEMMs begins; ``layer_of``: each
    position's layer), and so does a norm's gate between them (``gates``, per position: STR075);
    the walk passes a token mixer's own work that the layer holds already (before its input
    projection, it opened the layer: STR052). Returns how many kernels changed layer."""
    moved = 0
    for q in qkv_starts:
        v = layer_of[q]
        k = q - 1
        while k >= 0 and (
            stage[rows[k]] in _PROLOGUE_STAGES
            or (gates is not None and gates[k])
            or (layer_of[k] == v and stage[rows[k]] == "linear_attention")
        ):
            moved += layer_of[k] != v
            layer_of[k] = v
            k -= 1
    return moved


_PROLOGUE_STAGES = _V("prologue_stages")
