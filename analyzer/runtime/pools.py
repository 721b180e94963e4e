"""Where processes start: the local process pools and the Dask clients of the runtime.

Both local pools start here: the file-level workers that parse (and analyse) one input each
(:func:`pool_map`, used by :mod:`analyzer.runtime.loading` and :mod:`analyzer.runtime.rank_workers`)
and the chunk workers that parse one big Kineto file together (:func:`chunk_pool`, used by
:mod:`analyzer.runtime.chunked_kineto`). This module decides how they start (:func:`can_fork`,
:func:`start_method`), joins this process's background threads before anything forks, and sets up
each worker (:func:`init_chunk_worker`, :func:`init_reader_worker`): the garbage collector, the
Arrow memory pool, how many processes a worker may start itself.

* file-level workers are forked where this process runs no other thread (the CLI), else started by
  ``forkserver`` (or ``spawn``); they are worth starting only for :data:`POOL_MIN_BYTES` of input;
* chunk workers are always forked (:func:`can_fork`; elsewhere the file is read in this process);
* ``dask``: :func:`dask_client` connects to a scheduler or starts a ``LocalCluster``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import pyarrow as pa

from analyzer.errors import UsageError, option_name
from analyzer.runtime import background, memory

EXECUTORS = ("local", "dask")
POOL_MIN_BYTES = 64 << 20
ENV_JOBS = "LKM_READ_JOBS"  # processes that parse one Kineto file (analyzer.runtime.chunked_kineto)
ProgressFn = Callable[[str, int, int], None]


def default_jobs(n_files: int) -> int:
    """One process per file, at most one per CPU."""
    return max(1, min(n_files, os.cpu_count() or 1))


def check_settings(executor: str, jobs: int | None, scheduler: str | None) -> None:
    """UsageError for an unknown executor, fewer than one job, or a scheduler without Dask."""
    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")
    if jobs is not None and jobs < 1:
        raise UsageError(f"{option_name('jobs')} must be at least 1, got {jobs}")
    if scheduler and executor != "dask":
        raise UsageError("--scheduler needs --executor dask")


def plan_jobs(paths: Sequence[str], jobs: int | None) -> int:
    """Processes to use: ``jobs`` when given, else one per file (at most one per CPU), but only when
    the files hold at least :data:`POOL_MIN_BYTES`: a fresh worker costs a second or two of imports
    and warm-up, more than parsing a small trace here."""
    if jobs is not None:
        return max(1, min(jobs, len(paths)))
    if sum(_size(p) for p in paths) < POOL_MIN_BYTES:
        return 1
    return default_jobs(len(paths))


def _size(p: str) -> int:
    """Bytes to parse, roughly: gzip traces inflate about tenfold."""
    try:
        size = os.stat(p).st_size
    except OSError:
        return 0
    return size * 8 if p.lower().endswith(".gz") else size


def _workers_can_start() -> bool:
    # spawn/forkserver workers re-import the main script; input piped to python (<stdin>) has none.
    if _start_method() == "fork":
        return True
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return main_file is None or os.path.exists(main_file)


# --------------------------------------------------------------------------------------- start


def can_fork() -> bool:
    # Workers are forked: they start at once and import nothing. Where fork is unsafe or missing
    # (macOS, Windows) a fresh interpreter would re-import the caller's main script, which a script
    # without a ``__main__`` guard cannot survive: there the file is read in this process.
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def _start_method() -> str:
    """How file-level workers start: fork where this process runs no other thread (the CLI): the
    workers start at once with every module imported (a fresh interpreter imports pandas and pyarrow
    again, on each worker). A process with threads (a notebook, a Dask client) must not be forked: a
    lock another thread holds would stay locked in the child; there forkserver/spawn start clean
    workers."""
    background.wait()  # our own threads are done before anything forks
    if can_fork() and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def chunk_pool(jobs: int) -> ProcessPoolExecutor:
    """A pool of ``jobs`` forked chunk workers (callers check :func:`can_fork` first). Our own
    threads are done first: a fork must not copy a thread in the middle of its work."""
    background.wait()  # no thread of ours is mid-work when the workers are forked
    return ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("fork"), initializer=init_chunk_worker
    )


def init_chunk_worker() -> None:
    gc.disable()  # decoding allocates millions of acyclic objects
    worker_memory_pool()


def worker_memory_pool() -> None:
    """Arrow allocations of a chunk worker from jemalloc, which keeps freed pages for reuse a while.

    A forked worker inherits this process's mimalloc setting (``analyzer.runtime.memory``). Where that hands
    freed pages back at once, the inputs are big and memory comes first: the worker keeps it. Else
    jemalloc spares the worker faulting each chunk's pages in again (docs/performance.md); a worker holds one chunk's tables at a time, so what it keeps is small."""
    if memory.tight():
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:
        pass  # a pyarrow built without jemalloc keeps its default pool


def pool_map(
    fn: Callable[..., Any],
    args: Sequence[tuple[Any, ...]],
    labels: Sequence[str],
    jobs: int,
    progress: ProgressFn | None,
) -> list[Any]:
    """``[fn(*a) for a in args]`` in a pool of ``jobs`` fresh processes, in order; ``progress``
    hears of each as it completes. Raises ``BrokenProcessPool`` when a worker dies."""
    ctx = multiprocessing.get_context(_start_method())
    results: list[Any] = [None] * len(args)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=init_reader_worker) as pool:
        futures = {pool.submit(fn, *a): i for i, a in enumerate(args)}
        try:
            for done, fut in enumerate(as_completed(futures)):
                i = futures[fut]
                results[i] = fut.result()
                if progress:
                    progress(labels[i], done, len(args))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results


def pool_jobs(paths: Sequence[str], jobs: int | None) -> int:
    """Processes a local pool would use for ``paths`` (see :func:`plan_jobs`); 1: read here."""
    n = plan_jobs(paths, jobs)
    return n if n > 1 and _workers_can_start() else 1


def init_reader_worker() -> None:
    """Pool workers already run one per CPU: each parses its file without workers of its own."""
    os.environ[ENV_JOBS] = "1"


# --------------------------------------------------------------------------------------- dask


def dask_gather(futures: Sequence[Any], labels: Sequence[str], progress: ProgressFn | None) -> list[Any]:
    """The results of Dask ``futures`` in order; ``progress`` hears of each as it completes."""
    from dask.distributed import as_completed as dask_completed

    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    for done, fut in enumerate(dask_completed(futures)):
        i = index[fut.key]
        results[i] = fut.result()
        if progress:
            progress(labels[i], done, len(futures))
    return results


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: int, timeout: str = "30s") -> Iterator[Any]:
    """A ``dask.distributed`` client of the scheduler at ``scheduler``, else of a local cluster."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise UsageError(
            "--executor dask needs dask.distributed: pip install 'llm-kernel-map[dask]'"
        ) from None
    if scheduler:
        try:
            client = Client(scheduler, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler} ({e})") from None
        with client:
            yield client
        return
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client
