"""The one data flow: paths -> readers -> Trace -> classify -> phases -> roofline -> findings.

``load_inputs`` reads and joins the inputs of one run; ``analyze_trace`` runs every analysis on it
and returns an :class:`Analysis` (the analysed kernels table plus what the summary needs). The CLI
only wires options into these two calls; reporters and the gate consume the result.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from analyzer.model import Trace, concat_traces
from analyzer.readers import expand_inputs


@dataclasses.dataclass
class Options:
    """What a user can set for one analysis (DESIGN §6 shared options)."""

    rules: Sequence[str] = ()
    gpu: str | None = None
    model: str | None = None
    settings: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Analysis:
    """An analysed run: the kernels table with every analysis column, and its context."""

    trace: Trace
    kernels: pa.Table
    steps: pa.Table | None = None
    gpu: dict[str, Any] | None = None
    model: Any = None
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    annotations_found: list[str] = dataclasses.field(default_factory=list)
    rules_sha256: str = ""


ProgressFn = Callable[[str, int, int], None]


def load_inputs(
    paths: Sequence[str],
    progress: ProgressFn | None = None,
    byte_progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
    cache: bool | str | os.PathLike[str] | None = False,
    executor: str = "local",
    scheduler: str | None = None,
) -> Trace:
    """Read every input (directories expand to the traces inside) and join them as one run.

    ``jobs`` processes parse several files at once (default: one per file, at most one per CPU);
    ``cache`` (True: ``$LKM_CACHE_DIR`` or ``~/.cache/llm-kernel-map``; a folder; False: off) keeps
    parsed tables so the same trace is parsed once; ``executor="dask"`` runs the parsing on the Dask
    cluster at ``scheduler`` (a local one without it). See :mod:`analyzer.runtime.pools`.
    """
    from analyzer.runtime.pools import read_traces

    files = expand_inputs(list(paths))
    traces = read_traces(
        files,
        jobs=jobs,
        cache=cache,
        executor=executor,
        scheduler=scheduler,
        progress=progress,
        byte_progress=byte_progress,
    )
    trace = concat_traces(traces) if len(traces) > 1 else traces[0]
    for i, m in enumerate(trace.inputs):
        m.trace_id = i
    return trace


def analyze_trace(trace: Trace, options: Options | None = None, *, keep_host_ops: bool = True) -> Analysis:
    """Run classification, phases, roofline and findings on a loaded trace.

    Host ops are read by classification, phases and the roofline only. With ``keep_host_ops=False``
    (the CLI, which holds no other reference to the trace) ``analysis.trace`` loses them after the
    roofline, so the summary's frames are built without them in memory (~750 MB for a 10 GB trace).
    """
    from analyzer.analyses import classify

    options = options or Options()
    analysis = Analysis(trace=trace, kernels=trace.kernels, warnings=list(trace.warnings))
    analyze_inputs(analysis, options)
    if not keep_host_ops:
        del trace
        analysis.trace = dataclasses.replace(
            analysis.trace, host_ops=analysis.trace.host_ops.schema.empty_table()
        )
        classify.forget_launching_ops()
    finish_run(analysis, options)
    return analysis


def analyze_inputs(analysis: Analysis, options: Options) -> None:
    """The steps whose result for each input depends on that input alone (and on the run's GPU and
    world size): classification, phases and the roofline. They may run on each input apart
    (:mod:`analyzer.runtime.rank_workers`) and be joined."""
    from analyzer.analyses import classify, phases, roofline

    classify.run(analysis, options)
    phases.label(analysis, options)
    roofline.measure(analysis, options)


def finish_run(analysis: Analysis, options: Options) -> None:
    """The steps that need the whole run: its warnings and the findings."""
    from analyzer.analyses import findings, phases, roofline

    analysis.warnings.extend(phases.coverage_warnings(analysis.kernels))
    analysis.warnings.extend(roofline.rate_warnings(analysis))
    findings.run(analysis, options)


def analyze_run(
    paths: Sequence[str],
    options: Options | None = None,
    *,
    progress: ProgressFn | None = None,
    byte_progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
    cache: bool | str | os.PathLike[str] | None = False,
    executor: str = "local",
    scheduler: str | None = None,
) -> Analysis:
    """Load and analyse the inputs of one run, as the CLI does: host ops are dropped once used.

    When the inputs are parsed in worker processes (several files: ranks of a run, see
    :func:`load_inputs`), each worker also runs :func:`analyze_inputs` on its input, so only the
    joined warnings and findings run here (:mod:`analyzer.runtime.rank_workers`); the result equals that of
    ``analyze_trace(load_inputs(...), keep_host_ops=False)``.
    """
    from analyzer.runtime import background, rank_workers

    options = options or Options()
    files = list(paths)
    joined = rank_workers.analyze_parts(
        files, options, jobs=jobs, cache=cache, executor=executor, scheduler=scheduler, progress=progress
    )
    if joined is not None:
        finish_run(joined, options)
        return joined
    # a cache entry is written beside the classification (analyzer.runtime.background)
    with background.deferred():
        # no local name for the trace: the analysis may then free its host ops once they are used
        return analyze_trace(
            load_inputs(
                files,
                progress=progress,
                byte_progress=byte_progress,
                jobs=jobs,
                cache=cache,
                executor=executor,
                scheduler=scheduler,
            ),
            options,
            keep_host_ops=False,
        )


def analyze_paths(
    paths: Sequence[str], options: Options | None = None, progress: ProgressFn | None = None
) -> Analysis:
    return analyze_trace(load_inputs(paths, progress), options)
