"""Format registry: ``read_trace(path)`` sniffs a file's format from its content and reads it.

Every reader module exposes the same tiny protocol:

* ``FORMAT``: the format's name (``kineto``, ``rocprof``, ``rocpd``, ``nsys``, ...);
* ``READER_VERSION``: bumped whenever the reader's output changes (cache keys use it);
* ``sniff(path, head) -> bool``: ``head`` is the first bytes of the file, gzip already undone;
* ``read(path) -> Trace``: the canonical tables (:mod:`analyzer.model`), already validated. A reader with
  ``STREAMS = True`` also takes ``progress``; one with ``TAKES_POLICY = True`` takes the runtime's
  ``policy`` (:class:`analyzer.readers.policy.ReadPolicy`), and without it reads plainly.

Readers import nothing of :mod:`analyzer.runtime` (or the analyses, the knowledge, the reports, the
CLI): how fast or where a file is parsed reaches them as that policy.

Readers raise :class:`analyzer.errors.InputError` with one clear sentence for bad input.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from analyzer.errors import InputError
from analyzer.model import Trace
from analyzer.readers import gz
from analyzer.readers.policy import ReadPolicy

# Order matters only when two readers would accept the same bytes; the most specific goes first.
_READER_MODULES = (
    "analyzer.readers.kineto",
    "analyzer.readers.rocprof",
    "analyzer.readers.rocpd",
    "analyzer.readers.nsys",
)

HEAD_BYTES = 64 * 1024


def readers() -> list[ModuleType]:
    """The reader modules that are installed, in sniffing order."""
    mods = []
    for name in _READER_MODULES:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as e:  # a reader not written yet
            if e.name != name:
                raise
    return mods


def supported_formats() -> list[str]:
    return [m.FORMAT for m in readers()]


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """First ``n`` bytes of a file, decompressed when it is gzip."""
    with open(path, "rb") as f:
        raw = f.read(n)
    if raw[:2] == gz.MAGIC:
        try:
            with open(path, "rb") as f, gz.reader(f) as g:
                return g.read(n)
        except gz.ERRORS as e:
            raise InputError(f"{path}: corrupt gzip file ({e})") from None
    return raw


def sniff(path: str | os.PathLike[str]) -> ModuleType:
    """The reader module for ``path``, chosen by content; InputError when none accepts it."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, expected a trace file")
    if p.stat().st_size == 0:
        raise InputError(f"{p}: empty file")
    head = read_head(p)
    if not head.strip():
        raise InputError(f"{p}: empty file")
    for mod in readers():
        if mod.sniff(p, head):
            return mod
    raise InputError(f"{p}: not a recognised trace format (supported: {', '.join(supported_formats())})")


def read_trace(
    path: str | os.PathLike[str],
    progress: Callable[[int, int], None] | None = None,
    policy: ReadPolicy | None = None,
) -> Trace:
    """Read one trace file of any supported format into a validated :class:`Trace`.

    ``progress(done_bytes, total_bytes)`` is called while large files are read (readers that
    stream; others call it never). ``policy`` is the runtime's (:class:`ReadPolicy`): without it
    every reader takes its plain sequential path.
    """
    mod = sniff(path)
    kwargs: dict[str, Any] = (
        {"policy": policy} if policy is not None and getattr(mod, "TAKES_POLICY", False) else {}
    )
    if progress is not None and getattr(mod, "STREAMS", False):
        size = Path(path).stat().st_size
        trace: Trace = mod.read(Path(path), progress=lambda done: progress(done, size), **kwargs)
    else:
        trace = mod.read(Path(path), **kwargs)
    trace.validate()
    return trace


_SHA_MEMO: dict[tuple[str, int, int], str] = {}
_SHA_RUNNING: dict[tuple[str, int, int], threading.Event] = {}  # files being hashed now
_SHA_LOCK = threading.Lock()


def _stat_key(path: str | os.PathLike[str]) -> tuple[str, int, int]:
    st = os.stat(path)
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def remember_sha256(path: str | os.PathLike[str], digest: str) -> None:
    """Record a digest computed while streaming the file, so nobody hashes it again."""
    _SHA_MEMO[_stat_key(path)] = digest


def memo_sha256(path: str | os.PathLike[str]) -> str | None:
    """The digest :func:`file_sha256` or a reader already computed for the file as it is now."""
    return _SHA_MEMO.get(_stat_key(path))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of the file's bytes (memoised by path, size and mtime within one process). A thread
    asking for a file another thread is hashing waits for that digest instead of hashing it too."""
    key = _stat_key(path)
    hit = _SHA_MEMO.get(key)
    if hit is not None:
        return hit
    with _SHA_LOCK:
        running = _SHA_RUNNING.get(key)
        if running is None:
            _SHA_RUNNING[key] = done = threading.Event()
    if running is not None:
        running.wait()
        hit = _SHA_MEMO.get(key)
        return hit if hit is not None else file_sha256(path)  # that thread failed: try here
    try:
        h = hashlib.sha256()
        buf = bytearray(1 << 22)  # one buffer: a fresh 4 MB block per read costs its page faults each time
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        _SHA_MEMO[key] = h.hexdigest()
        return _SHA_MEMO[key]
    finally:
        with _SHA_LOCK:
            del _SHA_RUNNING[key]
        done.set()


def expand_inputs(paths: list[str]) -> list[Path]:
    """Expand directories into the trace files they hold (sorted); InputError when none is found."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = [c for c in sorted(p.rglob("*")) if c.is_file() and _looks_like_trace(c)]
            found = _drop_companions(found)
            if not found:
                raise InputError(f"{p}: directory holds no trace file")
            out.extend(found)
        else:
            out.append(p)
    return out


def _looks_like_trace(p: Path) -> bool:
    name = p.name.lower()
    if name.startswith(".") or name.endswith((".md", ".txt", ".py")) or name == "meta.json":
        return False
    try:
        sniff(p)
    except InputError:
        return False
    return True


# Profilers write the same run in several files; reading them all would count the work twice.
_V1_PREFERENCE = ("results.csv", "results.db", "results.json", "results.stats.csv")
_V3_COMPANIONS = ("_memory_copy_trace.csv", "_marker_api_trace.csv", "_agent_info.csv", "_kernel_stats.csv")


def _drop_companions(files: list[Path]) -> list[Path]:
    """Keep one file per rocprof run: v1's per-launch CSV over its .db/.json/.stats twins, and a
    v3 kernel trace over the copy/marker/agent files it reads itself."""
    names = {f.parent / f.name for f in files}
    out = []
    for f in files:
        if f.name in _V1_PREFERENCE:
            better = [f.parent / b for b in _V1_PREFERENCE[: _V1_PREFERENCE.index(f.name)]]
            if any(b in names for b in better):
                continue
        if f.name.endswith(_V3_COMPANIONS):
            stem = f.name
            for suffix in _V3_COMPANIONS:
                stem = stem.removesuffix(suffix)
            if f.parent / f"{stem}_kernel_trace.csv" in names:
                continue
        out.append(f)
    return out
