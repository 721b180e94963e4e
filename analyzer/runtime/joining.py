"""Whether several inputs can be analysed as one run (README.md, "Commands"), decided from their tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.model import InputMeta, Trace
from analyzer.tables import intervals

OVERLAP_SHARE = 0.01


def one_run_problem(trace: Trace) -> str | None:
    """Why the inputs of ``trace`` cannot be one run, or None when they can.

    Inputs are one run when they share the GPU type and the world size, and either name distinct
    ranks or cover non-overlapping time of one rank from one profiling session (the per-stage files
    of one profile). Separate captures of one rank (a graph-capture trace, an earlier benchmark) are
    two runs even when their times do not overlap: joined, their devices and steps would be counted
    as one run's. A session is told by what the files record (:func:`session_of`); inputs that record
    none are judged by time alone. Time overlaps when both inputs' GPU activity is busy at once for more than
    :data:`OVERLAP_SHARE` of the smaller one's busy time (extracts of one profile interleave at their
    edges; the same capture twice overlaps entirely). A summary-only input has no timeline: beside
    another input of its rank, their totals would overlap.
    """
    inputs = trace.inputs
    if len(inputs) < 2:
        return None
    known = [m for m in inputs if m.gpu_name or m.arch]
    for m in known[1:]:
        a = known[0]
        if _gpu_of(m) != _gpu_of(a):
            return f"{a.path} ({_gpu_text(a)}) and {m.path} ({_gpu_text(m)}) ran on different GPUs"
    for m in inputs[1:]:
        if m.world_size != inputs[0].world_size:
            a = inputs[0]
            return (
                f"{a.path} (world size {a.world_size}) and {m.path} (world size {m.world_size}) "
                "come from runs of different world sizes"
            )
    windows = _busy_intervals(trace.kernels)
    by_rank: dict[int, list[InputMeta]] = {}
    for m in inputs:
        by_rank.setdefault(m.rank, []).append(m)
    for rank, ms in by_rank.items():
        for i, a in enumerate(ms):
            for b in ms[i + 1 :]:
                differ = session_difference(a, b)
                if differ:
                    return (
                        f"{a.path} and {b.path} both claim rank {rank} but come from different "
                        f"profiling sessions ({differ})"
                    )
                wa, wb = windows.get(a.trace_id), windows.get(b.trace_id)
                if wa is None or wb is None:
                    what = (
                        "summary-only inputs whose totals would overlap"
                        if wa is None and wb is None
                        else "a summary-only input beside a trace of the same rank"
                    )
                    return f"{a.path} and {b.path} both claim rank {rank}: {what}"
                shared = _overlap_ns(wa, wb)
                smaller = min(int((wa[1] - wa[0]).sum()), int((wb[1] - wb[0]).sum()))
                if shared > OVERLAP_SHARE * max(smaller, 1):
                    return f"{a.path} and {b.path} both claim rank {rank} over overlapping time"
    return None


#: what identifies the profiling session that wrote an input, where its reader records it: the
#: process that launched the work, the clock base of its timestamps, the profiler's session id
#: (Kineto's ``trace_id``: one per profiler session, kept by tools that split a profile into files)
SESSION_FIELDS = (("pid", "process id"), ("clock_base_ns", "clock base"), ("trace_id", "profiler session id"))


def session_of(m: InputMeta) -> dict[str, Any]:
    """The session fields ``m`` records (an empty dict when its format records none)."""
    return {k: m.extra[k] for k, _ in SESSION_FIELDS if m.extra.get(k) not in (None, "")}


def session_difference(a: InputMeta, b: InputMeta) -> str | None:
    """What tells two inputs apart as different profiling sessions ("process id 12 vs 34"), judged
    on the fields both record; None when nothing does."""
    sa, sb = session_of(a), session_of(b)
    for key, label in SESSION_FIELDS:
        if key in sa and key in sb and sa[key] != sb[key]:
            return f"{label} {sa[key]} vs {sb[key]}"
    return None


def _gpu_of(m: InputMeta) -> tuple[str, str]:
    return ((m.gpu_name or "").strip().lower(), (m.arch or "").strip().lower())


def _gpu_text(m: InputMeta) -> str:
    return " ".join(x for x in (m.gpu_name, m.arch) if x) or "GPU unknown"


def _busy_intervals(kernels: pa.Table) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per input (trace_id) with a timeline: the union of its GPU activity as (starts, ends)."""
    timed = kernels.filter(pc.invert(kernels["aggregate"]))
    tid = timed["trace_id"].to_numpy(zero_copy_only=False)
    start = timed["start_ns"].to_numpy(zero_copy_only=False)
    end = start + timed["dur_ns"].to_numpy(zero_copy_only=False)
    return {int(i): intervals.merge_intervals(start[tid == i], end[tid == i]) for i in np.unique(tid)}


def _overlap_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Nanoseconds during which both unions of disjoint intervals are busy."""
    return sum(intervals.busy_ns(*x) for x in (a, b)) - intervals.busy_ns(
        np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])
    )
