"""Roofline: FLOPs/bytes formulas, achieved rates, bounds, GPU detection, model-based numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analyzer.analyses import roofline
from analyzer.knowledge import hardware
from analyzer.pipeline import Options
from tests.conftest import FIXTURES, H200_DENSE, H200_MOE, H200_TP2
from tests.runs import analyze_paths

ZOO = FIXTURES / "zoo"


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


# --------------------------------------------------------------------------- issue 32: sizes found, basis, no count


def test_graph_replays_are_counted_from_sizes_found_in_the_trace() -> None:
    # GIVEN the TP2 trace: an eager prefill with shapes, decode replayed from a CUDA graph (no host ops)
    a = analyze_paths([str(H200_TP2[0])])
    k = a.kernels.to_pandas()
    dec = k[(k["phase"] == "decode") & (k["stage"] == "gate_up_gemm")]
    # THEN without --model the decode GEMMs are counted from the sizes the prefill's shapes show
    assert (dec["flops_source"] == "found").all() and dec["uncounted"].isna().all()
    assert dec["flops"].iloc[0] == pytest.approx(2 * 8 * 4096 * 2 * 14336 / 2)
    sizes = a.work_sizes["0"]["sizes"]
    assert (sizes["hidden_size"], sizes["num_attention_heads"], sizes["num_key_value_heads"]) == (4096, 16, 4)
    assert (sizes["head_dim"], sizes["intermediate_size"], sizes["num_hidden_layers"]) == (128, 7168, 8)
    # AND --model gives the same numbers, as its own basis
    m = analyze_paths([str(H200_TP2[0])], Options(model="llama-3-8b")).kernels.to_pandas()
    mdec = m[(m["phase"] == "decode") & (m["stage"] == "gate_up_gemm")]
    assert (mdec["flops_source"] == "model").all()
    assert mdec["flops"].sum() == pytest.approx(dec["flops"].sum(), rel=1e-9)


def test_a_model_that_disagrees_with_the_trace_is_a_warning() -> None:
    # GIVEN the TP2 Llama-3-8B trace analysed with --model qwen3-8b (another MLP width and vocabulary)
    a = analyze_paths([str(H200_TP2[0])], Options(model="qwen3-8b"))
    (w,) = [x for x in a.warnings if "disagrees with the sizes" in x]
    # THEN one warning names each size that differs (a rank's shard of the heads is no difference)
    assert "MLP width 7168 (--model: 12288)" in w and "vocabulary 128256 (--model: 151936)" in w
    assert "attention heads" not in w and "--model's" in w
    # AND --model still counts the kernels without shapes
    k = a.kernels.to_pandas()
    assert (k.loc[(k["phase"] == "decode") & (k["stage"] == "o_gemm"), "flops_source"] == "model").all()


def test_sizes_found_in_a_moe_trace() -> None:
    from analyzer.analyses import shape_roles
    from analyzer.knowledge.attention_ops import load_attention_ops
    from analyzer.knowledge.work_ops import load_work_ops
    from analyzer.tables.dictionaries import objects

    a = analyze_paths([str(H200_MOE)])
    d = shape_roles.found_sizes(
        a.kernels, a.trace.host_ops, objects(a.kernels["stage"]), load_attention_ops(), load_work_ops()
    )
    # Qwen3-30B-A3B's shapes (4 of its 48 layers): hidden 2048, 32 / 4 heads of 128, 128 experts of
    # 768, top-8, vocabulary 151936; no dense MLP
    assert (d.hidden, d.heads, d.kv_heads, d.head_dim, d.layers) == (2048, 32, 4, 128, 4)
    assert (d.experts, d.experts_per_tok, d.expert_intermediate, d.vocab) == (128, 8, 768, 151936)
    assert d.intermediate is None


def test_moe_experts_and_expert_weight_gathers_are_counted_under_their_roofs() -> None:
    # GIVEN the Qwen3 MoE trace: grouped_mm experts in prefill, per-token gathered weights x bmm in decode
    k = analyze_paths([str(H200_MOE)]).kernels.to_pandas()
    pre = k[(k["phase"] == "prefill") & (k["stage"] == "moe_expert_gemm") & k["flops"].notna()]
    # THEN the prefill experts count 2048 tokens x top-8 rows through gate_up (2048 -> 1536) and
    # down (768 -> 2048), in each of 4 layers
    assert pre["flops"].sum() == pytest.approx(4 * 2 * 16384 * (2048 * 1536 + 768 * 2048))
    # AND a decode gather of 64 expert gate_up matrices (expert work: STR050) reads and writes them once
    gathers = k[
        (k["phase"] == "decode")
        & (k["stage"] == "moe_expert_gemm")
        & k["name"].str.contains("gather_kernel")
        & (k["bytes"] > 5e8)
    ]
    assert len(gathers) == 60 and gathers["bytes"].iloc[0] == 2 * 64 * 1536 * 2048 * 2 + 64 * 8
    # AND none of them is above a roof
    assert not pre["bound"].eq("invalid").any() and not gathers["bound"].eq("invalid").any()


def test_summary_says_why_kernels_have_no_count_and_analyze_hints_at_model(capsys, tmp_path) -> None:
    import json

    from analyzer.cli import main

    # GIVEN a forward captured without shapes
    case = ZOO / "llama-forward-bf16"
    # WHEN it is analysed without --model
    out_json = tmp_path / "s.json"
    assert main(["analyze", str(case / "trace.json.gz"), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    work = json.loads(out_json.read_text())["work"]
    # THEN the summary lists the kernels without numbers by reason, the GEMMs among them as ones
    # --model would count, and the text prints one hint line
    reasons = {r["reason"]: r for r in work["uncounted"]}
    assert {"no_sizes", "no_shapes"} <= set(reasons) and "qkv_gemm" in reasons["no_sizes"]["stages"]
    assert work["model_would_count"]["kernels"] == reasons["no_sizes"]["kernels"] > 0
    assert [line for line in text.splitlines() if line.startswith("hint:")] == [
        line for line in text.splitlines() if "--model CONFIG_OR_NAME would count" in line
    ] and text.count("hint:") == 1
    assert "half the score matrix" in work["causal"]
    # AND with --model (the capture's own config) those GEMMs are counted and the hint is gone
    meta = json.loads((case / "meta.json").read_text())
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": meta["model_type"], **meta["config"]}))
    assert main(["analyze", str(case / "trace.json.gz"), "--model", str(cfg), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    work = json.loads(out_json.read_text())["work"]
    assert "hint:" not in text and "model" in work["basis"] and work["model_would_count"] is None


def test_every_rate_row_states_its_basis() -> None:
    from analyzer.results.summary import build_summary

    s = build_summary(analyze_paths([str(H200_TP2[0])]))
    rated = [r for r in [*s["groups"], *s["top_kernels"], *s["stages"]] if r.get("achieved_tbps") is not None]
    assert rated and all(r["basis"] and set(r["basis"]) <= {"shapes", "found", "model"} for r in rated)
    assert any("found" in (r["basis"] or ()) for r in s["top_kernels"])


# --------------------------------------------------------------------------- issue 34: each GEMM's real dtype peak

LIBRARIES = FIXTURES / "libraries"
NCU_FLOPS = FIXTURES / "roofline-validation" / "ncu-flops" / "trace.json.gz"


def _with_ops(path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The analysed kernels with their launching op's name, and the host ops by external id."""
    a = analyze_paths([str(path)])
    k = a.kernels.to_pandas()
    ops = a.trace.host_ops.to_pandas()
    ops = ops[ops["category"].astype(str) == "cpu_op"].drop_duplicates("external_id", keep="last")
    ops = ops.set_index("external_id")
    k["op"] = [ops["name"].get(e) if pd.notna(e) else None for e in k["launch_op_id"]]
    return k, ops


def _peak_of(row: pd.Series, spec: hardware.GpuSpec) -> float:
    return hardware.peak_tflops(spec, str(row["roof_dtype"]))


@pytest.mark.parametrize(
    ("case", "op", "roof"),
    [
        ("fp8-row-llama-bf16", "aten::_scaled_mm", "fp8"),
        ("fp8-tensor-llama-bf16", "aten::_scaled_mm", "fp8"),
        ("int4-wo-llama-bf16", "aten::_weight_int4pack_mm", "bf16"),
        ("int8-pack-llama-bf16", "aten::_weight_int8pack_mm", "fp32"),
        ("int8-wo-llama-bf16", "aten::mm", "bf16"),
    ],
)
def test_each_quantized_gemm_is_under_its_own_dtype_peak(case: str, op: str, roof: str) -> None:
    # GIVEN an H200 capture whose decoder linears are quantized (torchao / PyTorch's int8-pack)
    k, _ = _with_ops(LIBRARIES / case / "trace.json.gz")
    spec = hardware.find_gpu("h200")
    gemm = k[(k["op"] == op) & k["flops"].notna()]
    assert len(gemm) >= (84 if op != "aten::mm" else 30)  # 14 linears x 6 steps; int8-wo: dequantized mm
    # THEN each of its GEMMs is measured against the peak of the dtype it computes in
    assert set(gemm["roof_dtype"].astype(str)) == {roof}
    # AND the bf16 LM head stays under the bf16 peak, and nothing exceeds its own roof
    head = k[(k["stage"] == "lm_head_gemm") & k["flops"].notna()]
    assert set(head["roof_dtype"].astype(str)) == {"bf16"}
    rated = k[k["achieved_tflops"].notna() & k["roof_dtype"].notna()]
    assert (rated["achieved_tflops"] <= rated.apply(_peak_of, axis=1, spec=spec)).all()
    assert not (k["bound"] == "invalid").any()


def test_int4_weight_only_reads_its_packed_weights() -> None:
    # GIVEN tinygemm's int4 weight-only GEMMs of a torchao capture (bf16 activations [M, K], int4
    # weights packed 8 to an int32, bf16 scales and zeros per group of 128)
    k, ops = _with_ops(LIBRARIES / "int4-wo-llama-bf16" / "trace.json.gz")
    gemm = k[(k["op"] == "aten::_weight_int4pack_mm") & k["flops"].notna()]
    for _, r in gemm.iterrows():
        a, w, _, sz = (list(d) for d in ops.loc[r["launch_op_id"], "input_dims"])
        m, kk, n = a[0], a[1], w[0] * 8
        # THEN its bytes are the packed weights it reads (N x K / 2) plus activations, scales and output
        assert math.prod(w) * 4 == n * kk // 2
        assert r["bytes"] == 2 * m * kk + n * kk // 2 + 2 * math.prod(sz) + 2 * m * n
        assert r["flops"] == 2 * m * kk * n and r["roof_dtype"] == "bf16"


def test_int8_and_fp8_products_of_the_counter_check_are_under_their_peaks() -> None:
    # GIVEN the ops Nsight Compute measured (docs/roofline-validation.md)
    k, _ = _with_ops(NCU_FLOPS)
    roofs = k[k["flops"] > 0].groupby("op")["roof_dtype"].agg(lambda s: set(s.astype(str)))
    # THEN _int_mm is under the int8 peak, _scaled_mm the fp8 one, the CUDA-core int8-pack kernel fp32
    assert roofs["aten::_int_mm"] == {"int8"} and roofs["aten::_scaled_mm"] == {"fp8"}
    assert roofs["aten::_weight_int8pack_mm"] == {"fp32"}
    assert roofs["aten::_weight_int4pack_mm"] == {"bf16"} and roofs["aten::_grouped_mm"] == {"bf16"}
    big_int8 = k[(k["op"] == "aten::_int_mm") & (k["flops"] > 1e11)]
    assert (big_int8["bound"] == "compute").all()
    assert np.allclose(big_int8["pct_of_peak"], big_int8["achieved_tflops"] / 1978.9)  # the int8 peak


def test_gemms_counted_from_sizes_take_the_dtype_their_kernel_names_spell() -> None:
    # GIVEN GEMM-role kernels without shapes, counted from an FP8 model's sizes
    ws = roofline.WorkSizes(
        basis="model", name="m", tp=1, hidden=64, gemms={"qkv_gemm": (64, 192)}, dtype="fp8"
    )
    names = [
        "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNN",
        "void cutlass::Kernel2<cutlass_80_tensorop_i16832gemm_s8_64x64>",
        "gemm_kernel",
    ]
    kernels = pa.table(
        {
            "stage": ["qkv_gemm"] * 3,
            "tokens": [8.0] * 3,
            "norm_name": names,
            "dur_ns": [1000] * 3,
            "layer": [0, 1, 2],
            "step": [0] * 3,
            "trace_id": [0] * 3,
            "rank": [0] * 3,
        }
    )
    flops, nbytes = np.full(3, np.nan), np.full(3, np.nan)
    source, dtype = ["none"] * 3, np.full(3, "bf16", object)
    roofline.model_work(kernels, ws, 1, flops, nbytes, source, dtype=dtype)
    # THEN a name that spells its dtype wins (bf16 nvjet, CUTLASS int8), else the model's (fp8)
    assert list(dtype) == ["bf16", "int8", "fp8"] and (flops == 2 * 8 * 64 * 192).all()
    # AND a model's sizes carry what its GEMMs compute in: FP8 checkpoints fp8, others their dtype
    from analyzer.knowledge.architectures import find_builtin

    assert roofline.WorkSizes.from_arch(find_builtin("deepseek-v3"), 1).dtype == "fp8"
    assert roofline.WorkSizes.from_arch(find_builtin("llama-3-8b"), 1).dtype == "bf16"
    assert roofline.WorkSizes.from_arch(find_builtin("gpt-oss-120b"), 1).dtype == "bf16"


def test_roof_dtype_says_which_peak_each_roof_uses() -> None:
    spec = hardware.find_gpu("a100")  # no fp8 path: an fp8 kernel falls back to the bf16 peak
    dur = np.array([1000.0, 1000.0, 1000.0])
    r = roofline.rates(
        dur, np.array([1e6, 1e6, np.nan]), np.array([1e3, 1e3, np.nan]), ["fp8", "int8", "bf16"], spec
    )
    got = pd.Series(r["roof_dtype"]).astype(object)
    assert got[:2].tolist() == ["bf16", "int8"] and pd.isna(got[2])  # no numbers: no roof
    unknown = roofline.rates(dur, np.ones(3), np.ones(3), ["bf16"] * 3, None)
    assert pd.Series(unknown["roof_dtype"]).isna().all()


def test_rate_rows_name_the_dtype_of_their_roof() -> None:
    # GIVEN the counter check's ops (bf16, fp16, fp8, int8 products) summarised
    import io

    from analyzer.report.text import render
    from analyzer.results.summary import build_summary

    a = analyze_paths([str(NCU_FLOPS)])
    s = build_summary(a)
    by_group = {}
    for r in s["groups"]:
        by_group.setdefault(r["roof_dtype"], set()).add(r["group_key"].split("|")[0])
    # THEN each group, stage and top-kernel row says which peak its rate is measured against
    assert any("qqtst" in g for g in by_group["fp8"]) and any("i16832gemm_s8" in g for g in by_group["int8"])
    assert any("hsh" in g for g in by_group["fp16"]) and any("weight_int8pack" in g for g in by_group["fp32"])
    top = [r["roof_dtype"] for r in s["top_kernels"] if "weight_int8pack_mm_kernel" in r["norm_name"]]
    assert top == ["fp32"]
    assert all(r.get("roof_dtype") is None for r in s["stages"] if r["flops"] is None)
    # AND the text prints it beside a compute-bound rate
    out = io.StringIO()
    render(s, out, top=30)
    assert " TFLOP/s fp8 (" in out.getvalue() and " TFLOP/s int8 (" in out.getvalue()
