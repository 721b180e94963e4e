"""Parse one big Kineto trace in several processes: the ``traceEvents`` array is cut into byte ranges at
event boundaries, each worker decodes its ranges into Arrow tables, and this process joins them.

Contract: :func:`stream` feeds a builder exactly the tables the sequential reader would (in file
order) and returns the top-level metadata object, or raises :class:`Fallback` when it cannot be sure
of that: a cut that lands inside a string or a nested object, corrupt JSON, an odd layout. The
caller then reads the file sequentially, which reports bad input precisely. Nothing is pickled but
ranges and paths one way and Arrow IPC bytes the other.

* plain files: workers read their own ranges (``pread``), this process only probes for the cuts and
  hashes the file in a thread (inside ``background.deferred()`` a thread started once the workers
  are done does, beside the post-processing and the analysis);
* gzip: this process decompresses (and hashes the compressed bytes); each chunk goes into an
  in-memory file the workers read like a plain file's range (nothing big crosses a pipe or a disk).

A cut is a ``}`` ``,`` ``{`` sequence found near each multiple of ``chunk_bytes``. If it lies
inside a string or a nested object, the text before it does not close as an array, so the worker's
decode fails and the whole file goes the sequential way: a wrong cut never yields wrong tables.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from analyzer import readers
from analyzer.errors import InputError
from analyzer.model import ipc_bytes
from analyzer.readers import gz as gzip_stream
from analyzer.readers.kineto_events import chunk_tables
from analyzer.readers.kineto_scan import BOUNDARY, DECODER, decode_last, find_events, open_trace
from analyzer.runtime import pools
from analyzer.runtime.pools import ENV_JOBS, can_fork

MIN_BYTES = 48 << 20  # smaller traces: starting workers costs more than it saves
CHUNK_BYTES = 16 << 20
PROBE_BYTES = 1 << 20
BATCH_BYTES = 32 << 20  # the workers' tables are joined this many bytes at a time (_Batches)


class Fallback(Exception):
    """The parallel path cannot vouch for this file: read it sequentially."""


def jobs_for(size: int) -> int:
    """Worker processes for a trace of ``size`` bytes (1: read it here)."""
    env = os.environ.get(ENV_JOBS)
    if env is not None:
        try:
            want = int(env)
        except ValueError:
            want = 1
    else:
        want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if size < MIN_BYTES:
            return 1
    if want < 2 or multiprocessing.current_process().daemon or not can_fork() or not _on_main_thread():
        return 1
    return want


def _on_main_thread() -> bool:
    # the chunk workers are forked; a process is forked only from its main thread (a notebook or an
    # engine calling the API from a thread of its own reads the file in that thread instead)
    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------------------------------- this process


def read_events(
    path: Path,
    gz: bool,
    add: Callable[[pa.Table | None, pa.Table | None, pa.Table | None], None],
    progress: Callable[[int], None] | None = None,
    *,
    hash_now: bool = True,
) -> tuple[bytes | None, bytes, str] | None:
    """The reader's ``ReadPolicy.parallel_events``: parse a big trace with :func:`jobs_for` workers
    (:func:`stream`); None when it is better read in the calling process (small, no ``fork``), or
    when the workers could not parse it (then the sequential reader gives the same tables, or the
    precise error). ``hash_now=False``: the sha256 is left to the caller (returned as "")."""
    size = path.stat().st_size * (8 if gz else 1)  # gzip traces inflate about tenfold
    jobs = jobs_for(size)
    if jobs < 2:
        return None
    try:
        return stream(path, gz, add, jobs, progress, CHUNK_BYTES, hash_now=hash_now)
    except (Fallback, InputError):
        return None


def stream(
    path: Path,
    gz: bool,
    add: Callable[[pa.Table | None, pa.Table | None, pa.Table | None], None],
    jobs: int,
    progress: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    *,
    hash_now: bool = True,
) -> tuple[bytes | None, bytes, str]:
    """Parse ``path`` with ``jobs`` workers; return (prefix, tail, sha256 or "") of the top-level object.

    ``add`` receives the tables in file order, each kind a few chunks' rows at a time
    (:class:`_Batches`). A plain file is hashed beside the workers
    unless not ``hash_now`` (then the sha256 is ""); a gzip file is always hashed as it is
    decompressed here.
    """
    pending: list[tuple[Future[Any], int, tuple[str, int, int]]] = []
    head: bytes | None = None
    last: tuple[Future[Any], int, tuple[str, int, int]] | None = None
    sha = ""
    pool = pools.chunk_pool(jobs)  # joins our background threads first
    files = _Memfds()  # gzip: the decompressed chunks, kept until their workers are done
    batches = _Batches(add)
    add = batches.add

    def collect(item: tuple[Future[Any], int, tuple[str, int, int]]) -> bytes:
        tail = _collect(item[:2], add, progress)
        if gz:
            files.release(item[2])
        return tail

    try:
        # fork every worker now, before the hashing thread starts: a fork copies no other thread
        pool.submit(pools.init_chunk_worker).result()
        if gz:
            pieces = _gzip_pieces(path, find_events, chunk_bytes, files)
        else:
            # hashing competes with the workers for the CPU: the policy may leave it for later
            # (analyzer.runtime.read_policy)
            pieces = _file_pieces(path, find_events, chunk_bytes, hash_now=hash_now)
        for kind, value, done in pieces:
            if kind == "prefix":
                head = value
            elif kind == "task":
                pending.append((pool.submit(_work, value), done, value))
                # collect in file order as results arrive; a few chunks in flight at most
                while len(pending) > 2 * jobs + 2 or (pending and pending[0][0].done()):
                    collect(pending.pop(0))
            elif kind == "last":
                last = (pool.submit(_work, value, True), done, value)
            elif kind == "sha":
                sha = value
        while pending:
            collect(pending.pop(0))
        if last is None:
            raise Fallback("no last chunk")
        tail = collect(last)
        batches.flush()
    except BrokenProcessPool:
        raise Fallback("a worker died") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        files.close()
    return head, tail, sha


def _collect(
    item: tuple[Future[Any], int],
    add: Callable[[pa.Table | None, pa.Table | None, pa.Table | None], None],
    progress: Callable[[int], None] | None,
) -> bytes:
    fut, done = item
    status, *payload = fut.result()
    if status != "ok":
        raise Fallback(payload[0])
    add(*(_from_ipc(b) for b in payload[:3]))
    if progress:
        progress(done)
    return payload[3]


class _Batches:
    """Passes the workers' tables on a few megabytes at a time, each kind's chunks joined into one
    table (the same rows in the same order, dictionaries unified as the reader would).

    A chunk's columns are small buffers (a few kB to a few hundred kB) that share the memory pool's
    pages with the other chunks' columns; the reader later frees them column by column, and a page
    goes back to the system only once all of its buffers are free. Joined, each column of a batch is
    one buffer of its own pages, freed whole (docs/performance.md, "third round")."""

    def __init__(self, add: Callable[[pa.Table | None, pa.Table | None, pa.Table | None], None]) -> None:
        self.out = add
        self.pending: tuple[list[pa.Table], ...] = ([], [], [])
        self.size = [0, 0, 0]

    def add(self, *tables: pa.Table | None) -> None:
        for i, t in enumerate(tables):
            if t is not None and t.num_rows:
                self.pending[i].append(t)
                self.size[i] += t.nbytes
                if self.size[i] >= BATCH_BYTES:
                    self._pass(i)

    def flush(self) -> None:
        for i in range(3):
            self._pass(i)

    def _pass(self, i: int) -> None:
        parts = self.pending[i]
        if not parts:
            return
        joined = pa.concat_tables(parts, promote_options="default").unify_dictionaries().combine_chunks()
        parts.clear()
        self.size[i] = 0
        tables: list[pa.Table | None] = [None, None, None]
        tables[i] = joined
        self.out(*tables)


def _file_pieces(
    path: Path,
    find_events: Callable[[bytes], tuple[bytes | None, int] | None],
    chunk: int,
    hash_now: bool = True,
) -> Iterator[tuple[str, Any, int]]:
    """("prefix", text before the array), ("task", (path, start, end)) ..., ("last", bytes), ("sha", hex
    or "" when not ``hash_now``)."""
    size = os.path.getsize(path)
    hasher = _FileHasher(path if hash_now else None)
    hasher.start()
    try:
        with open(path, "rb") as f:
            head = f.read(PROBE_BYTES)
            found = find_events(head)
            if found is None:
                raise Fallback("no traceEvents array near the start")
            prefix, pos = found
            yield "prefix", prefix, 0
            while pos + 2 * chunk < size:
                probe = os.pread(f.fileno(), PROBE_BYTES, pos + chunk)
                m = BOUNDARY.search(probe)
                if m is None:
                    raise Fallback("no event boundary in a probe window")
                cut = pos + chunk + m.start() + 1
                yield "task", (str(path), pos, cut), cut
                pos = pos + chunk + m.end() - 1
            yield "last", (str(path), pos, size), size
    finally:
        hasher.join()
    if hasher.error is not None:
        raise Fallback(f"hashing failed ({hasher.error})")
    yield "sha", hasher.digest, size


class _FileHasher(threading.Thread):
    """The file's sha256 (``readers.file_sha256``) in a thread: hashlib and reads release the GIL."""

    def __init__(self, path: Path | None) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.digest = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        if self.path is None:
            return  # hashed later
        try:
            self.digest = readers.file_sha256(self.path)
        except OSError as e:
            self.error = e


class _Memfds:
    """Decompressed chunks for the workers, each in an in-memory file (``memfd``) they open as
    ``/proc/<this pid>/fd/<n>``. A file is written again once its task is collected, so its pages are
    allocated once: at most a few chunks exist at a time, and nothing goes to disk (a spill file cost
    seconds of system time per GB: docs/performance.md). A chunk is written piece by piece as it is decompressed: no
    buffer of this process holds it whole."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.fds: list[int] = []
        self.fd = -1  # the file being written, and its length so far
        self.size = 0

    def write(self, data: memoryview) -> None:
        """Append ``data`` to the chunk being written (a new one if none is)."""
        self._start()
        done = 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], self.size + done)
        self.size += done

    def task(self) -> tuple[str, int, int]:
        """The chunk written so far as a task range (path, 0, size); the next write starts another."""
        self._start()
        task = (f"/proc/{os.getpid()}/fd/{self.fd}", 0, self.size)
        self.fd, self.size = -1, 0
        return task

    def _start(self) -> None:
        """A file for the chunk being written, if it has none yet: a free one, else a new one."""
        if self.fd >= 0:
            return
        if self.free:
            self.fd = self.free.pop()
        else:
            try:
                self.fd = os.memfd_create("lkm-chunk", os.MFD_CLOEXEC)
            except (AttributeError, OSError) as e:
                raise Fallback(f"no in-memory file for a chunk ({e})") from None
            self.fds.append(self.fd)
        self.size = 0

    def release(self, task: tuple[str, int, int]) -> None:
        """The worker of ``task`` is done with its file: it may hold the next chunk."""
        self.free.append(int(task[0].rsplit("/", 1)[1]))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        self.free.clear()
        self.fd, self.size = -1, 0


def _gzip_pieces(
    path: Path, find_events: Callable[[bytes], tuple[bytes | None, int] | None], chunk: int, files: _Memfds
) -> Iterator[tuple[str, Any, int]]:
    """The same pieces for a gzip file: this process decompresses, and each chunk goes to the workers
    in one of ``files``.

    Each decompressed block is written straight into the chunk files, cut at an event boundary once
    a chunk holds ``chunk`` bytes; no cut leaves less than ``chunk`` bytes after it (known from the
    next block, read ahead), so the rest of the top-level object stays in the last chunk, as in
    :func:`_file_pieces`. A boundary split between two blocks is not seen: the cut moves to the
    next one."""
    g, raw = open_trace(path)

    def read() -> bytes:
        try:
            return g.read(chunk)
        except gzip_stream.ERRORS as e:
            raise Fallback(f"gzip: {e}") from None

    try:
        block = read()
        found = find_events(block[:PROBE_BYTES])
        if found is None:
            raise Fallback("no traceEvents array near the start")
        prefix, pos = found
        yield "prefix", prefix, 0
        rx = BOUNDARY
        while block:
            ahead = read()
            view = memoryview(block)
            while True:
                start = pos + max(0, chunk - files.size)  # the chunk being written is full there
                m = rx.search(block, start) if start < len(block) else None
                if m is None or len(block) - m.end() + 1 + len(ahead) < chunk:
                    files.write(view[pos:])
                    break
                files.write(view[pos : m.start() + 1])
                yield "task", files.task(), raw.tell()
                pos = m.end() - 1
            view.release()
            block, pos = ahead, 0
        yield "last", files.task(), raw.tell()
        while raw.readinto(bytearray(1 << 20)):  # bytes after the gzip stream, if any
            pass
        yield "sha", raw.sha.hexdigest(), raw.tell()
    finally:
        g.close()
        raw.close()


def _from_ipc(data: bytes | None) -> pa.Table | None:
    """The table in ``data``, copied into Arrow's memory pool: the ``bytes`` (from ``malloc``) are
    then freed at once and their space reused for the next result, instead of living as long as
    the chunk's columns and leaving the C heap larger than the tables (docs/performance.md)."""
    if data is None:
        return None
    with pa.ipc.open_stream(pa.py_buffer(data)) as r:
        if not hasattr(pa.RecordBatch, "copy_to"):  # pyarrow < 16: keep the zero-copy view
            return r.read_all()
        manager = pa.default_cpu_memory_manager()
        return pa.Table.from_batches([b.copy_to(manager) for b in r], schema=r.schema)


# --------------------------------------------------------------------------------------- workers


def _work(task: tuple[str, int, int], last: bool = False) -> tuple[Any, ...]:
    """Decode one range (path, start, end) of a file into IPC-encoded tables; the last range ends
    the array, and what follows it (the rest of the top-level object) comes back too."""
    p, start, end = task
    buf = bytearray(end - start + 2)
    try:
        with open(p, "rb", buffering=0) as f:
            f.seek(start)
            view = memoryview(buf)[1:-1]
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    return ("fail", "file shrank while it was read")
                got += n
            view.release()  # buf may be resized below
    except OSError as e:  # e.g. no /proc to open a gzip chunk's in-memory file through
        return ("fail", f"cannot read the range ({e})")
    tail = b""
    if last:
        try:
            del buf[-1]  # decode_last wants one spare byte before the text, none after
            events, tail = decode_last(buf)
        except InputError as e:
            return ("fail", str(e))
    else:
        buf[0], buf[-1] = 0x5B, 0x5D  # [ ... ]
        try:
            events = DECODER.decode(buf)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return ("fail", str(e))
    del buf
    tables = chunk_tables(events)
    del events
    return ("ok", *(_to_ipc(t) for t in tables), tail)


def _to_ipc(t: pa.Table | None) -> bytes | None:
    return None if t is None else ipc_bytes(t)
