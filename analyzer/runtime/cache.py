"""Parsed-trace cache: a trace's canonical tables stored as Parquet, keyed by its content and its reader.

Contract. An entry holds what ``read_trace(path)`` returns: the three tables of :mod:`analyzer.model` as Parquet
files (``kernels``, ``host_ops``, ``annotations``) and ``meta.json`` (the key, the InputMeta, the
reader's warnings). No pickle anywhere: only Parquet and JSON cross the disk (and, between processes,
only path strings). An entry is used only when its key equals the key of the file now:

* the sha256 of the trace file, its reader's ``FORMAT`` and ``READER_VERSION``, :data:`CACHE_FORMAT`;
* the sha256 of the reader code and the model (so a reader changed without a version bump never
  serves old tables);
* the file's name (readers take the rank from names such as ``-TP-3``);
* for readers that also read neighbouring files (rocprof's agent info, sysinfo, copy and marker
  traces) the name, size and mtime of every file next to it.

The key is stored in the entry and compared again on load. Entries are written to a temporary folder
and renamed into place, so a reader never sees half an entry; a corrupt or foreign entry is a miss.
Reports that ``nsys`` must export first (``.nsys-rep``) are not cached: the export depends on the tool.

Where: ``$LKM_CACHE_DIR``, else ``~/.cache/llm-kernel-map``. Paths inside the tables' warnings and
``InputMeta.path`` are stored relative to the file and restored to the path given on load.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from analyzer import readers
from analyzer.errors import AnalyzerError
from analyzer.model import ANNOTATION_SCHEMA, HOST_OP_SCHEMA, KERNEL_SCHEMA, InputMeta, Trace
from analyzer.runtime import background
from analyzer.runtime.read_policy import read_policy

CACHE_FORMAT = "1"
ENV_DIR = "LKM_CACHE_DIR"
TABLES: dict[str, pa.Schema] = {
    "kernels": KERNEL_SCHEMA,
    "host_ops": HOST_OP_SCHEMA,
    "annotations": ANNOTATION_SCHEMA,
}
META_FILE = "meta.json"
# Readers whose output depends on files next to the trace, and reports a tool must convert first.
_READS_NEIGHBOURS = {"rocprof"}
_TOOL_EXPORTED = (".nsys-rep", ".qdrep")
_PATH_MARK = "\x00path\x00"


def default_dir() -> Path:
    """``$LKM_CACHE_DIR``, else ``~/.cache/llm-kernel-map``."""
    env = os.environ.get(ENV_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-kernel-map"


def resolve_dir(cache: bool | str | os.PathLike[str] | None) -> Path | None:
    """The cache folder for a ``cache`` argument: ``True`` the default one, ``False``/``None`` none."""
    if cache is None or cache is False:
        return None
    if cache is True:
        return default_dir()
    return Path(cache)


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """Everything a parsed trace depends on; two files with equal keys parse to equal tables."""

    sha256: str
    format: str
    reader_version: str
    name: str
    code: str
    neighbours: str = ""
    cache_format: str = CACHE_FORMAT

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @property
    def entry_name(self) -> str:
        return f"{self.format}-{self.sha256[:16]}-{self.digest[:16]}"

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of the source that turns a file into tables: the readers, the table helpers, the
    chunked Kineto reading and the model."""
    root = Path(__file__).resolve().parent.parent
    files = (
        sorted((root / "readers").glob("*.py"))
        + sorted((root / "tables").glob("*.py"))
        + [root / "runtime" / "chunked_kineto.py", root / "model.py"]
    )
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cacheable(path: str | os.PathLike[str]) -> bool:
    return not str(path).lower().endswith(_TOOL_EXPORTED)


def cache_key(path: str | os.PathLike[str], sha256: str | None = None) -> CacheKey:
    """The key of ``path`` now (sniffs the format; hashes the file unless ``sha256`` is given)."""
    p = Path(path)
    mod = readers.sniff(p)
    return CacheKey(
        sha256=sha256 or readers.file_sha256(p),
        format=mod.FORMAT,
        reader_version=str(mod.READER_VERSION),
        name=p.name,
        code=code_digest(),
        neighbours=_neighbours(p) if mod.FORMAT in _READS_NEIGHBOURS else "",
    )


def _neighbours(p: Path) -> str:
    h = hashlib.sha256()
    for c in sorted(p.parent.iterdir()):
        if c.name == p.name or not c.is_file():
            continue
        st = c.stat()
        h.update(f"{c.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def entry_dir(cache_dir: Path, key: CacheKey) -> Path:
    return Path(cache_dir) / key.entry_name


# --------------------------------------------------------------------------------------- write / read


def write_entry(
    trace: Trace, key: CacheKey, cache_dir: Path, path: str | os.PathLike[str], replace: bool = False
) -> Path | None:
    """Store ``trace`` (one input, read from ``path``) under ``key``; the entry's folder, or None when
    the trace cannot be stored faithfully (then it is simply not cached). An entry already there is
    kept (another process stored the same key) unless ``replace`` (it failed to load)."""
    meta = _meta_json(trace, key, path)
    if meta is None:
        return None
    final = entry_dir(cache_dir, key)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key.entry_name}-", dir=cache_dir))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; other users of a shared cache read it too
    try:
        for name in TABLES:
            table: pa.Table = getattr(trace, name)
            # bounded row groups: the writer never buffers a whole big column at once
            pq.write_table(table, tmp / f"{name}.parquet", compression="zstd", row_group_size=1 << 18)
        (tmp / META_FILE).write_text(meta, encoding="utf-8")
        try:
            os.rename(tmp, final)
        except OSError:
            # The folder exists: another process stored the same key first, or a damaged entry.
            if replace or _entry_key(final) != key.to_dict():
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        pa.default_memory_pool().release_unused()  # give the writer's buffers back before analysing
    return final


def _meta_json(trace: Trace, key: CacheKey, path: str | os.PathLike[str]) -> str | None:
    if len(trace.inputs) != 1 or (trace.inputs[0].sha256 and trace.inputs[0].sha256 != key.sha256):
        return None  # not one file, or the file changed while it was read
    given = str(Path(path))
    m = trace.inputs[0].to_dict()
    m["path"] = _PATH_MARK
    doc = {
        "cache_format": CACHE_FORMAT,
        "key": key.to_dict(),
        "input": m,
        "warnings": [w.replace(given, _PATH_MARK) for w in trace.warnings],
    }
    try:
        text = json.dumps(doc, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return None
    if json.loads(text) != doc:
        return None  # something would not come back as it went in (tuples, int keys, ...)
    return text


def _entry_key(entry: Path) -> dict[str, Any] | None:
    try:
        return json.loads((entry / META_FILE).read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        return None


def read_entry(
    entry: str | os.PathLike[str], key: CacheKey | None, path: str | os.PathLike[str]
) -> Trace | None:
    """The trace stored in ``entry`` as read from ``path``; None when the entry is absent, corrupt, or
    holds another key (``key=None`` trusts the entry: for entries a worker has just written)."""
    entry = Path(entry)
    try:
        doc = json.loads((entry / META_FILE).read_text(encoding="utf-8"))
        if doc.get("cache_format") != CACHE_FORMAT or (key is not None and doc.get("key") != key.to_dict()):
            return None
        tables = {name: _read_table(entry / f"{name}.parquet", schema) for name, schema in TABLES.items()}
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None
    given = str(Path(path))
    meta = InputMeta(**{**doc["input"], "path": given})
    warnings = [w.replace(_PATH_MARK, given) for w in doc["warnings"]]
    trace = Trace(tables["kernels"], tables["host_ops"], tables["annotations"], [meta], warnings)
    try:
        trace.validate()
    except Exception:  # noqa: BLE001 - a damaged entry is a miss, never an error
        return None
    return trace


def _read_table(p: Path, schema: pa.Schema) -> pa.Table:
    t = pq.read_table(p)
    if t.schema != schema:
        t = t.select(schema.names).cast(schema)
    return t.unify_dictionaries().combine_chunks()


# --------------------------------------------------------------------------------------- use


def load_trace(
    path: str | os.PathLike[str],
    cache_dir: Path | None,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """``read_trace(path)`` through the cache in ``cache_dir`` (None: no cache).

    A file seen before is looked up by its stat index (no hashing); a new one is parsed at once and
    keyed by the sha256 its reader computed while streaming, so a first analysis reads the file once.
    """
    background.wait()  # the entry of the input before is complete before this one is looked up
    if cache_dir is None or not cacheable(path):
        trace = readers.read_trace(path, progress=progress, policy=read_policy())
        if len(trace.inputs) == 1 and not trace.inputs[0].sha256:
            background.run(_hash, trace.inputs[0], path)  # the input, not the tables: those may go
        return trace
    key = None
    sha = known_sha256(cache_dir, path)
    if sha is not None:
        key = cache_key(path, sha256=sha)
        hit = read_entry(entry_dir(cache_dir, key), key, path)
        if hit is not None:
            return hit
    before = _stat_id(path)
    trace = readers.read_trace(path, progress=progress, policy=read_policy())
    # written now, or beside the classification (analyzer.runtime.background), not after the analysis: the
    # analysis may then free tables it no longer needs (host ops), and the writer's own buffers are
    # small next to the tables. A reader that left the file unhashed (to spare the CPU its workers
    # used) has it hashed there first.
    background.run(_store, trace, key, cache_dir, path, before)
    return trace


def _hash(meta: InputMeta, path: str | os.PathLike[str]) -> str:
    """The file's sha256, recorded in the trace's input when its reader left it empty."""
    if not meta.sha256:
        meta.sha256 = readers.file_sha256(path)
    return meta.sha256


def _store(
    trace: Trace,
    key: CacheKey | None,
    cache_dir: Path,
    path: str | os.PathLike[str],
    before: tuple[str, int] | None,
) -> None:
    streamed = _hash(trace.inputs[0], path) if len(trace.inputs) == 1 else None
    if key is None or (streamed and streamed != key.sha256):
        key = cache_key(path, sha256=streamed or None)
    entry = entry_dir(cache_dir, key)
    if _try_write(trace, key, cache_dir, path, replace=entry.exists()) is not None:
        remember_sha256(cache_dir, path, key.sha256, before)


# ------------------------------------------------------------------------------ stat index
# Maps a file's identity and stat (path, device, inode, size, mtime, ctime; all in ns) to the sha256
# of its bytes, so that re-analysing a trace skips hashing it. A file changes its mtime and ctime
# when written (ctime cannot be set back by users), so a changed file never matches its old record.
# Files modified in the last few seconds are not recorded (their clock tick may not be over yet).
STAT_DIR = ".stat-index"
_SETTLED_NS = 3_000_000_000


def _stat_id(path: str | os.PathLike[str]) -> tuple[str, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = [str(Path(path).resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest(), max(st.st_mtime_ns, st.st_ctime_ns)


def known_sha256(cache_dir: Path, path: str | os.PathLike[str]) -> str | None:
    """The sha256 recorded for ``path`` as it is now, or None."""
    sid = _stat_id(path)
    if sid is None:
        return None
    try:
        sha = (Path(cache_dir) / STAT_DIR / sid[0]).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return sha if len(sha) == 64 and all(c in "0123456789abcdef" for c in sha) else None


def remember_sha256(
    cache_dir: Path, path: str | os.PathLike[str], sha: str, before: tuple[str, int] | None
) -> None:
    """Record ``sha`` for ``path`` when the file did not change since ``before`` and has settled."""
    import time

    now = _stat_id(path)
    if now is None or now != before or time.time_ns() - now[1] < _SETTLED_NS:
        return
    folder = Path(cache_dir) / STAT_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(sha)
        os.replace(tmp, folder / now[0])
    except OSError:
        pass  # a read-only cache folder costs speed, never the analysis


def _try_write(
    trace: Trace, key: CacheKey, cache_dir: Path, path: str | os.PathLike[str], replace: bool = False
) -> Path | None:
    try:
        return write_entry(trace, key, cache_dir, path, replace=replace)
    except OSError:
        return None  # a read-only or full cache folder costs speed, never the analysis


def parse_into(path: str, cache_dir: str, lookup: bool = True) -> tuple[str, str]:
    """Worker side: make sure ``cache_dir`` holds the parsed ``path``; return (status, value).

    ``("entry", folder)`` on success; ``("direct", "")`` when the trace cannot be stored (the caller
    reads it itself); ``("error", message)`` for bad input. Takes and returns strings only, so it runs
    in another process or on another machine with nothing pickled but paths. ``lookup=False`` skips
    the hit check (a private scratch folder) and takes the hash the reader computed.
    """
    try:
        if not cacheable(path):
            return "direct", ""
        sha = known_sha256(Path(cache_dir), path) if lookup else None
        if sha is not None:
            key = cache_key(path, sha256=sha)
            entry = entry_dir(Path(cache_dir), key)
            if _entry_key(entry) == key.to_dict():
                return "entry", str(entry)
        before = _stat_id(path)
        trace = readers.read_trace(path, policy=read_policy())
        key = cache_key(path, sha256=trace.inputs[0].sha256 or None)
        stored = write_entry(trace, key, Path(cache_dir), path)
        if stored is not None and lookup:
            remember_sha256(Path(cache_dir), path, key.sha256, before)
    except AnalyzerError as e:
        return "error", str(e)
    except OSError:
        return "direct", ""  # the folder cannot be written here: the caller reads the file itself
    return ("entry", str(stored)) if stored is not None else ("direct", "")
