"""Roofline: FLOPs/bytes formulas, achieved rates, bounds, GPU detection, model-based numbers."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.analyses import roofline
from analyzer.knowledge import hardware
from analyzer.pipeline import Options
from tests.conftest import H200_DENSE, H200_TP2
from tests.runs import analyze_paths


def test_gemm_formulas() -> None:
    f, b, dt = roofline.op_work("aten::mm", [[4, 4096], [4096, 14336]], ["c10::BFloat16", "c10::BFloat16"])
    assert f == 2 * 4 * 4096 * 14336 and dt == "bf16"
    assert b == 2 * (4 * 4096 + 4096 * 14336 + 4 * 14336)
    f, _, _ = roofline.op_work("aten::addmm", [[14336], [8, 4096], [4096, 14336]], ["c10::BFloat16"] * 3)
    assert f == 2 * 8 * 4096 * 14336
    f, _, _ = roofline.op_work(
        "aten::linear", [[4, 512, 4096], [1024, 4096], []], ["c10::BFloat16"] * 2 + [""]
    )
    assert f == 2 * 4 * 512 * 4096 * 1024
    f, _, _ = roofline.op_work("aten::bmm", [[64, 1536, 2048], [64, 2048, 1]], ["c10::BFloat16"] * 2)
    assert f == 2 * 64 * 1536 * 2048


def test_attention_formula_counts_the_causal_half() -> None:
    # a whole prompt counts the pairs its causal mask keeps: q (q + 1) / 2 of the q x q scores
    q, kv = [4, 32, 512, 128], [4, 8, 512, 128]
    f, b, _ = roofline.op_work(
        "aten::_scaled_dot_product_cudnn_attention", [q, kv, kv], ["c10::BFloat16"] * 3
    )
    assert f == 2 * 4 * 32 * (512 * 513 / 2) * 256
    assert b == 2 * (4 * 32 * 512 * 128 * 2 + 2 * 4 * 8 * 512 * 128)
    f1, _, _ = roofline.op_work(
        "aten::_scaled_dot_product_cudnn_attention",
        [[4, 32, 1, 128], [4, 8, 513, 128], [4, 8, 513, 128]],
        ["c10::BFloat16"] * 3,
    )
    assert f1 == 2 * 4 * 32 * 1 * 513 * 256


def test_memory_bound_ops_and_unknowns() -> None:
    _, b, _ = roofline.op_work(
        "aten::copy_", [[4, 512, 4096], [4, 512, 4096], []], ["float", "c10::BFloat16", "Scalar"]
    )
    assert b == 4 * 512 * 4096 * (4 + 2)  # write fp32 dst, read bf16 src
    assert roofline.op_work("aten::index", [[128, 1536, 2048], []], ["c10::BFloat16", ""]) is None
    assert roofline.op_work("sgl_kernel::store_kvcache", [[8, 4096]], ["c10::BFloat16"]) is None


def test_rates_and_bounds() -> None:
    spec = hardware.find_gpu("h200")
    dur = np.array([1000.0, 1000.0, 3000.0, 1_000_000.0])
    flops = np.array([2e8, 1e6, np.nan, 2e17])
    nbytes = np.array([1e5, 4e6, 1e3, 1e9])
    r = roofline.rates(dur, flops, nbytes, ["bf16"] * 4, spec)
    assert r["achieved_tflops"][0] == pytest.approx(200.0)  # 2e8 flop in 1 us
    assert r["bound"][0] == "compute"  # intensity 2000 > ridge ~206
    assert r["bound"][1] == "memory" and r["achieved_tbps"][1] == pytest.approx(4.0)
    assert r["bound"][2] == "latency"
    assert r["bound"][3] == "invalid" and np.isnan(r["achieved_tflops"][3])
    unknown = roofline.rates(dur, flops, nbytes, ["bf16"] * 4, None)
    assert set(unknown["bound"]) == {"unknown"} and unknown["achieved_tflops"][0] == pytest.approx(200.0)


def test_h200_prefill_gemms_below_peak_and_decode_memory_bound() -> None:
    a = analyze_paths([str(H200_DENSE)])
    k = a.kernels.to_pandas()
    gemm = k[k["stage"].str.endswith("_gemm") & (k["flops_source"] == "shapes")]
    pre = gemm[gemm["phase"] == "prefill"]
    assert len(pre) and (pre["achieved_tflops"] < 989.4).all()
    assert (pre.loc[pre["stage"] != "lm_head_gemm", "bound"] == "compute").all()
    dec = gemm[(gemm["phase"] == "decode") & (gemm["stage"] != "lm_head_gemm")]
    assert (dec["bound"].isin(["memory", "latency"])).all()
    # decode GEMM bytes are the weights (bf16): the 4096 x 14336 gate projection = 117 MB
    gate = dec[dec["stage"] == "gate_up_gemm"]["bytes"]
    assert gate.max() == pytest.approx(2 * 4096 * 14336 + 2 * 4 * (4096 + 14336))
    assert a.gpu["name"].startswith("NVIDIA H200")


def test_model_based_numbers_for_graph_replays() -> None:
    # GIVEN the TP2 trace whose decode GEMMs are graph replays without shapes
    a = analyze_paths([str(H200_TP2[0])], Options(model="llama-3-8b"))
    k = a.kernels.to_pandas()
    dec = k[(k["phase"] == "decode") & (k["stage"] == "gate_up_gemm")]
    assert (dec["flops_source"] == "model").all()
    # tokens per decode step = the prefill batch (8); TP2 shard of the gate+up weights
    w = 4096 * 2 * 14336 / 2
    assert dec["flops"].iloc[0] == pytest.approx(2 * 8 * w)
    pre = k[(k["phase"] == "prefill") & (k["stage"] == "gate_up_gemm")]
    assert (pre["flops_source"] == "shapes").all()


def test_unknown_gpu_still_reports_times(capsys) -> None:
    from analyzer.cli import main

    code = main(["analyze", str(H200_TP2[0]), "--gpu", "mi300x"])
    out = capsys.readouterr().out
    assert code == 0 and "MI300X" in out
    spec, reason = hardware.detect_gpu("Mystery GPU", "sm_99", 7, 10**9)
    assert spec is None and "unknown" in reason.lower()
