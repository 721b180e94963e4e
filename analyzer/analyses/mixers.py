"""Token mixers that are not softmax attention (STR052): a Mamba / Gated DeltaNet / short-convolution
layer's input projections, core and output projection.

Contract: a pure pass over one segment of kernels in launch order, before the layer walk (which
takes the projections it labels as a layer's QKV and O projections: STR055 reads a mixer's block);
it changes stages only. An *anchor* is a kernel only a mixer runs: one whose stage its name gave as
``linear_attention`` (a scan or delta-rule kernel of a library), or one launched by a convolution op
whose weight is depthwise (``[channels, 1, ...]``: a causal conv1d) or by another op of
``mixer_anchor_ops`` (the convolution state's shift in decode, a delta rule's triangular solve). From
an anchor, the mixer spans from the first linear GEMM after the nearest norm before it (its input
projection, with no batched GEMM and no router or expert work between it and the anchor) to its
output projection: the first linear GEMM after the anchor that the next norm follows with no GEMM in
between and a residual add before it. Inside it: linear GEMMs before the output projection are
input projections (``qkv_gemm``: Mamba's x_proj / dt_proj too), the norm kernels after the core's
last GEMM (with one cast right before them: a composed norm's upcast) are the mixer's own norm
(``norm``), and so is a gap between two input projections that holds norm kernels (Mamba's and
Jamba's dt / B / C RMSNorms between x_proj and dt_proj), copies keep their memory stage,
everything else is the core (``linear_attention``: its convolution, scan or delta rule, gates,
batched GEMMs); the output projection is ``o_gemm``. The
input norm's tail is left to the walk (its learned norm shape covers it). A span holding an
attention kernel is no
mixer (a sliding-window cache's shift in an attention layer): nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.positions import _cluster_bounds, gemm_elements, numel
from analyzer.analyses.walk.registry import ATTENTION, GENERIC, KNOWLEDGE, MIXER_SPAN, REGION_RULE_CODES
from analyzer.analyses.weight_gathers import BATCHED_GEMM_OPS
from analyzer.knowledge.taxonomy import MEMORY_STAGES

CONV_OPS = frozenset(KNOWLEDGE.set_of("depthwise_conv_ops"))
ANCHOR_OPS = frozenset(KNOWLEDGE.set_of("mixer_anchor_ops"))
STABILIZER_OPS = frozenset(KNOWLEDGE.set_of("stabilizer_ops"))
EXP_OPS = frozenset(KNOWLEDGE.set_of("exp_ops"))
# ops of a mixer's own work, whatever their weights' shape
_ANCHOR_BY_OP = CONV_OPS | ANCHOR_OPS | STABILIZER_OPS
LINEAR_OPS = frozenset(KNOWLEDGE.set_of("linear_gemm_ops"))
BATCHED_OPS = BATCHED_GEMM_OPS
ADD_OPS = frozenset(KNOWLEDGE.set_of("add_ops"))
CAST_OPS = frozenset(KNOWLEDGE.set_of("cast_ops"))
NORM_OPS = frozenset(KNOWLEDGE.set_of("region_ops_norm"))  # the ops a norm module is made of
NORM_SIGNAL_OPS = frozenset(KNOWLEDGE.set_of("norm_ops"))  # ops only a norm runs (its reductions, rsqrt)
_MEMORY = frozenset(MEMORY_STAGES)
PRODUCT_OPS = frozenset(KNOWLEDGE.set_of("mixer_product_ops"))
NORMALIZER_OPS = frozenset(KNOWLEDGE.set_of("normalizer_ops"))
_CORE = "linear_attention"
_SOFTMAX = ATTENTION - {_CORE}  # softmax attention's kernels: never inside a mixer
_KEEP = _MEMORY | {"quantize"}  # copies and an activation quantization keep their own stage
# ops of other work (experts' batched GEMMs, a router's top-k or sort): never between a mixer's input
# projection and its anchor
_OTHER_WORK = (
    (BATCHED_OPS - PRODUCT_OPS)
    | frozenset(KNOWLEDGE.set_of("topk_ops"))
    | frozenset(KNOWLEDGE.set_of("sort_ops"))
)


def depthwise(dims: Any) -> bool:
    """A convolution's weight ``[channels, 1, ...]`` (input 1): one filter per channel."""
    w = dims[1] if dims and len(dims) > 1 else None
    return isinstance(w, list) and len(w) >= 3 and w[1] == 1


def _is_anchor(
    rows: list[int],
    p: int,
    stage: list[str],
    op_names: Sequence[str | None],
    op_dims: Mapping[int, Any],
    th: Any,
) -> bool:
    r = rows[p]
    op = op_names[r]
    if stage[r] == _CORE:
        return True
    if op in CONV_OPS:
        return depthwise(op_dims.get(r))
    if op in STABILIZER_OPS:  # a running maximum is a recurrence's only when its difference is exponentiated
        reach = int(th.stabilizer_reach)
        return any(op_names[x] in EXP_OPS for x in rows[p + 1 : p + 1 + reach])
    if op in PRODUCT_OPS and stage[r] == "gemm":
        # a batched product no softmax attention took (composed attention is placed before this
        # pass), reducing over more than one (a rotary table's outer product reduces over one)
        return _reduces(op, op_dims.get(r))
    return op in ANCHOR_OPS


def _reduces(op: str | None, dims: Any) -> bool:
    """A batched product's recorded left operand ``[..., M, K]`` reduces over K > 1 (``baddbmm``'s
    first input is the term it adds: its left factor is the second)."""
    at = 1 if op == "aten::baddbmm" else 0
    a = dims[at] if isinstance(dims, list) and len(dims) > at else None
    return isinstance(a, list) and len(a) >= 2 and isinstance(a[-1], int) and a[-1] > 1


def has_products(op_names: Sequence[str | None], op_dims: Mapping[int, Any]) -> bool:
    """Whether a batched product that could anchor a mixer ran (recorded shapes reducing over more
    than one): the token-mixers group's precondition, beside its anchor ops."""
    return any(op_names[r] in PRODUCT_OPS and _reduces(op_names[r], d) for r, d in op_dims.items())


#: the ops a mixer's anchor may be launched by (besides a linear_attention kernel by name): the
#: caller finds their kernels at once (``candidates``), so the span search visits only those
ANCHOR_CANDIDATE_OPS = _ANCHOR_BY_OP | PRODUCT_OPS


def mark_mixers(
    seq: np.ndarray,
    stage: list[str],
    op_names: Sequence[str | None],
    op_dims: Mapping[int, Any],
    why: Any,
    th: Any,
    launch: np.ndarray | None = None,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
    layout: Callable[[int], bool] | None = None,
    fused_norm: Callable[[int], bool] | None = None,
    candidates: np.ndarray | None = None,
    masked: np.ndarray | None = None,
) -> int:
    """STR052 over one segment (kernel rows in launch order); returns the kernels relabelled.
    ``launch`` (per kernel row): the launching op's id, so a split-K GEMM's kernels count as one;
    ``inputs`` (kernel row -> its op's input dims, on demand): an add of operands of two shapes
    (a bias, a parameter) is no residual add; ``layout`` (kernel row -> a layout-only copy, by
    name): such a copy right before a projection is the projection's own; ``fused_norm`` (kernel
    row -> a fused norm kernel, by name): the kernels between such an input norm and the first
    input projection are the mixer's (a token shift); ``candidates`` (per kernel row, optional):
    the kernels whose op may anchor a mixer (:data:`ANCHOR_CANDIDATE_OPS`) or whose stage is
    ``linear_attention``; only those are tried as anchors. ``masked`` (per kernel row, optional): a
    multiply by an integer or boolean mask; one between the input norm and the first projection
    is the mixer's own (its padding mask on its input), never the norm's."""
    rows = seq.tolist()
    reach = int(th.mixer_reach)
    done = 0
    end = -1  # the last output projection placed: spans never overlap
    blocked = -1  # the last anchor refused for other work (an MoE block) before it
    tried = np.flatnonzero(candidates[seq]).tolist() if candidates is not None else range(len(rows))
    for p in tried:
        if p <= end or not _is_anchor(rows, p, stage, op_names, op_dims, th):
            continue
        if blocked >= 0 and not any(stage[rows[i]] == "norm" for i in range(blocked + 1, p)):
            continue  # the same input norm as the refused anchor: the same other work lies between
        span = _span(rows, p, end, stage, op_names, reach, why, launch, inputs)
        if span == _BLOCKED:
            blocked = p
        if span is None or span == _BLOCKED:
            continue
        blocked = -1
        norm_at, start, out = span
        # a fused input norm (one kernel) with more than max_norm_tail kernels before the first
        # projection: those are the mixer's own (a token shift), as the learned norm shape says
        shift = (
            fused_norm is not None and fused_norm(rows[norm_at]) and start - norm_at - 1 > th.max_norm_tail
        )
        lead = norm_at + 1 if shift else start
        if masked is not None:
            for i in range(norm_at + 1, lead):
                if masked[rows[i]] and stage[rows[i]] in GENERIC:
                    stage[rows[i]], why[rows[i]] = _CORE, MIXER_SPAN
                    done += 1
        done += _label(
            rows, lead, start, out, stage, op_names, why, launch, int(th.norm_cluster_gap), layout, inputs
        )
        end = out
    return done


def _linear(r: int, op_names: Sequence[str | None]) -> bool:
    return op_names[r] in LINEAR_OPS


def _gemm(r: int, op_names: Sequence[str | None]) -> bool:
    return op_names[r] in LINEAR_OPS or op_names[r] in BATCHED_OPS


_BLOCKED = (-1, -1, -1)  # _span's answer where other work lies between the input projection and the anchor


def _span(
    rows: list[int],
    p: int,
    floor: int,
    stage: list[str],
    op_names: Sequence[str | None],
    reach: int,
    why: Any,
    launch: np.ndarray | None = None,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
) -> tuple[int, int, int] | None:
    """(the input norm's last kernel, the input projection, the output projection) around anchor p."""

    def residual(r: int) -> bool:  # an add of two activations (unknown shapes: any add)
        if op_names[r] not in ADD_OPS:
            return False
        got = inputs(r) if inputs is not None else None
        return got is None or len(got) < 2 or _activations(got[0], got[1])

    def attention(r: int) -> bool:  # softmax attention by evidence, not a region's default
        return stage[r] in _SOFTMAX and int(why[r]) not in REGION_RULE_CODES

    s = p - 1
    while s > floor and p - s <= reach and stage[rows[s]] != "norm":
        if attention(rows[s]):
            return None
        s -= 1
    if s <= floor or stage[rows[s]] != "norm":
        return None
    start = next((i for i in range(s + 1, p) if _linear(rows[i], op_names)), None)
    if start is None:
        return None
    # between the input projection and the anchor only the mixer's own work: a batched GEMM or a
    # router's or experts' kernel there is other work (an MoE block) between a norm and this anchor
    # (a batched product there is the mixer's own unless an expert's: a router's top-k comes first)
    if any(op_names[rows[i]] in _OTHER_WORK or stage[rows[i]].startswith("moe_") for i in range(start, p)):
        return _BLOCKED
    product = op_names[rows[p]] in PRODUCT_OPS and stage[rows[p]] != _CORE  # anchored by a product
    if product and any(op_names[rows[i]] in NORMALIZER_OPS for i in range(start, p)):
        return None  # (a product after a softmax is attention's)
    for g in range(p + 1, min(len(rows), p + reach)):
        r = rows[g]
        if attention(r) or (product and op_names[r] in NORMALIZER_OPS):
            return None  # (a product normalised by a softmax is attention's)
        if not _linear(r, op_names) or (launch is not None and launch[r] == launch[rows[g - 1]]):
            continue  # not a linear GEMM op's first kernel (a split-K reduce belongs to its GEMM)
        k = g + 1
        while launch is not None and k < len(rows) and launch[rows[k]] == launch[r]:
            k += 1
        after = k
        # (an add labelled norm by a sandwich rule is still the residual add, not the next norm)
        while (
            k < len(rows)
            and (stage[rows[k]] != "norm" or op_names[rows[k]] in ADD_OPS)
            and not _gemm(rows[k], op_names)
        ):
            if attention(rows[k]):
                return None
            k += 1
        # the output projection's result is added to the residual before the next norm (a gate's
        # projection before the mixer's own gated norm is not)
        if k >= len(rows) or (stage[rows[k]] == "norm" and any(residual(rows[j]) for j in range(after, k))):
            return s, start, g
        if _linear(rows[k], op_names) and _attention_branch(rows, k, stage, reach, attention):
            return s, start, g  # a parallel hybrid: the attention branch reads the same normed input
    return None


def _activations(a: Any, b: Any) -> bool:
    """Two operands of an add are activations of one batch: one shape, or one rank with the same batch
    and hidden sizes (one broadcast over the positions: RWKV's decode adds its state's last position);
    a bias or a parameter of another rank is not (one of the same rank, ``[1, 1, H]``, passes at a
    batch of one: shapes alone cannot tell it)."""
    if a == b:
        return True
    return (
        isinstance(a, list)
        and isinstance(b, list)
        and len(a) == len(b) >= 2
        and a[0] == b[0]
        and a[-1] == b[-1]
    )


def _attention_branch(rows: list[int], k: int, stage: list[str], reach: int, attention: Any) -> bool:
    """Whether the linear GEMM at ``k`` opens a softmax-attention branch: attention follows it before
    the next norm (Falcon-H1 runs its Mamba-2 mixer and its attention side by side on one norm)."""
    for i in range(k + 1, min(len(rows), k + reach)):
        if attention(rows[i]):
            return True
        if stage[rows[i]] == "norm":
            return False
    return False


def _own_norm(
    rows: list[int], last_gemm: int, out: int, stage: list[str], op_names: Sequence[str | None], gap: int
) -> int:
    """Where the mixer's own norm starts: the first kernel of the last cluster of norm kernels (at
    most ``gap`` positions apart) before the output projection and after the core's last GEMM (a
    delta rule's q / k normalisation inside the core is an earlier cluster; a composed LayerNorm's
    mean and variance are its kernels too, by their ops); ``out`` when none."""
    norms = np.asarray(
        [
            i
            for i in range(last_gemm + 1, out)
            if stage[rows[i]] == "norm" or op_names[rows[i]] in NORM_SIGNAL_OPS
        ],
        np.int64,
    )
    firsts, _ = _cluster_bounds(norms, gap)
    return firsts[-1] if firsts else out


def _norms_between_projections(
    rows: list[int], start: int, out: int, stage: list[str], op_names: Sequence[str | None]
) -> frozenset[int]:
    """The positions of norms on an input projection's output: a gap between two consecutive linear
    GEMMs of the span's input projections that holds a kernel already staged ``norm`` (a mean
    reduction, an rsqrt) and only kernels of a norm's ops (``region_ops_norm``: no anchor's work, no
    gate, no recurrence) is a norm module applied to the first projection's output before the next
    one reads it (Mamba's and Jamba's dt / B / C RMSNorms between x_proj and dt_proj; a delta rule's
    decode step between its gate projections, with its q / k normalisation, is no norm)."""
    gemms = [i for i in range(start, out) if _gemm(rows[i], op_names)]
    found: set[int] = set()
    for a, b in zip(gemms, gemms[1:], strict=False):
        if not (_linear(rows[a], op_names) and _linear(rows[b], op_names)):
            continue
        gap = range(a + 1, b)
        if any(stage[rows[i]] == _CORE or op_names[rows[i]] in _ANCHOR_BY_OP for i in gap):
            continue  # the core's own work (a scan, a convolution by name) lies between them
        if any(stage[rows[i]] == "norm" for i in gap) and all(
            op_names[rows[i]] is None or op_names[rows[i]] in NORM_OPS for i in gap
        ):
            found.update(gap)
    return frozenset(found)


def _projection_input_copy(
    rows: list[int],
    i: int,
    out: int,
    op_names: Sequence[str | None],
    layout: Callable[[int], bool],
    inputs: Callable[[int], list[list[int]] | None] | None,
) -> bool:
    """Position ``i`` is a layout-only copy (no dtype cast) right before one of the span's linear
    projections, of as many elements as the projection reads (recorded shapes): the linear makes
    its strided input contiguous (Mamba's transposed scan output before out_proj). A cast there, or
    a copy of another tensor (a convolution's output before a gate projection of the hidden
    states), is the mixer's own code."""
    nxt = i + 1
    if not (
        nxt <= out and _linear(rows[nxt], op_names) and op_names[rows[i]] in CAST_OPS and layout(rows[i])
    ):
        return False
    copied = inputs(rows[i]) if inputs is not None else None
    io = gemm_elements(op_names[rows[nxt]], inputs(rows[nxt])) if copied else None
    return bool(copied and copied[0] and io) and numel(copied[0]) == io[0] > 0


def _label(
    rows: list[int],
    lead: int,
    start: int,
    out: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    launch: np.ndarray | None,
    gap: int = 3,
    layout: Callable[[int], bool] | None = None,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
) -> int:
    # the core's last GEMM: its last batched product where it has one (a gate's projection may
    # follow the mixer's own norm, MiniMax's lightning attention), else its last GEMM
    last_gemm = max(
        (i for i in range(start, out) if op_names[rows[i]] in BATCHED_OPS),
        default=max((i for i in range(start, out) if _gemm(rows[i], op_names)), default=start),
    )
    done = 0

    def put(i: int, s: str) -> None:
        nonlocal done
        r = rows[i]
        if stage[r] != s:
            stage[r] = s
            why[r] = MIXER_SPAN
            done += 1

    # the mixer's own (gated) norm: the last cluster of norm kernels before the output projection
    own_norm = _own_norm(rows, last_gemm, out, stage, op_names, gap)
    if own_norm < out and own_norm - 1 > last_gemm and op_names[rows[own_norm - 1]] in CAST_OPS:
        own_norm -= 1  # a composed norm's leading cast (to fp32) is the norm's
    # the own norm ends at a gate's projection after it (MiniMax: norm, gate GEMM, sigmoid, multiply)
    norm_end = next((i for i in range(own_norm, out) if _linear(rows[i], op_names)), out)
    between = _norms_between_projections(rows, start, out, stage, op_names)
    for i in range(lead, start):  # after a fused input norm, before the first projection: a token shift
        if stage[rows[i]] not in _KEEP:
            put(i, _CORE)
    for i in range(start, out):
        r = rows[i]
        if stage[r] in _KEEP:
            continue
        if _linear(r, op_names):
            put(i, "qkv_gemm")
        elif layout is not None and _projection_input_copy(rows, i, out, op_names, layout, inputs):
            put(i, "elementwise")  # the linear's own copy of a strided input (a transposed scan output)
            why[r] = MIXER_SPAN  # (its stage may be elementwise already: the span decided it)
        elif own_norm <= i < norm_end or i in between:
            put(i, "norm")
        else:
            put(i, _CORE)
    put(out, "o_gemm")
    k = out + 1
    while launch is not None and k < len(rows) and launch[rows[k]] == launch[rows[out]]:
        put(k, "o_gemm")  # the rest of a split-K GEMM (its reduce kernel)
        k += 1
    return done
