"""PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip, CUDA and ROCm builds -> Trace.

Contract: every ``ph == "X"`` event of category ``kernel``, ``gpu_memcpy`` or ``gpu_memset`` becomes one
row of ``kernels`` (times in absolute int64 ns, device ids 0-based, ROCm work-item grids converted to
blocks); ``cpu_op``, ``cuda_runtime`` and ``cuda_driver`` events become ``host_ops``; ``user_annotation``
and ``gpu_user_annotation`` events become ``annotations``. Nothing else is kept.

The file is never decoded whole: the ``traceEvents`` array is cut into chunks at event boundaries and
each chunk is decoded by a typed msgspec decoder that skips every field we do not need, then turned
into Arrow columns before the next chunk is read. Peak memory is one chunk plus the columnar tables.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.errors import InputError
from analyzer.model import (
    ANNOTATION_SCHEMA,
    HOST_OP_SCHEMA,
    KERNEL_SCHEMA,
    InputMeta,
    Trace,
    dict_isin,
    dict_strings,
    dict_take,
    launch_calls,
    table_from_columns,
)
from analyzer.readers import gz
from analyzer.tables import lookup

FORMAT = "kineto"
READER_VERSION = "5"
STREAMS = True  # read() takes a progress callback

CHUNK_BYTES = 16 << 20
READ_BYTES = 8 << 20

_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_HOST_CATS = {"cpu_op": "cpu_op", "cuda_runtime": "runtime", "cuda_driver": "driver"}
_ANN_CATS = {"user_annotation": "cpu", "gpu_user_annotation": "gpu"}
_KNOWN_CATS = (
    frozenset(_GPU_CATS)
    | frozenset(_HOST_CATS)
    | frozenset(_ANN_CATS)
    | frozenset(
        {
            "python_function",
            "cuda_sync",
            "overhead",
            "Trace",
            "cpu_instant_event",
            "ac2g",
            "fwdbwd",
            "cuda_event",
        }
    )
)
_GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch|^cuGraphLaunch")
# hipExtModuleLaunchKernel records globalWorkSize (work-items) as "grid" (FORMATS §1.4).
_WORKITEM_LAUNCH = "hipExtModuleLaunchKernel"

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_END = re.compile(rb"\}\s*\]")
_NON_SPACE = re.compile(rb"[^ \t\n\r]")


class _Args(msgspec.Struct, gc=False):
    # Integers are sometimes written as strings ("256", "0x0" on ROCm): accept both, coerce later.
    external_id: int | str | None = msgspec.field(name="External id", default=None)
    correlation: int | str | None = None
    device: int | str | None = None
    stream: int | str | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    registers: int | str | None = msgspec.field(name="registers per thread", default=None)
    shared_memory: int | str | None = msgspec.field(name="shared memory", default=None)
    # Shapes stay raw JSON until we know which ops launched kernels (most never do).
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw())
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw())
    nbytes: int | str | None = msgspec.field(name="bytes", default=None)


class _Body(msgspec.Struct, gc=False):
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | str | None = None
    dur: float | str | None = None
    args: _Args | None = None


class _Event(_Body, gc=False):
    ph: Any = None


_LENIENT = msgspec.json.Decoder(list[_Event])


class _X(_Body, gc=False, tag_field="ph", tag="X"):
    """A complete event; the only phase we read."""


def _skipped(tag: str) -> type:
    # other phases (flows, instants, counters, metadata ...) decode to an empty struct: msgspec
    # skips their fields in C without building a single string
    return msgspec.defstruct(f"_Ph{ord(tag)}", [], gc=False, tag_field="ph", tag=tag)


_PHASES = "BEiICbneOstfPNDMVvRc()"
_FAST = msgspec.json.Decoder(list[Union[_X, *[_skipped(t) for t in _PHASES]]])  # type: ignore[misc]


class _Decoder:
    """Tagged decoding first; any surprise (a phase not in the list, no "ph") -> the lenient one."""

    @staticmethod
    def decode(data: bytes) -> list[Any]:
        try:
            return _FAST.decode(data)
        except msgspec.ValidationError:
            return _LENIENT.decode(data)


_DECODER = _Decoder()


def sniff(path: Path, head: bytes) -> bool:
    """A JSON object with a ``traceEvents`` key, or a bare event list (old HTA files)."""
    h = head.lstrip()
    if b'"BeginNs"' in head:  # rocprof v1 results.json: Chrome trace written by rocprof, not Kineto
        return False
    if h[:1] == b"{":
        return b'"traceEvents"' in head or (
            b'"schemaVersion"' in head and b"rocprofiler-sdk-tool" not in head
        )
    return h[:1] == b"[" and (b'"ph"' in head and b'"cat"' in head)


def read(path: Path, progress: Callable[[int], None] | None = None) -> Trace:
    """Read one Kineto trace; ``progress`` is called with the bytes read so far.

    ``meta.sha256`` stays empty when the parallel reader left hashing to a background thread
    (inside :func:`analyzer.runtime.background.deferred`; see :func:`analyzer.runtime.cache.load_trace`)."""
    from analyzer.readers import file_sha256, memo_sha256
    from analyzer.runtime import background

    with _gc_paused():
        builder = _parallel_read(path, progress)
        if builder is None:
            builder = _Builder()
            meta_obj = _stream_events(path, builder, progress)
        else:
            meta_obj = builder.meta
    meta = _input_meta(path, meta_obj, any(_uses_hip(h) for h in builder.host))
    meta.sha256 = memo_sha256(path) or ("" if background.deferring() else file_sha256(path))
    if not meta.sha256:
        # left to a thread by the parallel reader: started now, beside the post-processing (mostly
        # Arrow kernels, outside the GIL), it is done before the analysis ends and the cache entry
        # that waits for it is written in time (whoever asks for the digest meanwhile waits for it)
        background.run(_hash_ahead, path)
    kernels, host_ops, annotations, warnings = _post_process(builder, meta, meta_obj)
    if kernels.num_rows == 0:
        raise InputError(f"{path}: no GPU activity recorded (no kernel, memcpy or memset events)")
    return Trace(kernels, host_ops, annotations, [meta], warnings)


def _hash_ahead(path: Path) -> None:
    from analyzer.readers import file_sha256

    with contextlib.suppress(OSError):  # whoever needs the digest hashes again and reports it
        file_sha256(path)


def _parallel_read(path: Path, progress: Callable[[int], None] | None) -> _Builder | None:
    """The tables of a big trace parsed by worker processes; None when it is read here instead."""
    from analyzer.readers import remember_sha256
    from analyzer.runtime import chunked_kineto

    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    size = path.stat().st_size * (8 if gz else 1)  # gzip traces inflate about tenfold
    jobs = chunked_kineto.jobs_for(size)
    if jobs < 2:
        return None
    builder = _Builder()
    try:
        prefix, tail, sha = chunked_kineto.stream(
            path, gz, builder.add_tables, _find_events, jobs, progress, chunked_kineto.CHUNK_BYTES
        )
    except (chunked_kineto.Fallback, InputError):
        return None  # read sequentially: same tables, or the precise error
    if sha:
        remember_sha256(path, sha)
    builder.meta = _top_level(path, prefix, tail)
    return builder


def _find_events(head: bytes) -> tuple[bytes | None, int] | None:
    """(text before the traceEvents array or None for a bare list, offset of its first event)."""
    m = _EVENTS_KEY.search(head)
    if m is not None:
        prefix, pos = head[: m.start()], m.end()
    else:
        stripped = head.lstrip()
        if stripped[:1] != b"[":
            return None
        prefix, pos = None, len(head) - len(stripped) + 1
    while pos < len(head) and head[pos : pos + 1].isspace():
        pos += 1
    return (prefix, pos) if head[pos : pos + 1] == b"{" else None


# --------------------------------------------------------------------------- byte stream -> events


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding allocates millions of acyclic objects; the cyclic GC only slows it down."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Hashing(io.RawIOBase):
    """A file whose bytes are hashed as they are read: the trace's sha256 costs no second pass."""

    def __init__(self, path: Path) -> None:
        self._f = open(path, "rb")
        self.sha = hashlib.sha256()
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b) or 0
        if n:
            self.sha.update(memoryview(b)[:n])
            self.pos += n
        return n

    def tell(self) -> int:
        """Bytes read so far (of the file as stored: compressed bytes for gzip)."""
        return self.pos

    def close(self) -> None:
        self._f.close()
        super().close()


def _open(path: Path) -> tuple[io.BufferedIOBase, _Hashing]:
    with open(path, "rb") as f:
        magic = f.read(2)
    raw = _Hashing(path)
    if magic == gz.MAGIC:
        return gz.reader(io.BufferedReader(raw, 1 << 20)), raw
    return io.BufferedReader(raw, 1 << 20), raw  # type: ignore[return-value]


def _read_block(f: io.BufferedIOBase, path: Path) -> bytes:
    try:
        return f.read(READ_BYTES)
    except gz.ERRORS as e:
        raise InputError(f"{path}: corrupt or truncated gzip file ({e})") from None


def _stream_events(path: Path, builder: _Builder, progress: Callable[[int], None] | None) -> dict[str, Any]:
    """Feed every event of ``path`` to ``builder``; return the top-level metadata object."""
    f, hashing = _open(path)
    with f, hashing:
        buf = bytearray()
        total = 0
        prefix: bytes | None = b""
        # 1. find the start of the traceEvents array
        while True:
            block = _read_block(f, path)
            total += len(block)
            buf += block
            m = _EVENTS_KEY.search(buf)
            if m:
                prefix = bytes(buf[: m.start()])
                del buf[: m.end() - 1]  # from here on buf[0] is a spare byte before the events
                break
            stripped = buf.lstrip()
            if stripped[:1] == b"[":  # bare list of events
                del buf[: len(buf) - len(stripped)]
                prefix = None
                break
            if not block:
                if not buf.strip():
                    raise InputError(f"{path}: empty file")
                _raise_not_trace(path, bytes(buf))
            if len(buf) > (64 << 20):
                raise InputError(f"{path}: no traceEvents array in the first 64 MB")
        # 2. decode whole chunks of events as they arrive
        eof = False
        while True:
            while len(buf) < CHUNK_BYTES and not eof:
                block = _read_block(f, path)
                total += len(block)
                if progress:
                    raw = getattr(f, "fileobj", None)  # gzip: report compressed bytes
                    progress(raw.tell() if raw is not None else total)
                if not block:
                    eof = True
                buf += block
            if eof:
                break
            found = _decode_at_boundary(buf, CHUNK_BYTES // 2, path)
            if found is None:
                # no boundary yet: read more (a single huge event)
                block = _read_block(f, path)
                total += len(block)
                if not block:
                    eof = True
                buf += block
                continue
            events, cut = found
            builder.add(events)
            del events, found  # their raw fields pointed into buf
            # drop the decoded events and the separator after them but its last byte: the spare
            m = _SEPARATOR.match(buf, cut)
            del buf[: (m.end() if m else cut) - 1]
        # 3. the rest: last events, "]", then the tail of the top-level object
        events, tail = decode_last(buf, path)
        builder.add(events)
        while hashing.readinto(bytearray(1 << 20)):  # bytes after the gzip stream, if any
            pass
        from analyzer.readers import remember_sha256

        remember_sha256(path, hashing.sha.hexdigest())
    return _top_level(path, prefix, tail)


_SEPARATOR = re.compile(rb"\s*,?")


def _top_level(path: Path, prefix: bytes | None, tail: bytes) -> dict[str, Any]:
    """The top-level object without its events (empty for a bare list of events)."""
    if prefix is None:
        return {}
    try:
        meta = orjson.loads(prefix + b'"traceEvents": []' + tail)
    except orjson.JSONDecodeError:
        raise InputError(f"{path}: not valid JSON (top-level object is malformed or truncated)") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not a trace (top level is not an object)")
    return meta


def _decode_at_boundary(buf: bytearray, start: int, path: Path) -> tuple[list[_Event], int] | None:
    """Decode the events before the first whole-event boundary (``}`` ``,`` ``{``) after ``start``;
    return them and the index just after their last ``}``, or None when no boundary is found.
    ``buf[0]`` is a spare byte, the events start after it (see :func:`_decode_through`)."""
    found = _decode_through(buf, _BOUNDARY, max(start, 1), path)
    return None if found is None else (found[0], found[1].start() + 1)


def _decode_through(
    buf: bytearray, end: re.Pattern[bytes], pos: int, path: Path | str
) -> tuple[list[Any], re.Match[bytes]] | None:
    """Decode the events from ``buf[1]`` to the first match of ``end`` at or after ``pos`` that
    closes them (its ``}`` ends the last event); return them and that match, or None when there is
    none.

    A candidate inside a string or a nested object leaves the text unbalanced, which the decoder
    reports at its very end: then the next one is tried. An error earlier is real corruption. The
    text is decoded in place: the spare byte ``buf[0]`` becomes ``[`` and the byte after the ``}``
    ``]`` for the time of the decoding (a copy per chunk cost its page faults: ~0.3 s per 250 MB
    here). The events' raw fields point into ``buf``: drop them before ``buf`` is resized.
    """
    buf[0] = 0x5B  # [
    while True:
        m = end.search(buf, pos)
        if m is None:
            return None
        cut = m.start() + 1
        keep = buf[cut]
        buf[cut] = 0x5D  # ]
        try:
            return _DECODER.decode(memoryview(buf)[: cut + 1]), m
        except msgspec.ValidationError as e:
            raise InputError(f"{path}: event with unexpected field type ({e})") from None
        except msgspec.DecodeError as e:
            if not _error_at_end(str(e), cut + 1):
                raise InputError(f"{path}: not valid JSON in traceEvents ({e})") from None
        finally:
            buf[cut] = keep
        pos = m.end() - 1


_ERR_BYTE = re.compile(r"\(byte (\d+)\)")


def _error_at_end(msg: str, size: int) -> bool:
    if "truncated" in msg:
        return True
    m = _ERR_BYTE.search(msg)
    return m is not None and int(m.group(1)) >= size - 2


def decode_last(buf: bytearray, path: Path | str = "trace") -> tuple[list[Any], bytes]:
    """Decode the final events; return them and what follows the array (the rest of the top object).

    ``buf[0]`` is a spare byte, the text starts at ``buf[1]``; the events are decoded in place
    (:func:`_decode_through`: three copies of up to two chunks made the last chunk the peak of a
    worker's memory)."""
    first = _first_text(buf)
    if buf[first : first + 1] == b"]":
        return [], bytes(memoryview(buf)[first + 1 :])
    found = _decode_through(buf, _ARRAY_END, first, path)
    if found is None:
        raise InputError(f"{path}: truncated trace (traceEvents array never ends)")
    events, m = found
    return events, bytes(memoryview(buf)[m.end() :])


def _first_text(buf: bytearray) -> int:
    """Index of the first byte after ``buf[0]`` that is not JSON whitespace (len(buf) if none)."""
    m = _NON_SPACE.search(buf, 1)
    return m.start() if m else len(buf)


def _raise_not_trace(path: Path, buf: bytes) -> None:
    try:
        obj = orjson.loads(buf)
    except orjson.JSONDecodeError:
        raise InputError(f"{path}: not JSON") from None
    raise InputError(
        f"{path}: JSON but not a PyTorch profiler trace (no traceEvents; top level is {type(obj).__name__})"
    )


# --------------------------------------------------------------------------- events -> columns


class _Builder:
    """Accumulates Arrow tables chunk by chunk; the Python objects of a chunk die with it."""

    def __init__(self) -> None:
        self.kernels: list[pa.Table] = []
        self.host: list[pa.Table] = []
        self.ann: list[pa.Table] = []
        self.meta: dict[str, Any] = {}

    def add(self, events: list[Any]) -> None:
        self.add_tables(*chunk_tables(events))

    def add_tables(self, k: pa.Table | None, h: pa.Table | None, a: pa.Table | None) -> None:
        for parts, t in ((self.kernels, k), (self.host, h), (self.ann, a)):
            if t is not None and t.num_rows:
                parts.append(t)


# cpu_ops that only make views, allocate or read metadata: they never launch GPU work, so no kernel
# can name them; skipping them before column building saves a third of the host rows of a trace.
_NEVER_LAUNCH = frozenset(
    {
        "aten::as_strided",
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::transpose",
        "aten::t",
        "aten::permute",
        "aten::expand",
        "aten::slice",
        "aten::select",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::narrow",
        "aten::split",
        "aten::chunk",
        "aten::unbind",
        "aten::detach",
        "aten::alias",
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::result_type",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::lift_fresh",
        "aten::set_",
    }
)


def chunk_tables(events: list[Any]) -> tuple[pa.Table | None, pa.Table | None, pa.Table | None]:
    """Decoded events of one chunk -> (gpu, host, annotation) tables in file order; None where a
    kind is absent. cpu_ops and launch calls are built apart (they need different columns), then
    interleaved back into file order, so the tables never depend on where chunks were cut."""
    gpu: list[Any] = []
    ops: list[Any] = []
    calls: list[Any] = []
    ann: list[Any] = []
    op_at: list[int] = []
    call_at: list[int] = []
    to_gpu, to_op, to_call, to_ann = gpu.append, ops.append, calls.append, ann.append
    gpu_cats, ann_cats, skip = _GPU_CATS, _ANN_CATS, _NEVER_LAUNCH
    for i, e in enumerate(events):
        t = type(e)
        if t is not _X and (t is not _Event or e.ph != "X"):
            continue
        c = e.cat
        if c == "cpu_op":
            if e.name not in skip:
                to_op(e)
                op_at.append(i)
        elif c in gpu_cats:
            to_gpu(e)
        elif c == "cuda_runtime" or c == "cuda_driver":
            to_call(e)
            call_at.append(i)
        elif c in ann_cats:
            to_ann(e)
        elif c and c not in _KNOWN_CATS and c.lower() in gpu_cats:
            # early Kineto capitalised categories ("Kernel", "Memcpy" ...)
            to_gpu(e)
    host = None
    if ops and calls:
        both = pa.concat_tables([_op_table(ops), _call_table(calls)], promote_options="default")
        host = both.take(pa.array(np.argsort(np.array(op_at + call_at), kind="stable")))
    elif ops:
        host = _op_table(ops)
    elif calls:
        host = _call_table(calls)
    return (
        _gpu_table(gpu) if gpu else None,
        host,
        _ann_table(ann) if ann else None,
    )


def _int(v: Any) -> int | None:
    """An integer field that may be written as a string or float; None when it is not a number."""
    if type(v) is int:
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                return None
            return int(f) if f.is_integer() else None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _ints(values: list[Any]) -> pa.Array:
    """int64 column; the C fast path handles ints and None, strings and floats take the slow one."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        out = [v if type(v) is int else _int(v) for v in values]
        return pa.array([v if v is None or -(2**63) <= v < 2**63 else None for v in out], pa.int64())


def _num(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return np.nan
    return np.nan


def _us_to_ns(values: list[Any]) -> pa.Array:
    try:
        arr = pa.array(values, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        arr = np.array([_num(v) for v in values], dtype=np.float64)
    mask = ~np.isfinite(arr) | (np.abs(arr) > 9e15)
    ns = np.rint(arr * 1000.0)
    ns[mask] = 0
    return pa.array(ns.astype(np.int64), mask=mask)


def _gpu_table(evs: list[_Event]) -> pa.Table:
    name, cat, ts, dur, pid, tid = [], [], [], [], [], []
    dev, stream, corr, ext, regs, smem, nbytes, grid, block = [], [], [], [], [], [], [], [], []
    cats, empty = _GPU_CATS, _EMPTY_ARGS
    for e in evs:
        name.append(e.name)
        c = e.cat
        cat.append(cats.get(c) or cats.get((c or "").lower()))
        ts.append(e.ts)
        dur.append(e.dur)
        pid.append(e.pid)
        tid.append(e.tid)
        a = e.args or empty
        dev.append(a.device)
        stream.append(a.stream)
        corr.append(a.correlation)
        ext.append(a.external_id)
        regs.append(a.registers)
        smem.append(a.shared_memory)
        nbytes.append(a.nbytes)
        grid.append(a.grid)
        block.append(a.block)
    cols: dict[str, Any] = {
        "name": dict_strings(name),
        "cat": dict_strings(cat),
        "ts": _us_to_ns(ts),
        "dur": _us_to_ns(dur),
        "pid": _ints(pid),
        "tid": _ints(tid),
        "device": _ints(dev),
        "stream": _ints(stream),
        "correlation": _ints(corr),
        "external_id": _ints(ext),
        "registers": _ints(regs),
        "shared_mem": _ints(smem),
        "bytes": _ints(nbytes),
    }
    for field, vals in (("grid", grid), ("block", block)):
        for ax, col in zip("xyz", _dims3(vals), strict=True):
            cols[f"{field}_{ax}"] = col
    return pa.table(cols)


_EMPTY_ARGS = _Args()
_NO_DIMS = (None, None, None)


def _dims3(vals: list[list[int] | None]) -> list[pa.Array]:
    """x, y, z columns of grid/block triples (missing entries, and lists of another length, null)."""
    try:
        lists = pa.array(vals, pa.list_(pa.int64()))  # in C; values beyond int64 take the slow way
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return _dims3_slow(vals)
    if lists.values.null_count:
        return _dims3_slow(vals)
    starts = lists.offsets.to_numpy()[:-1]
    ok = pc.fill_null(pc.equal(pc.list_value_length(lists), 3), False).to_numpy(zero_copy_only=False)
    values = np.append(lists.values.to_numpy(zero_copy_only=False), np.zeros(3, np.int64))
    at = np.where(ok, starts, len(values) - 3)  # a missing triple reads zeros, masked
    return [pa.array(values[at + i], mask=~ok) for i in range(3)]


def _dims3_slow(vals: list[Any]) -> list[pa.Array]:
    flat = [v for d in vals for v in (d if d is not None and len(d) == 3 else _NO_DIMS)]
    arr = _ints(flat).to_numpy(zero_copy_only=False)  # float64 with NaN where null
    if arr.dtype.kind == "f":
        return [_float_to_int(arr[i::3]) for i in range(3)]
    return [pa.array(arr[i::3]) for i in range(3)]


def _float_to_int(a: np.ndarray) -> pa.Array:
    mask = np.isnan(a)
    return pa.array(np.where(mask, 0, a).astype(np.int64), mask=mask)


_LINES = msgspec.json.Encoder()


def _dict_raw(values: list[msgspec.Raw]) -> pa.DictionaryArray:
    """Raw JSON fragments dictionary-encoded (an absent one is null). msgspec writes them out as
    lines in one call, which beats copying each fragment to ``bytes`` in Python by far."""
    blob = _LINES.encode_lines(values)
    parts = blob.split(b"\n")
    parts.pop()  # after the last newline
    if len(parts) != len(values):  # a fragment that spans lines: copy one by one
        parts = [bytes(v) for v in values]
    arr = pa.array(parts, pa.binary())
    arr = pc.if_else(pc.equal(pc.binary_length(arr), 0), pa.scalar(None, pa.binary()), arr)
    return arr.dictionary_encode()


def _op_table(evs: list[_Event]) -> pa.Table:
    name, ts, dur, tid, ext, dims, types = [], [], [], [], [], [], []
    empty = _EMPTY_ARGS
    for e in evs:
        name.append(e.name)
        ts.append(e.ts)
        dur.append(e.dur)
        tid.append(e.tid)
        a = e.args or empty
        ext.append(a.external_id)
        dims.append(a.input_dims)
        types.append(a.input_type)
    n = len(evs)
    return pa.table(
        {
            "name": dict_strings(name),
            "category": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["cpu_op"])),
            "ts": _us_to_ns(ts),
            "dur": _us_to_ns(dur),
            "tid": _ints(tid),
            "external_id": _ints(ext),
            "correlation": pa.nulls(n, pa.int64()),
            # shapes repeat every layer and step: dictionary-encoded they cost 4 bytes a row
            "dims_raw": _dict_raw(dims),
            "types_raw": _dict_raw(types),
        }
    )


def _call_table(evs: list[_Event]) -> pa.Table:
    name, cat, ts, dur, tid, ext, corr = [], [], [], [], [], [], []
    cats, empty = _HOST_CATS, _EMPTY_ARGS
    for e in evs:
        name.append(e.name)
        cat.append(cats[e.cat])
        ts.append(e.ts)
        dur.append(e.dur)
        tid.append(e.tid)
        a = e.args or empty
        ext.append(a.external_id)
        corr.append(a.correlation)
    n = len(evs)
    none = pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], pa.binary()))
    return pa.table(
        {
            "name": dict_strings(name),
            "category": dict_strings(cat),
            "ts": _us_to_ns(ts),
            "dur": _us_to_ns(dur),
            "tid": _ints(tid),
            "external_id": _ints(ext),
            "correlation": _ints(corr),
            "dims_raw": none,
            "types_raw": none,
        }
    )


def _parse_dims(d: bytes | None) -> list[list[int]] | None:
    if d is None:
        return None
    try:
        return _DIMS.decode(d)  # the common case, validated in C
    except msgspec.ValidationError:
        return _clean_dims(orjson.loads(d))  # TensorList entries, odd values
    except msgspec.DecodeError:
        return None


def _parse_types(t: bytes | None) -> list[str] | None:
    if t is None:
        return None
    try:
        return _TYPES.decode(t)
    except msgspec.ValidationError:
        return _clean_types(orjson.loads(t))
    except msgspec.DecodeError:
        return None


_DIMS = msgspec.json.Decoder(list[list[int]])
_TYPES = msgspec.json.Decoder(list[str])


def _clean_dims(d: Any) -> list[list[int]] | None:
    """Input Dims as list of int lists; TensorList entries (lists of lists) become their first."""
    if not isinstance(d, list):
        return None
    out = []
    for x in d:
        if isinstance(x, list) and all(type(v) is int for v in x):
            out.append(x)
        elif isinstance(x, list) and x and isinstance(x[0], list):
            first = x[0]
            out.append(first if all(type(v) is int for v in first) else [])
        else:
            out.append([])
    return out


def _clean_types(t: Any) -> list[str] | None:
    if not isinstance(t, list):
        return None
    return [x if isinstance(x, str) else str(x) for x in t]


def _ann_table(evs: list[_Event]) -> pa.Table:
    return pa.table(
        {
            "name": dict_strings([e.name or "" for e in evs]),
            "side": dict_strings([_ANN_CATS[e.cat or ""] for e in evs]),
            "ts": _us_to_ns([e.ts for e in evs]),
            "dur": _us_to_ns([e.dur for e in evs]),
        }
    )


# --------------------------------------------------------------------------- columns -> model


def _post_process(
    builder: _Builder, meta: InputMeta, meta_obj: dict[str, Any]
) -> tuple[pa.Table, pa.Table, pa.Table, list[str]]:
    """Canonical tables from the builder's chunk tables, which it consumes.

    Memory is the point here: a 10 GB trace yields ~1 GB of chunk tables and ~1 GB of canonical
    ones. Host chunks are converted one at a time and dropped; kernel columns are built one at a
    time, each taken in time order directly (no second copy of the table for the sort).
    """
    base = _base_ns(meta_obj)
    rank = meta.rank
    ext = [c.cast(pa.int64()) for t in builder.kernels for c in t["external_id"].chunks]
    wanted = lookup.unique(pa.chunked_array(ext, pa.int64())) if ext else None
    host = _host_ops(builder.host, wanted, base, rank)
    ann = _annotations(builder.ann, base, rank)
    kernels = _kernels(builder.kernels, host, base, rank, meta)
    return kernels, host, ann, []


def _host_ops(parts: list[pa.Table], wanted: pa.Array | None, base: int, rank: int) -> pa.Table:
    """Launch calls and the cpu_ops some GPU activity names (``wanted`` external ids); the rest is
    never used. Consumes ``parts``: each chunk is freed once converted."""
    if not parts:
        return HOST_OP_SCHEMA.empty_table()
    # one dictionary per column across chunks: shape codes, hence shape ids, are global
    whole = pa.concat_tables(parts, promote_options="default").unify_dictionaries()
    parts.clear()
    if whole.num_rows == 0:
        return HOST_OP_SCHEMA.empty_table()
    shapes = [
        _decoded_dictionary(whole["dims_raw"], _parse_dims, pa.list_(pa.list_(pa.int64()))),
        _decoded_dictionary(whole["types_raw"], _parse_types, pa.list_(pa.string())),
    ]
    batches = whole.to_batches()
    del whole
    batches.reverse()
    out: list[pa.Table] = []
    while batches:
        b = batches.pop()
        keep = ~dict_isin(b["category"], ["cpu_op"])
        if wanted is not None:
            keep |= lookup.isin(b["external_id"], wanted)
        b = b.filter(pa.array(keep))
        del keep
        nh = b.num_rows
        if nh == 0:
            continue
        linked = dict_isin(b["category"], ["cpu_op"])
        codes = []
        cols: dict[str, Any] = {}
        for values, key, raw in zip(
            shapes, ("input_dims", "input_types"), ("dims_raw", "types_raw"), strict=True
        ):
            c = _codes(b[raw], linked)
            codes.append(c)
            cols[key] = values.take(pa.array(np.where(c < 0, len(values) - 1, c)))
        shape_id = np.where(linked, (codes[0] + 1) * (1 << 31) + (codes[1] + 1), -1)
        cols.update(
            {
                "trace_id": np.zeros(nh, np.int16),
                "rank": np.full(nh, rank, np.int16),
                "name": b["name"],
                "start_ns": _shift(b["ts"], base),
                "dur_ns": _fill0(b["dur"]),
                "external_id": b["external_id"],
                "shape_id": pa.array(shape_id, mask=shape_id < 0),
                "category": b["category"],
                "tid": b["tid"],
                "correlation": b["correlation"],
            }
        )
        del b
        out.append(table_from_columns(cols, HOST_OP_SCHEMA))
    return pa.concat_tables(out) if out else HOST_OP_SCHEMA.empty_table()


def _decoded_dictionary(col: pa.ChunkedArray, parse: Callable[[Any], Any], typ: pa.DataType) -> pa.Array:
    """The parsed values of a (unified) dictionary column, each decoded once, plus a trailing null."""
    raw = [] if col.num_chunks == 0 else col.chunk(0).dictionary.to_pylist()
    return pa.array([parse(v) for v in raw] + [None], typ)


def _codes(col: pa.Array, wanted: np.ndarray) -> np.ndarray:
    """Dictionary codes as int64, -1 for nulls and rows not ``wanted``."""
    codes = pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    codes[~wanted] = -1
    return codes


def _annotations(parts: list[pa.Table], base: int, rank: int) -> pa.Table:
    a = pa.concat_tables(parts, promote_options="default").unify_dictionaries() if parts else None
    parts.clear()
    if a is None or a.num_rows == 0:
        return ANNOTATION_SCHEMA.empty_table()
    start = _shift(a["ts"], base)
    dur = _fill0(a["dur"]).to_numpy(zero_copy_only=False)
    return table_from_columns(
        {
            "trace_id": np.zeros(a.num_rows, np.int16),
            "rank": np.full(a.num_rows, rank, np.int16),
            "name": a["name"].cast(pa.string()),
            "start_ns": start,
            "end_ns": pa.array(start.to_numpy(zero_copy_only=False) + dur),
            "side": a["side"].cast(pa.string()),
        },
        ANNOTATION_SCHEMA,
    )


def _kernels(parts: list[pa.Table], host: pa.Table, base: int, rank: int, meta: InputMeta) -> pa.Table:
    """The kernels table in time order. Consumes ``parts``."""
    if not parts:
        return KERNEL_SCHEMA.empty_table()
    k = pa.concat_tables(parts, promote_options="default").unify_dictionaries()
    parts.clear()
    n = k.num_rows
    if n == 0:
        return KERNEL_SCHEMA.empty_table()
    if k["ts"].null_count or k["dur"].null_count:
        raise InputError(f"{meta.path}: GPU event without ts or dur")
    if pc.any(pc.less(k["dur"], 0)).as_py():
        raise InputError(f"{meta.path}: GPU event with negative duration")
    # device ids: CUDA writes 0-based ids; ROCm writes HSA node ids (2, 5, 9 ...) -> rank them
    dev_raw = _np(k["device"]) if k["device"].null_count == 0 else None
    if dev_raw is None:
        pid = k["pid"].to_pandas()
        devcol = k["device"].to_pandas().fillna(pid).fillna(0).astype("int64").to_numpy()
    else:
        devcol = dev_raw.astype(np.int64)
    if meta.extra.get("rocm"):
        devcol = np.searchsorted(lookup.unique(devcol), devcol)
    # launch linkage via correlation
    launch_api, graph = _launch_info(k, host)
    start = _shift(k["ts"], base)
    order = pc.sort_indices(start)  # stable: ties keep file order
    cols: dict[str, Any] = {
        "trace_id": lambda: np.zeros(n, np.int16),
        "rank": lambda: np.full(n, rank, np.int16),
        "name": lambda: k["name"],
        "norm_name": lambda: k["name"],
        "kind": lambda: k["cat"].cast(pa.string()),
        "start_ns": lambda: start,
        "dur_ns": lambda: k["dur"],
        "device": lambda: pa.array(devcol.astype(np.int16)),
        "stream": lambda: k["stream"] if k["stream"].null_count < n else k["tid"],
        "correlation": lambda: k["correlation"],
        "launch_op_id": lambda: k["external_id"],
        "graph_launch": lambda: graph,
        "count": lambda: np.ones(n, np.int64),
        "aggregate": lambda: np.zeros(n, bool),
        "registers": lambda: k["registers"],
        "shared_mem": lambda: k["shared_mem"],
        "bytes_recorded": lambda: k["bytes"],
        "launch_api": lambda: launch_api,
    }
    workitems = None
    if meta.extra.get("rocm"):
        wi = pc.fill_null(pc.equal(launch_api, _WORKITEM_LAUNCH), False).to_numpy(zero_copy_only=False)
        workitems = wi if wi.any() else None
    for ax in "xyz":
        cols[f"grid_{ax}"] = functools.partial(_grid, k, ax, workitems)
        cols[f"block_{ax}"] = functools.partial(lambda ax: _to_int32(_np(k[f"block_{ax}"])), ax)
    arrays = []
    for f in KERNEL_SCHEMA:
        one = table_from_columns({f.name: cols.pop(f.name)()}, pa.schema([f]))
        arrays.append(one.column(0).take(order))
    return pa.Table.from_arrays(arrays, schema=KERNEL_SCHEMA)


def _grid(k: pa.Table, ax: str, workitems: np.ndarray | None) -> pa.Array:
    """Blocks along ``ax``; ROCm grids given in work-items (``hipExtModuleLaunchKernel``) divided
    by the block size."""
    g = _np(k[f"grid_{ax}"])
    if workitems is None:
        return _to_int32(g)
    g = g.astype(np.float64)
    b = _np(k[f"block_{ax}"]).astype(np.float64)
    ok = workitems & ~np.isnan(g) & ~np.isnan(b) & (b > 0)
    g[ok] = np.ceil(g[ok] / b[ok])
    return _to_int32(g)


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False)


def _to_int32(values: np.ndarray | pa.Array) -> pa.Array:
    arr = np.asarray(values, dtype=np.float64)
    mask = np.isnan(arr) | (arr > 2**31 - 1) | (arr < -(2**31))
    arr = np.where(mask, 0, arr)
    return pa.array(arr.astype(np.int32), mask=mask)


def _fill0(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pa.compute.fill_null(arr, 0)


def _shift(col: pa.ChunkedArray | pa.Array, base: int) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not base:
        return arr
    return pa.compute.add(arr, pa.scalar(base, pa.int64()))


def _base_ns(meta_obj: dict[str, Any]) -> int:
    b = meta_obj.get("baseTimeNanoseconds")
    return b if isinstance(b, int) and b > 0 else 0


def _launch_info(k: pa.Table, host: pa.Table) -> tuple[pa.Array, pa.Array]:
    """Name of the runtime/driver call with the same correlation, and whether it is a graph launch."""
    n = k.num_rows
    corr = (
        k["correlation"].combine_chunks()
        if isinstance(k["correlation"], pa.ChunkedArray)
        else k["correlation"]
    )
    none = pa.nulls(n, pa.string()), pa.array(np.zeros(n, bool))
    if host.num_rows == 0 or corr.null_count == n:
        return none
    launches = launch_calls(host, ["correlation", "name"])
    if launches.num_rows == 0:
        return none
    pos = lookup.index_in(corr, launches["correlation"])  # first match per correlation
    names = dict_take(launches["name"], pos)
    # the pattern is tested once per distinct call name, not once per kernel
    graph = pc.match_substring_regex(names.dictionary, _GRAPH_LAUNCH.pattern).take(names.indices)
    return names, pc.fill_null(graph, False)


# --------------------------------------------------------------------------- metadata


def _uses_hip(host: pa.Table | None) -> bool:
    """ROCm builds keep CUDA category names but call HIP APIs (FORMATS §1.8)."""
    if host is None or host.num_rows == 0:
        return False
    names = host["name"].combine_chunks()
    dic = names.dictionary if isinstance(names, pa.DictionaryArray) else pa.compute.unique(names)
    return bool(pa.compute.any(pa.compute.starts_with(dic, "hip")).as_py())


def _input_meta(path: Path, m: dict[str, Any], hip_calls: bool = False) -> InputMeta:
    meta = InputMeta(path=str(path), format=FORMAT, reader_version=READER_VERSION)
    rocm = hip_calls or any(
        k in m for k in ("roctracer_version", "hip_runtime_version", "hip_driver_version")
    )
    meta.extra["rocm"] = rocm
    for key in (
        "cuda_runtime_version",
        "cuda_driver_version",
        "cupti_version",
        "hip_runtime_version",
        "hip_driver_version",
        "roctracer_version",
    ):
        if key in m and isinstance(m[key], (int, float, str)):
            meta.versions[key] = str(m[key])
    for key in ("record_shapes", "with_stack", "with_flops", "profile_memory", "trace_id", "traceName"):
        if key in m and isinstance(m[key], (int, float, str)):
            meta.extra[key] = m[key]
    devs = m.get("deviceProperties")
    if isinstance(devs, list):
        meta.devices = [d for d in devs if isinstance(d, dict)]
    if meta.devices:
        d0 = meta.devices[0]
        name = d0.get("name")
        meta.gpu_name = name if isinstance(name, str) else None
        major, minor = d0.get("computeMajor"), d0.get("computeMinor")
        if isinstance(major, int) and isinstance(minor, int):
            meta.arch = _arch(rocm, major, minor)
        sms = d0.get("numSms")
        meta.sm_count = sms if isinstance(sms, int) else None
        mem = d0.get("totalGlobalMem")
        meta.total_memory = mem if isinstance(mem, int) else None
    dist = m.get("distributedInfo")
    if isinstance(dist, dict):
        r, ws = dist.get("rank"), dist.get("world_size")
        meta.rank = r if isinstance(r, int) and 0 <= r < 2**15 else 0
        meta.world_size = ws if isinstance(ws, int) and ws > 0 else 1
        if isinstance(dist.get("backend"), str):
            meta.extra["dist_backend"] = dist["backend"]
        if isinstance(dist.get("nccl_version"), str):
            meta.versions["nccl"] = dist["nccl_version"]
    else:
        r = _rank_from_name(path.name)
        if r is not None:
            meta.rank = r
    return meta


# Kineto on ROCm reports gfx major/minor without the stepping digit (observed: MI250 9/0,
# MI300X 9/4, MI350X 9/5); the full gfx names of the shipping parts.
_ROCM_ARCH = {(9, 0): "gfx90a", (9, 4): "gfx942", (9, 5): "gfx950", (12, 0): "gfx1201", (11, 0): "gfx1100"}


def _arch(rocm: bool, major: int, minor: int) -> str:
    if rocm:
        return _ROCM_ARCH.get((major, minor), f"gfx{major}{minor:x}")
    return f"sm_{major}{minor}"


_RANK_PATTERNS = (re.compile(r"-TP-(\d{1,4})"), re.compile(r"rank[_-]?(\d{1,4})", re.I))


def _rank_from_name(name: str) -> int | None:
    for pat in _RANK_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None
