"""Where the per-trace work (read + parse) runs: this process, a pool of local processes, or Dask.

Contract: :func:`read_traces` returns one validated :class:`Trace` per file, in the order given, equal
to ``[read_trace(f) for f in files]`` whichever executor runs it. Tables never cross a process
boundary as pickles: workers get path strings and hand back either the folder of a cache entry they
wrote (Parquet + JSON, read back here) or the tables as Arrow IPC bytes.

* ``local`` with one file, ``jobs=1``, or (``jobs`` not given) less than :data:`POOL_MIN_BYTES` to
  parse: read here, one file after the other, through the cache when one is given;
* ``local`` otherwise: a ``ProcessPoolExecutor`` (``forkserver`` where the platform has it, else
  ``spawn``) of ``jobs`` processes; each parses one file into the cache folder, or into a scratch
  folder removed afterwards when caching is off;
* ``dask``: the same per-file task on a ``dask.distributed`` cluster (``scheduler`` address, or a
  ``LocalCluster`` of ``jobs`` processes). With a cache folder the workers write the entries there
  (a folder the workers and this process share); otherwise, or when this process cannot see the
  folder a worker wrote, the worker sends the tables as Arrow IPC bytes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from analyzer.errors import InputError, UsageError
from analyzer.model import InputMeta, Trace, ipc_bytes, ipc_table
from analyzer.runtime import cache as cache_mod
from analyzer.runtime.chunked_kineto import can_fork

EXECUTORS = ("local", "dask")
POOL_MIN_BYTES = 64 << 20
ProgressFn = Callable[[str, int, int], None]


def default_jobs(n_files: int) -> int:
    """One process per file, at most one per CPU."""
    return max(1, min(n_files, os.cpu_count() or 1))


def read_traces(
    files: Sequence[str | os.PathLike[str]],
    *,
    jobs: int | None = None,
    cache: bool | str | os.PathLike[str] | None = False,
    executor: str = "local",
    scheduler: str | None = None,
    progress: ProgressFn | None = None,
    byte_progress: Callable[[int, int], None] | None = None,
) -> list[Trace]:
    """Read every file (see the module contract); ``cache``: True for the default folder, a folder, or off."""
    check_settings(executor, jobs, scheduler)
    cache_dir = cache_mod.resolve_dir(cache)
    paths = [str(f) for f in files]
    if executor == "dask":
        return _read_dask(paths, cache_dir, scheduler, jobs, progress)
    jobs = pool_jobs(paths, jobs)
    if jobs > 1:
        try:
            return _read_pool(paths, cache_dir, jobs, progress)
        except BrokenProcessPool:
            pass  # a worker died (killed for memory?): read one file at a time here instead
    out = []
    for i, p in enumerate(paths):
        if progress:
            progress(p, i, len(paths))
        out.append(cache_mod.load_trace(p, cache_dir, byte_progress))
    return out


def check_settings(executor: str, jobs: int | None, scheduler: str | None) -> None:
    """UsageError for an unknown executor, fewer than one job, or a scheduler without Dask."""
    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
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


# --------------------------------------------------------------------------------------- local pool


def _start_method() -> str:
    """fork where this process runs no other thread (the CLI): the workers start at once with every
    module imported (a fresh interpreter spends ~1 s importing pandas and pyarrow, on each worker).
    A process with threads (a notebook, a Dask client) must not be forked: a lock another thread
    holds would stay locked in the child; there forkserver/spawn start clean workers."""
    from analyzer.runtime import background

    background.wait()  # our own threads are done before anything forks
    if can_fork() and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _read_pool(
    paths: list[str], cache_dir: Path | None, jobs: int, progress: ProgressFn | None
) -> list[Trace]:
    with tempfile.TemporaryDirectory(prefix="lkm-parse-") as scratch:
        target = str(cache_dir) if cache_dir is not None else scratch
        lookup = cache_dir is not None
        results = pool_map(cache_mod.parse_into, [(p, target, lookup) for p in paths], paths, jobs, progress)
        return [_collect(p, r, cache_dir) for p, r in zip(paths, results, strict=True)]


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
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_one_reader_process) as pool:
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


def _one_reader_process() -> None:
    """Pool workers already run one per CPU: each parses its file without workers of its own."""
    from analyzer.runtime import chunked_kineto

    os.environ[chunked_kineto.ENV_JOBS] = "1"


def _collect(path: str, result: tuple[str, str] | None, cache_dir: Path | None) -> Trace:
    """The trace a worker parsed, loaded from the entry it names (or read here when it could not)."""
    status, value = result or ("direct", "")
    if status == "error":
        raise InputError(value)
    if status == "entry":
        # The worker checked the key moments ago; loading validates the tables again.
        trace = cache_mod.read_entry(value, None, path)
        if trace is not None:
            return trace
    return cache_mod.load_trace(path, cache_dir)


# --------------------------------------------------------------------------------------- dask


def _read_dask(
    paths: list[str],
    cache_dir: Path | None,
    scheduler: str | None,
    jobs: int | None,
    progress: ProgressFn | None,
) -> list[Trace]:
    with dask_client(scheduler, jobs or default_jobs(len(paths))) as client:
        if cache_dir is not None:
            futures = [client.submit(dask_parse, p, str(cache_dir), pure=False) for p in paths]
        else:
            futures = [client.submit(dask_tables, p, None, pure=False) for p in paths]
        results = dask_gather(futures, paths, progress)
        out = []
        for p, r in zip(paths, results, strict=True):
            trace = _from_dask(p, r)
            if trace is None:
                # The worker's entry is not visible here (no shared folder): have the tables sent.
                trace = _from_dask(p, client.submit(dask_tables, p, str(cache_dir), pure=False).result())
            assert trace is not None
            out.append(trace)
        return out


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


def dask_parse(path: str, cache_dir: str) -> tuple[str, str]:
    """Dask task: parse ``path`` into the shared cache folder (see :func:`analyzer.runtime.cache.parse_into`)."""
    return cache_mod.parse_into(path, cache_dir, lookup=True)


def dask_tables(path: str, cache_dir: str | None) -> tuple[str, Any]:
    """Dask task: the parsed trace as Arrow IPC bytes and JSON, or ("error", message)."""
    from analyzer.errors import AnalyzerError

    try:
        trace = cache_mod.load_trace(path, Path(cache_dir) if cache_dir else None)
    except AnalyzerError as e:
        return "error", str(e)
    return "tables", to_ipc(trace)


def _from_dask(path: str, result: tuple[str, Any]) -> Trace | None:
    status, value = result
    if status == "error":
        raise InputError(value)
    if status == "tables":
        return from_ipc(value)
    if status == "entry" and Path(value).is_dir():
        return cache_mod.read_entry(value, None, path)
    return None


def to_ipc(trace: Trace) -> dict[str, bytes | str]:
    """A trace as Arrow IPC stream bytes per table plus its metadata as JSON (no pickle)."""
    out: dict[str, bytes | str] = {}
    for name in cache_mod.TABLES:
        out[name] = ipc_bytes(getattr(trace, name))
    out["meta"] = json.dumps({"inputs": [m.to_dict() for m in trace.inputs], "warnings": trace.warnings})
    return out


def from_ipc(data: dict[str, Any]) -> Trace:
    tables = {name: ipc_table(data[name]).combine_chunks() for name in cache_mod.TABLES}
    meta = json.loads(data["meta"])
    trace = Trace(
        tables["kernels"],
        tables["host_ops"],
        tables["annotations"],
        [InputMeta(**m) for m in meta["inputs"]],
        list(meta["warnings"]),
    )
    trace.validate()
    return trace
