"""Kineto reader: numbers equal an independent stdlib reading of the same JSON; bad input fails cleanly."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.errors import InputError
from analyzer.readers import kineto_events, kineto_scan, read_trace, sniff
from analyzer.runtime import chunked_kineto
from analyzer.runtime.read_policy import read_policy
from analyzer.tables import intervals
from tests import rawtrace
from tests.conftest import H200_TRACES, SHARED, shared, shared_kineto_traces

ALL_KINETO = [pytest.param(p, id=p.parent.name + "/" + p.name) for p in H200_TRACES] + [
    pytest.param(SHARED / rel, id=rel) for rel in shared_kineto_traces()
]


@pytest.mark.parametrize("path", ALL_KINETO)
def test_kernel_count_and_time_match_raw_json(path: Path) -> None:
    # GIVEN a real Kineto trace and an independent reading of its JSON
    obj = rawtrace.load(path)
    events = rawtrace.gpu_events(obj)
    if not events:
        with pytest.raises(InputError, match="no GPU activity"):
            read_trace(path, policy=read_policy())
        return
    # WHEN the reader reads it
    trace = read_trace(path, policy=read_policy())
    trace.validate()
    k = trace.kernels
    # THEN kernel count, total time and kinds agree exactly
    assert k.num_rows == len(events)
    assert trace.kernel_ns == sum(rawtrace.ns(e["dur"]) for e in events)
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    want = sorted(kinds[e["cat"].lower()] for e in events)
    assert sorted(k["kind"].to_pylist()) == want
    # absolute start times: baseTimeNanoseconds + ts
    base = obj.get("baseTimeNanoseconds", 0) or 0
    assert int(np.min(k["start_ns"].to_numpy())) == base + min(rawtrace.ns(e["ts"]) for e in events)


@pytest.mark.parametrize("path", ALL_KINETO)
def test_per_stream_busy_time_matches_raw_json(path: Path) -> None:
    obj = rawtrace.load(path)
    events = rawtrace.gpu_events(obj)
    if not events:
        pytest.skip("trace without GPU activity")
    want = sorted(rawtrace.stream_busy(events).values())
    df = read_trace(path, policy=read_policy()).kernels.to_pandas()
    got = []
    for _, g in df.groupby(["device", "stream"], dropna=False):
        s = g["start_ns"].to_numpy(np.int64)
        got.append(intervals.busy_ns(s, s + g["dur_ns"].to_numpy(np.int64)))
    assert sorted(got) == want


def test_h200_metadata_and_links() -> None:
    trace = read_trace(H200_TRACES[0], policy=read_policy())
    m = trace.inputs[0]
    assert (m.format, m.gpu_name, m.arch, m.sm_count) == ("kineto", "NVIDIA H200", "sm_90", 132)
    assert m.total_memory == 150109880320
    k = trace.kernels
    # every kernel of an eager HF run is linked to its launch call and its host op
    assert k["correlation"].null_count == 0
    assert k["launch_api"].null_count < k.num_rows * 0.01
    linked = set(k["launch_op_id"].drop_null().to_pylist())
    ops = trace.host_ops.to_pandas()
    cpu = ops[ops["category"] == "cpu_op"]
    assert linked <= set(cpu["external_id"].dropna().astype(int))
    # shapes are decoded for the ops that launched kernels
    mm = cpu[(cpu["name"] == "aten::mm") & cpu["input_dims"].notna()]
    assert len(mm) > 0 and all(len(d) == 2 for d in mm["input_dims"])


def test_tp2_graph_replay_and_rank() -> None:
    trace = read_trace(H200_TRACES[3], policy=read_policy())
    assert trace.inputs[0].rank == 1 and trace.inputs[0].world_size == 2
    k = trace.kernels.to_pandas()
    graph = k[k["graph_launch"]]
    assert len(graph) > 10000
    assert set(graph["launch_api"].astype(str)) == {"cudaGraphLaunch"}
    # many kernels share one graph launch correlation
    assert graph.groupby("correlation").size().max() > 100


def test_rocm_devices_and_workitem_grids() -> None:
    path = shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz")
    raw = rawtrace.gpu_events(rawtrace.load(path))
    assert {e["args"]["device"] for e in raw} != {0}  # HSA node ids in the raw trace
    trace = read_trace(path, policy=read_policy())
    assert trace.inputs[0].arch == "gfx942"
    assert set(trace.kernels["device"].to_pylist()) == {0}
    k = trace.kernels.to_pandas()
    # hipBLASLt via hipExtModuleLaunchKernel: grid in work-items -> work-groups
    tensile = k[
        k["name"].astype(str).str.startswith("Cijk_") & (k["launch_api"] == "hipExtModuleLaunchKernel")
    ]
    assert len(tensile) > 0
    raw_by_corr = {e["args"]["correlation"]: e for e in raw}
    for r in tensile.itertuples():
        e = raw_by_corr[r.correlation]
        assert r.grid_x == -(-e["args"]["grid"][0] // e["args"]["block"][0])


def test_mi250_without_rocm_metadata_is_still_rocm() -> None:
    trace = read_trace(
        shared("mi250-hta-minitoy/mi250_minitoy_train_ROCm6_2_kineto.json.gz"), policy=read_policy()
    )
    assert trace.inputs[0].arch == "gfx90a"
    assert set(trace.kernels["device"].to_pylist()) == {0}


def test_chunked_reading_equals_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN tiny chunks so the events array is cut hundreds of times
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "1")
    whole = read_trace(H200_TRACES[1], policy=read_policy())
    monkeypatch.setattr(kineto_scan, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(kineto_scan, "READ_BYTES", 16 << 10)
    chunked = read_trace(H200_TRACES[1], policy=read_policy())
    for a, b in zip(_tables(chunked), _tables(whole), strict=True):
        assert a.equals(b)


def _tables(trace) -> list:
    return [trace.kernels, trace.host_ops, trace.annotations]


@pytest.mark.parametrize(
    "path",
    [pytest.param(H200_TRACES[0], id="h200-dense.gz"), pytest.param(H200_TRACES[3], id="h200-tp2-rank1.gz")]
    + [
        pytest.param(SHARED / rel, id=rel)
        for rel in shared_kineto_traces()
        if rel.endswith(("prefilldecode.json.gz", "graph_execution.json.gz", "ROCm6_2_kineto.json.gz"))
    ],
)
def test_parallel_reading_equals_sequential(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN worker processes and small chunks, on the gzip trace and on its plain JSON
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "1")
    want = read_trace(path, policy=read_policy())
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "2")
    monkeypatch.setattr(chunked_kineto, "CHUNK_BYTES", max(4 << 10, plain.stat().st_size // 16))
    used = []
    monkeypatch.setattr(chunked_kineto, "_collect", _counting(chunked_kineto._collect, used))
    for src in (path, plain):
        got = read_trace(src, policy=read_policy())
        # THEN the workers parsed it, and into exactly the sequential tables
        assert len(used) >= 8, "the parallel path was not taken"
        used.clear()
        for a, b in zip(_tables(got), _tables(want), strict=True):
            assert a.equals(b)
        assert got.inputs[0].sha256 == rawtrace.sha256(src)
        assert got.inputs[0].to_dict() | {"path": "", "sha256": ""} == want.inputs[0].to_dict() | {
            "path": "",
            "sha256": "",
        }


def _counting(fn, calls: list):
    def wrapped(*a, **k):
        calls.append(1)
        return fn(*a, **k)

    return wrapped


@pytest.mark.parametrize("chunk", [4093, 4096, 5000, 9999])
def test_gzip_chunks_tile_the_events_at_boundaries(chunk: int, tmp_path: Path) -> None:
    # GIVEN a gzip trace whose events are spaced so that some boundaries fall across two blocks
    events = [{"ph": "X", "cat": "kernel", "name": "k" * (i % 37), "ts": i, "dur": 1} for i in range(2000)]
    text = json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0}, {"id": 1}]}, indent=1).encode()
    p = _write(tmp_path, "t.json.gz", gzip.compress(text))
    files = chunked_kineto._Memfds()
    chunks: list[bytes] = []
    try:
        for kind, value, _ in chunked_kineto._gzip_pieces(p, kineto_scan.find_events, chunk, files):
            if kind in ("task", "last"):
                path, start, end = value
                chunks.append(Path(path).read_bytes()[start:end])
                files.release(value)
            elif kind == "sha":
                sha = value
    finally:
        files.close()
    # THEN the chunks, joined by the boundaries they were cut at, are the text from the first event
    first = text.index(b"{", text.index(b"["))
    pos = first
    for c in chunks[:-1]:
        assert text[pos : pos + len(c)] == c
        assert c.startswith(b"{") and c.endswith(b"}") and len(c) >= chunk
        gap = kineto_scan.BOUNDARY.match(text, pos + len(c) - 1)
        assert gap is not None, "a cut not at an event boundary"
        pos = gap.end() - 1
    assert text[pos:] == chunks[-1] and len(chunks[-1]) >= chunk
    assert len(chunks) > 5
    assert sha == rawtrace.sha256(p)


def test_parallel_gzip_cut_short_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a gzip trace cut in the middle, read by workers in small chunks (held in memfds)
    data = gzip.compress(gzip.decompress(H200_TRACES[0].read_bytes()))
    p = _write(tmp_path, "cut.json.gz", data[: len(data) * 2 // 3])
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "2")
    monkeypatch.setattr(chunked_kineto, "CHUNK_BYTES", 256 << 10)
    used = []
    monkeypatch.setattr(chunked_kineto, "_collect", _counting(chunked_kineto._collect, used))
    fds = len(os.listdir("/proc/self/fd"))
    # THEN the workers took some chunks, the damage is one InputError, and no chunk file stays open
    with pytest.raises(InputError, match="gzip|truncated"):
        read_trace(p, policy=read_policy())
    assert used, "the parallel path was not taken"
    assert len(os.listdir("/proc/self/fd")) == fds


def test_parallel_gzip_chunk_file_unreadable_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN workers that cannot open the in-memory files holding the gzip chunks (no /proc, say)
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "1")
    want = read_trace(H200_TRACES[0], policy=read_policy())
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "2")
    monkeypatch.setattr(chunked_kineto, "CHUNK_BYTES", 256 << 10)
    real_task = chunked_kineto._Memfds.task

    def task(self):
        _, start, end = real_task(self)
        return str(tmp_path / "no-such-chunk"), start, end

    monkeypatch.setattr(chunked_kineto._Memfds, "task", task)
    # THEN the file is read sequentially instead, into the same tables
    got = read_trace(H200_TRACES[0], policy=read_policy())
    for a, b in zip(_tables(got), _tables(want), strict=True):
        assert a.equals(b)


def test_parallel_cut_inside_a_string_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN kernel names holding the text of an event boundary, so some cuts land inside strings
    evil = "void k<{lambda()#1}, {lambda()#2}>"
    events = [
        {"ph": "X", "cat": "kernel", "name": evil + "}, {" * 40, "ts": i, "dur": 1, "args": {"device": 0}}
        for i in range(4000)
    ]
    p = tmp_path / "evil.json"
    p.write_text(json.dumps({"traceEvents": events}, separators=(",", ":")))
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "2")
    monkeypatch.setattr(chunked_kineto, "CHUNK_BYTES", 16 << 10)
    trace = read_trace(p, policy=read_policy())
    # THEN every event is read once, with its name whole
    assert trace.kernels.num_rows == 4000
    assert set(trace.kernels["name"].to_pylist()) == {evil + "}, {" * 40}


# --------------------------------------------------------------------------- bad input


def _write(tmp: Path, name: str, data: bytes) -> Path:
    p = tmp / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(
    "name,data,msg",
    [
        ("empty.json", b"", "empty file"),
        ("blank.json", b"  \n ", "empty file"),
        ("text.json", b"hello, world", "not a recognised trace format"),
        ("other.json", b'{"a": 1, "b": [1, 2]}', "not a recognised trace format"),
        (
            "nogpu.json",
            b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2}]}',
            "no GPU activity",
        ),
        (
            "trunc.json",
            b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2},',
            "truncated",
        ),
        (
            "badtype.json",
            b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "args": {"grid": "x"}}]}',
            "unexpected field type",
        ),
        (
            "negdur.json",
            b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": -2}]}',
            "negative",
        ),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path: Path, name: str, data: bytes, msg: str) -> None:
    p = _write(tmp_path, name, data)
    with pytest.raises(InputError, match=msg):
        read_trace(p, policy=read_policy())


def test_truncated_gzip(tmp_path: Path) -> None:
    data = H200_TRACES[1].read_bytes()
    p = _write(tmp_path, "cut.json.gz", data[: len(data) // 2])
    with pytest.raises(InputError, match="gzip|truncated"):
        read_trace(p, policy=read_policy())


def test_directory_and_missing(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="directory"):
        sniff(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        sniff(tmp_path / "nope.json")


# --------------------------------------------------------------------------- properties

_SMALL = rawtrace.load(H200_TRACES[1])
_EVENTS = _SMALL["traceEvents"][:400]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    drop=st.lists(st.integers(0, len(_EVENTS) - 1), max_size=30),
    mutate=st.lists(
        st.tuples(
            st.integers(0, len(_EVENTS) - 1),
            st.sampled_from(["ts", "dur", "args", "cat", "name", "pid", "ph"]),
            st.one_of(
                st.none(),
                st.integers(-5, 10**12),
                st.text(max_size=5),
                st.floats(allow_nan=False),
                st.lists(st.integers(), max_size=3),
            ),
        ),
        max_size=10,
    ),
    cut=st.one_of(st.none(), st.integers(1, 20000)),
)
def test_reader_never_crashes_on_mutated_traces(
    tmp_path_factory: pytest.TempPathFactory,
    drop: list[int],
    mutate: list[tuple[int, str, object]],
    cut: int | None,
) -> None:
    events = [dict(e) for i, e in enumerate(_EVENTS) if i not in set(drop)]
    for i, key, val in mutate:
        if i < len(events):
            events[i][key] = val
    data = json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1}).encode()
    if cut is not None:
        data = data[:cut]
    p = tmp_path_factory.mktemp("mut") / "t.json.gz"
    p.write_bytes(gzip.compress(data))
    try:
        trace = read_trace(p, policy=read_policy())
    except InputError:
        return
    # whatever was read is a valid trace and never loses a kernel it accepted
    trace.validate()
    gpu = [
        e
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    assert trace.kernels.num_rows == len(gpu)


@pytest.mark.parametrize(
    "vals",
    [
        [[1, 2, 3], None, [4, 5, 6]],
        [None, None],
        [],
        [[1, 2], [1, 2, 3, 4], [7, 8, 9], []],
        [[2**62, 1, 1], [0, 0, 0]],
        [[2**64, 1, 1], [1, 2, 3]],  # beyond int64: that value null, as any a column cannot hold
    ],
)
def test_grid_and_block_triples_split_into_columns(vals: list) -> None:
    # GIVEN grid/block values as decoded: triples, missing ones, lists of another length
    cols = kineto_events._dims3(vals)

    # THEN each axis holds the triple's value, null where there is no triple or it does not fit
    def want(v: list | None, i: int) -> int | None:
        ok = v is not None and len(v) == 3 and -(2**63) <= v[i] < 2**63
        return v[i] if ok else None

    for i, col in enumerate(cols):
        assert col.type == "int64"
        assert col.to_pylist() == [want(v, i) for v in vals]


def test_the_reader_keeps_the_module_ops_the_structure_rules_read() -> None:
    # the Kineto reader keeps a few cpu_ops that launch nothing themselves; the rules that read
    # an enclosing op (STR033's module copies) must find theirs among them
    from analyzer.analyses.walk.registry import KNOWLEDGE
    from analyzer.readers.kineto import CONTEXT_OPS

    assert set(KNOWLEDGE.set_of("module_copy_ops")) <= set(CONTEXT_OPS)
