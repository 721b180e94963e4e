"""Kineto trace bytes -> decoded events: where the ``traceEvents`` array starts, chunks cut at event
boundaries and decoded in place, the last chunk and the top-level object around the array.

Nothing here builds a table: :mod:`analyzer.readers.kineto_events` turns the decoded events into Arrow
columns, :mod:`analyzer.readers.kineto` the columns into the model. The typed msgspec decoder skips
every field and phase we do not need; the file is hashed while it is read (:class:`HashingFile`).
The runtime's chunk workers (:mod:`analyzer.runtime.chunked_kineto`) decode their byte ranges with
the same :data:`DECODER` and :func:`decode_last`.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import msgspec
import orjson

from analyzer import readers
from analyzer.errors import InputError
from analyzer.readers import gz

CHUNK_BYTES = 16 << 20
READ_BYTES = 8 << 20

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_END = re.compile(rb"\}\s*\]")
_NON_SPACE = re.compile(rb"[^ \t\n\r]")
_SEPARATOR = re.compile(rb"\s*,?")


class EventArgs(msgspec.Struct, gc=False):
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
    args: EventArgs | None = None


class Event(_Body, gc=False):
    ph: Any = None


_LENIENT = msgspec.json.Decoder(list[Event])


class CompleteEvent(_Body, gc=False, tag_field="ph", tag="X"):
    """A complete event; the only phase we read."""


def _skipped(tag: str) -> type:
    # other phases (flows, instants, counters, metadata ...) decode to an empty struct: msgspec
    # skips their fields in C without building a single string
    return msgspec.defstruct(f"_Ph{ord(tag)}", [], gc=False, tag_field="ph", tag=tag)


_PHASES = "BEiICbneOstfPNDMVvRc()"
_FAST = msgspec.json.Decoder(list[Union[CompleteEvent, *[_skipped(t) for t in _PHASES]]])  # type: ignore[misc]


class _Decoder:
    """Tagged decoding first; any surprise (a phase not in the list, no "ph") -> the lenient one."""

    @staticmethod
    def decode(data: bytes) -> list[Any]:
        try:
            return _FAST.decode(data)
        except msgspec.ValidationError:
            return _LENIENT.decode(data)


DECODER = _Decoder()


def find_events(head: bytes) -> tuple[bytes | None, int] | None:
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


class HashingFile(io.RawIOBase):
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


def open_trace(path: Path) -> tuple[io.BufferedIOBase, HashingFile]:
    with open(path, "rb") as f:
        magic = f.read(2)
    raw = HashingFile(path)
    if magic == gz.MAGIC:
        return gz.reader(io.BufferedReader(raw, 1 << 20)), raw
    return io.BufferedReader(raw, 1 << 20), raw  # type: ignore[return-value]


def _read_block(f: io.BufferedIOBase, path: Path) -> bytes:
    try:
        return f.read(READ_BYTES)
    except gz.ERRORS as e:
        raise InputError(f"{path}: corrupt or truncated gzip file ({e})") from None


def stream_events(
    path: Path, add: Callable[[list[Any]], None], progress: Callable[[int], None] | None
) -> dict[str, Any]:
    """Feed the events of ``path`` to ``add``, one chunk at a time; return the top-level metadata
    object. The file's sha256, computed on the way, is remembered (:func:`analyzer.readers.memo_sha256`)."""
    f, hashing = open_trace(path)
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
            found = _decode_at_boundary(buf, CHUNK_BYTES // 2, path, total - len(buf))
            if found is None:
                # no boundary yet: read more (a single huge event)
                block = _read_block(f, path)
                total += len(block)
                if not block:
                    eof = True
                buf += block
                continue
            events, cut = found
            add(events)
            del events, found  # their raw fields pointed into buf
            # drop the decoded events and the separator after them but its last byte: the spare
            m = _SEPARATOR.match(buf, cut)
            del buf[: (m.end() if m else cut) - 1]
        # 3. the rest: last events, "]", then the tail of the top-level object
        events, tail = decode_last(buf, path, total - len(buf))
        add(events)
        while hashing.readinto(bytearray(1 << 20)):  # bytes after the gzip stream, if any
            pass
        readers.remember_sha256(path, hashing.sha.hexdigest())
    return top_level(path, prefix, tail)


def top_level(path: Path, prefix: bytes | None, tail: bytes) -> dict[str, Any]:
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


def _decode_at_boundary(
    buf: bytearray, start: int, path: Path, offset: int = 0
) -> tuple[list[Event], int] | None:
    """Decode the events before the first whole-event boundary (``}`` ``,`` ``{``) after ``start``;
    return them and the index just after their last ``}``, or None when no boundary is found.
    ``buf[0]`` is a spare byte, the events start after it (see :func:`_decode_through`)."""
    found = _decode_through(buf, BOUNDARY, max(start, 1), path, offset)
    return None if found is None else (found[0], found[1].start() + 1)


def _decode_through(
    buf: bytearray, end: re.Pattern[bytes], pos: int, path: Path | str, offset: int = 0
) -> tuple[list[Any], re.Match[bytes]] | None:
    """Decode the events from ``buf[1]`` to the first match of ``end`` at or after ``pos`` that
    closes them (its ``}`` ends the last event); return them and that match, or None when there is
    none.

    A candidate inside a string or a nested object leaves the text unbalanced, which the decoder
    reports at its very end: then the next one is tried. An error earlier is real corruption. The
    text is decoded in place: the spare byte ``buf[0]`` becomes ``[`` and the byte after the ``}``
    ``]`` for the time of the decoding (a copy per chunk cost its page faults, docs/performance.md).
    The events' raw fields point into ``buf``: drop them before ``buf`` is resized.
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
            return DECODER.decode(memoryview(buf)[: cut + 1]), m
        except msgspec.ValidationError as e:
            raise InputError(f"{path}: event with unexpected field type ({e})") from None
        except msgspec.DecodeError as e:
            if not _error_at_end(str(e), cut + 1):
                raise InputError(
                    f"{path}: not valid JSON in traceEvents ({_at_file_byte(str(e), offset)})"
                ) from None
        finally:
            buf[cut] = keep
        pos = m.end() - 1


_ERR_BYTE = re.compile(r"\(byte (\d+)\)")


def _error_at_end(msg: str, size: int) -> bool:
    if "truncated" in msg:
        return True
    m = _ERR_BYTE.search(msg)
    return m is not None and int(m.group(1)) >= size - 2


def _at_file_byte(message: str, offset: int) -> str:
    """The decoder's message with its ``(byte N)`` counted from the start of the file's (JSON) text:
    ``buf[i]`` holds byte ``offset + i`` of it."""
    return _ERR_BYTE.sub(lambda m: m.group(0).replace(m.group(1), str(int(m.group(1)) + offset)), message)


def decode_last(buf: bytearray, path: Path | str = "trace", offset: int = 0) -> tuple[list[Any], bytes]:
    """Decode the final events; return them and what follows the array (the rest of the top object).

    ``buf[0]`` is a spare byte, the text starts at ``buf[1]``; the events are decoded in place
    (:func:`_decode_through`: three copies of up to two chunks made the last chunk the peak of a
    worker's memory)."""
    first = _first_text(buf)
    if buf[first : first + 1] == b"]":
        return [], bytes(memoryview(buf)[first + 1 :])
    found = _decode_through(buf, _ARRAY_END, first, path, offset)
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
