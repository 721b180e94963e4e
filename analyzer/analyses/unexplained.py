"""Kernels the layer walk cannot explain: placed by position only, under host ops foreign to that
place (STR051); an activation inside a layer's attention input (STR058); GEMMs inside the layers
that no role rule explains (STR059); attention outside every layer (STR060).

Contract: a pure check after the walk; it changes no stage. The region defaults (STR034-STR040) and
the expert block's dispatch / combine (STR025) give a generic kernel the stage of the place it sits
in (between the QKV GEMM and attention: RoPE; after the last layer: sampling ...). That is right
when the kernel does what that place does, and each place has the host ops that do it
(``region_ops_<place>`` in ``rules/structure.toml``: RoPE's mul / cat / neg ..., an activation's
silu / gelu ..., a norm's pow / mean / rsqrt ...). A kernel placed so whose launching op is none of
them (a convolution or a scan's exp / cumsum / sum where RoPE should be, a recurrence's gates in a
sampling tail) is work the rules do not know: a token mixer, a router, an indexer. Where such
kernels take at least ``foreign_share`` of the kernel time, the analysis warns, naming the layers
and the ops: their stages are a guess. Only kernels launched by an ATen op are judged (a compiled
region or a library's op can wrap work of any kind); kernels without a launching op (graph replays,
traces without host ops) cannot be judged either.

An activation kernel (its name or its op said so) between a layer's first QKV projection and its
attention is in no place of the layer's grammar: the GEMMs around it are an MLP or a gate the walk
read as projections (a gated norm's MLP, per-layer input embeddings). Where such kernels take at
least ``attention_input_activation_share`` of the kernel time, the analysis warns, naming the layers
and the kernels (STR058). So does a GEMM the walk placed inside a layer but gave no role (``gemm``),
for at least ``roleless_gemm_share`` (STR059): the grammar met a block it does not know (a token
mixer without an anchor kernel, Lightning attention's torch path). And so do attention kernels in no
layer where the walk found layers, for at least ``attention_outside_layers_share`` (STR060): the
walk lost the layers there (an indexer's top-k read as sampling ends the forward early).
"""

from __future__ import annotations

import array
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.registry import KNOWLEDGE

FOREIGN_OPS = KNOWLEDGE.code_of("foreign-op-in-region")
ACTIVATION_IN_ATTENTION_INPUT = KNOWLEDGE.code_of("activation-in-attention-input")
ROLELESS_GEMM = KNOWLEDGE.code_of("gemm-without-role-in-layer")
ATTENTION_OUTSIDE_LAYERS = KNOWLEDGE.code_of("attention-outside-layers")
#: rule code of a position-only decision -> the host ops that do that place's work
_PLACES = {
    KNOWLEDGE.code_of(name): frozenset(KNOWLEDGE.set_of(f"region_ops_{place}"))
    for name, place in (
        ("region-attn-in", "attn_in"),
        ("region-attn", "attn"),
        ("region-attn-out", "norm"),
        ("region-mlp-in", "mlp_in"),
        ("region-mlp-out", "norm"),
        ("region-moe", "moe"),
        ("moe-block", "moe"),
        ("region-tail", "tail"),
    )
}


# only the framework's own ops are judged: a compiled region or a library's op wraps work of any kind
_JUDGED = "aten::"


def foreign_ops_warning(
    why: Sequence[int] | np.ndarray,
    op_names: Sequence[str | None],
    layer: np.ndarray,
    dur: np.ndarray,
    th: Any,
    fired: Counter | None = None,
) -> str | None:
    """The warning for kernels placed by position under foreign ops, or None below the share."""
    codes = np.frombuffer(why, np.int16) if isinstance(why, array.array) else np.asarray(why, np.int64)
    dur = np.nan_to_num(np.asarray(dur, dtype=np.float64))
    placed = np.flatnonzero(np.isin(codes, list(_PLACES)))
    total = float(dur.sum())
    if not len(placed) or total <= 0:
        return None
    foreign_ns = 0.0
    by_op: Counter = Counter()
    layers: set[int] = set()
    n = 0
    for r in placed.tolist():
        op = op_names[r]
        if op is None or not op.startswith(_JUDGED) or op in _PLACES[int(codes[r])]:
            continue
        d = float(dur[r])
        foreign_ns += d
        by_op[op] += d
        n += 1
        if layer[r] >= 0:
            layers.add(int(layer[r]))
    if fired is not None and n:
        fired[FOREIGN_OPS] += n
    share = foreign_ns / total
    if share < float(th.foreign_share):
        return None
    ops = ", ".join(op for op, _ in by_op.most_common(4))
    where = _layers(sorted(layers)) if layers else "outside the layers"
    return (
        f"{100 * share:.1f}% of kernel time ({n} kernels) was placed by its position in a layer only, "
        f"under host ops that do not do that place's work ({ops}; {where}): work the structure rules "
        "do not know (a token mixer, a router or indexer), so the stages there are a guess"
    )


def activation_in_attention_input_warning(
    rows: Sequence[int],
    names: Sequence[str],
    layer: np.ndarray,
    dur: np.ndarray,
    th: Any,
    fired: Counter | None = None,
) -> str | None:
    """The warning for activations the walk found inside a layer's attention input (``rows``: their
    kernel rows; ``names``: normalised kernel names per row), or None below the share."""
    return _unexplained(
        np.asarray(rows, np.int64), names, layer, dur, th.attention_input_activation_share, fired,
        ACTIVATION_IN_ATTENTION_INPUT,
        "is an activation inside a layer's attention input, between its QKV projection and its attention",
        "the GEMMs around it are an MLP or a gate the layer grammar does not know, so their roles there "
        "are a guess",
    )  # fmt: skip


def roleless_gemm_warning(
    roleless: np.ndarray,
    names: Sequence[str],
    layer: np.ndarray,
    dur: np.ndarray,
    th: Any,
    fired: Counter | None = None,
) -> str | None:
    """The warning for GEMMs inside the layers that no role rule explains (``roleless``, per kernel
    row: stage ``gemm`` with a layer number), or None below the share."""
    return _unexplained(
        np.flatnonzero(roleless), names, layer, dur, th.roleless_gemm_share, fired, ROLELESS_GEMM,
        "is GEMMs inside the layers that no role rule explains",
        "the layer grammar does not know this block (a token mixer no anchor marks, another kind of "
        "block), so the stages around them are a guess",
    )  # fmt: skip


def attention_outside_layers_warning(
    outside: np.ndarray,
    names: Sequence[str],
    layer: np.ndarray,
    dur: np.ndarray,
    th: Any,
    fired: Counter | None = None,
) -> str | None:
    """The warning for attention kernels in no layer where the walk found layers (``outside``, per
    kernel row), or None below the share."""
    return _unexplained(
        np.flatnonzero(outside), names, layer, dur, th.attention_outside_layers_share, fired,
        ATTENTION_OUTSIDE_LAYERS,
        "is attention outside every layer, though the walk found layers",
        "the walk took a layer's boundary for the forward's (an indexer's or a router's top-k read as "
        "sampling, a GEMM as the LM head), so the stages and steps around them are a guess",
    )  # fmt: skip


def _unexplained(
    at: np.ndarray,
    names: Sequence[str],
    layer: np.ndarray,
    dur: np.ndarray,
    threshold: float,
    fired: Counter | None,
    rule: int,
    what: str,
    why: str,
) -> str | None:
    """The warning for kernel rows ``at`` the walk cannot explain, naming their layers and kernels,
    or None below ``threshold`` of the kernel time."""
    dur = np.nan_to_num(np.asarray(dur, dtype=np.float64))
    total = float(dur.sum())
    if not len(at) or total <= 0:
        return None
    share = float(dur[at].sum()) / total
    if fired is not None:
        fired[rule] += len(at)
    if share < float(threshold):
        return None
    by_name: Counter = Counter()
    for r in at.tolist():
        by_name[_short(names[r])] += float(dur[r])
    layers = sorted({int(x) for x in layer[at].tolist() if x >= 0})
    where = _layers(layers) if layers else "outside the layers"
    kernels = ", ".join(nm for nm, _ in by_name.most_common(3))
    return f"{100 * share:.1f}% of kernel time ({len(at)} kernels) {what} ({where}; {kernels}): {why}"


def _short(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."


def _layers(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:6])
    return f"layer{'s' if len(ids) > 1 else ''} {shown}{' ...' if len(ids) > 6 else ''}"
