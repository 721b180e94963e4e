"""Tests for analyzer/readers/nsys.py: the real SQLite export and stats CSVs first, then edge cases."""

from __future__ import annotations

import csv
import re
import sqlite3
from pathlib import Path

import pytest

from analyzer.errors import InputError
from analyzer.readers import nsys, read_head, sniff

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
DB = SHARED / "nsys-sqlite-nvfuser-h200" / "report1.sqlite"
KERN_SUMS = [
    SHARED / "nsys-stats-csv-deepseek-ocr-rtx5090" / stage / "summary_cuda_gpu_kern_sum.csv"
    for stage in ("decode", "prefill", "all-stage")
]
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"public sample traces not found at {SHARED} (../shared absent)"
)


def _query(sql: str):
    con = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# --------------------------------------------------------------------------- real SQLite export


@needs_shared
def test_sqlite_matches_independent_counts_and_times():
    # GIVEN the activity tables queried directly
    expected = {}
    for kind, table in (("kernel", "KERNEL"), ("memcpy", "MEMCPY"), ("memset", "MEMSET")):
        expected[kind] = _query(f"SELECT COUNT(*), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_{table}")[0]
    (base,) = _query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    (first,) = _query("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    # WHEN the reader reads the export
    trace = nsys.read(DB)
    trace.validate()
    k = trace.kernels.to_pydict()
    # THEN each kind has the same count and total time, on an absolute clock
    for kind, (n, total) in expected.items():
        rows = [d for d, kd in zip(k["dur_ns"], k["kind"], strict=True) if kd == kind]
        assert (len(rows), sum(rows)) == (n, total), kind
    assert expected["kernel"] == (19, 393_539)
    assert min(s for s, kd in zip(k["start_ns"], k["kind"], strict=True) if kd == "kernel") == base + first
    assert k["norm_name"] == k["name"]


@needs_shared
def test_sqlite_names_grid_launch_api_and_gpu():
    rows = _query(
        "SELECT k.start, s.value, k.gridX, k.gridY, k.blockX, k.correlationId "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
        "WHERE k.gridY > 1 LIMIT 1"
    )
    start, name, gx, gy, bx, corr = rows[0]
    (api,) = _query(
        "SELECT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        f"WHERE r.correlationId = {corr}"
    )[0]
    (base,) = _query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    trace = nsys.read(DB)
    k = trace.kernels.to_pydict()
    i = k["start_ns"].index(base + start)
    assert k["name"][i] == name
    assert (k["grid_x"][i], k["grid_y"][i], k["block_x"][i]) == (gx, gy, bx)  # CUDA grids are blocks
    assert k["correlation"][i] == corr
    assert k["launch_api"][i] == re.sub(r"_v\d{4,}$", "", api)  # cudaLaunchKernel_v7000 -> cudaLaunchKernel
    assert not any(k["graph_launch"])
    meta = trace.inputs[0]
    assert (meta.format, meta.gpu_name, meta.arch, meta.sm_count, meta.total_memory) == (
        "nsys",
        "NVIDIA H200",
        "sm_90",
        132,
        150_137_864_192,
    )
    assert meta.versions["nsys"] == "2024.6.2.25"


@needs_shared
def test_sqlite_runtime_calls_and_nvtx_ranges():
    ((n_runtime,),) = _query("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    ((n_ranges,),) = _query(
        "SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"
    )
    trace = nsys.read(DB)
    ops = trace.host_ops.to_pydict()
    assert len(ops["name"]) == n_runtime == 968
    assert set(ops["category"]) == {"runtime", "driver"}
    assert "cudaLaunchKernel_v7000" in ops["name"]  # host op names stay as recorded
    ann = trace.annotations.to_pydict()
    assert len(ann["name"]) == n_ranges == 652
    assert set(ann["side"]) == {"cpu"} and ann["name"][0] == "Fusion::resetTvUses"


@needs_shared
@pytest.mark.parametrize("path", KERN_SUMS, ids=lambda p: p.parent.name)
def test_kern_sum_csv_gives_aggregate_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    trace = nsys.read(path)
    trace.validate()
    k = trace.kernels.to_pydict()
    assert trace.kernels.num_rows == len(rows)
    assert sum(k["count"]) == sum(int(r["Instances"]) for r in rows)
    assert trace.kernel_ns == sum(int(r["Total Time (ns)"]) for r in rows)
    assert all(k["aggregate"]) and set(k["start_ns"]) == {None}
    assert k["name"][0] == rows[0]["Name"]


@needs_shared
def test_kern_sum_known_totals():
    trace = nsys.read(KERN_SUMS[0])
    assert (trace.kernels.num_rows, sum(trace.kernels["count"].to_pylist()), trace.kernel_ns) == (
        46,
        78_016,
        179_072_697,
    )


@needs_shared
def test_registry_sniffs_nsys_and_nsys_rejects_other_formats():
    assert sniff(DB).FORMAT == "nsys"
    for p in KERN_SUMS:
        assert sniff(p).FORMAT == "nsys"
    for rel in (
        "rocpd-llamacpp-r9700/32432_results.db",
        "rocprofv1-llamacpp-r9700/results.db",
        "rocprofv1-llamacpp-r9700/results.csv",
        "rocprofv1-llamacpp-r9700/results.stats.csv",
        "rocprofv3-json-mi350x-training/908_results.json.gz",
        "h200-llama3-8b-dense/trace.json.gz",
        "nsys-stats-csv-deepseek-ocr-rtx5090/PROVENANCE.md",  # quotes the header in prose
        "nsys-stats-csv-deepseek-ocr-rtx5090/decode/cmd.txt",
    ):
        p = SHARED / rel
        if p.exists():
            assert nsys.sniff(p, read_head(p)) is False, rel


# --------------------------------------------------------------------------- synthetic edge cases

GPU_TRACE_HEADER = (
    "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),DymSMem (MB),"
    "Bytes (MB),Throughput (MB/s),SrcMemKd,DstMemKd,Device,Ctx,GreenCtx,Strm,Name\n"
)


def test_gpu_trace_csv_with_preamble(tmp_path):
    # GIVEN `nsys stats` stdout: preamble lines, then a cuda_gpu_trace report
    p = tmp_path / "out_cuda_gpu_trace.csv"
    p.write_text(
        "Generating SQLite file report.sqlite from report.nsys-rep\n"
        "Processing [report.sqlite] with [cuda_gpu_trace.py]... \n"
        "\n"
        " ** CUDA GPU Trace (cuda_gpu_trace):\n"
        "\n" + GPU_TRACE_HEADER + "1000,200,12,,,,,,,,,,0.524,2621.440,Pageable,Device,NVIDIA H200 (0),1,,7,"
        "[CUDA memcpy Host-to-Device]\n"
        '1500,4000,13,132,1,1,256,1,1,64,0.000,0.049,,,,,NVIDIA H200 (0),1,,7,"void k<(int)4, float>'
        '(T1, int)"\n'
        "6000,90,14,,,,,,,,,,0.001,11.111,,Device,NVIDIA H200 (0),1,,7,[CUDA memset]\n"
    )
    assert nsys.sniff(p, p.read_bytes())
    # WHEN read
    trace = nsys.read(p)
    trace.validate()
    k = trace.kernels.to_pydict()
    # THEN rows keep kinds, launch dimensions and the device named in the Device column
    assert k["kind"] == ["memcpy", "kernel", "memset"]
    assert k["dur_ns"] == [200, 4000, 90]
    assert (k["grid_x"][1], k["block_x"][1], k["registers"][1], k["stream"][1]) == (132, 256, 64, 7)
    assert k["name"][1] == "void k<(int)4, float>(T1, int)"
    assert k["correlation"] == [12, 13, 14] and set(k["device"]) == {0}
    assert trace.inputs[0].gpu_name == "NVIDIA H200"


def test_old_gpukernsum_header(tmp_path):
    p = tmp_path / "report_gpukernsum.csv"
    p.write_text(
        '"Time(%)","Total Time (ns)","Instances","Average","Minimum","Maximum","Name"\n'
        '"60.0","600","3","200.0","100","300","gemm_kernel"\n'
        '"40.0","400","4","100.0","90","110","elementwise"\n'
    )
    assert nsys.sniff(p, p.read_bytes())
    trace = nsys.read(p)
    assert trace.kernels["count"].to_pylist() == [3, 4]
    assert trace.kernel_ns == 1000


def test_nvtx_sum_is_not_a_kernel_summary(tmp_path):
    p = tmp_path / "r_nvtx_sum.csv"
    p.write_text(
        "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range\n"
        "100.0,500,1,500.0,500.0,500,500,0.0,PushPop,decode\n"
    )
    assert nsys.sniff(p, p.read_bytes()) is False


def test_truncated_gpu_trace_csv(tmp_path):
    p = tmp_path / "t_cuda_gpu_trace.csv"
    p.write_text(GPU_TRACE_HEADER + "1500,4000,13,132,1,1,256,1,1,64,0.000\n")
    with pytest.raises(InputError, match="truncated CSV") as e:
        nsys.read(p)
    assert "\n" not in str(e.value)


def _sqlite(path: Path, script: str) -> Path:
    con = sqlite3.connect(path)
    con.executescript(script)
    con.close()
    return path


def test_sqlite_without_nsys_tables(tmp_path):
    p = _sqlite(tmp_path / "x.sqlite", "CREATE TABLE foo (x INTEGER);")
    assert nsys.sniff(p, read_head(p)) is False
    with pytest.raises(InputError, match="not an Nsight Systems export"):
        nsys.read(p)


def test_sqlite_without_gpu_activity(tmp_path):
    p = _sqlite(
        tmp_path / "cpu_only.sqlite",
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
        "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER);"
        "CREATE TABLE OSRT_API (start INTEGER, end INTEGER);",
    )
    assert nsys.sniff(p, read_head(p))
    with pytest.raises(InputError, match="no GPU activity recorded"):
        nsys.read(p)


def test_sqlite_graph_launch_and_old_columns(tmp_path):
    # GIVEN an old-style export: no greenContextId/graphNodeId, no session start, no NVTX
    p = _sqlite(
        tmp_path / "graph.sqlite",
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        INSERT INTO StringIds VALUES (1, 'cudaGraphLaunch_v10000'), (2, 'void gemv<float>(int)'),
            (3, 'gemv'), (4, 'cudaLaunchKernel_v7000');
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER,
            correlationId INTEGER, nameId INTEGER);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES
            (10, 20, 281980910466508, 5, 1), (30, 40, 281980910466508, 6, 4);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
            streamId INTEGER, correlationId INTEGER, globalPid INTEGER, shortName INTEGER,
            gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER,
            blockZ INTEGER);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
            (100, 150, 1, 13, 5, 281980910436352, 3, 4, 1, 1, 128, 1, 1),
            (160, 170, 1, 13, 5, 281980910436352, 3, 4, 1, 1, 128, 1, 1),
            (200, 260, 1, 13, 6, 281980910436352, 3, 8, 1, 1, 128, 1, 1);
        """,
    )
    # WHEN read
    trace = nsys.read(p)
    trace.validate()
    k = trace.kernels.to_pydict()
    # THEN kernels replayed from the graph launch are marked; names fall back to shortName
    assert k["graph_launch"] == [True, True, False]
    assert k["launch_api"] == ["cudaGraphLaunch", "cudaGraphLaunch", "cudaLaunchKernel"]
    assert k["name"] == ["gemv"] * 3 and k["device"] == [1, 1, 1]
    assert k["start_ns"] == [100, 160, 200]  # no session start: times stay session-relative
    assert trace.host_ops.to_pydict()["tid"] == [281980910466508 & 0xFFFFFF] * 2


def test_kernel_table_without_name_columns(tmp_path):
    p = _sqlite(
        tmp_path / "noname.sqlite",
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER);"
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2);",
    )
    with pytest.raises(InputError, match="no kernel name column"):
        nsys.read(p)


def test_nsys_rep_without_nsys_says_how_to_export(tmp_path, monkeypatch):
    p = tmp_path / "profile.nsys-rep"
    p.write_bytes(b"\x00binary report")
    monkeypatch.setattr(nsys.shutil, "which", lambda _name: None)
    assert nsys.sniff(p, p.read_bytes())
    with pytest.raises(InputError, match="nsys export --type sqlite -o out.sqlite profile.nsys-rep"):
        nsys.read(p)


def test_sniff_never_raises(tmp_path):
    p = tmp_path / "junk.csv"
    p.write_bytes(b"\xff\xfe\x00garbage,,,\n" * 10)
    assert nsys.sniff(p, p.read_bytes()) is False
    assert nsys.sniff(tmp_path / "absent.sqlite", b"SQLite format 3\x00") is False
