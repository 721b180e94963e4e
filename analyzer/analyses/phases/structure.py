"""Steps found by the run's structure when no engine annotation applies: forwards, else idle gaps.

Contract: :func:`_steps_from_structure` cuts one trace's timed kernels (in time order) at the first
kernel of every forward (:func:`forward_starts`, moved back to a CUDA graph replay's first kernel),
else at idle gaps, labels the steps (:func:`~analyzer.analyses.phases.labels.label_steps`) and writes
each kernel's step, phase and tokens in place; it returns the steps' rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.analyses.phases.labels import label_steps, unshaped_prefill_runs
from analyzer.analyses.phases.registry import (
    DEFAULT_THRESHOLDS,
    FORWARD_PROLOGUE,
    FORWARD_STARTS,
    GAP_STEPS,
    GRAPH_LAUNCH_START,
    HEAVY_PREFIX,
    HEAVY_STAGES,
    LOOKUP_IN_LAYERS,
    UNSHAPED_PREFILL_RUN,
)
from analyzer.analyses.phases.steps import _step_row
from analyzer.knowledge.structure_rules import Thresholds
from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES
from analyzer.tables.dictionaries import dict_isin


def _stage_is(stages: Any, wanted: Sequence[str]) -> np.ndarray:
    """Per position: the stage is one of ``wanted``; ``stages`` as strings, or as a dictionary
    array (tested once per distinct stage)."""
    if isinstance(stages, (pa.Array, pa.ChunkedArray)):
        return dict_isin(stages, wanted)
    return np.isin(np.asarray(stages), list(wanted))


def forward_starts(stages: Any, dropped: list[int] | None = None) -> np.ndarray:
    """Positions (in time order) where a forward begins: its first embedding lookup; for a forward without
    an embedding kernel (compiled into a fused kernel, replayed from a graph, run on the host), the
    first norm / QKV GEMM / attention kernel after the previous forward's LM head. ``stages``: the
    kernels' stages in time order (strings, or a dictionary array)."""
    is_emb = _stage_is(stages, ("embedding",))
    emb = np.flatnonzero(is_emb)
    # embedding kernels with no GEMM, attention or norm between them start one forward: a gather
    # and its scale, or the token lookup and a learned position lookup after the mask work (OPT)
    work = np.concatenate([[0], np.cumsum(_stage_is(stages, (*HEAVY_STAGES, "norm")))])
    joined = work[emb[1:]] == work[emb[:-1] + 1] if len(emb) else np.zeros(0, bool)
    starts = emb[np.concatenate([[True], ~joined])].tolist() if len(emb) else []
    attn = _stage_is(stages, ATTENTION_KERNEL_STAGES)
    if not attn.any():
        return np.asarray(starts, np.int64)
    is_open = _stage_is(stages, ("norm", "qkv_gemm", "embedding", *ATTENTION_KERNEL_STAGES))
    opens = np.flatnonzero(is_open)
    lm = np.flatnonzero(_stage_is(stages, ("lm_head_gemm",)))
    if len(lm) and len(starts) > 1:
        # PHS037: where the forwards end in an LM head, a lookup after attention but before the
        # forward's LM head is the layers' own (a MoE block's token gather by index_select), no
        # forward's start
        kept = _after_lm_heads(starts, lm, attn)
        if dropped is not None:
            dropped.extend(sorted(set(starts) - set(kept)))
        starts = kept
    if not starts:
        starts = [0]
    inside = _heads_inside_forwards(np.asarray(starts, np.int64), lm)
    for j, p in enumerate(lm.tolist()):
        if inside[j]:
            continue
        k = int(np.searchsorted(opens, p + 1))
        if k < len(opens) and not is_emb[opens[k]]:
            starts.append(int(opens[k]))
    return np.unique(np.asarray(starts, np.int64))


def _heads_inside_forwards(lookups: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Per LM head (positions ``lm``): it is a misread inside a forward, not that forward's end. Where
    most forwards between two lookups (``lookups``: the forward starts kept) hold exactly one LM
    head, a forward that holds more ends at its last one: the others open no forward (PHS003)."""
    out = np.zeros(len(lm), bool)
    if len(lookups) < 2 or len(lm) < 2:
        return out
    seg = np.searchsorted(lookups, lm, side="right")  # 0: before the first lookup
    counts = np.bincount(seg, minlength=len(lookups) + 1)[1:]
    if (counts == 1).sum() * 2 <= len(counts):
        return out  # (forwards replayed from graphs run without a lookup of their own)
    out[:-1] = (seg[:-1] == seg[1:]) & (seg[:-1] > 0)
    return out


def _after_lm_heads(starts: list[int], lm: np.ndarray, attn: np.ndarray) -> list[int]:
    """The forward starts but those with attention and no LM head since the start kept before them."""
    seen_attn = np.concatenate([[0], np.cumsum(attn)])
    kept = [starts[0]]
    for s in starts[1:]:
        head = int(np.searchsorted(lm, s)) - int(np.searchsorted(lm, kept[-1]))
        if head == 0 and seen_attn[s] > seen_attn[kept[-1]]:
            continue
        kept.append(s)
    return kept


MAX_STAGING_FILLS = int(DEFAULT_THRESHOLDS.max_staging_fills)


def _graph_launch_start(
    starts: np.ndarray,
    corr: np.ndarray,
    graph: np.ndarray,
    fill: np.ndarray,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> np.ndarray:
    """A forward replayed from a CUDA/HIP graph begins with the graph's first kernel (position ids,
    buffer fills ... come before the embedding), so move each start back to it; the eager fills
    launched right before the replay reset its static input buffers, so they open the step too."""
    out = []
    for s in starts.tolist():
        if graph[s]:
            while s > 0 and graph[s - 1] and corr[s - 1] == corr[s]:
                s -= 1
            k = 0
            while s > 0 and k < th.max_staging_fills and not graph[s - 1] and fill[s - 1]:
                s -= 1
                k += 1
        out.append(s)
    return np.unique(np.asarray(out, np.int64))


def _prologue_start(
    starts: np.ndarray, idx: np.ndarray, prologue: set[int], layout_copy: set[int]
) -> tuple[np.ndarray, set[int]]:
    """PHS038: the kernels right before a forward's start that the walk found to be its input
    preparation (STR062: after the previous step's stop check, the model's own code builds the next
    forward's positions and masks) open its step, but for their leading layout-only copies (the
    caller's clones of its sliced ids); returns the starts and those moved back. ``idx``: the
    trace's kernel rows in time order; ``prologue`` / ``layout_copy``: rows (a few per step)."""
    if not prologue:
        return starts, set()
    out, opened = [], set()
    for s in starts.tolist():
        t = s
        while t > 0 and int(idx[t - 1]) in prologue:
            t -= 1
        while t < s and int(idx[t]) in layout_copy:
            t += 1
        if t < s:
            opened.add(t)
        out.append(t)
    return np.unique(np.asarray(out, np.int64)), opened


def _gap_starts(start: np.ndarray, dur: np.ndarray, th: Thresholds = DEFAULT_THRESHOLDS) -> np.ndarray:
    if len(start) == 0:
        return np.empty(0, np.int64)
    end = np.maximum.accumulate(start + dur)
    gaps = start[1:] - end[:-1]
    if len(gaps) == 0:
        return np.array([0])
    thresh = max(th.min_gap_ns, th.gap_factor * float(np.median(np.maximum(gaps, 0))))
    cuts = np.flatnonzero(gaps > thresh) + 1
    return np.concatenate([[0], cuts]).astype(np.int64)


def _steps_from_structure(
    idx: np.ndarray,
    df: Any,
    kernels: pa.Table,
    shapes: dict[int, dict[str, np.ndarray]],
    step: np.ndarray,
    phase: np.ndarray,
    tokens: np.ndarray,
    tid: int,
    warnings: list[str] | None = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> list[dict[str, Any]]:
    """One trace's steps found by its structure (:func:`_cut_steps`) and labelled
    (:func:`~analyzer.analyses.phases.labels.label_steps`); writes each kernel's step, phase and
    tokens in place and returns the steps' rows."""
    segments, found_by, source = _cut_steps(idx, df, th)
    if not segments:
        return []
    labels = label_steps(segments, df, shapes.get(int(tid)), warnings, tid, th)
    labels = [
        dataclasses.replace(lab, evidence=(*f, *lab.evidence))
        for lab, f in zip(labels, found_by, strict=True)
    ]
    doubt = unshaped_prefill_runs(labels)
    for i in doubt:
        labels[i] = dataclasses.replace(
            labels[i],
            phase="unknown",
            rule=UNSHAPED_PREFILL_RUN,
            evidence=(*labels[i].evidence, labels[i].rule),
        )
    if doubt and warnings is not None:
        warnings.append(
            f"trace {tid}: {len(doubt)} steps run a prefill's kernels right after another prefill step "
            "and no shapes were recorded: under continuous batching or chunked prefill each may be a "
            "prompt chunk alone or one beside decode tokens (mixed), so their phase is unknown; "
            "capture with record_shapes=True to count each step's prefill and decode tokens"
        )
    rows = []
    k_start = df["start"]
    for s, seg in enumerate(segments):
        step[seg] = s
        phase[seg] = labels[s].phase
        tokens[seg] = labels[s].tokens
        lo = int(k_start[seg[0]])
        if s + 1 < len(segments):
            hi = int(k_start[segments[s + 1][0]])
        else:
            hi = int((k_start[seg] + df["dur"][seg]).max())
        rows.append(_step_row(tid, df, seg, s, labels[s], lo, hi, source))
    return rows


def _cut_steps(
    idx: np.ndarray, df: Any, th: Thresholds
) -> tuple[list[np.ndarray], list[tuple[str, ...]], str]:
    """One trace's timed kernels (positions, in time order) cut at the forwards' starts, else at idle
    gaps; kernels before the first forward are a step of their own where they do heavy work. Returns
    the steps, the ids of the rules that found each, and their source (``forward`` or ``gaps``)."""
    stages = df["stage"][idx]
    taken = df["stage_dict"].take(pa.array(idx))
    dropped: list[int] = []
    found = forward_starts(taken, dropped)
    starts = _graph_launch_start(found, df["corr"][idx], df["graph"][idx], df["fill"][idx], th)
    moved = set(starts.tolist()) - set(found.tolist())  # starts a graph replay moved back
    rows, layout = df["prologue"]
    starts, opened = _prologue_start(starts, idx, set(rows.tolist()), set(layout.tolist()))
    source, finder = "forward", FORWARD_STARTS
    k_st = df["start"][idx]
    k_du = df["dur"][idx]
    prefix = -1
    bare = not _stage_is(taken, ("embedding", "lm_head_gemm")).any()
    gaps = _gap_starts(k_st, k_du, th) if len(starts) == 0 or (bare and len(starts) <= 1) else None
    if gaps is not None and (len(starts) == 0 or len(gaps) > 1):
        # no forward start to cut at (no embedding, no LM head: the layers alone): idle gaps cut
        starts = gaps
        source, finder = "gaps", GAP_STEPS
    elif starts[0] > 0 and df["is_heavy"][idx[: starts[0]]].any():
        # a forward before the first recognised one (its embedding ran elsewhere, e.g. on the
        # host): the prefix is a step of its own rather than time outside every step
        first_heavy = int(np.flatnonzero(df["is_heavy"][idx[: starts[0]]])[0])
        lead = first_heavy
        while lead > 0 and stages[lead - 1] not in ("memset", "memcpy"):
            lead -= 1
        starts = np.unique(np.concatenate([[lead], starts]))
        prefix = lead
    bounds = list(starts.tolist()) + [len(idx)]
    # per segment: a lookup PHS037 kept from starting a forward lies inside it (one search, not a
    # scan of the lookups per segment: a MoE trace drops one per layer and step)
    lo = np.searchsorted(dropped, bounds[:-1], side="right")
    inside = (lo < np.searchsorted(dropped, bounds[1:], side="left")).tolist()
    found_by = [
        (finder, HEAVY_PREFIX)
        if a == prefix
        else (finder, GRAPH_LAUNCH_START)
        if a in moved
        else (finder, FORWARD_PROLOGUE)
        if a in opened
        else (finder, LOOKUP_IN_LAYERS)
        if inside[k]
        else (finder,)
        for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))
        if b > a
    ]
    segments = [idx[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return segments, found_by, source
