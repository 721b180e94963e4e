"""The one analysis path: load the inputs of a run (processes, pools, the parsed-trace cache) and
run :mod:`analyzer.pipeline`'s ordered analyses on them.

The CLI, the Python API and the tests all call :func:`analyze`. How the work is spread (local
processes or Dask, the cache, what memory is kept) is the :class:`RunPolicy`; it never changes
what is computed: :func:`analyze` gives what ``pipeline.analyze_trace(load_inputs(paths))`` gives.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

from analyzer.errors import InputError
from analyzer.model import Trace, concat_traces
from analyzer.pipeline import Analysis, Context, Options, analyze_trace, as_context, finish_run
from analyzer.readers import expand_inputs
from analyzer.runtime import background, rank_workers
from analyzer.runtime.joining import one_run_problem
from analyzer.runtime.loading import read_traces
from analyzer.runtime.pools import ProgressFn


@dataclasses.dataclass(frozen=True)
class RunPolicy:
    """How a run is loaded: never what it computes.

    ``jobs`` processes parse several files at once (default: one per file, at most one per CPU);
    ``cache`` (True: ``$LKM_CACHE_DIR`` or ``~/.cache/llm-kernel-map``; a folder; False: off) keeps
    parsed tables so the same trace is parsed once; ``executor="dask"`` runs the parsing on the Dask
    cluster at ``scheduler`` (a local one without it). ``keep_host_ops=False`` lets the analysis
    drop the host ops once the per-input steps have read them (the CLI: nothing else needs them).
    ``progress(path, i, n)`` and ``byte_progress(done, total)`` report reading.
    """

    jobs: int | None = None
    cache: bool | str | os.PathLike[str] | None = False
    executor: str = "local"
    scheduler: str | None = None
    keep_host_ops: bool = False
    progress: ProgressFn | None = None
    byte_progress: Callable[[int, int], None] | None = None


def load_inputs(paths: Sequence[str], policy: RunPolicy | None = None) -> Trace:
    """Read every input (directories expand to the traces inside) and join them as one run."""
    policy = policy or RunPolicy()
    files = expand_inputs(list(paths))
    traces = read_traces(
        files,
        jobs=policy.jobs,
        cache=policy.cache,
        executor=policy.executor,
        scheduler=policy.scheduler,
        progress=policy.progress,
        byte_progress=policy.byte_progress,
    )
    trace = concat_traces(traces) if len(traces) > 1 else traces[0]
    for i, m in enumerate(trace.inputs):
        m.trace_id = i
    check_one_run(trace)
    return trace


def check_one_run(trace: Trace) -> None:
    """InputError (exit 2) when the inputs cannot be one run: analyse them apart instead."""
    problem = one_run_problem(trace)
    if problem is not None:
        raise InputError(f"not one run: {problem}; analyse them side by side with --compare")


def analyze(
    paths: Sequence[str], options: Options | Context | None = None, policy: RunPolicy | None = None
) -> Analysis:
    """Load and analyse the inputs of one run.

    When the inputs are parsed in worker processes (several files: ranks of a run), each worker also
    runs the per-input analyses on its input, so only the run steps run here
    (:mod:`analyzer.runtime.rank_workers`); the result is the same.
    """
    policy = policy or RunPolicy()
    context = as_context(options)  # bad options fail before any trace is read
    files = list(paths)
    if not policy.keep_host_ops:
        joined = rank_workers.analyze_parts(
            files,
            context,
            jobs=policy.jobs,
            cache=policy.cache,
            executor=policy.executor,
            scheduler=policy.scheduler,
            progress=policy.progress,
        )
        if joined is not None:
            check_one_run(joined.trace)
            return finish_run(joined, context)
    # a cache entry is written beside the classification (analyzer.runtime.background)
    with background.deferred():
        # no local name for the trace: the analysis may then free its host ops once they are used
        return analyze_trace(load_inputs(files, policy), context, keep_host_ops=policy.keep_host_ops)
