"""Where the per-trace work (read + parse) runs: this process, a pool of local processes, or Dask.

Contract: :func:`read_traces` returns one validated :class:`Trace` per file, in the order given, equal
to ``[read_trace(f) for f in files]`` whichever executor runs it. Tables never cross a process
boundary as pickles: workers get path strings and hand back either the folder of a cache entry they
wrote (Parquet + JSON, read back here) or the tables as Arrow IPC bytes.

* ``local`` with one file, ``jobs=1``, or (``jobs`` not given) less than
  :data:`analyzer.runtime.pools.POOL_MIN_BYTES` to parse: read here, one file after the other,
  through the cache when one is given;
* ``local`` otherwise: a pool of ``jobs`` processes (:func:`analyzer.runtime.pools.pool_map`); each
  parses one file into the cache folder, or into a scratch folder removed afterwards when caching
  is off;
* ``dask``: the same per-file task on a ``dask.distributed`` cluster (``scheduler`` address, or a
  ``LocalCluster`` of ``jobs`` processes). With a cache folder the workers write the entries there
  (a folder the workers and this process share); otherwise, or when this process cannot see the
  folder a worker wrote, the worker sends the tables as Arrow IPC bytes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from analyzer.errors import AnalyzerError, InputError
from analyzer.model import InputMeta, Trace, ipc_bytes, ipc_table
from analyzer.runtime import cache as cache_mod
from analyzer.runtime import pools
from analyzer.runtime.pools import ProgressFn


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
    pools.check_settings(executor, jobs, scheduler)
    cache_dir = cache_mod.resolve_dir(cache)
    paths = [str(f) for f in files]
    if executor == "dask":
        return _read_dask(paths, cache_dir, scheduler, jobs, progress)
    jobs = pools.pool_jobs(paths, jobs)
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


def _read_pool(
    paths: list[str], cache_dir: Path | None, jobs: int, progress: ProgressFn | None
) -> list[Trace]:
    with tempfile.TemporaryDirectory(prefix="lkm-parse-") as scratch:
        target = str(cache_dir) if cache_dir is not None else scratch
        lookup = cache_dir is not None
        results = pools.pool_map(
            cache_mod.parse_into, [(p, target, lookup) for p in paths], paths, jobs, progress
        )
        return [_collect(p, r, cache_dir) for p, r in zip(paths, results, strict=True)]


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
    with pools.dask_client(scheduler, jobs or pools.default_jobs(len(paths))) as client:
        if cache_dir is not None:
            futures = [client.submit(dask_parse, p, str(cache_dir), pure=False) for p in paths]
        else:
            futures = [client.submit(dask_tables, p, None, pure=False) for p in paths]
        results = pools.dask_gather(futures, paths, progress)
        out = []
        for p, r in zip(paths, results, strict=True):
            trace = _from_dask(p, r)
            if trace is None:
                # The worker's entry is not visible here (no shared folder): have the tables sent.
                trace = _from_dask(p, client.submit(dask_tables, p, str(cache_dir), pure=False).result())
            assert trace is not None
            out.append(trace)
        return out


def dask_parse(path: str, cache_dir: str) -> tuple[str, str]:
    """Dask task: parse ``path`` into the shared cache folder (see :func:`analyzer.runtime.cache.parse_into`)."""
    return cache_mod.parse_into(path, cache_dir, lookup=True)


def dask_tables(path: str, cache_dir: str | None) -> tuple[str, Any]:
    """Dask task: the parsed trace as Arrow IPC bytes and JSON, or ("error", message)."""
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
