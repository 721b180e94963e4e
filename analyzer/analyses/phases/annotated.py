"""Steps from engine annotations: the annotation patterns, and the kernels each step annotation holds.

Contract: :func:`parse_annotation` says what one annotation name says by the patterns of
``rules/annotations.toml`` (first match wins; no other annotation is ever looked at);
:func:`step_annotations` parses a run's annotations; :func:`_steps_from_annotations` gives one
trace's annotated steps their kernels (by launch call on the CPU timeline, by kernel start on the
GPU one), writes each kernel's step, phase and tokens in place and returns the steps' rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.analyses.phases.registry import ANNOTATION_STEPS, MERGE_NESTED
from analyzer.analyses.phases.steps import StepLabel, _step_row


@dataclasses.dataclass
class StepAnnotation:
    """A parsed engine annotation: one forward step."""

    start_ns: int
    end_ns: int
    side: str
    phase: str
    tokens: int | None
    name: str
    trace_id: int
    rank: int
    capture: bool = False
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    model: str = "target"
    verify_k: int | None = None
    engine: str = ""  # the id of the annotation pattern that matched
    merged: bool = False  # two annotations of one step merged (:func:`merge_nested`)


# --------------------------------------------------------------------------- annotation patterns


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What one step annotation says: its engine, phase (None: graph capture) and token counts."""

    engine: str
    phase: str | None
    tokens: int | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    model: str = "target"
    verify_k: int | None = None


def parse_annotation(name: str, patterns: Sequence[Mapping[str, Any]]) -> StepInfo | None:
    """What a step annotation name says, else None (no step annotation, or an outer bound).

    ``patterns``: the annotation patterns of ``rules/annotations.toml``
    (:func:`analyzer.knowledge.annotations.load_annotation_patterns`), first match wins. Optional
    groups: ``tokens``, ``q`` x ``bs``, ``prefill_tokens`` / ``decode_tokens`` (the step's tokens of
    each kind) and ``model`` (``draft`` for a speculative draft model's step)."""
    for a in patterns:
        m = a["regex"].search(name)
        if not m:
            continue
        g = m.groupdict()
        kind = a["kind"]
        if kind == "capture":
            return StepInfo(a["id"], None)
        if kind == "outer":
            return None
        phase = _phase_of(a, g)
        tokens = _int(g.get("tokens"))
        q = _int(g.get("q"))
        if tokens is None and q is not None and g.get("bs"):
            tokens = q * int(g["bs"])
        if tokens is None and phase == "decode":
            tokens = _int(g.get("bs"))  # one new token per sequence
        pre, dec = _int(g.get("prefill_tokens")), _int(g.get("decode_tokens"))
        if pre is None and dec is None and tokens is not None:
            if phase == "prefill":
                pre, dec = tokens, 0
            elif phase == "decode":
                pre, dec = 0, tokens
        if tokens is None and pre is not None and dec is not None:
            tokens = pre + dec
        model = (g.get("model") or "target").lower()
        # a decode step that scores several tokens per sequence verifies a speculation
        verify = q if phase == "decode" and model != "draft" and q is not None and q > 1 else None
        return StepInfo(a["id"], phase, tokens, pre, dec, model, verify)
    return None


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _phase_of(a: dict[str, Any], g: dict[str, str | None]) -> str:
    kind = a["kind"]
    if kind == "fixed":
        return a["phase"]
    if kind == "word":
        w = (g.get("word") or "").lower()
        for phase, words in a["words"].items():
            if w in words:
                return phase
        return "unknown"
    if kind == "counts":
        p = _int(g.get("prefill")) or 0
        d = _int(g.get("decode")) or 0
        if p and d:
            return "mixed"
        if p:
            return "prefill"
        if d:
            return "decode"
        return "unknown"
    return "unknown"


def step_annotations(
    annotations: pa.Table, patterns: Sequence[Mapping[str, Any]]
) -> tuple[list[StepAnnotation], list[str]]:
    """Parse every recognised step annotation; return them and the engine ids found."""
    out: list[StepAnnotation] = []
    engines: set[str] = set()
    if annotations.num_rows == 0:
        return out, []
    df = annotations.to_pandas()
    names = df["name"].astype(str)
    cache: dict[str, Any] = {}
    for i, name in enumerate(names):
        if name not in cache:
            cache[name] = parse_annotation(name, patterns)
        hit = cache[name]
        if hit is None:
            continue
        engines.add(hit.engine)
        r = df.iloc[i]
        out.append(
            StepAnnotation(
                int(r.start_ns),
                int(r.end_ns),
                str(r.side),
                hit.phase or "unknown",
                hit.tokens,
                name,
                int(r["trace_id"]),
                int(r["rank"]),
                capture=hit.phase is None,
                prefill_tokens=hit.prefill_tokens,
                decode_tokens=hit.decode_tokens,
                model=hit.model,
                verify_k=hit.verify_k,
                engine=hit.engine,
            )
        )
    return out, sorted(engines)


# --------------------------------------------------------------------------- annotated steps


def _inside(anns: list[StepAnnotation], start: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Which kernels lie in one of ``anns``: by kernel start for a GPU range, by launch call for a CPU one."""
    out = np.zeros(len(start), bool)
    for a in anns:
        at = start if a.side == "gpu" else launch
        out |= (at >= a.start_ns) & (at < a.end_ns)
    return out


def _steps_from_annotations(
    idx: np.ndarray,
    df: pd.DataFrame,
    launch_ts: np.ndarray,
    launched: np.ndarray,
    anns: list[StepAnnotation],
    step: np.ndarray,
    phase: np.ndarray,
    tokens: np.ndarray,
    warnings: list[str],
    tid: int,
) -> list[dict[str, Any]]:
    # A step is the CPU range around the launch calls of its kernels. The profiler's GPU copy of a
    # range covers only the kernels whose innermost range it is, so once ranges nest (an engine's
    # step around its own module ranges) it misses most of the step: the GPU copies decide only
    # where the launch calls are not known (most kernels without one: no runtime events kept).
    gpu = [a for a in anns if a.side == "gpu"]
    cpu = [a for a in anns if a.side != "gpu"]
    on_gpu = bool(gpu) and not (cpu and launched[idx].mean() >= 0.5)
    use = merge_nested(sorted(gpu if on_gpu else cpu, key=lambda a: a.start_ns))
    for a, b in zip(use, use[1:], strict=False):
        if b.start_ns < a.end_ns:
            warnings.append(f"trace {tid}: overlapping step annotations {a.name!r} and {b.name!r}")
            break
    rows = []
    k_start = df["start"]
    k_dur = df["dur"]
    # launch times are nearly, not exactly, in kernel order: a step's kernels are found by a
    # sorted search on them, then put back in kernel order (a mask per step is quadratic)
    by_launch, sorted_key = _sorted_keys(k_start[idx] if on_gpu else launch_ts[idx], on_gpu)
    for s, a in enumerate(use):
        lo = np.searchsorted(sorted_key, a.start_ns, side="left")
        hi = np.searchsorted(sorted_key, a.end_ns, side="left")
        members = idx[lo:hi] if by_launch is None else idx[np.sort(by_launch[lo:hi])]
        members = members[step[members] < 0]
        if len(members) == 0:
            warnings.append(f"trace {tid}: step annotation {a.name!r} holds no kernel")
            continue
        step[members] = s
        phase[members] = a.phase
        tokens[members] = a.tokens
        ks, ke = k_start[members], k_start[members] + k_dur[members]
        lo_t = min(int(ks.min()), a.start_ns) if on_gpu else int(ks.min())
        hi_t = max(int(ke.max()), a.end_ns) if on_gpu else int(ke.max())
        evidence = (ANNOTATION_STEPS, MERGE_NESTED) if a.merged else (ANNOTATION_STEPS,)
        label = StepLabel(
            a.phase, a.tokens, a.prefill_tokens, a.decode_tokens, a.model, a.verify_k, a.engine, evidence
        )
        rows.append(_step_row(tid, df, members, s, label, lo_t, hi_t, "annotation:" + a.name[:60]))
    return rows


def _sorted_keys(key: np.ndarray, in_order: bool) -> tuple[np.ndarray | None, np.ndarray]:
    """The order that sorts ``key`` (None: ``in_order``, already sorted) and ``key`` sorted; the
    unsorted copy is not kept beside them (8 bytes a kernel)."""
    if in_order:
        return None, key
    by_launch = np.argsort(key, kind="stable")
    return by_launch, key[by_launch]


def merge_nested(anns: list[StepAnnotation]) -> list[StepAnnotation]:
    """Engines and patches often annotate one step twice (``execute_...`` around ``step[...]``):
    annotations that mostly overlap are one step, with the outer range and whichever tokens and
    phase are known."""
    out: list[StepAnnotation] = []
    for a in anns:
        if out:
            b = out[-1]
            inter = min(a.end_ns, b.end_ns) - max(a.start_ns, b.start_ns)
            shorter = max(min(a.end_ns - a.start_ns, b.end_ns - b.start_ns), 1)
            if inter >= 0.5 * shorter:
                phase = b.phase if b.phase != "unknown" else a.phase
                if "unknown" not in (a.phase, b.phase) and a.phase != b.phase:
                    phase = "mixed"
                out[-1] = dataclasses.replace(
                    b,
                    start_ns=min(a.start_ns, b.start_ns),
                    end_ns=max(a.end_ns, b.end_ns),
                    phase=phase,
                    tokens=b.tokens if b.tokens is not None else a.tokens,
                    prefill_tokens=b.prefill_tokens if b.prefill_tokens is not None else a.prefill_tokens,
                    decode_tokens=b.decode_tokens if b.decode_tokens is not None else a.decode_tokens,
                    model=b.model if b.model != "target" else a.model,
                    verify_k=b.verify_k if b.verify_k is not None else a.verify_k,
                    name=b.name if len(b.name) <= len(a.name) else a.name,
                    engine=b.engine if len(b.name) <= len(a.name) else a.engine,
                    merged=True,
                )
                continue
        out.append(a)
    return out
