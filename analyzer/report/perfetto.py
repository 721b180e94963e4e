"""Perfetto reporter: the run as one Chrome-trace JSON (``.perfetto.json``) that Perfetto UI and
``chrome://tracing`` open, every GPU activity carrying its classification in ``args``.

Contract (``render(export, stream)``, a binary stream; :class:`PerfettoExport` is the data):

* every GPU activity gets ``stage``, ``category``, ``provider``, ``phase``, ``step``, ``layer``,
  ``rule_id`` (the kernel rule its name matched) and ``stage_rule`` (the rule that gave its final
  stage) in its ``args`` (JSON null where the kernels table has null);
* a Kineto input (``ExportInput.events`` set) keeps every one of its events, in file order, byte for
  byte: the entries are inserted into the text of a GPU event's ``args`` object (or an ``args``
  object is added), nothing else is re-serialised, so ``ts``/``dur`` are the input's own. Its GPU
  events are matched to their kernels-table rows by their rounded ``ts`` and file order (the order
  the reader's stable time sort keeps); a count or time that does not match is an InputError;
* any other input gets one ``X`` event per kernels-table row, times in µs of the table's ns;
* per input (one process per rank, pid ``PID_BASE + trace_id``, named by ``M`` metadata events): a
  ``steps`` track with one slice per step (phase, tokens ...) and per device a ``layers GPU d`` track
  with one slice per (step, layer): the span of that layer's kernels in that step. Slices that would
  overlap part-way go to a further lane (``steps (2)`` ...), so the slices of one track are disjoint;
  added times are exact decimals of the table's ns, in the input's µs base (Kineto: ``ts`` base);
* one input of Kineto keeps its top-level object (``deviceProperties`` ...); several inputs, or
  another format, are written as ``{"traceEvents": [...], "otherData": {...}}``.

The reporter opens nothing: the caller hands over each Kineto input's events as an iterator
(:mod:`analyzer.readers.kineto_raw` makes them) and the output stream. Memory is one chunk of events
plus per-row fragments of the kernels table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import IO, Any, ClassVar, Protocol

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.errors import InputError

FORMAT_VERSION = 1
PID_BASE = 1_000_000_000  # above any OS pid: the processes this reporter adds never meet Kineto's
ARG_COLUMNS = ("stage", "category", "provider", "phase", "step", "layer", "rule_id", "stage_rule")
_INT_COLUMNS = frozenset({"step", "layer"})
_SEP = b",\n"
TABLE_TID = 10_000  # the kernel tracks of an input built from the table; the added tracks count from 1


class RawChunkLike(Protocol):
    events: list[Any]  # each event's exact text (bytes-like; the GPU activities' are bytes)
    gpu: np.ndarray  # positions of the GPU activities in ``events``
    ts_ns: np.ndarray  # their ts in ns as the reader rounds it, before the base
    splices: list[tuple[int, int, bytes, bytes]]  # where their args entries go


class RawEvents(Protocol):
    """A Kineto input's own events (see :class:`analyzer.readers.kineto_raw.KinetoEvents`)."""

    prefix: bytes | None
    tail: bytes | None

    def __iter__(self) -> Iterator[RawChunkLike]: ...

    @property
    def base_ns(self) -> int: ...


@dataclasses.dataclass
class ExportInput:
    """One input of the run: its events streamed by the caller (Kineto), or None: built from the table."""

    trace_id: int
    rank: int
    format: str
    path: str = ""
    events: RawEvents | None = None


@dataclasses.dataclass
class PerfettoExport:
    """What the reporter writes: the analysed kernels table, the steps table and the inputs."""

    kernels: pa.Table
    steps: pd.DataFrame | None
    inputs: Sequence[ExportInput]


class PerfettoReporter:
    name: ClassVar[str] = "perfetto"
    extensions: ClassVar[tuple[str, ...]] = (".perfetto.json",)
    binary: ClassVar[bool] = True

    def render(self, data: PerfettoExport, stream: IO[bytes]) -> None:
        _Writer(data, stream).write()


class _Writer:
    def __init__(self, data: PerfettoExport, stream: IO[bytes]) -> None:
        self.data = data
        self.out = stream
        self.first = True
        k = data.kernels
        self.trace_id = k["trace_id"].to_numpy(zero_copy_only=False)
        self.start = k["start_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        self.dur = k["dur_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        self.args = arg_fragments(k)  # per row, built once (vectorised): ~150 bytes a row

    def emit(self, blob: bytes | bytearray) -> None:
        if not blob:
            return
        if not self.first:
            self.out.write(_SEP)
        self.out.write(blob)
        self.first = False

    def write(self) -> None:
        inputs = list(self.data.inputs)
        keep_top = len(inputs) == 1 and inputs[0].events is not None and inputs[0].events.prefix is not None
        if keep_top:
            self.out.write(inputs[0].events.prefix + b'"traceEvents": [\n')  # type: ignore[union-attr,operator]
        else:
            self.out.write(b'{"traceEvents": [\n')
        bases = {}
        for inp in inputs:
            rows = np.flatnonzero(self.trace_id == inp.trace_id)
            if inp.events is not None:
                bases[inp.trace_id] = self.raw_events(inp, rows)
            else:
                bases[inp.trace_id] = 0
                self.table_events(inp, rows)
        for inp in inputs:
            rows = np.flatnonzero(self.trace_id == inp.trace_id)
            self.added_events(inp, rows, bases[inp.trace_id])
        if keep_top:
            self.out.write(b"\n]" + (inputs[0].events.tail or b"}"))  # type: ignore[union-attr]
        else:
            other = {
                "llm_kernel_map": {
                    "format_version": FORMAT_VERSION,
                    "inputs": [
                        {"trace_id": i.trace_id, "rank": i.rank, "format": i.format, "path": i.path}
                        for i in inputs
                    ],
                }
            }
            self.out.write(b'\n],\n"displayTimeUnit": "ms",\n"otherData": ' + orjson.dumps(other) + b"}\n")

    # -- Kineto: the input's own events, args inserted

    def raw_events(self, inp: ExportInput, rows: np.ndarray) -> int:
        """Write the input's events with args added; return its base (ns) once checked."""
        assert inp.events is not None
        match = _Matcher(self.start[rows], inp.path or f"input {inp.trace_id}")
        for chunk in inp.events:
            parts = chunk.events
            if len(chunk.gpu):
                at = match.rows(chunk.ts_ns)
                frags = self.args.take(pa.array(rows[at])).to_pylist()
                for i, (s, e, before, after), frag in zip(
                    chunk.gpu.tolist(), chunk.splices, frags, strict=True
                ):
                    text = parts[i]
                    parts[i] = b"".join((text[:s], before, frag, after, text[e:]))
            self.emit(_SEP.join(parts))
        match.finish(inp.events.base_ns)
        return inp.events.base_ns

    # -- other formats: events from the kernels table

    def table_events(self, inp: ExportInput, rows: np.ndarray) -> None:
        k = self.data.kernels.take(pa.array(rows))
        if k.num_rows == 0:
            return
        keep = pc.invert(k["aggregate"].fill_null(False)).to_numpy(zero_copy_only=False)
        start, dur = self.start[rows], self.dur[rows]
        device = k["device"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        stream = k["stream"].fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        tracks: dict[tuple[int, int], list[int]] = {}
        for i in np.flatnonzero(keep).tolist():
            tracks.setdefault((int(device[i]), int(stream[i])), []).append(i)
        tid = np.zeros(k.num_rows, np.int64)
        names: list[tuple[int, str]] = []
        for (d, s), members in sorted(tracks.items()):
            m = np.asarray(members)
            lanes = pack_lanes(start[m], start[m] + dur[m])
            for lane in range(int(lanes.max()) + 1):
                t = TABLE_TID + len(names)
                label = f"GPU {d} stream {s}" if s >= 0 else f"GPU {d}"
                names.append((t, label if lane == 0 else f"{label} ({lane + 1})"))
                tid[m[lanes == lane]] = t
        pid = PID_BASE + inp.trace_id
        self.emit(_SEP.join(_thread_names(pid, names)))
        sel = np.flatnonzero(keep)
        if not len(sel):
            return
        k = k.take(pa.array(sel))
        text = pc.binary_join_element_wise(
            '{"ph": "X", "cat": ',
            json_texts(k["kind"]),
            ', "name": ',
            json_texts(k["name"]),
            f', "pid": {pid}, "tid": ',
            pc.cast(pa.array(tid[sel]), pa.string()),
            ', "ts": ',
            us_texts(start[sel]),
            ', "dur": ',
            us_texts(dur[sel]),
            ', "args": {',
            self.args.take(pa.array(rows[sel])).cast(pa.string()),
            ', "device": ',
            pc.cast(pa.array(device[sel]), pa.string()),
            ', "stream": ',
            json_texts(k["stream"]),
            ', "correlation": ',
            json_texts(k["correlation"]),
            "}}",
            "",
        )
        step = 1 << 16
        for lo in range(0, len(text), step):
            self.emit(_SEP.join(s.encode() for s in text.slice(lo, step).to_pylist()))

    # -- the added tracks: steps and layers

    def added_events(self, inp: ExportInput, rows: np.ndarray, base: int) -> None:
        pid = PID_BASE + inp.trace_id
        label = f"rank {inp.rank}"
        if inp.events is not None:
            label += " (llm-kernel-map)"
        out = [
            _meta(pid, 0, "process_name", {"name": label}),
            _meta(pid, 0, "process_sort_index", {"sort_index": -1000 + inp.trace_id}),
        ]
        names: list[tuple[int, str]] = []
        phases: dict[int, str] = {}
        steps = self.data.steps
        if steps is not None and len(steps):
            st = steps[steps["trace_id"] == inp.trace_id].sort_values(["start_ns", "step"], kind="stable")
            phases = dict(zip(st["step"].astype(int), st["phase"].astype(str), strict=True))
            s0 = st["start_ns"].to_numpy(np.int64)
            d0 = st["dur_ns"].to_numpy(np.int64)
            lanes = pack_lanes(s0, s0 + d0)
            for lane in range(int(lanes.max()) + 1 if len(lanes) else 0):
                names.append((len(names) + 1, "steps" if lane == 0 else f"steps ({lane + 1})"))
            recs = st.to_dict("records")
            for r, lane in zip(recs, lanes.tolist(), strict=True):
                args = {
                    "step": int(r["step"]),
                    "phase": r["phase"],
                    "tokens": None if pd.isna(r["tokens"]) else int(r["tokens"]),
                    "kernels": int(r["kernels"]),
                    "busy_ns": int(r["busy_ns"]),
                    "kernel_ns": int(r["kernel_ns"]),
                    "source": r["source"],
                }
                name = f"step {args['step']} {r['phase']}"
                if args["tokens"] is not None:
                    name += f" ({args['tokens']} tokens)"
                out.append(
                    _slice(pid, lane + 1, name, "lkm_step", int(r["start_ns"]) - base, int(r["dur_ns"]), args)
                )
        for device, ranges in layer_ranges(self.data.kernels.take(pa.array(rows))):
            s0, e0 = ranges["start_ns"], ranges["end_ns"]
            lanes = pack_lanes(s0, e0)
            first = len(names) + 1
            for lane in range(int(lanes.max()) + 1 if len(lanes) else 0):
                label = f"layers GPU {device}"
                names.append((len(names) + 1, label if lane == 0 else f"{label} ({lane + 1})"))
            for j in range(len(s0)):
                step, layer = int(ranges["step"][j]), int(ranges["layer"][j])
                args = {
                    "layer": layer,
                    "step": step,
                    "phase": phases.get(step, "unknown"),
                    "kernels": int(ranges["kernels"][j]),
                }
                out.append(
                    _slice(
                        pid,
                        first + int(lanes[j]),
                        f"layer {layer}",
                        "lkm_layer",
                        int(s0[j]) - base,
                        int(e0[j] - s0[j]),
                        args,
                    )
                )
        self.emit(_SEP.join(out[:2] + _thread_names(pid, names) + out[2:]))


# --------------------------------------------------------------------------- matching


class _Matcher:
    """Kernels-table rows of one input's GPU events, in file order.

    The reader sorts the rows by ``rounded ts + base`` (stable: ties in file order), so an event's row
    is the number of rows that start earlier plus the events of the same start seen before it. The
    base is Kineto's ``baseTimeNanoseconds``, written after the events: it is inferred from the first
    events (the one shift that lands them all on rows) and checked against the file's at the end.
    """

    def __init__(self, start: np.ndarray, label: str) -> None:
        self.start = start
        self.label = label
        self.base: int | None = None
        self.hit = np.zeros(len(start), bool)
        dup = start[1:][np.diff(start) == 0]
        self.dups = np.unique(dup) if len(dup) else None
        self.seen: dict[int, int] = {}
        if len(start) and (np.diff(start) < 0).any():
            raise InputError(f"{label}: kernels table not in time order")

    def _fail(self, what: str) -> InputError:
        return InputError(
            f"{self.label}: the trace's GPU events do not match its analysis ({what}); was it changed?"
        )

    def rows(self, ts: np.ndarray) -> np.ndarray:
        if self.base is None:
            self.base = self._infer_base(ts)
        key = ts + self.base
        pos = np.searchsorted(self.start, key, "left")
        if self.dups is not None:
            for j in np.flatnonzero(np.isin(key, self.dups)).tolist():
                kj = int(key[j])
                n = self.seen.get(kj, 0)
                self.seen[kj] = n + 1
                pos[j] += n
        n = len(self.start)
        if (pos >= n).any() or (self.start[np.minimum(pos, n - 1)] != key).any():
            raise self._fail("an event at a time no kernel starts")
        if self.hit[pos].any():
            raise self._fail("two events for one kernel")
        self.hit[pos] = True
        return pos

    def _infer_base(self, ts: np.ndarray) -> int:
        if not len(self.start):
            raise self._fail("GPU events, but no kernels")
        cand = np.unique(self.start - ts[0])
        for t in ts[1:].tolist():
            if len(cand) <= 1:
                break
            key = cand + t
            pos = np.minimum(np.searchsorted(self.start, key), len(self.start) - 1)
            cand = cand[self.start[pos] == key]
        if len(cand) > 1:  # the same shift pattern repeats (copies of one run): the earliest rows
            cand = cand[:1]
        if not len(cand):
            raise self._fail("no time shift aligns them")
        return int(cand[0])

    def finish(self, base: int) -> None:
        if not len(self.start):
            return
        if self.base is None:
            raise self._fail(f"{len(self.start)} kernels, no GPU event")
        if self.base != base:
            raise self._fail("the time base differs")
        if not self.hit.all():
            raise self._fail(f"{int((~self.hit).sum())} kernels without their event")


# --------------------------------------------------------------------------- building blocks


def arg_fragments(kernels: pa.Table) -> pa.Array:
    """Per row the ``args`` entries (``"stage": "attention", ... "stage_rule": "ATT001"``) as binary."""
    parts: list[Any] = []
    for i, c in enumerate(ARG_COLUMNS):
        parts.append(("" if i == 0 else ", ") + f'"{c}": ')
        col = kernels[c] if c in kernels.column_names else pa.nulls(kernels.num_rows)
        parts.append(json_texts(col))
    out = pc.binary_join_element_wise(*parts, "").cast(pa.binary())
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def json_texts(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each value's JSON text (``null`` for nulls); strings via their dictionary, escaped once each."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_integer(arr.type):
        return pc.fill_null(pc.cast(arr, pa.string()), "null")
    if pa.types.is_null(arr.type):
        return pa.array(["null"] * len(arr), pa.string())
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    values = [orjson.dumps(v).decode() for v in arr.dictionary.to_pylist()]
    return pc.fill_null(pa.array(values, pa.string()).take(arr.indices), "null")


def us_texts(ns: np.ndarray) -> pa.Array:
    """ns as exact decimal µs (``1234.567``): no float rounding moves a slice edge."""
    mag = np.abs(ns)
    whole = pc.cast(pa.array(mag // 1000), pa.string())
    frac = pc.utf8_lpad(pc.cast(pa.array(mag % 1000), pa.string()), width=3, padding="0")
    sign = pa.array(np.where(ns < 0, "-", ""))
    return pc.binary_join_element_wise(sign, whole, ".", frac, "")


def _us(ns: int) -> str:
    mag = abs(ns)
    return f"{'-' if ns < 0 else ''}{mag // 1000}.{mag % 1000:03d}"


def pack_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A lane per interval such that the intervals of one lane are disjoint (touching is fine): the
    first lane free at its start, in order of start (longer first)."""
    n = len(start)
    lanes = np.zeros(n, np.int64)
    if n < 2:
        return lanes
    order = np.lexsort((-end, start))
    s, e = start[order], end[order]
    if (s[1:] >= e[:-1]).all():
        return lanes
    free: list[int] = []  # each lane's end
    for j, (a, b) in enumerate(zip(s.tolist(), e.tolist(), strict=True)):
        for lane, end_at in enumerate(free):
            if end_at <= a:
                free[lane] = b
                lanes[order[j]] = lane
                break
        else:
            lanes[order[j]] = len(free)
            free.append(b)
    return lanes


def layer_ranges(kernels: pa.Table) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Per device, one range per (step, layer): the span of that layer's kernels within that step."""
    if kernels.num_rows == 0 or "layer" not in kernels.column_names:
        return []
    k = kernels.select(["device", "step", "layer", "start_ns", "dur_ns", "aggregate"])
    ok = pc.and_(pc.is_valid(k["layer"]), pc.greater_equal(k["layer"].fill_null(-1), 0))
    ok = pc.and_(ok, pc.and_(pc.is_valid(k["start_ns"]), pc.invert(k["aggregate"].fill_null(False))))
    k = k.filter(ok)
    if k.num_rows == 0:
        return []
    k = k.append_column("end_ns", pc.add(k["start_ns"], k["dur_ns"]))
    g = k.group_by(["device", "step", "layer"], use_threads=False).aggregate(
        [("start_ns", "min"), ("end_ns", "max"), ("start_ns", "count")]
    )
    g = g.sort_by([("device", "ascending"), ("start_ns_min", "ascending"), ("layer", "ascending")])
    out = []
    dev = g["device"].to_numpy()
    for d in np.unique(dev).tolist():
        sel = g.filter(pc.equal(g["device"], d))
        out.append(
            (
                int(d),
                {
                    "step": sel["step"].to_numpy(),
                    "layer": sel["layer"].to_numpy(),
                    "start_ns": sel["start_ns_min"].to_numpy().astype(np.int64),
                    "end_ns": sel["end_ns_max"].to_numpy().astype(np.int64),
                    "kernels": sel["start_ns_count"].to_numpy(),
                },
            )
        )
    return out


def _meta(pid: int, tid: int, name: str, args: dict[str, Any]) -> bytes:
    return orjson.dumps({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args})


def _thread_names(pid: int, names: list[tuple[int, str]]) -> list[bytes]:
    out = []
    for tid, name in names:
        out.append(_meta(pid, tid, "thread_name", {"name": name}))
        out.append(_meta(pid, tid, "thread_sort_index", {"sort_index": tid}))
    return out


def _slice(pid: int, tid: int, name: str, cat: str, ts_ns: int, dur_ns: int, args: dict[str, Any]) -> bytes:
    head = orjson.dumps({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid})[:-1]
    return b'%s, "ts": %s, "dur": %s, "args": %s}' % (
        head,
        _us(ts_ns).encode(),
        _us(dur_ns).encode(),
        orjson.dumps(args),
    )
