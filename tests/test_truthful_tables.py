"""Every number a table prints is true of its row, or marked (issue 22, items 1 and 3): no rate above
a peak printed as a fact, invalid kernels kept out of aggregate rates, a kernel's dominant stage,
steps counted once per run, "—" where there is nothing to say."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analyzer.analyses import roofline
from analyzer.knowledge import architectures
from analyzer.model import InputMeta
from analyzer.pipeline import Options
from analyzer.report import html, text
from analyzer.results import summary as summary_mod
from analyzer.results.compare import compare_summaries
from analyzer.results.summary import build_summary
from analyzer.results.summary_rates import roofline_fields
from tests.conftest import H200_MOE, H200_TP2
from tests.runs import analyze_paths

DASH = "—"


@pytest.fixture(scope="module")
def moe_with_model():
    a = analyze_paths([str(H200_MOE)], Options(model="qwen3-30b-a3b"))
    return a, build_summary(a)


def _rated_rows(s: dict) -> list[tuple[str, dict]]:
    rows = [("group", r) for r in s["groups"]] + [("stage", r) for r in s["stages"]]
    return rows + [("top", r) for r in s["top_kernels"]]


# --------------------------------------------------------------------------- item 1: rates and peaks


def test_no_aggregate_rate_exceeds_a_peak(moe_with_model) -> None:
    # GIVEN the MoE fixture measured with its model architecture on an H200
    _, s = moe_with_model
    peaks = s["gpu"]["peaks"]
    top_tflops = max(v for k, v in peaks.items() if k.endswith("_tflops"))
    # THEN no group, stage or top-kernel row claims more than the HBM or the best compute peak
    for kind, r in _rated_rows(s):
        assert (r["achieved_tbps"] or 0) <= peaks["hbm_tbps"], (kind, r["stage"], r["achieved_tbps"])
        assert (r["achieved_tflops"] or 0) <= top_tflops, (kind, r["stage"], r["achieved_tflops"])
        # AND a row whose kernels were all invalid has no rate but a reason
        if r["bound"] == "invalid":
            assert r["achieved_tbps"] is None and r["achieved_tflops"] is None
            assert r["invalid_reason"]


def test_split_k_reduce_reads_partials_not_the_gemms_operands(moe_with_model) -> None:
    # GIVEN cuBLAS split-K reduce kernels in decode, numbered from the model (no shapes for them)
    a, _ = moe_with_model
    df = a.frame
    red = df[df["norm_name"].astype(str).str.contains("splitKreduce") & (df["phase"] == "decode")]
    assert len(red)
    # THEN each one reads partial sums and writes C (tokens x N), far below the GEMM's weight bytes
    hidden = a.model.hidden_size
    for r in red.itertuples():
        assert r.bytes < 64 * r.tokens * hidden * 4, r.bytes
        assert r.bound != "invalid"


def test_moe_expert_kernels_of_a_layer_share_the_layers_work() -> None:
    # GIVEN two expert GEMM kernels in one layer of one step (gate_up, then down) and the model
    arch = architectures.load_model("qwen3-30b-a3b")
    k = pa.table(
        {
            "trace_id": pa.array([0, 0], pa.int16()),
            "rank": pa.array([0, 0], pa.int16()),
            "norm_name": ["moe_gemm_a", "moe_gemm_b"],
            "start_ns": pa.array([0, 100_000], pa.int64()),
            "dur_ns": pa.array([100_000, 50_000], pa.int64()),
            "stage": ["moe_expert_gemm", "moe_expert_gemm"],
            "step": pa.array([0, 0], pa.int32()),
            "layer": pa.array([3, 3], pa.int32()),
            "tokens": pa.array([8, 8], pa.int64()),
            "split_k": pa.array([None, None], pa.int32()),
        }
    )
    flops = np.full(2, np.nan)
    nbytes = np.full(2, np.nan)
    source = ["none", "none"]
    roofline.model_work(k, arch, 1, flops, nbytes, source)
    # THEN the two kernels together carry one layer's expert work, not twice it
    routed = 8 * arch.num_experts_per_tok
    w = 3 * arch.hidden_size * arch.expert_intermediate_size
    assert flops.sum() == pytest.approx(2.0 * routed * w)
    assert nbytes.sum() < 2.0 * (min(arch.num_experts, routed) * w) * 1.1


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["bound"] = pd.Categorical(df["bound"], categories=roofline.BOUNDS)
    for c in ("flops", "achieved_tflops", "intensity"):
        df[c] = df.get(c, np.nan)
    return df


def test_invalid_kernels_stay_out_of_aggregate_rates() -> None:
    # GIVEN one group of two kernels: one valid at 1 TB/s, one invalid (bytes say 100 TB/s)
    base = {"group_key": "k", "phase": "decode", "stage": "activation", "provider": "x", "count": 1}
    df = _frame(
        [
            {**base, "dur_ns": 1000, "bytes": 1e6, "achieved_tbps": 1.0, "pct_of_peak": 0.2, "bound": "latency"},
            {**base, "dur_ns": 1000, "bytes": 1e8, "achieved_tbps": np.nan, "pct_of_peak": np.nan, "bound": "invalid"},
        ]
    )  # fmt: skip
    # THEN the group row, the stage row and the roofline fields rate the valid kernel only
    (g,) = summary_mod.group_rows(df)
    assert g["achieved_tbps"] == pytest.approx(1.0)
    assert g["invalid_kernels"] == 1 and g["invalid_reason"]
    f = roofline_fields(df)
    assert f["achieved_tbps"] == pytest.approx(1.0) and f["bytes"] == pytest.approx(1e6)


def test_invalid_rows_print_a_dash_and_the_reason() -> None:
    # GIVEN a summary whose top kernel is invalid
    s = {
        "inputs": [],
        "gpu": {"name": "X", "peaks": {"hbm_tbps": 4.8}},
        "totals": {"wall_ns": 10, "busy_ns": 10, "idle_fraction": 0.0, "kernel_ns": 10, "kernels": 1},
        "stages": [],
        "providers": [],
        "top_kernels": [
            {"share": 1.0, "time_ns": 10, "count": 1, "stage": "norm", "provider": "p", "phases": ["decode"],
             "achieved_tbps": None, "achieved_tflops": None, "pct_of_peak": None, "bound": "invalid",
             "invalid_reason": "5.16 TB/s above the HBM peak 4.8 TB/s", "norm_name": "k", "mean_ns": 10}
        ],
    }  # fmt: skip
    out = io.StringIO()
    text.render(s, out)
    # THEN the text shows a dash and why
    assert DASH in out.getvalue() and "above the HBM peak" in out.getvalue()
    # AND so does the HTML table
    page = html.Page("t")
    html._top(page, s)
    body = "".join(page.parts)
    assert DASH in body and "above the HBM peak" in body


# --------------------------------------------------------------------------- item 3: tables say what is true


def test_top_kernels_show_the_dominant_stage_and_phase() -> None:
    # GIVEN one kernel configuration whose first row is 0.1% embedding and the rest moe_sort
    base = {"group_key": "g", "norm_name": "vectorized_gather_kernel", "provider": "pytorch", "rule_id": "R",
            "count": 1, "tile_m": None, "tile_n": None, "tile_k": None, "split_k": None}  # fmt: skip
    df = pd.DataFrame(
        [
            {**base, "stage": "embedding", "phase": "decode", "dur_ns": 1},
            {**base, "stage": "moe_sort", "phase": "prefill", "dur_ns": 999},
        ]
    )
    (r,) = summary_mod.top_kernels(df, 1000)
    # THEN the row names the stage and phase that hold most of its time, with every share
    assert r["stage"] == "moe_sort" and r["phase"] == "prefill"
    assert r["stages"] == [{"stage": "moe_sort", "share": 0.999}, {"stage": "embedding", "share": 0.001}]


def test_multi_rank_steps_and_tokens_are_counted_once_per_run() -> None:
    # GIVEN the TP2 fixture: 1 prefill step and 32 decode steps of batch 8, on each of two ranks
    s = build_summary(analyze_paths([str(p) for p in H200_TP2]))
    dec, pre = s["phases"]["decode"], s["phases"]["prefill"]
    # THEN the run has 32 decode steps and 256 decode tokens, not one count per rank
    assert (dec["steps"], dec["tokens"]) == (32, 256)
    assert (pre["steps"], pre["tokens"]) == (1, 8192)
    # AND a step's time is its wall span across the ranks (at least each rank's own step)
    per_rank = [r["dur_ns"] for r in s["steps"] if r["phase"] == "prefill"]
    assert pre["step_ns"]["p50"] >= max(per_rank)


def test_summary_only_input_prints_a_dash_not_zero_wall() -> None:
    s = {
        "inputs": [],
        "gpu": {"name": None, "reason": "x"},
        "totals": {"wall_ns": 0, "busy_ns": 0, "idle_fraction": 0.0, "kernel_ns": 5000, "kernels": 3,
                   "devices": 0, "aggregate_rows": 3},
        "stages": [], "providers": [], "top_kernels": [],
    }  # fmt: skip
    out = io.StringIO()
    text.render(s, out)
    assert "wall 0 ns" not in out.getvalue() and f"wall {DASH}" in out.getvalue()


def test_a_stage_absent_on_one_side_of_compare_is_a_dash() -> None:
    def fake(stages: list[tuple[str, int]]) -> dict:
        return {
            "inputs": [{"trace_id": 0, "path": "x", "format": "kineto", "sha256": "0", "rank": 0}],
            "gpu": {"name": None, "reason": "r"},
            "totals": {"wall_ns": 10, "busy_ns": 10, "idle_fraction": 0.0, "kernel_ns": 10, "kernels": 1},
            "phases": {"decode": {"steps": 1, "kernel_ns": 10, "step_ns": {"p50": 10}, "profile": []}},
            "stages": [{"phase": "decode", "stage": s, "category": "c", "provider": "p", "time_ns": t}
                       for s, t in stages],
        }  # fmt: skip

    r = compare_summaries([fake([("norm", 10), ("rope", 5)]), fake([("norm", 20)])])
    rope = next(x for x in r["stages"] if x["stage"] == "rope")
    assert rope["time_ns"] == [5, None] and rope["ratio"] == [1.0, None]
    out = io.StringIO()
    text.render_compare(r, out)
    line = next(ln for ln in out.getvalue().splitlines() if ln.strip().startswith("rope"))
    assert "0 ns" not in line and "0.00x" not in line and DASH in line


def test_unknown_gpu_says_what_the_trace_lacked() -> None:
    spec, reason = roofline.resolve_gpu([InputMeta()])
    assert spec is None
    assert "''" not in reason and "no GPU name, arch or SM count in the trace" in reason
