"""``export -o NAME.perfetto.json``: what Perfetto's JSON importer needs, checked without Perfetto.

Valid JSON; added slices on named (pid, tid) tracks (``M`` metadata); slices of one added track
disjoint; times in the input's µs base; every original event kept (Kineto: byte for byte, args
inserted) plus the added ones; every GPU event with its classification; every step on a step track.
Traces are read back with the standard library only (``json.JSONDecoder.raw_decode`` for each event's
exact text), never with the modules under test.
"""

from __future__ import annotations

import gzip
import io
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

from analyzer.cli import main
from analyzer.errors import InputError
from analyzer.readers import kineto_raw
from analyzer.report import TABLES
from analyzer.report.perfetto import (
    ARG_COLUMNS,
    PID_BASE,
    ExportInput,
    PerfettoExport,
    PerfettoReporter,
    pack_lanes,
)
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2, shared
from tests.runs import analyze_run

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_DEC = json.JSONDecoder(parse_float=Decimal)


# --------------------------------------------------------------------------- reading back


def read_text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def event_texts(text: str) -> list[str]:
    """The exact text of every event of the document's ``traceEvents`` array (or bare list)."""
    start = text.find('"traceEvents"')
    pos = text.index("[", start if start >= 0 else 0) + 1
    out = []
    n = len(text)
    while pos < n:
        while text[pos] in " \t\r\n,":
            pos += 1
        if text[pos] == "]":
            return out
        _, end = _DEC.raw_decode(text, pos)
        out.append(text[pos:end])
        pos = end
    raise AssertionError("array never ends")


def is_gpu(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS


def ns(us: Any) -> int:
    return int((Decimal(str(us)) * 1000).to_integral_value())


def only_inserted(orig: str, out: str) -> None:
    """``out`` is ``orig`` with the classification entries inserted into its args (or a new args
    object holding them) and nothing else changed."""
    i = out.rindex('"stage": ')
    last = f'"{ARG_COLUMNS[-1]}": '
    j = out.index(last, i) + len(last)
    _, e = _DEC.raw_decode(out, j)
    head, rest = out[:i], out[e:]
    ways = [head + rest]  # into an empty args object
    if head.endswith(", "):  # after the existing entries
        ways.append(head[:-2] + rest)
    if head.endswith(', "args": {') and rest.startswith("}"):  # a new args object
        ways.append(head[: -len(', "args": {')] + rest[1:])
    assert orig in ways, f"event changed beyond an insertion:\n{orig}\n{out}"


def check_tracks(added: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    """Added slices lie on named tracks of named processes, disjoint per track; returns the tracks."""
    procs = {e["pid"] for e in added if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in added if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in added:
        if e["ph"] == "X":
            assert e["pid"] in procs and (e["pid"], e["tid"]) in threads
            assert isinstance(e["ts"], Decimal) and e["dur"] >= 0
            tracks[(e["pid"], e["tid"])].append(e)
    for slices in tracks.values():
        iv = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in slices)
        for (_, end), (start, _) in zip(iv, iv[1:], strict=False):
            assert start >= end, "slices of one track overlap"
    return tracks


def check_added(
    analysis: Any, added: list[dict[str, Any]], bases: dict[int, int], want_layers: bool = True
) -> None:
    """Steps and layers tracks: every step once, layer ranges = their kernels' span per step."""
    tracks = check_tracks(added)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in added if e["name"] == "thread_name"}
    k = analysis.kernels.to_pandas()
    for tid, steps in analysis.steps.groupby("trace_id"):
        pid = PID_BASE + int(tid)
        got = [
            e for key, sl in tracks.items() if key[0] == pid and names[key].startswith("steps") for e in sl
        ]
        assert sorted(e["args"]["step"] for e in got) == sorted(steps["step"].tolist())
        by_step = {e["args"]["step"]: e for e in got}
        for r in steps.itertuples():
            e = by_step[r.step]
            assert ns(e["ts"]) + bases[int(tid)] == r.start_ns and ns(e["dur"]) == r.dur_ns
            assert e["args"]["phase"] == r.phase
        layers = [
            e for key, sl in tracks.items() if key[0] == pid and names[key].startswith("layers") for e in sl
        ]
        sub = k[(k["trace_id"] == tid) & k["layer"].notna() & (k["layer"] >= 0)]
        assert len(layers) == (sub.groupby(["device", "step", "layer"]).ngroups if len(sub) else 0)
        assert len(layers) > 0 or not want_layers
        for e in layers[:50]:
            m = sub[(sub["step"] == e["args"]["step"]) & (sub["layer"] == e["args"]["layer"])]
            assert ns(e["ts"]) + bases[int(tid)] == m["start_ns"].min()
            assert ns(e["ts"]) + ns(e["dur"]) + bases[int(tid)] == (m["start_ns"] + m["dur_ns"]).max()


def check_kineto_export(paths: list[Path], out: Path, want_layers: bool = True) -> None:
    """The checks of the module docstring for an export of Kineto inputs ``paths``."""
    analysis = analyze_run([str(p) for p in paths])
    text = read_text(out)
    doc = json.loads(text, parse_float=Decimal)  # valid JSON
    got = event_texts(text)
    bases, n = {}, 0
    for tid, p in enumerate(paths):
        src = read_text(p)
        top = json.loads(src)
        bases[tid] = top.get("baseTimeNanoseconds", 0)
        orig = event_texts(src)
        mine = got[n : n + len(orig)]
        n += len(orig)
        gpu = []
        for o, m in zip(orig, mine, strict=True):
            oe = _DEC.decode(o)
            if not is_gpu(oe):
                assert m == o  # byte for byte
                continue
            if "args" in oe and oe["args"] is None:  # a null args value becomes the object
                o = o.replace('"args": null', '"args": {}')
            only_inserted(o, m)
            me = _DEC.decode(m)
            assert set(ARG_COLUMNS) <= set(me["args"]) and me["args"] | (oe.get("args") or {}) == me["args"]
            gpu.append(me)
        # the row each event got is the reader's: its stable time order
        order = sorted(range(len(gpu)), key=lambda i: ns(gpu[i]["ts"]))
        rows = analysis.kernels.filter(pc.equal(analysis.kernels["trace_id"], tid))
        assert len(gpu) == rows.num_rows
        for col in ("stage", "step", "layer", "rule_id", "stage_rule", "phase"):
            assert [gpu[i]["args"][col] for i in order] == rows[col].to_pylist(), col
    added = [_DEC.decode(t) for t in got[n:]]
    assert all(e["pid"] >= PID_BASE for e in added)
    assert len(doc["traceEvents"]) == n + len(added)
    check_added(analysis, added, bases, want_layers)
    if len(paths) == 1:  # the top-level object is the input's own
        assert {k: v for k, v in doc.items() if k != "traceEvents"} == {
            k: v
            for k, v in json.loads(read_text(paths[0]), parse_float=Decimal).items()
            if k != "traceEvents"
        }
    else:
        assert [i["rank"] for i in doc["otherData"]["llm_kernel_map"]["inputs"]] == list(range(len(paths)))


# --------------------------------------------------------------------------- exports of real traces


def export(*args: str) -> int:
    return main(["export", *args])


def test_dense_kineto_keeps_every_event_and_adds_classification(tmp_path: Path) -> None:
    # GIVEN a Kineto trace WHEN exported for Perfetto THEN its events are kept byte for byte, args added
    out = tmp_path / "trace.perfetto.json"
    assert export(str(H200_DENSE), "-o", str(out)) == 0
    check_kineto_export([H200_DENSE], out)


def test_two_ranks_go_into_one_file_one_process_each(tmp_path: Path) -> None:
    out = tmp_path / "tp2.json"
    assert export(*map(str, H200_TP2), "-o", str(out), "--format", "perfetto") == 0
    check_kineto_export(H200_TP2, out)
    doc = json.loads(out.read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names[PID_BASE] == "rank 0 (llm-kernel-map)" and names[PID_BASE + 1] == "rank 1 (llm-kernel-map)"


def test_small_chunks_cut_anywhere_give_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN chunks far smaller than the trace (cuts land inside strings and args objects too)
    whole = tmp_path / "a.perfetto.json"
    assert export(str(H200_MOE), "-o", str(whole)) == 0
    monkeypatch.setattr(kineto_raw, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(kineto_raw, "READ_BYTES", 1000)
    cut = tmp_path / "b.perfetto.json"
    assert export(str(H200_MOE), "-o", str(cut)) == 0
    assert cut.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize(
    "rel", ["rocpd-llamacpp-r9700/32432_results.db", "rocprofv1-llamacpp-r9700/results.csv"]
)
def test_other_formats_get_events_from_the_kernels_table(tmp_path: Path, rel: str) -> None:
    src = shared(rel)
    out = tmp_path / "t.perfetto.json"
    assert export(str(src), "-o", str(out)) == 0
    analysis = analyze_run([str(src)])
    doc = json.loads(out.read_text(), parse_float=Decimal)
    evs = doc["traceEvents"]
    gpu = [e for e in evs if is_gpu(e)]
    k = analysis.kernels
    assert len(gpu) == k.num_rows
    assert all(set(ARG_COLUMNS) <= set(e["args"]) for e in gpu)
    # ts/dur: the table's ns as µs, exactly
    assert sorted(ns(e["ts"]) for e in gpu) == sorted(k["start_ns"].to_pylist())
    assert sum(ns(e["dur"]) for e in gpu) == pc.sum(k["dur_ns"]).as_py()
    tracks = check_tracks(evs)  # the kernel tracks too: one lane per stream unless kernels overlap
    assert sum(len(v) for v in tracks.values()) == len([e for e in evs if e["ph"] == "X"])
    check_added(analysis, [e for e in evs if not is_gpu(e)], {0: 0})
    assert doc["otherData"]["llm_kernel_map"]["inputs"][0]["format"] in ("rocpd", "rocprof")


def test_extension_or_format_is_required(tmp_path: Path) -> None:
    assert TABLES.for_path("x/T.Perfetto.JSON").name == "perfetto"
    assert TABLES.for_path("x/t.json") is None
    assert export(str(H200_DENSE), "-o", str(tmp_path / "t.json")) == 2
    assert not (tmp_path / "t.json").exists()


# --------------------------------------------------------------------------- odd Kineto layouts

ODD = """{"traceEvents": [
  {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
  {"ph": "X", "cat": "kernel", "name": "gemm_a", "pid": 0, "tid": 7, "ts": 1000.5, "dur": 2,
   "args": {"device": 0, "stream": 7, "correlation": 1}},
  {"ph": "X", "cat": "Kernel", "name": "say \\"},{\\" here", "pid": 0, "tid": 7, "ts": "1003", "dur": 1},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 1005, "dur": 1, "args": { }},
  {"args": {"device": 0, "stream": 7, "correlation": 4}, "ph": "X", "cat": "kernel", "name": "k4",
   "pid": 0, "tid": 7, "ts": 1007.25, "dur": 0.5},
  {"ph": "X", "cat": "gpu_memset", "name": "Memset", "pid": 0, "tid": 7, "ts": 1003, "dur": 0.1, "args": null},
  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 999, "dur": 3, "args": {}}
  ],
  "baseTimeNanoseconds": 1000000000
}
"""


def test_odd_layouts_get_their_args_inserted_and_nothing_else_changes(tmp_path: Path) -> None:
    # GIVEN args absent, empty, null, not last; a string ts; a capitalised category; "},{" in a name
    src = tmp_path / "odd.json"
    src.write_text(ODD)
    out = tmp_path / "odd.perfetto.json"
    assert export(str(src), "-o", str(out)) == 0
    check_kineto_export([src], out, want_layers=False)
    doc = json.loads(out.read_text())
    gpu = [e for e in doc["traceEvents"] if is_gpu(e)]
    assert [e["name"] for e in gpu][:2] == ["gemm_a", 'say "},{" here'] and len(gpu) == 5
    assert doc["traceEvents"][4]["args"]["correlation"] == 4  # args written first keep their place


def test_events_of_another_trace_are_refused(tmp_path: Path) -> None:
    # GIVEN the analysis of one trace and the events of another WHEN exported THEN InputError
    analysis = analyze_run([str(H200_DENSE)])
    with kineto_raw.open_events(H200_MOE) as events:
        data = PerfettoExport(
            analysis.kernels, analysis.steps, [ExportInput(0, 0, "kineto", str(H200_MOE), events)]
        )
        with pytest.raises(InputError, match="do not match its analysis"):
            PerfettoReporter().render(data, io.BytesIO())


def test_pack_lanes_keeps_each_lane_disjoint() -> None:
    start = np.array([0, 5, 10, 12, 20, 20])
    end = np.array([10, 15, 11, 30, 25, 20])
    lanes = pack_lanes(start, end)
    for lane in set(lanes.tolist()):
        iv = sorted(zip(start[lanes == lane].tolist(), end[lanes == lane].tolist(), strict=True))
        assert all(b[0] >= a[1] for a, b in zip(iv, iv[1:], strict=False))
    assert lanes.max() == 2  # at 20: [12, 30), [20, 25) and the empty [20, 20) inside both
    assert pack_lanes(np.array([0, 1]), np.array([1, 2])).tolist() == [0, 0]
