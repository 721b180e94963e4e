"""Formats without a real sample: synthetic fixtures from documented column sets, analysed end to end."""

from __future__ import annotations

import csv

from analyzer.readers import sniff
from tests.conftest import FIXTURES
from tests.runs import analyze_paths

NSYS = FIXTURES / "synthetic" / "h200_cuda_gpu_trace.csv"
V3 = FIXTURES / "synthetic" / "4242_kernel_trace.csv"


def test_nsys_cuda_gpu_trace_end_to_end() -> None:
    rows = list(csv.DictReader(open(NSYS)))
    a = analyze_paths([str(NSYS)])
    assert sniff(NSYS).FORMAT == "nsys"
    assert a.kernels.num_rows == len(rows)
    assert a.trace.kernel_ns == sum(int(r["Duration (ns)"]) for r in rows)
    assert a.gpu["name"].startswith("NVIDIA H200")
    k = a.kernels.to_pandas()
    assert k.loc[k["stage"] == "other", "dur_ns"].sum() / k["dur_ns"].sum() < 0.01
    steps = a.steps
    assert (steps["phase"] == "prefill").sum() == 1 and (steps["phase"] == "decode").sum() >= 5
    assert {"qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm", "communication"} <= set(k["stage"])


def test_rocprofv3_kernel_trace_end_to_end() -> None:
    rows = list(csv.DictReader(open(V3)))
    a = analyze_paths([str(V3)])
    assert sniff(V3).FORMAT == "rocprof"
    assert a.kernels.num_rows == len(rows)
    assert a.trace.kernel_ns == sum(int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in rows)
    k = a.kernels.to_pandas()
    # work-item grids became block counts
    r0 = rows[0]
    assert k["grid_x"].iloc[0] == int(r0["Grid_Size_X"]) // int(r0["Workgroup_Size_X"])
    steps = a.steps
    assert (steps["phase"] == "prefill").sum() == 1 and (steps["phase"] == "decode").sum() >= 5
