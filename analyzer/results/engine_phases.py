"""Phases of engine traces without their annotations, scored against the annotations they had.

Contract: :func:`engine_phase_agreement` analyses one trace twice: as it is (its engine step
annotations decide the phases: the truth) and with every annotation removed except ``ProfilerStep#``
(CPU and GPU copies: what an nsys / rocprof capture or a plain profiler run around the engine
gives). Over the kernels whose annotated phase is known, it returns the kernel-time shares where the
unannotated phase agrees, is ``unknown`` (undecided) and is another phase (wrong); the three sum to 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.model import Trace
from analyzer.pipeline import analyze_trace

__all__ = ["OUTER_BOUND", "engine_phase_agreement", "without_annotations"]

OUTER_BOUND = "ProfilerStep#"


def without_annotations(trace: Trace) -> Trace:
    """``trace`` with every annotation removed but the profiler's outer ``ProfilerStep#`` ranges."""
    ann = trace.annotations
    keep = pc.fill_null(pc.starts_with(ann["name"], OUTER_BOUND), False)
    return dataclasses.replace(trace, annotations=ann.filter(keep))


def _phases(kernels: pa.Table) -> np.ndarray:
    return np.asarray(kernels["phase"].combine_chunks().cast(pa.string()).to_pylist(), object)


def engine_phase_agreement(trace: Trace, options: Any = None) -> dict[str, Any]:
    """The scores of one trace (module docstring), with the steps found and their phase rules."""
    truth_run = analyze_trace(trace, options)
    bare_run = analyze_trace(without_annotations(trace), options)
    truth, got = _phases(truth_run.kernels), _phases(bare_run.kernels)
    dur = truth_run.kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.float64)
    known = truth != "unknown"
    total = float(dur[known].sum())

    def share(mask: np.ndarray) -> float | None:
        return round(float(dur[known & mask].sum()) / total, 6) if total > 0 else None

    steps = bare_run.steps
    rules: Sequence[str] = steps["phase_rule"].tolist() if steps is not None and len(steps) else []
    return {
        "engines": truth_run.annotations_found,
        "truth_steps": int(len(truth_run.steps)) if truth_run.steps is not None else 0,
        "steps": int(len(steps)) if steps is not None else 0,
        "agreement": share(got == truth),
        "undecided": share(got == "unknown"),
        "wrong": share((got != truth) & (got != "unknown")),
        "phase_rules": sorted(set(rules)),
        "truth_phases": sorted(set(truth[known].tolist())),
        "phases": sorted(set(got.tolist())),
    }
