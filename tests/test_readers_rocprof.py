"""Tests for analyzer/readers/rocprof.py: real rocprof v1 / rocprofv3 samples first, then edge cases.

Counts and times are checked against an independent reading of each file (csv / json / sqlite3).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.errors import InputError
from analyzer.readers import read_head, rocprof, sniff

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
V1 = SHARED / "rocprofv1-llamacpp-r9700"
V3_JSON = SHARED / "rocprofv3-json-mi350x-training" / "908_results.json.gz"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"public sample traces not found at {SHARED} (../shared absent)"
)


def _kernels(trace):
    return trace.kernels.to_pydict()


# --------------------------------------------------------------------------- real samples


@needs_shared
def test_v1_results_csv_matches_independent_count_and_time():
    # GIVEN the per-dispatch CSV read with the plain csv module
    with open(V1 / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    expected_ns = sum(int(r["EndNs"]) - int(r["BeginNs"]) for r in rows)
    # WHEN the reader reads it
    trace = rocprof.read(V1 / "results.csv")
    trace.validate()
    # THEN every dispatch is there with the same total time
    assert trace.kernels.num_rows == len(rows) == 1963
    assert trace.kernel_ns == expected_ns == 662_138_329
    k = _kernels(trace)
    assert set(k["kind"]) == {"kernel"}
    assert set(k["device"]) == {0}  # gpu-id 2 is the only GPU seen
    assert not any(k["aggregate"]) and set(k["count"]) == {1}
    assert k["name"][0] == "__amd_rocclr_fillBufferAligned.kd"
    assert k["norm_name"] == k["name"]
    meta = trace.inputs[0]
    assert (meta.format, meta.gpu_name, meta.arch, meta.sm_count) == (
        "rocprof",
        "AMD Radeon AI PRO R9700",
        "gfx1201",
        64,
    )
    assert len(meta.sha256) == 64


@needs_shared
def test_v1_grid_in_work_items_becomes_work_groups():
    with open(V1 / "results.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if int(r["grd"]) > int(r["wgr"]) > 1)
    trace = rocprof.read(V1 / "results.csv")
    k = _kernels(trace)
    i = k["start_ns"].index(int(row["BeginNs"]))
    assert k["grid_x"][i] == math.ceil(int(row["grd"]) / int(row["wgr"]))
    assert (k["grid_y"][i], k["grid_z"][i]) == (1, 1)
    assert k["block_x"][i] == int(row["wgr"])
    # a known row: rms_norm_f32 with grd 524288, wgr 1024 -> 512 work-groups
    j = k["start_ns"].index(769537591952897)
    assert k["name"][j].startswith("void rms_norm_f32<1024, true, false>")
    assert (k["grid_x"][j], k["block_x"][j]) == (512, 1024)


@needs_shared
def test_v1_results_json_uses_ns_args_not_truncated_us():
    doc = json.loads((V1 / "results.json").read_text())
    evs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "BeginNs" in e.get("args", {})]
    expected_ns = sum(int(e["args"]["EndNs"]) - int(e["args"]["BeginNs"]) for e in evs)
    trace = rocprof.read(V1 / "results.json")
    trace.validate()
    assert trace.kernels.num_rows == len(evs) == 1963
    assert trace.kernel_ns == expected_ns
    assert _kernels(trace)["start_ns"][0] == int(evs[0]["args"]["BeginNs"])
    assert trace.inputs[0].arch == "gfx1201"


@needs_shared
def test_v1_results_db_strips_wrapping_quotes():
    con = sqlite3.connect(f"file:{V1 / 'results.db'}?mode=ro", uri=True)
    n, total = con.execute("SELECT COUNT(*), SUM(EndNs - BeginNs) FROM KERN").fetchone()
    raw = con.execute("SELECT KernelName FROM KERN ORDER BY rowid LIMIT 1").fetchone()[0]
    con.close()
    trace = rocprof.read(V1 / "results.db")
    trace.validate()
    assert trace.kernels.num_rows == n == 1963
    assert trace.kernel_ns == total
    assert raw.startswith('"') and _kernels(trace)["name"][0] == raw.strip('"')


@needs_shared
def test_v1_stats_csv_gives_aggregate_rows():
    with open(V1 / "results.stats.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    trace = rocprof.read(V1 / "results.stats.csv")
    trace.validate()
    k = _kernels(trace)
    assert trace.kernels.num_rows == len(rows)
    assert sum(k["count"]) == sum(int(r["Calls"]) for r in rows) == 1963
    assert trace.kernel_ns == sum(int(r["TotalDurationNs"]) for r in rows)
    assert all(k["aggregate"]) and set(k["start_ns"]) == {None}


@needs_shared
def test_v3_json_matches_independent_count_and_time():
    doc = json.loads(gzip.decompress(V3_JSON.read_bytes()))
    tool = doc["rocprofiler-sdk-tool"][0]
    disp = tool["buffer_records"]["kernel_dispatch"]
    trace = rocprof.read(V3_JSON)
    trace.validate()
    assert trace.kernels.num_rows == len(disp) == 43_915
    assert trace.kernel_ns == sum(r["end_timestamp"] - r["start_timestamp"] for r in disp)
    # names resolve through kernel_symbols; the only agent used is the first GPU
    k = _kernels(trace)
    symbols = {s["kernel_id"]: s for s in tool["kernel_symbols"]}
    assert k["name"][0] == symbols[disp[0]["dispatch_info"]["kernel_id"]]["formatted_kernel_name"]
    assert set(k["device"]) == {0}
    meta = trace.inputs[0]
    assert (meta.gpu_name, meta.arch, meta.sm_count) == ("AMD Instinct MI350X", "gfx950", 256)
    # grid conversion on a dispatch whose grid spans several work-groups
    r = next(
        r
        for r in disp
        if r["dispatch_info"]["grid_size"]["x"] > r["dispatch_info"]["workgroup_size"]["x"] > 1
    )
    i = k["start_ns"].index(r["start_timestamp"])
    info = r["dispatch_info"]
    assert k["grid_x"][i] == math.ceil(info["grid_size"]["x"] / info["workgroup_size"]["x"])
    assert k["block_x"][i] == info["workgroup_size"]["x"]


ROCPROF_SAMPLES = [
    "rocprofv1-llamacpp-r9700/results.csv",
    "rocprofv1-llamacpp-r9700/results.db",
    "rocprofv1-llamacpp-r9700/results.stats.csv",
    "rocprofv3-json-mi350x-training/908_results.json.gz",
]
OTHER_SAMPLES = [
    "rocpd-llamacpp-r9700/32432_results.db",
    "nsys-sqlite-nvfuser-h200/report1.sqlite",
    "nsys-stats-csv-deepseek-ocr-rtx5090/decode/summary_cuda_gpu_kern_sum.csv",
    "h200-llama3-8b-dense/trace.json.gz",
    "mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_decode.json.gz",
    "rocprofv1-llamacpp-r9700/results.sysinfo.txt",
    "rocprofv1-llamacpp-r9700/PROVENANCE.md",
]


@needs_shared
@pytest.mark.parametrize("rel", ROCPROF_SAMPLES)
def test_registry_sniffs_rocprof_samples(rel):
    assert sniff(SHARED / rel).FORMAT == "rocprof"


@needs_shared
def test_registry_sniffs_v1_results_json():
    p = V1 / "results.json"
    assert rocprof.sniff(p, read_head(p))
    assert sniff(p).FORMAT == "rocprof"


@needs_shared
@pytest.mark.parametrize("rel", OTHER_SAMPLES)
def test_rocprof_sniff_rejects_other_formats(rel):
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"{rel} not in this checkout of ../shared")
    assert rocprof.sniff(p, read_head(p)) is False


# --------------------------------------------------------------------------- synthetic edge cases

V3_HEADER = (
    '"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name",'
    '"Correlation_Id","Start_Timestamp","End_Timestamp","LDS_Block_Size","Scratch_Size","VGPR_Count",'
    '"Accum_VGPR_Count","SGPR_Count","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z",'
    '"Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n'
)


def _v3_row(agent, queue, name, corr, start, end, wg=(64, 1, 1), grid=(1024, 1024, 1)):
    return (
        f'"KERNEL_DISPATCH","{agent}",{queue},{queue},847809,{corr},49,"{name}",{corr},{start},{end},'
        f"512,0,8,0,16,{wg[0]},{wg[1]},{wg[2]},{grid[0]},{grid[1]},{grid[2]}\n"
    )


def test_v3_csv_newer_columns_agent_strings_and_siblings(tmp_path):
    # GIVEN a rocprofv3 kernel trace with "Agent 7" ids and Stream_Id, beside copy and marker traces
    kt = tmp_path / "123_kernel_trace.csv"
    kt.write_text(
        V3_HEADER
        + _v3_row("Agent 7", 17, "void addition_kernel<float>(float*, int)", 101, 1000, 1500)
        + _v3_row("Agent 9", 19, "subtract_kernel(float*, int)", 102, 2000, 2600, grid=(100, 3, 1))
    )
    (tmp_path / "123_memory_copy_trace.csv").write_text(
        '"Kind","Direction","Stream_Id","Source_Agent_Id","Destination_Agent_Id","Correlation_Id",'
        '"Start_Timestamp","End_Timestamp"\n'
        '"MEMORY_COPY","MEMORY_COPY_HOST_TO_DEVICE",1,"Agent 0","Agent 9",90,500,900\n'
        '"MEMORY_COPY","MEMORY_COPY_DEVICE_TO_HOST",1,"Agent 7","Agent 0",91,3000,3100\n'
    )
    (tmp_path / "123_marker_api_trace.csv").write_text(
        '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp",'
        '"End_Timestamp"\n'
        '"MARKER_CORE_API","decode step",1,1,5,900,2700\n'
        '"MARKER_CONTROL_API","roctxProfilerPause",1,1,6,950,960\n'
    )
    # WHEN it is read
    assert rocprof.sniff(kt, kt.read_bytes())
    trace = rocprof.read(kt)
    trace.validate()
    k = _kernels(trace)
    # THEN kernels and copies share one device numbering (Agent 7 -> 0, Agent 9 -> 1)
    assert k["kind"] == ["kernel", "kernel", "memcpy", "memcpy"]
    assert k["device"] == [0, 1, 1, 0]
    assert k["dur_ns"] == [500, 600, 400, 100]
    assert (k["grid_x"][0], k["grid_y"][0], k["grid_z"][0]) == (16, 1024, 1)
    assert (k["grid_x"][1], k["grid_y"][1]) == (2, 3)  # ceil(100 / 64) = 2
    assert (k["block_x"][0], k["registers"][0], k["shared_mem"][0]) == (64, 8, 512)
    assert k["correlation"][:2] == [101, 102]
    assert k["name"][2] == "MEMORY_COPY_HOST_TO_DEVICE"
    ann = trace.annotations.to_pydict()
    assert ann["name"] == ["decode step"] and ann["side"] == ["cpu"]


def test_v3_csv_type_relative_gpu_ids_are_device_indices(tmp_path):
    kt = tmp_path / "9_kernel_trace.csv"
    kt.write_text(V3_HEADER + _v3_row("GPU 3", 1, "k", 1, 10, 20))
    assert _kernels(rocprof.read(kt))["device"] == [3]


def test_v3_csv_agent_info_maps_agents_and_names_the_gpu(tmp_path):
    kt = tmp_path / "7_kernel_trace.csv"
    kt.write_text(V3_HEADER + _v3_row("Agent 2", 1, "k", 1, 10, 20))
    (tmp_path / "7_agent_info.csv").write_text(
        '"Node_Id","Logical_Node_Id","Agent_Type","Cu_Count","Name","Product_Name"\n'
        '0,0,"CPU",0,"AMD EPYC","AMD EPYC"\n'
        '1,1,"GPU",304,"gfx942","AMD Instinct MI300X"\n'
        '2,2,"GPU",304,"gfx942","AMD Instinct MI300X"\n'
    )
    trace = rocprof.read(kt)
    assert _kernels(trace)["device"] == [1]
    meta = trace.inputs[0]
    assert (meta.gpu_name, meta.arch, meta.sm_count) == ("AMD Instinct MI300X", "gfx942", 304)


def test_v3_csv_old_column_set(tmp_path):
    kt = tmp_path / "1_kernel_trace.csv"
    kt.write_text(
        '"Kind","Agent_Id","Queue_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name",'
        '"Correlation_Id","Start_Timestamp","End_Timestamp","Private_Segment_Size",'
        '"Group_Segment_Size","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z",'
        '"Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n'
        '"KERNEL_DISPATCH",2,1,21228,1,11,"void add<float>(float*)",1937,100,300,0,256,64,1,1,'
        "1024,1024,1\n"
    )
    k = _kernels(rocprof.read(kt))
    assert (k["grid_x"], k["grid_y"], k["shared_mem"], k["dur_ns"]) == ([16], [1024], [256], [200])


def test_v2_csv(tmp_path):
    p = tmp_path / "results_v2.csv"
    p.write_text(
        "Dispatch_ID,GPU_ID,Queue_ID,PID,TID,Grid_Size,Workgroup_Size,LDS_Per_Workgroup,"
        "Scratch_Per_Workitem,Arch_VGPR,Accum_VGPR,SGPR,Wave_Size,Kernel_Name,Start_Timestamp,"
        "End_Timestamp,Correlation_ID\n"
        '1,4,0,10,10,1000,256,0,0,32,0,16,64,"Cijk_Alik_Bljk_HHS_BH_MT64x64x32.kd",100,250,7\n'
    )
    assert rocprof.sniff(p, p.read_bytes())
    k = _kernels(rocprof.read(p))
    assert (k["grid_x"], k["block_x"], k["device"], k["dur_ns"], k["correlation"]) == (
        [4],
        [256],
        [0],
        [150],
        [7],
    )


def test_truncated_csv_is_one_line_input_error(tmp_path):
    full = (V3_HEADER + _v3_row("Agent 1", 1, "k", 1, 10, 20)).rstrip("\n")
    p = tmp_path / "5_kernel_trace.csv"
    p.write_text(full[: len(full) - 30])
    with pytest.raises(InputError, match="truncated CSV") as e:
        rocprof.read(p)
    assert "\n" not in str(e.value)


def test_v1_csv_without_timestamps_names_the_missing_columns(tmp_path):
    p = tmp_path / "results.csv"
    p.write_text(
        '"Index","KernelName","gpu-id","queue-id","queue-index","pid","tid","grd","wgr","lds",'
        '"scr","arch_vgpr","accum_vgpr","sgpr","wave_size","sig","obj",SQ_WAVES\n'
        '0,"k.kd",2,0,0,1,1,256,256,0,0,16,0,128,32,"0x0","0x1",4\n'
    )
    with pytest.raises(InputError, match="BeginNs"):
        rocprof.read(p)


def test_header_only_csv_has_no_gpu_activity(tmp_path):
    p = tmp_path / "2_kernel_trace.csv"
    p.write_text(V3_HEADER)
    with pytest.raises(InputError, match="no GPU activity recorded"):
        rocprof.read(p)


def test_api_stats_share_the_header_but_are_not_kernel_stats(tmp_path):
    body = '"Name","Calls","TotalDurationNs","AverageNs","Percentage"\n"hipMemcpy",3,300,100,100\n'
    hip = tmp_path / "results.hip_stats.csv"
    hip.write_text(body)
    kern = tmp_path / "8_kernel_stats.csv"
    kern.write_text(body)
    assert rocprof.sniff(hip, hip.read_bytes()) is False
    assert rocprof.sniff(kern, kern.read_bytes()) is True


def test_sqlite_without_kern_table(tmp_path):
    p = tmp_path / "results.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE other (x INTEGER)")
    con.commit()
    con.close()
    assert rocprof.sniff(p, read_head(p)) is False
    with pytest.raises(InputError, match="not a rocprof output"):
        rocprof.read(p)


def test_sniff_never_raises_on_foreign_bytes(tmp_path):
    p = tmp_path / "junk.bin"
    p.write_bytes(b"\x00\xff\xfe" * 100)
    assert rocprof.sniff(p, p.read_bytes()) is False
    assert rocprof.sniff(tmp_path / "missing.db", b"SQLite format 3\x00") is False


def test_v3_json_copies_and_markers(tmp_path):
    # GIVEN a minimal rocprofv3 JSON with one dispatch, one copy and one roctx range
    kinds = ["NONE"] * 12
    kinds[7], kinds[10], kinds[11] = "MARKER_CORE_API", "MEMORY_COPY", "KERNEL_DISPATCH"
    strings = [{"kind": k, "operations": []} for k in kinds]
    strings[10]["operations"] = ["MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST", "MEMORY_COPY_HTOD"]
    strings[7]["operations"] = ["roctxMarkA", "roctxRangePushA"]
    tool = {
        "agents": [
            {"id": {"handle": 5}, "type": 1, "name": "cpu"},
            {"id": {"handle": 6}, "type": 2, "name": "gfx942", "product_name": "MI300X",
             "cu_count": 304},
        ],  # fmt: skip
        "kernel_symbols": [{"kernel_id": 0}, {"kernel_id": 1, "kernel_name": "k.kd",
                                              "formatted_kernel_name": "k", "arch_vgpr_count": 4}],
        "strings": {"buffer_records": strings, "marker_api": [{"key": 9, "value": "step 1"}]},
        "buffer_records": {
            "kernel_dispatch": [{
                "kind": 11, "operation": 2, "correlation_id": {"internal": 3},
                "start_timestamp": 100, "end_timestamp": 180,
                "dispatch_info": {"agent_id": {"handle": 6}, "queue_id": {"handle": 1},
                                  "kernel_id": 1, "group_segment_size": 0,
                                  "workgroup_size": {"x": 256, "y": 1, "z": 1},
                                  "grid_size": {"x": 491520, "y": 1, "z": 1}},
            }],
            "memory_copy": [{
                "kind": 10, "operation": 2, "correlation_id": {"internal": 4},
                "start_timestamp": 50, "end_timestamp": 90, "bytes": 4096,
                "src_agent_id": {"handle": 5}, "dst_agent_id": {"handle": 6},
            }],
            "marker_api": [{"kind": 7, "operation": 1, "correlation_id": {"internal": 9},
                            "start_timestamp": 40, "end_timestamp": 200}],
        },
    }  # fmt: skip
    p = tmp_path / "1_results.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"rocprofiler-sdk-tool": [tool]}).encode()))
    # WHEN read
    assert rocprof.sniff(p, read_head(p))
    trace = rocprof.read(p)
    k = _kernels(trace)
    # THEN the dispatch has 1920 work-groups, the copy lands on the GPU, the range is an annotation
    assert k["kind"] == ["kernel", "memcpy"]
    assert (k["grid_x"][0], k["block_x"][0], k["registers"][0]) == (1920, 256, 4)
    assert (k["name"][1], k["device"][1], k["bytes_recorded"][1]) == ("MEMORY_COPY_HTOD", 0, 4096)
    assert trace.annotations.to_pydict()["name"] == ["step 1"]
    assert trace.inputs[0].gpu_name == "MI300X"


def test_corrupt_json_is_input_error(tmp_path):
    p = tmp_path / "1_results.json"
    p.write_text('{"rocprofiler-sdk-tool": [{"agents": [')
    with pytest.raises(InputError):
        rocprof.read(p)


_dispatch = st.tuples(
    st.sampled_from(["Agent 1", "Agent 4", "GPU 0"]),
    st.integers(0, 5),
    st.text(st.characters(codec="utf-8", exclude_characters='"\r\n\x00'), min_size=1, max_size=40),
    st.integers(0, 10**15),
    st.integers(0, 10**9),
    st.integers(1, 1024),
    st.integers(0, 10**7),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_dispatch, min_size=1, max_size=30))
def test_v3_csv_never_loses_a_kernel(tmp_path, dispatches):
    # GIVEN any set of dispatches written as a rocprofv3 kernel trace
    p = tmp_path / "42_kernel_trace.csv"
    body = "".join(
        _v3_row(agent, q, name.replace(",", ";"), i, start, start + dur, wg=(wg, 1, 1), grid=(grid, 1, 1))
        for i, (agent, q, name, start, dur, wg, grid) in enumerate(dispatches)
    )
    p.write_text(V3_HEADER + body, encoding="utf-8")
    # WHEN read
    k = rocprof.read(p).kernels.to_pydict()
    # THEN every dispatch is there, with its time, name and work-group count
    assert len(k["name"]) == len(dispatches)
    assert k["dur_ns"] == [d[4] for d in dispatches]
    assert k["name"] == [d[2].replace(",", ";") for d in dispatches]
    assert k["grid_x"] == [math.ceil(d[6] / d[5]) for d in dispatches]
