"""Grow a real Kineto trace to a target size by repeating its events, ids kept unique and linked.

Usage::

    python benchmarks/scale_trace.py fixtures/h200-llama3-8b-dense/trace.json.gz --size 1GB \
        -o benchmarks/data/dense-1GB.json [--gzip]

Copy 0 is the source's ``traceEvents`` text byte for byte. Each further copy repeats every event but
the ``ph: "M"`` metadata ones (process/thread names are written once), with

* ``ts`` shifted by ``copy x (span of the trace + 1 ms)`` so the copies follow each other in time;
* ``args["External id"]``, ``args.correlation``, ``args["Ev Idx"]`` and the flow-event ``id``
  (``ph`` ``s``/``f``, which equals the correlation of the launch it links) all offset by
  ``copy x stride``, one stride larger than every id of the source, so links stay intact and no id
  repeats.

Everything outside the array (``deviceProperties``, ``baseTimeNanoseconds``, ``distributedInfo``,
``traceName`` ...) is kept as is. The events keep Kineto's own text layout (only the rewritten numbers
change), so the bytes per event match a real trace. The output is streamed copy by copy: memory is a
few copies of the source, whatever the target size. ``--size`` counts uncompressed bytes, also with
``--gzip`` (the .json.gz then holds exactly the bytes of the plain file of that size). Sizes are
decimal (``MB`` = 10^6, ``GB`` = 10^9); ``MiB``/``GiB`` are binary.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import re
import sys
import time
from decimal import Decimal
from pathlib import Path

import orjson

ID_KEYS = (b"id", b"External id", b"correlation", b"Ev Idx")
GAP_NS = 1_000_000  # between the end of one copy and the start of the next

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_END = re.compile(rb"\}\s*\]")
# A rewritten field: a top-level or args key we shift, and its plain JSON number.
_FIELD = re.compile(rb'"(ts|id|External id|correlation|Ev Idx)"\s*:\s*(-?\d+(?:\.\d+)?)(?=\s*[,}\n])')

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def parse_size(text: str) -> int:
    """``250MB`` -> 250_000_000; ``1GiB`` -> 2**30."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 250MB, 1GB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def size_label(n: int) -> str:
    """250_000_000 -> '250MB'; 1_000_000_000 -> '1GB' (for file names)."""
    for unit, mult in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= mult:
            v = n / mult
            return f"{v:g}{unit}" if abs(v - round(v, 1)) < 1e-9 else f"{round(v, 1):g}{unit}"
    return f"{n}B"


def _read_source(path: Path) -> bytes:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        with gzip.open(path, "rb") as g:
            return g.read()
    return path.read_bytes()


def _ts_ns(num: bytes) -> int:
    """A ``ts`` in microseconds as written -> integer nanoseconds (exact, no float rounding)."""
    return int((Decimal(num.decode()) * 1000).to_integral_value())


def _fmt_ts(ns: int) -> bytes:
    q, r = divmod(ns, 1000)
    return b"%d.%03d" % (q, r)


class Template:
    """The events of one further copy as literal pieces with the numbers to rewrite between them."""

    def __init__(self, blob: bytes) -> None:
        self.literals: list[bytes] = []
        self.is_ts: list[bool] = []
        self.values: list[int] = []
        pos = 0
        for m in _FIELD.finditer(blob):
            key, num = m.group(1), m.group(2)
            if key == b"ts":
                value = _ts_ns(num)
            elif b"." in num or num in (b"0", b"-1"):
                continue  # a float id cannot be offset exactly; 0 / -1 mean "no link": keep as is
            else:
                value = int(num)
            self.literals.append(blob[pos : m.start(2)])
            self.is_ts.append(key == b"ts")
            self.values.append(value)
            pos = m.end(2)
        self.literals.append(blob[pos:])

    def render(self, shift_ns: int, id_offset: int) -> bytes:
        nums = [
            _fmt_ts(v + shift_ns) if t else b"%d" % (v + id_offset)
            for t, v in zip(self.is_ts, self.values, strict=True)
        ]
        out = [b""] * (2 * len(nums) + 1)
        out[0::2] = self.literals
        out[1::2] = nums
        return b"".join(out)


class Source:
    """A Kineto trace cut into: text before the events, each event's text, text after the events."""

    def __init__(self, path: Path) -> None:
        raw = _read_source(path)
        obj = orjson.loads(raw)
        if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
            raise SystemExit(f"{path}: not a Kineto trace (no traceEvents array)")
        events = obj["traceEvents"]
        if not events:
            raise SystemExit(f"{path}: traceEvents is empty")
        m = _EVENTS_KEY.search(raw)
        if m is None:
            raise SystemExit(f"{path}: traceEvents array not found in the text")
        start = raw.index(b"{", m.end())
        end = self._array_end(raw, start, len(events))
        self.head = raw[:start]  # ends with "[" + whitespace
        self.tail = raw[end:]  # whitespace + "]" + the rest of the top-level object
        self.segments = self._split(raw[start:end], len(events))
        self.phases = [e.get("ph") for e in events]
        self.events = events
        self.sep = b",\n  "
        # span and id stride
        t0, t1 = None, None
        max_id = 0
        for e in events:
            ts = e.get("ts")
            if e.get("ph") != "M" and isinstance(ts, (int, float)):
                dur = e.get("dur") if isinstance(e.get("dur"), (int, float)) else 0
                t0 = ts if t0 is None else min(t0, ts)
                t1 = ts + dur if t1 is None else max(t1, ts + dur)
            if isinstance(e.get("id"), int):
                max_id = max(max_id, e["id"])
            args = e.get("args")
            if isinstance(args, dict):
                for k in ("External id", "correlation", "Ev Idx"):
                    v = args.get(k)
                    if isinstance(v, int):
                        max_id = max(max_id, v)
        self.span_ns = int(round(((t1 or 0) - (t0 or 0)) * 1000))
        self.shift_ns = self.span_ns + GAP_NS
        self.stride = 10 ** len(str(max_id + 1))  # a round number above every id
        self.copy0 = raw[start:end]
        self.template = Template(
            self.sep.join(s for s, ph in zip(self.segments, self.phases, strict=True) if ph != "M")
        )

    @staticmethod
    def _array_end(raw: bytes, start: int, n: int) -> int:
        """Index just past the last event's closing brace (the last ``} ]`` that closes the array)."""
        ends = [m.start() + 1 for m in _ARRAY_END.finditer(raw, start)]
        for end in reversed(ends):
            try:
                if len(orjson.loads(b"[" + raw[start:end] + b"]")) == n:
                    return end
            except orjson.JSONDecodeError:
                continue
        raise SystemExit("cannot find the end of the traceEvents array")

    @staticmethod
    def _split(region: bytes, n: int) -> list[bytes]:
        """Each event's own text; a candidate ``},{`` inside a nested value is skipped."""
        segs: list[bytes] = []
        seg_start = 0
        for m in _BOUNDARY.finditer(region):
            cand = region[seg_start : m.start() + 1]
            try:
                orjson.loads(cand)
            except orjson.JSONDecodeError:
                continue  # the boundary was inside this event
            segs.append(cand)
            seg_start = m.end() - 1
        segs.append(region[seg_start:])
        orjson.loads(segs[-1])
        if len(segs) != n:
            raise SystemExit(f"split the events into {len(segs)} pieces, expected {n}")
        return segs


class _Counter:
    def __init__(self, f) -> None:  # noqa: ANN001
        self.f = f
        self.n = 0

    def write(self, b: bytes) -> None:
        self.f.write(b)
        self.n += len(b)


_EVENT_SEP = b"},\n  {"  # Kineto writes one event per "  {" ... "  }" block, nested values indented deeper


def scale(
    src: Source, out: Path, size: int | None, copies: int | None, gz: bool, level: int, whole: bool = False
) -> dict:
    """Write the scaled trace; return what was written.

    With ``size``, the last copy is cut at the first event boundary past the target (unless ``whole``),
    so the file is the target size to within one event.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    opener = (lambda p: gzip.open(p, "wb", compresslevel=level)) if gz else (lambda p: open(p, "wb"))
    n_copies = 1
    events = len(src.segments)
    per_copy = sum(1 for ph in src.phases if ph != "M")
    partial = 0
    with opener(tmp) as f:
        w = _Counter(f)
        w.write(src.head)
        w.write(src.copy0)
        c = 1
        while True:
            if copies is not None and c >= copies:
                break
            if copies is None and w.n + len(src.tail) >= (size or 0):
                break
            blob = src.template.render(c * src.shift_ns, c * src.stride)
            if copies is None and not whole:
                room = (size or 0) - w.n - len(src.tail) - len(src.sep)
                if len(blob) > room:
                    cut = blob.find(_EVENT_SEP, max(room - 1, 0))
                    if cut >= 0:
                        blob = blob[: cut + 1]
                        partial = blob.count(_EVENT_SEP) + 1
            w.write(src.sep)
            w.write(blob)
            events += partial or per_copy
            n_copies += 1
            c += 1
            if partial:
                break
        w.write(src.tail)
        written = w.n
    tmp.replace(out)
    return {
        "path": str(out),
        "bytes": written,
        "file_bytes": out.stat().st_size,
        "copies": n_copies,
        "last_copy_events": partial or per_copy,
        "events": events,
        "shift_ns": src.shift_ns,
        "id_stride": src.stride,
    }


def verify(path: Path, info: dict, src: Source) -> None:
    """Load the output whole; check events, metadata, id uniqueness and links (small outputs only)."""
    obj = orjson.loads(_read_source(path))
    ev = obj["traceEvents"]
    assert len(ev) == info["events"], f"{len(ev)} events, expected {info['events']}"
    src_obj = orjson.loads(src.head + b"]" + src.tail[src.tail.index(b"]") + 1 :])
    src_obj.pop("traceEvents", None)
    assert {k: v for k, v in obj.items() if k != "traceEvents"} == src_obj, "top-level metadata changed"
    stride = info["id_stride"]
    whole = info["copies"] - (0 if info["last_copy_events"] == sum(1 for p in src.phases if p != "M") else 1)

    def links(events: list[dict]) -> tuple[list[int], set[int], set[int], list[tuple]]:
        gpu_corr, launch_corr, ext_ops, flows = [], set(), set(), []
        for e in events:
            a = e.get("args") or {}
            cat = e.get("cat")
            if cat in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in a:
                gpu_corr.append(a["correlation"])
            elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in a:
                launch_corr.add(a["correlation"])
            elif cat == "cpu_op" and "External id" in a:
                ext_ops.add(a["External id"])
            if e.get("ph") in ("s", "f"):
                flows.append((e["ph"], e.get("cat"), e["id"]))
        return gpu_corr, launch_corr, ext_ops, flows

    g0, l0, x0, f0 = links(src.events)
    g_all, la, x_all, f_all = links(ev)
    # only the whole copies can be compared exactly (a cut last copy lost some of its events)
    g = [c for c in g_all if c // stride < whole]
    x = {c for c in x_all if c // stride < whole}
    f = {t for t in f_all if t[2] // stride < whole}
    # (a CUDA-graph launch has one correlation for all its kernels: distinct ids must scale exactly)
    assert len(g) == whole * len(g0) and len(set(g)) == whole * len(set(g0)), "GPU correlation ids repeat"
    unlinked0 = sum(1 for c in g0 if c not in l0)
    assert sum(1 for c in g if c not in la) == whole * unlinked0, "kernel -> launch links broken"
    assert len(x) == whole * len(x0), "cpu_op External ids repeat"
    assert len(f) == whole * len(set(f0)), "flow ids repeat"
    ts = [e["ts"] for e in ev if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    print(
        f"verified {path}: {len(ev):,} events ({whole} whole copies checked), {len(g_all):,} GPU ops, "
        f"{len(set(g_all)):,} distinct correlations, {len(x_all):,} cpu_op External ids, "
        f"ts {min(ts):.3f} .. {max(ts):.3f} us",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="a Kineto trace (.json or .json.gz)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--size", type=parse_size, help="target uncompressed size, e.g. 250MB, 1GB (to within one event)"
    )
    g.add_argument("--copies", type=int, help="number of copies instead of a size")
    p.add_argument(
        "-o", "--output", type=Path, help="output file (default benchmarks/data/<source>-<size>.json[.gz])"
    )
    p.add_argument("--gzip", action="store_true", help="write gzip (.json.gz)")
    p.add_argument("--level", type=int, default=6, help="gzip compression level (default 6)")
    p.add_argument("--whole", action="store_true", help="with --size: end on a whole copy (may overshoot)")
    p.add_argument(
        "--verify", action="store_true", help="load the result and check ids and links (needs RAM ~10x)"
    )
    a = p.parse_args(argv)
    gc.disable()  # millions of acyclic objects: the cyclic collector only slows this down
    t0 = time.perf_counter()
    src = Source(a.source)
    out = a.output
    if out is None:
        stem = a.source.name.split(".")[0]
        label = size_label(a.size) if a.size else f"x{a.copies}"
        out = Path("benchmarks/data") / f"{a.source.parent.name}-{stem}-{label}.json{'.gz' if a.gzip else ''}"
    info = scale(src, out, a.size, a.copies, a.gzip, a.level, a.whole)
    dt = time.perf_counter() - t0
    print(
        f"wrote {info['path']}: {info['bytes']:,} bytes JSON"
        + (f" ({info['file_bytes']:,} gzip)" if a.gzip else "")
        + f", {info['copies']} copies, {info['events']:,} events, {dt:.1f} s",
        file=sys.stderr,
    )
    if a.verify:
        verify(out, info, src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
