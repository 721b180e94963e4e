"""A Kineto trace's own events streamed as raw text, chunk by chunk, for writing them out again.

Contract: :func:`open_events` yields a :class:`KinetoEvents` whose iteration gives :class:`RawChunk`\\ s
in file order. Each chunk holds every event of its stretch of the ``traceEvents`` array as its exact
text (a ``msgspec.Raw``: the bytes between its braces, never re-serialised) and, for the GPU
activities among them (the events :mod:`analyzer.readers.kineto` turns into kernels rows: ``ph``
``X`` and category ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` in any case), their ``ts`` in
nanoseconds rounded as that reader rounds it (``rint(ts * 1000)``, before the file's
``baseTimeNanoseconds`` is added) and where extra ``args`` entries go in their text. The
top-level object around the array (its text before and after) is kept too; ``base_ns`` is known
once the events are exhausted (Kineto writes it after them).

The file is never decoded whole: memory is one chunk (:data:`CHUNK_BYTES`) and its events.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import orjson
import pyarrow as pa

from analyzer.errors import InputError
from analyzer.readers import gz
from analyzer.readers.kineto_scan import _ARRAY_END, _ERR_BYTE, _EVENTS_KEY, _NON_SPACE, BOUNDARY

CHUNK_BYTES = 4 << 20  # small: the writer's memory is a few chunks beside the analysis
READ_BYTES = 1 << 20

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

_ARGS_KEY = re.compile(rb'"args"\s*:\s*')
_SEPARATOR = re.compile(rb"\s*,\s*")


class _X(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event: what tells a GPU activity apart, and its args object's text."""

    cat: str | None = None
    ts: float | str | None = None
    args: msgspec.Raw = msgspec.Raw()


def _skipped(tag: str) -> type:
    # events of other phases decode to an empty struct: msgspec skips their fields in C
    return msgspec.defstruct(f"_Ph{ord(tag)}", [], gc=False, tag_field="ph", tag=tag)


class _Light(msgspec.Struct, gc=False):
    """The lenient form, for what the tagged one refuses (a phase not listed, odd field types)."""

    ph: Any = None
    cat: Any = None
    ts: Any = None
    args: msgspec.Raw = msgspec.Raw()


_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_PHASES = "BEiICbneOstfPNDMVvRc()"  # the trace-event phases but X
_FAST = msgspec.json.Decoder(list[Union[_X, *[_skipped(t) for t in _PHASES]]])  # type: ignore[misc]
_LENIENT = msgspec.json.Decoder(list[_Light])


class _IsGpu(dict[Any, bool]):
    """category -> GPU activity or not, each distinct category decided once."""

    def __missing__(self, cat: Any) -> bool:
        got = type(cat) is str and cat.lower() in GPU_CATEGORIES
        self[cat] = got
        return got


_IS_GPU = _IsGpu()
_SPACE = frozenset(b" \t\r\n")


@dataclasses.dataclass
class RawChunk:
    """Consecutive events of the array.

    ``events[i]`` is event ``i``'s exact text (``bytes`` for the GPU activities); ``gpu`` the positions (int64) of the GPU activities
    among them, ``ts_ns`` their rounded ``ts`` (int64 ns, no base) and ``splices`` where their
    extra args go: ``(start, end, before, after)`` means the event's text becomes
    ``text[:start] + before + ENTRIES + after + text[end:]``, ``ENTRIES`` being ``"key": value``
    pairs joined by ``", "`` (inside the existing ``args`` object, or a new one).
    """

    events: list[Any]
    gpu: np.ndarray
    ts_ns: np.ndarray
    splices: list[tuple[int, int, bytes, bytes]]


class KinetoEvents:
    """One Kineto file's events, read once by iterating; see the module docstring."""

    def __init__(self, path: Path, f: io.BufferedIOBase) -> None:
        self.path = path
        self._f = f
        self._buf = bytearray()
        self._eof = False
        self._started = False
        self.prefix: bytes | None = None  # the top-level text before "traceEvents"; None: a bare list
        self.tail: bytes | None = None  # the text after the array, once the events are exhausted
        self._find_array()

    # -- reading

    def _read(self) -> bytes:
        try:
            block = self._f.read(READ_BYTES)
        except gz.ERRORS as e:
            raise InputError(f"{self.path}: corrupt or truncated gzip file ({e})") from None
        if not block:
            self._eof = True
        return block

    def _find_array(self) -> None:
        buf = self._buf
        while True:
            buf += self._read()
            m = _EVENTS_KEY.search(buf)
            if m:
                self.prefix = bytes(buf[: m.start()])
                del buf[: m.end()]
                return
            stripped = buf.lstrip()
            if stripped[:1] == b"[":
                del buf[: len(buf) - len(stripped) + 1]
                return
            if self._eof or len(buf) > (64 << 20):
                raise InputError(f"{self.path}: not a Kineto trace (no traceEvents array)")

    def __iter__(self) -> Iterator[RawChunk]:
        if self._started:
            raise RuntimeError("the events of a Kineto file are read once")
        self._started = True
        buf = self._buf
        while True:
            while len(buf) < CHUNK_BYTES and not self._eof:
                buf += self._read()
            if self._eof:
                break
            found = self._decode_until(BOUNDARY, CHUNK_BYTES // 2)
            if found is None:  # one huge event: read on
                buf += self._read()
                continue
            chunk, end, _ = found
            m = _SEPARATOR.match(buf, end)
            del buf[: m.end() if m else end]
            yield chunk
        first = _NON_SPACE.search(buf)
        if first is not None and buf[first.start() : first.start() + 1] == b"]":
            self.tail = bytes(buf[first.start() + 1 :])
            return
        found = self._decode_until(_ARRAY_END, 0)
        if found is None:
            raise InputError(f"{self.path}: truncated trace (traceEvents array never ends)")
        chunk, _, after = found
        self.tail = bytes(buf[after:])  # after the "]"
        yield chunk

    def _decode_until(self, end: re.Pattern[bytes], pos: int) -> tuple[RawChunk, int, int] | None:
        """The events from the start of the buffer to the first match of ``end`` at or after ``pos``
        that closes them, the index just after their last ``}`` and the end of the match; None when
        no match does.

        A match inside a string or a nested object leaves the text unbalanced, which the decoder
        reports at its very end: then the next one is tried. An error earlier is corruption."""
        buf = self._buf
        while True:
            m = end.search(buf, pos)
            if m is None:
                return None
            cut = m.start() + 1
            with memoryview(buf) as view:
                text = b"".join((b"[", view[:cut], b"]"))
            try:
                raws = _RAWS.decode(text)
            except msgspec.DecodeError as e:
                if not _error_at_end(str(e), len(text)):
                    raise InputError(f"{self.path}: not valid JSON in traceEvents ({e})") from None
                pos = m.end() - 1
                continue
            return self._chunk(text, raws), cut, m.end()

    def _chunk(self, text: bytes, raws: list[Any]) -> RawChunk:
        is_gpu = _IS_GPU
        try:
            light: list[Any] = _FAST.decode(text)
            gpu = [i for i, e in enumerate(light) if type(e) is _X and is_gpu[e.cat]]
        except msgspec.ValidationError:
            try:
                light = _LENIENT.decode(text)
            except msgspec.DecodeError as e:  # an event that is not an object
                raise InputError(f"{self.path}: unexpected event in traceEvents ({e})") from None
            gpu = [i for i, e in enumerate(light) if e.ph == "X" and type(e.cat) is str and is_gpu[e.cat]]
        ts = _ts_ns([light[i].ts for i in gpu], self.path)
        splices = []
        space, add = _SPACE, splices.append
        for i in gpu:
            event = raws[i] = bytes(raws[i])  # the GPU events as bytes: their text gets spliced
            args = bytes(light[i].args)
            # the common layout, inline (a third of the export's time is spent here): args last
            end = len(event) - 1
            while event[end - 1] in space:
                end -= 1
            at = end - len(args)
            if args[:1] == b"{" and at > 0 and event.startswith(args, at):
                key = event.rfind(b'"args"', 0, at)
                if key >= 0 and event[key + 6 : at].strip() == b":":
                    last = end - 1  # the args object's "}"
                    while event[last - 1] in space:
                        last -= 1
                    add((last, last, b"", b"") if event[last - 1] == 0x7B else (last, last, b", ", b""))
                    continue
            add(_splice(event, args))
        return RawChunk(raws, np.asarray(gpu, np.int64), ts, splices)

    # -- the top-level object

    def top_level(self) -> dict[str, Any]:
        """The top-level object without its events (empty for a bare list); after iterating."""
        if self.tail is None:
            raise RuntimeError("the top-level object is known once the events are read")
        if self.prefix is None:
            return {}
        try:
            meta = orjson.loads(self.prefix + b'"traceEvents": []' + self.tail)
        except orjson.JSONDecodeError:
            raise InputError(
                f"{self.path}: not valid JSON (top-level object is malformed or truncated)"
            ) from None
        return meta if isinstance(meta, dict) else {}

    @property
    def base_ns(self) -> int:
        """``baseTimeNanoseconds`` as the reader adds it to every ``ts`` (0 when absent)."""
        b = self.top_level().get("baseTimeNanoseconds")
        return b if isinstance(b, int) and b > 0 else 0


@contextlib.contextmanager
def open_events(path: str | Path) -> Iterator[KinetoEvents]:
    """The events of the Kineto file ``path`` (plain or gzip), to iterate once."""
    p = Path(path)
    try:
        raw = open(p, "rb")
    except OSError as e:
        raise InputError(f"{p}: {e.strerror or e}") from None
    with raw:
        magic = raw.read(2)
        raw.seek(0)
        f: io.BufferedIOBase = gz.reader(raw) if magic == gz.MAGIC else raw  # type: ignore[assignment]
        with f:
            yield KinetoEvents(p, f)


def _error_at_end(msg: str, size: int) -> bool:
    if "truncated" in msg:
        return True
    m = _ERR_BYTE.search(msg)
    return m is not None and int(m.group(1)) >= size - 2


def _ts_ns(values: list[Any], path: Path) -> np.ndarray:
    """``ts`` in ns as the reader rounds it: ``rint(ts_us * 1000)``; numbers written as strings too."""
    try:
        arr = pa.array(values, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        arr = np.array([_num(v) for v in values], np.float64)
    if not np.isfinite(arr).all():
        raise InputError(f"{path}: GPU event without ts")
    return np.rint(arr * 1000.0).astype(np.int64)


def _num(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _splice(event: bytes, args: bytes) -> tuple[int, int, bytes, bytes]:
    """Where extra args entries go in ``event`` (see :class:`RawChunk`); ``args`` is the text of its
    ``args`` value (empty when the event has none). ``event`` starts with ``{`` and ends with ``}``."""
    if not args:  # no args: a new object before the event's closing brace
        at = _before_space(event, len(event) - 1)
        return at, at, b', "args": {', b"}"
    at = _args_at(event, args)
    if args == b"null":
        return at, at + 4, b"{", b"}"
    last = _before_space(event, at + len(args) - 1)  # just after the last entry (or the "{")
    if event[last - 1] == 0x7B:  # {
        return last, last, b"", b""
    return last, last, b", ", b""


def _before_space(text: bytes, end: int) -> int:
    """``end`` moved back over the JSON whitespace before it."""
    space = _SPACE
    while text[end - 1] in space:
        end -= 1
    return end


def _args_at(event: bytes, args: bytes) -> int:
    """Offset of the ``args`` value in the event's text. Kineto writes ``args`` last (the fast path:
    the last value of the event, after an ``"args"`` key); otherwise the first ``"args":`` key
    followed by that exact text."""
    at = _before_space(event, len(event) - 1) - len(args)
    if at > 0 and event.startswith(args, at):
        key = event.rfind(b'"args"', 0, at)
        if key >= 0 and event[key + 6 : at].strip() == b":":
            return at
    for m in _ARGS_KEY.finditer(event):
        if event.startswith(args, m.end()):
            return m.end()
    raise InputError("GPU event whose args could not be located in its text")  # pragma: no cover
