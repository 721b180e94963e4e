"""The Python API: the CLI's operations as functions on values, for notebooks and engine scripts.

Contract: :func:`analyze` takes the one analysis path the CLI takes
(:func:`analyzer.runtime.driver.analyze`), so its numbers are the CLI's; nothing here prints, exits
or keeps state between calls. Bad input raises :class:`analyzer.InputError`, bad usage
:class:`analyzer.UsageError` (each with the ``exit_code`` the CLI would return). Off the main
thread no worker process is forked: inputs are read in the calling thread.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from analyzer import regressions as gate_mod
from analyzer.errors import InputError, UsageError, api_keywords
from analyzer.options import Options
from analyzer.output import write_report
from analyzer.pipeline import Analysis
from analyzer.report.html import HtmlReporter
from analyzer.report.tables import ParquetReporter
from analyzer.results.baseline import TOP_SHARE, build_baseline, check_baseline
from analyzer.results.compare import compare_summaries
from analyzer.results.summary import build_summary
from analyzer.runtime.driver import RunPolicy
from analyzer.runtime.driver import analyze as analyze_run

__all__ = ["Result", "analyze", "compare", "gate"]

PathLike = str | os.PathLike[str]
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


@dataclasses.dataclass(frozen=True, eq=False)
class Result:
    """One analysed run. ``kernels`` (README.md's "Output columns", Arrow-backed pandas dtypes), ``steps``,
    ``summary`` (the dict ``analyze --json`` writes) and ``findings`` are built on first use."""

    analysis: Analysis

    def __repr__(self) -> str:
        """One line: the inputs, the GPU and the size of the run (not the tables)."""
        a = self.analysis
        paths = [m.path for m in a.trace.inputs]
        shown = ", ".join(repr(p) for p in paths[:3]) + (
            f", ... ({len(paths)} inputs)" if len(paths) > 3 else ""
        )
        gpu = (a.gpu or {}).get("name") or next((m.gpu_name for m in a.trace.inputs if m.gpu_name), None)
        steps = 0 if a.steps is None else len(a.steps)
        return (
            f"<Result [{shown}] gpu={gpu!r} kernels={a.kernels.num_rows:,} steps={steps} "
            f"findings={len(a.findings)}>"
        )

    @functools.cached_property
    def kernels(self) -> pd.DataFrame:
        """One row per GPU activity with every analysis column."""
        return self.analysis.kernels.to_pandas(types_mapper=pd.ArrowDtype)

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        """One row per step (phase, start, duration, tokens, rank ...); empty when none was found."""
        st = self.analysis.steps
        return st.copy() if st is not None else pd.DataFrame()

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        """The versioned summary (README.md, "Output columns"), as ``analyze --json`` writes it."""
        return orjson.loads(orjson.dumps(build_summary(self.analysis), option=_JSON_OPTIONS))

    @property
    def findings(self) -> list[dict[str, Any]]:
        """The findings, most severe first (each with id, severity, phase, title, evidence ...)."""
        return self.summary["findings"]

    def phase_profile(self, phase: str) -> pd.DataFrame:
        """The profile template of one phase (category, label, time, share, bound) as a frame."""
        p = self.summary["phases"].get(phase)
        return pd.DataFrame(
            p["profile"] if p else [], columns=["category", "label", "time_ns", "share", "bound"]
        )

    def to_html(self, path: PathLike, *, cdn: bool = False) -> Path:
        """Write the self-contained HTML report (``report -o``) and return its path."""
        write_report(HtmlReporter(self.analysis.kernels, cdn=cdn), self.summary, path)
        return Path(path)

    def to_parquet(self, path: PathLike) -> Path:
        """Write the kernels table (``export -o x.parquet``) and return its path."""
        write_report(ParquetReporter(), self.analysis.kernels, path)
        return Path(path)

    def baseline(self, top_share: float = TOP_SHARE) -> dict[str, Any]:
        """What ``baseline -o`` saves for the gate."""
        return build_baseline(self.analysis, top_share)


def analyze(
    paths: PathLike | Sequence[PathLike],
    *,
    rules: Sequence[PathLike] | None = None,
    gpu: str | None = None,
    model: str | None = None,
    settings: Mapping[str, Any] | None = None,
    cache: bool | PathLike = False,
    jobs: int | None = None,
) -> Result:
    """Analyse the trace(s) at ``paths`` as one run, as ``lkm analyze`` does.

    Args:
        paths: a trace file or folder, or several (the ranks of one run; prefill and decode traces).
        rules: extra rule files, matched before the built-in table (``--rules``).
        gpu: the GPU to assume instead of detecting it (``--gpu``).
        model: a HF ``config.json`` or built-in architecture name (``--model``).
        settings: finding thresholds, ``{"decode_gpu_idle.max_idle": 0.9}`` (``--set``).
        cache: keep parsed tables (True: the default folder; a folder; False: off).
        jobs: processes parsing the inputs (main thread only; default: one per input).
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise UsageError("analyze: no trace given")
    options = Options(
        rules=[str(r) for r in rules or ()],
        gpu=gpu,
        model=model,
        settings={str(k): str(v) for k, v in (settings or {}).items()},
    )
    on_main = threading.current_thread() is threading.main_thread()
    policy = RunPolicy(jobs=jobs if on_main else 1, cache=cache)
    with api_keywords():  # errors name gpu=, settings[...], not the CLI's --gpu, --set
        return Result(analyze_run([str(p) for p in items], options, policy))


def compare(results: Sequence[Result]) -> dict[str, Any]:
    """The side-by-side comparison ``analyze --compare`` prints, of two or more results."""
    if len(results) < 2:
        raise UsageError("compare: give at least two results")
    return compare_summaries([r.summary for r in results])


def gate(
    baseline: Result | Mapping[str, Any] | PathLike,
    candidate: Result | Mapping[str, Any],
    thresholds: gate_mod.Thresholds | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Compare ``candidate`` with ``baseline`` as ``lkm gate`` does: the gate result its reports
    render (``status`` "pass" or "fail", ``failed``, ``failures`` ...). ``baseline``: a result, a
    baseline dict, or a saved ``baseline.json``; ``thresholds``: :class:`analyzer.regressions.Thresholds`
    or a ``[tool.llm-kernel-map.gate]`` table (``threshold``, ``min_delta_us`` ...).
    :class:`analyzer.regressions.NotComparableError` (an InputError) when the runs cannot be compared."""
    t = thresholds if isinstance(thresholds, gate_mod.Thresholds) else gate_mod.make_thresholds(thresholds)
    return gate_mod.compare(_baseline_of(baseline, "baseline"), _baseline_of(candidate, "candidate"), t)


def _baseline_of(side: Result | Mapping[str, Any] | PathLike, label: str) -> dict[str, Any]:
    if isinstance(side, Result):
        return side.baseline()
    if isinstance(side, Mapping):
        return check_baseline(dict(side), label)
    path = Path(side)
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    except orjson.JSONDecodeError as e:
        raise InputError(f"{path}: not a baseline (invalid JSON: {e})") from None
    return check_baseline(data, str(path))
