"""A step's phase from its kernels' signature when no shapes were recorded, and the models of a run.

Contract: pure functions over a run's steps (kernel positions) and the per-kernel columns: prefill
steps are those whose heavy kernels run many times longer, or under names the run's other steps
never use (:func:`_label_from_signature`), judged within each model of a speculative run
(:func:`_signature_by_model`); ``draft`` / ``target`` per step by the attention ops' count and head
size (:func:`_models`) or by the decoder layers each step ran (:func:`_depth_models`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from analyzer.analyses.phases.registry import (
    DEFAULT_THRESHOLDS,
    SIGNATURE_ALL_HEAVY,
    SIGNATURE_KERNELS,
    SIGNATURE_NOVEL,
    SIGNATURE_WORK,
    SINGLE_STEP,
)
from analyzer.knowledge.structure_rules import Thresholds


def _label_from_signature(
    segments: list[np.ndarray], df: Any, th: Thresholds = DEFAULT_THRESHOLDS
) -> tuple[list[str], list[str]]:
    """Prefill steps do the same kernels' work over many tokens: their heavy kernels run longer, or
    (small models, where the time hardly grows with the tokens) run under other names: GEMM tiles
    and attention kernels picked for many query rows, which the run's repeated decode steps never
    use. A single step has nothing to be compared with: unknown. Returns the phases and the ids of
    the rules that decided them."""
    if len(segments) == 1:
        return ["unknown"], [SINGLE_STEP]
    work = []
    for seg in segments:
        dur = df["dur"][seg]
        heavy = dur[df["is_heavy"][seg]]
        work.append(float(np.median(heavy)) if len(heavy) else float(np.median(dur)))
    w = np.asarray(work)
    base = float(np.percentile(w, 25))
    by_work = (w > th.prefill_work_ratio * base) if base > 0 else np.zeros(len(w), bool)
    prefill = by_work.copy()
    by_names = np.zeros(len(w), bool)
    if "name" in df:
        by_names = (_novel_share(segments, df) > th.novel_share) & (w >= base)
    # a step that launches many more kernels than the run's typical step ran another algorithm over
    # many tokens (a token mixer's chunked scan, experts a loop visits for many tokens)
    counts = np.asarray([len(s) for s in segments], float)
    total = np.asarray([float(df["dur"][s].sum()) for s in segments])
    by_count = (counts > th.prefill_kernel_ratio * float(np.median(counts))) & (total > np.median(total))
    prefill |= by_names | by_count
    if prefill.all():
        return ["unknown"] * len(w), [SIGNATURE_ALL_HEAVY] * len(w)
    rules = [
        SIGNATURE_WORK if bw else SIGNATURE_NOVEL if bn else SIGNATURE_KERNELS if bc else SIGNATURE_WORK
        for bw, bn, bc in zip(by_work, by_names, by_count, strict=True)
    ]
    return ["prefill" if p else "decode" for p in prefill], rules


# a step whose heavy kernel time is largely (a quarter and more) under names that most steps never
# run did other work (decode steps of the zoo and the H200 traces stay below 0.15)
NOVEL_SHARE = DEFAULT_THRESHOLDS.novel_share


def _novel_share(segments: list[np.ndarray], df: Any) -> np.ndarray:
    """Per step, the share of its heavy kernel time under names that at most half the steps run."""
    seg_of = np.concatenate([np.full(len(s), i) for i, s in enumerate(segments)])
    rows = np.concatenate(segments)
    heavy = df["is_heavy"][rows]
    seg_of, rows = seg_of[heavy], rows[heavy]
    if len(rows) == 0:
        return np.zeros(len(segments))
    code = df["name"][rows]
    pairs = np.unique(np.stack([seg_of, code]), axis=1)
    names, steps_with = np.unique(pairs[1], return_counts=True)
    common = names[steps_with >= len(segments) / 2]
    novel = ~np.isin(code, common)
    dur = df["dur"][rows].astype(float)
    tot = np.bincount(seg_of, dur, len(segments))
    nov = np.bincount(seg_of, dur * novel, len(segments))
    return np.divide(nov, tot, out=np.zeros(len(segments)), where=tot > 0)


def _signature_by_model(
    segments: list[np.ndarray], df: Any, models: list[str] | None, th: Thresholds = DEFAULT_THRESHOLDS
) -> tuple[list[str], list[str]]:
    """:func:`_label_from_signature`, within each model of a speculative run told by its layer count
    (``models``, from :func:`_depth_models`; None: one model): a large target's verify steps
    outweigh its draft's decode steps many times and would all look like prefills beside them.
    Returns the phases and the ids of the rules that decided them."""
    if models is None:
        return _label_from_signature(segments, df, th)
    out = [""] * len(segments)
    why = [""] * len(segments)
    for name in ("draft", "target"):
        at = [i for i, m in enumerate(models) if m == name]
        phases, rules = _label_from_signature([segments[i] for i in at], df, th)
        for i, ph, rule in zip(at, phases, rules, strict=True):
            out[i], why[i] = ph, rule
    return out, why


def _depth_models(depth: Sequence[int]) -> list[str] | None:
    """``draft`` / ``target`` per step from the decoder layers each step ran, where exactly two
    depths alternate (each at least twice, three switches or more, the shallower at most half the
    deeper): a speculative run without shapes. None otherwise."""
    seq = [d for d in depth if d > 0]
    kinds = sorted(set(seq))
    if len(kinds) != 2 or 2 * kinds[0] > kinds[1] or min(seq.count(k) for k in kinds) < 2:
        return None
    if sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b) < 3:
        return None
    return ["draft" if d == kinds[0] else "target" for d in depth]


def _models(
    hits: list[tuple[int, int, int, tuple[int, int]] | None],
    phases: list[str | None],
    by_depth: list[str] | None = None,
) -> list[str]:
    """``target`` or ``draft`` per step. Speculative decoding runs two models whose decode steps
    interleave: their attention ops differ in count (layers) and head size; the larger is the target.
    Without shapes, by the decoder layers the walk numbered in each step (``by_depth``, from
    :func:`_depth_models`)."""
    keys = {h[3] for h, p in zip(hits, phases, strict=True) if h is not None and p == "decode"}
    if len(keys) >= 2:
        target = max(keys)
        return ["draft" if h is not None and h[3] in keys and h[3] != target else "target" for h in hits]
    if not keys and by_depth is not None and len(by_depth) == len(hits):
        return by_depth
    return ["target"] * len(hits)
