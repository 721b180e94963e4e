"""The label of each unannotated step: phase, tokens, model and verify width, and the rules that gave it.

Contract: :func:`label_steps` takes one trace's steps (kernel positions, in time order), the
per-kernel columns and the trace's attention shapes, and returns one :class:`StepLabel` per step.
Each step's phase comes from its shapes (:mod:`.shapes`), else its kernels' phase evidence
(:mod:`.evidence`; unknown where it contradicts the shapes), else the run's signature
(:mod:`.signature`); a continuous batcher's packed steps are then decided by request bookkeeping.
Steps a trace cannot tell are ``unknown`` with a warning, never a guess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from analyzer.analyses.phases.evidence import _evidence_phase, _fresh_context
from analyzer.analyses.phases.registry import (
    DEFAULT_THRESHOLDS,
    EVIDENCE_CONFLICT,
    FRESH_CONTEXT,
    GRID_QUERY_TILES,
    GRID_SEQUENCES,
    KERNEL_EVIDENCE,
    MODELS_BY_DEPTH,
    MODELS_BY_SHAPE,
    NORM_ROWS,
    PACKED_BOOKKEEPING,
    PACKED_PHASE,
    PACKED_STEP,
    PADDED_OR_REPLAYED,
    PREFILL_GRID_EVIDENCE,
    SCORED_UNKNOWN,
    SIGNATURE_BY_MODEL,
    SINGLE_STEP,
    STATIC_BATCH,
    VERIFY_WIDTH,
)
from analyzer.analyses.phases.shapes import (
    _every_token_scored,
    _is_packed,
    _padded_or_replayed,
    _shape_rule,
    _step_shapes,
    packed_decode_tokens,
    phase_from_shape,
    phase_of_packed,
    recomputed_prefix,
)
from analyzer.analyses.phases.signature import _depth_models, _models, _signature_by_model
from analyzer.analyses.phases.steps import StepLabel
from analyzer.knowledge.structure_rules import Thresholds

# a step's first attention op: (batch, query length, key length, model key), None without shapes
_Hit = tuple[int, int, int, tuple[int, int], bool]


@dataclasses.dataclass
class _Decisions:
    """Per step, as the labelling goes: the phase (None: not decided yet), the id of the rule that
    decided it and the ids of the rules whose evidence it used."""

    phases: list[str | None]
    rules: list[str]
    evidence: list[list[str]]

    def overrule(self, i: int, rule: str) -> None:
        """``rule`` decides step ``i``; the rule that decided it before becomes evidence."""
        self.evidence[i].append(self.rules[i])
        self.rules[i] = rule


def label_steps(
    segments: list[np.ndarray],
    df: Any,
    shapes: dict[str, np.ndarray] | None,
    warnings: list[str] | None = None,
    tid: int = 0,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> list[StepLabel]:
    """The label of each unannotated step: from its attention ops' shapes where recorded
    (:func:`phase_from_shape`), else from the kernels' signature (:func:`_label_from_signature`);
    the model (``draft`` where a second, smaller model's steps interleave with the target's, told by
    the attention ops' count and head size) and the verify width of multi-token decode steps.

    A continuous batcher that replays CUDA graphs pads every step to the graph's sizes: packed steps
    whose key length never changes are padded (their shapes say nothing of their tokens), and a
    graph replay in a run of packed steps may hold prompt chunks as well as decodes. Such steps get
    ``unknown`` and a warning, not a guess."""
    hits = [_step_shapes(seg, df, shapes) for seg in segments]
    rows_out = [int(df["lm_rows"][seg].max()) if len(seg) else -1 for seg in segments]
    verify_max = int(th.max_verify_tokens)
    packed, scored = _packed_steps(hits, rows_out)
    d = _by_shapes(hits, rows_out, packed, verify_max)
    doubtful = _scored_unknown(hits, scored, packed, verify_max, d, warnings, tid)
    recomputed_prefix(hits, packed, d.phases, d.rules, d.evidence)
    _by_kernel_evidence(segments, df, doubtful, d, warnings, tid)
    by_depth = _by_signature(segments, df, d, warnings, tid, th)
    decodes = _by_bookkeeping(segments, df, hits, rows_out, packed, d, warnings, tid)
    models = _models(hits, d.phases, by_depth)
    by_shape = (
        len({h[3] for h, p in zip(hits, d.phases, strict=True) if h is not None and p == "decode"}) >= 2
    )
    if by_shape or by_depth is not None:
        for ev in d.evidence:
            ev.append(MODELS_BY_SHAPE if by_shape else MODELS_BY_DEPTH)
    return _with_tokens(segments, df, hits, models, packed, decodes, d)


def _packed_steps(hits: Sequence[_Hit | None], rows_out: Sequence[int]) -> tuple[list[bool], list[bool]]:
    """Per step: whether several sequences are packed into its attention call (:func:`_is_packed`),
    and whether the LM head scores every one of its tokens (:func:`_every_token_scored`)."""
    packed = [h is not None and _is_packed(h[0], h[1], r) for h, r in zip(hits, rows_out, strict=True)]
    scored = _every_token_scored(hits, rows_out)
    one_model = len({h[3] for h in hits if h is not None}) <= 1
    if any(packed) and one_model:
        # a continuous batcher's run: its step of decodes alone packs one token per request
        packed = [pk or sc for pk, sc in zip(packed, scored, strict=True)]
    return packed, scored


def _by_shapes(
    hits: Sequence[_Hit | None], rows_out: Sequence[int], packed: Sequence[bool], verify_max: int
) -> _Decisions:
    """The phase each step's attention shapes say (None: no shapes), packed steps by
    :func:`phase_of_packed`, the others by :func:`phase_from_shape`."""
    phases: list[str | None] = [
        None
        if h is None
        else phase_of_packed(h[1], h[2], r)
        if pk
        else phase_from_shape(*h[:3], verify_max, h[4])
        for h, r, pk in zip(hits, rows_out, packed, strict=True)
    ]
    # which rule decided each phase, and the rules whose evidence it used
    rules: list[str] = [
        "" if h is None else PACKED_PHASE if pk else _shape_rule(h[1], h[2], verify_max, h[4])
        for h, pk in zip(hits, packed, strict=True)
    ]
    evidence: list[list[str]] = [[PACKED_STEP] if pk else [] for pk in packed]
    return _Decisions(phases, rules, evidence)


def _scored_unknown(
    hits: Sequence[_Hit | None],
    scored: Sequence[bool],
    packed: Sequence[bool],
    verify_max: int,
    d: _Decisions,
    warnings: list[str] | None,
    tid: int,
) -> list[int]:
    """Outside a batcher's run, one sequence of many tokens that all score over a cached context is
    a batcher's decodes or a continuation with every logit kept: no phase. Returns those steps."""
    doubtful = [
        i
        for i, (h, sc, pk) in enumerate(zip(hits, scored, packed, strict=True))
        if sc and not pk and h is not None and h[1] > verify_max
    ]
    for i in doubtful:
        d.overrule(i, SCORED_UNKNOWN)
    _no_phase(
        d.phases, doubtful, warnings,
        f"trace {tid}: {len(doubtful)} steps score every token of one sequence over a cached "
        "context: a continuous batcher's decodes (one token per request) or a continuation that "
        "keeps every logit, so their phase is unknown (capture a step that also holds a prompt "
        "chunk, or engine step annotations, to tell them)",
    )  # fmt: skip
    return doubtful


def _by_kernel_evidence(
    segments: list[np.ndarray],
    df: Any,
    doubtful: Sequence[int],
    d: _Decisions,
    warnings: list[str] | None,
    tid: int,
) -> None:
    """Each step's own kernels: families engines run in one phase only decide a step without shapes,
    and a step whose shapes say otherwise has no phase (the two kinds of evidence contradict)."""
    said = [_evidence_phase(seg, df) if "evidence" in df else (None, KERNEL_EVIDENCE) for seg in segments]
    conflict = []
    for i, (ph, (ev, by)) in enumerate(zip(d.phases, said, strict=True)):
        if ev is None or i in doubtful:
            continue
        grid = (
            [GRID_QUERY_TILES] if bool((df["evidence"][segments[i]] == PREFILL_GRID_EVIDENCE).any()) else []
        )
        if _fresh_context(segments[i], df)[1]:
            grid.append(FRESH_CONTEXT)
        if ph is None:
            d.phases[i], d.rules[i] = ev, by
            d.evidence[i] += [r for r in grid if r != by]
        elif ev != "mixed" and ph != "mixed" and ev != ph:
            d.evidence[i] += [d.rules[i], KERNEL_EVIDENCE, *grid]
            d.rules[i] = EVIDENCE_CONFLICT
            conflict.append(i)
        else:
            d.evidence[i] += [KERNEL_EVIDENCE, *grid]
    _no_phase(
        d.phases, conflict, warnings,
        f"trace {tid}: {len(conflict)} steps have attention shapes of one phase and kernels that "
        "engines run only in the other: their phase is unknown (check the rule's `phases` with "
        "`rules explain`)",
    )  # fmt: skip


def _by_signature(
    segments: list[np.ndarray],
    df: Any,
    d: _Decisions,
    warnings: list[str] | None,
    tid: int,
    th: Thresholds,
) -> list[str] | None:
    """The steps still without a phase by the kernels' signature, within each model where the
    decoder layers each step ran tell a draft from a target (:func:`_depth_models`). Returns those
    models (None: one model)."""
    depth = [int(df["layer"][seg].max()) + 1 if "layer" in df and len(seg) else 0 for seg in segments]
    by_depth = _depth_models(depth)  # draft / target without shapes, or None
    if any(p is None for p in d.phases):
        sig, sig_rules = _signature_by_model(segments, df, by_depth, th)
        for i, p in enumerate(d.phases):
            if p is None:
                d.phases[i], d.rules[i] = sig[i], sig_rules[i]
                if by_depth is not None:
                    d.evidence[i] += [SIGNATURE_BY_MODEL, MODELS_BY_DEPTH]
    if SINGLE_STEP in d.rules and warnings is not None:
        warnings.append(
            f"trace {tid}: a single step with no recorded shapes and no kernels that engines run in one "
            "phase only: its phase is unknown (a step is never decided by its position; a run of several "
            "steps, record_shapes=True or engine step annotations tell it)"
        )
    return by_depth


def _by_bookkeeping(
    segments: list[np.ndarray],
    df: Any,
    hits: Sequence[_Hit | None],
    rows_out: Sequence[int],
    packed: Sequence[bool],
    d: _Decisions,
    warnings: list[str] | None,
    tid: int,
) -> list[int | None]:
    """A continuous batcher's packed steps: their phase by the decode tokens request bookkeeping
    counts (:func:`packed_decode_tokens`), none where padded or replayed from a CUDA graph
    (:func:`_padded_or_replayed`). Returns each step's decode tokens by bookkeeping (None: not told)."""
    undecided = set(_padded_or_replayed(segments, df, hits, packed))
    decodes = packed_decode_tokens(
        [(h[1], h[2], r) if h is not None else None for h, r in zip(hits, rows_out, strict=True)],
        [pk and i not in undecided for i, pk in enumerate(packed)],
    )
    for i, dec in enumerate(decodes):
        h = hits[i]
        if dec is not None and h is not None:
            q = h[1]
            d.phases[i] = "prefill" if dec == 0 else "decode" if dec == q else "mixed"
            d.overrule(i, PACKED_BOOKKEEPING)
    for i in undecided:
        d.overrule(i, PADDED_OR_REPLAYED)
    _no_phase(
        d.phases, undecided, warnings,
        f"trace {tid}: {len(undecided)} steps of a continuous batcher have no phase: their attention "
        "ops are padded to fixed sizes or replayed from a CUDA graph, so they show neither their "
        "prompt nor their decode tokens (capture without CUDA graphs, or with engine step "
        "annotations, to tell them)",
    )  # fmt: skip
    return decodes


def _with_tokens(
    segments: list[np.ndarray],
    df: Any,
    hits: Sequence[_Hit | None],
    models: Sequence[str],
    packed: Sequence[bool],
    decodes: Sequence[int | None],
    d: _Decisions,
) -> list[StepLabel]:
    """Each step's label: its decided phase, model and rules, with its tokens (from its shapes, else
    its decode launches' sequences, its norm's rows or the prefill batch) and a verify width."""
    # graph-replayed decode steps record no shapes: with static batching each sequence of the
    # prefill batch adds one token per decode step
    batches = {h[0] for h, p in zip(hits, d.phases, strict=True) if h is not None and p == "prefill"}
    batch = batches.pop() if len(batches) == 1 else None
    speculative = "draft" in models
    # a decode step without shapes: the sequences its decode family's launches count (PHS031)
    seqs = [int(df["seqs"][seg].max()) if df.get("seqs") is not None and len(seg) else 0 for seg in segments]
    # a step without shapes: the token rows of its first norm launch with a row axis (PHS034)
    rows = [_fresh_context(seg, df)[0] for seg in segments]
    out: list[StepLabel] = []
    for h, ph, model, pk, d_packed, rule, ev in zip(
        hits, d.phases, models, packed, decodes, d.rules, d.evidence, strict=True
    ):
        tok = verify = None
        if h is not None:
            b, q = h[0], h[1]
            tok = q * (b if b > 0 else 1)
            # a target's multi-token decode step verifies a speculation (its LM head scores every
            # candidate: not packed, :func:`_is_packed`); only where a draft model's steps show the
            # speculation: a continuous batcher's step of decodes alone looks the same (one packed
            # sequence, every token scored)
            if ph == "decode" and q > 1 and model == "target" and not pk and speculative:
                verify = q
                ev.append(VERIFY_WIDTH)
        elif ph == "decode" and seqs[len(out)] > 0:
            tok = seqs[len(out)]
            ev.append(GRID_SEQUENCES)
        elif rows[len(out)] > 0:
            tok = rows[len(out)]
            ev.append(NORM_ROWS)
        elif ph == "decode" and batch:
            tok = batch
            ev.append(STATIC_BATCH)
        pre = dec = None
        if tok is not None:
            pre, dec = (tok, 0) if ph == "prefill" else (0, tok) if ph == "decode" else (None, None)
        if pk and d_packed is not None and tok is not None:
            pre, dec = tok - d_packed, d_packed
        out.append(StepLabel(str(ph), tok, pre, dec, model, verify, rule, tuple(dict.fromkeys(ev))))
    return out


def _no_phase(phases: list[str | None], steps: Any, warnings: list[str] | None, why: str) -> None:
    """Mark ``steps`` (positions) ``unknown`` and, if there are any, say ``why`` among the warnings."""
    for i in steps:
        phases[i] = "unknown"
    if steps and warnings is not None:
        warnings.append(why)


def unshaped_prefill_runs(labels: Sequence[StepLabel]) -> list[int]:
    """The prefill steps without token counts (told from kernels, not shapes) that come right after
    another such prefill step of the same model: back-to-back forwards over many tokens are a
    continuous batcher's or a chunked prefill's, and kernels alone cannot tell a pure prompt chunk
    from one beside decodes. The first of a run is a prefill: nothing ran before it to decode."""
    return [
        i + 1
        for i, (a, b) in enumerate(zip(labels, labels[1:], strict=False))
        if a.phase == b.phase == "prefill" and a.tokens is None and b.tokens is None and a.model == b.model
    ]
