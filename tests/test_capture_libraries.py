"""Kernel libraries and quantized linear layers in a capture (analyzer/capture/libraries.py) on the CPU:
options are checked before anything is built, a library's patches run inside the truth ranges and are
undone after the capture, quantized linears keep their projection regions, transformers' own choice
of fla is reported, and the library cases' runner records failures. Liger's Triton kernels, fla and
FP8 run on a GPU only (``python -m analyzer.capture.library_cases``); here Liger is a stand-in module
with its interface, and the torchao tests skip where torchao is not installed.

Skips when torch or transformers is not installed (the test command installs both).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="capture tests need torch (pip install torch)")
pytest.importorskip(
    "transformers", reason="capture tests need transformers (pip install transformers==5.17.0)"
)

from analyzer.capture import libraries, library_cases  # noqa: E402
from analyzer.capture.hf import CaptureError, CaptureSpec, build, capture  # noqa: E402
from analyzer.cli import capture_cmd  # noqa: E402

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip
PROJECTIONS = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}


def _capture(tmp: Path, name: str, **kw) -> tuple[list[dict], dict]:
    spec = CaptureSpec(
        config=kw.pop("config", LLAMA), output=str(tmp / f"{name}.json.gz"), device="cpu",
        dtype=kw.pop("dtype", "bf16"), prompt=8, new_tokens=3, **kw,
    )  # fmt: skip
    meta = capture(spec)
    with gzip.open(spec.output, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"], meta


def _innermost_regions(events: list[dict], op: str) -> list[str]:
    """The innermost truth region around each cpu_op named ``op``."""
    ranges = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith("lkm::truth region="):
            ranges[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"].split("=", 1)[1]))
    out = []
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] == op:
            spans = [s for s in ranges[e["tid"]] if s[0] <= e["ts"] <= s[1]]
            out.append(min(spans, key=lambda s: s[1] - s[0])[2] if spans else "-")
    return out


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"kernels": "unsloth"}, "unknown kernel library 'unsloth'"),
        ({"quant": "nf4"}, "unknown quantization 'nf4'"),
        ({"quant": "int4-wo", "dtype": "fp16"}, "needs --dtype bf16"),
        ({"quant": "fp8-row"}, "runs on a GPU only"),
    ],
)
def test_options_are_refused_before_building(tmp_path: Path, kw: dict, message: str) -> None:
    """GIVEN an option that cannot run WHEN captured THEN one CaptureError names it, and no trace is written."""
    with pytest.raises(CaptureError, match=message):
        _capture(tmp_path, "refused", **kw)
    assert not (tmp_path / "refused.json.gz").exists()


def test_the_cli_offers_the_quantization_schemes() -> None:
    assert tuple(libraries.QUANTS) == capture_cmd.QUANTS


def test_int8_pack_linears_keep_their_projection_regions(tmp_path: Path) -> None:
    """GIVEN int8 weight-only linears (aten._weight_int8pack_mm) WHEN captured with truth THEN every
    int8 GEMM runs in a projection region and the LM head stays a plain linear."""
    events, meta = _capture(tmp_path, "int8-pack", quant="int8-pack")
    regions = _innermost_regions(events, "aten::_weight_int8pack_mm")
    assert regions and set(regions) == PROJECTIONS
    assert set(_innermost_regions(events, "aten::linear")) == {"lm_head"}
    assert meta["quant"] == "int8-pack" and meta["quantized"]["linears"] == 2 * 7


def _fake_liger(calls: list[str]) -> types.ModuleType:
    """A stand-in for liger_kernel.transformers.monkey_patch: its apply function patches the modeling
    module's apply_rotary_pos_emb and each MLP instance, as Liger's do."""
    from transformers.models.llama import modeling_llama

    def fake_rope(q, k, cos, sin, *a, **kw):
        calls.append("rope")
        return torch.flip(q, [0]).flip([0]), k  # a recognisable op (aten::flip) in the rope region

    def apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True, model=None):  # fmt: skip
        assert not cross_entropy and not fused_linear_cross_entropy
        modeling_llama.apply_rotary_pos_emb = fake_rope
        for layer in model.model.layers:
            mlp = layer.mlp
            mlp.forward = lambda x, mlp=mlp: mlp.down_proj(
                torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)
            )

    mod = types.ModuleType("liger_kernel.transformers.monkey_patch")
    mod.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": apply_liger_kernel_to_llama}
    return mod


def test_liger_patches_run_inside_the_truth_ranges_and_are_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN Liger's interface WHEN a model is captured with kernels=liger THEN the patched RoPE runs
    in the rope region, the MLP's own GEMMs keep their regions, and the modeling module is plain after."""
    from transformers.models.llama import modeling_llama

    calls: list[str] = []
    fake = _fake_liger(calls)
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", fake)
    sys.modules["liger_kernel.transformers"].monkey_patch = fake
    plain = modeling_llama.apply_rotary_pos_emb

    events, meta = _capture(tmp_path, "liger", kernels="liger")

    assert calls and set(_innermost_regions(events, "aten::flip")) == {"rope"}
    assert "gate_up_proj" in _innermost_regions(events, "aten::linear")
    assert meta["liger"]["apply"] == "apply_liger_kernel_to_llama"
    assert meta["liger"]["options"]["fused_linear_cross_entropy"] is False
    assert (
        "transformers.models.llama.modeling_llama.apply_rotary_pos_emb" in meta["liger"]["module_attributes"]
    )
    assert modeling_llama.apply_rotary_pos_emb is plain


def test_liger_without_a_patch_for_the_type_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("liger_kernel.transformers.monkey_patch")
    fake.MODEL_TYPE_TO_APPLY_LIGER_FN = {}
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", fake)
    sys.modules["liger_kernel.transformers"].monkey_patch = fake
    with pytest.raises(CaptureError, match="Liger has no patch for model type 'llama'"):
        _capture(tmp_path, "liger-none", kernels="liger")


def test_fla_is_required_where_asked(tmp_path: Path) -> None:
    """GIVEN kernels=fla on a model without linear attention THEN the capture is refused."""
    with pytest.raises(CaptureError, match="kernels fla"):
        _capture(tmp_path, "fla-llama", kernels="fla")


def test_transformers_choice_of_linear_attention_kernels_is_reported() -> None:
    """GIVEN a Gated DeltaNet hybrid THEN hub_functions names the implementation transformers chose at
    import: fla's when it is installed, else its own torch fallback."""
    config, _, _ = library_cases.CASES["fla-qwen3-5-bf16"]
    model = build({**config, "hidden_size": 64, "intermediate_size": 128}, dtype="fp32", device="cpu",
                  attn="sdpa", experts=None, seed=0)  # fmt: skip
    impl = libraries.hub_functions(model)
    chunk = impl["torch_chunk_gated_delta_rule"]
    if importlib.util.find_spec("fla") is None:
        assert chunk.endswith("modeling_qwen3_5.torch_chunk_gated_delta_rule")
    else:
        assert chunk.startswith("fla.ops.gated_delta_rule")
    assert impl["causal_conv1d_fn"].startswith("transformers.")  # causal-conv1d is not installed


def test_activation_quantization_runs_in_the_quantize_region(tmp_path: Path) -> None:
    """GIVEN torchao int8 dynamic-activation linears WHEN captured with truth THEN torchao's activation
    quantization is in a quantize region inside the projection and the int8 GEMM in the projection."""
    pytest.importorskip("torchao", reason="torchao is not installed")
    events, meta = _capture(tmp_path, "int8-dq", quant="int8-dq")
    assert set(_innermost_regions(events, "aten::amax")) >= {"quantize"}
    assert set(_innermost_regions(events, "aten::_int_mm")) == PROJECTIONS
    assert meta["quantized"]["weight_types"] == ["Int8Tensor"]
    from torchao.quantization.quantize_.workflows.int8 import int8_tensor

    assert not hasattr(int8_tensor._choose_quant_func_and_quantize_tensor, "__wrapped__")  # undone


def test_every_library_case_is_a_valid_capture() -> None:
    import transformers

    for name, (config, opts, covers) in library_cases.CASES.items():
        libraries.check_options(opts.get("kernels"), opts.get("quant"), device="cuda", dtype="bf16")
        assert opts.get("kernels") or opts.get("quant"), name
        assert covers
        cfg = {k: v for k, v in config.items() if k != "model_type"}
        transformers.AutoConfig.for_model(config["model_type"], **cfg)
    assert {o.get("quant") for _, o, _ in library_cases.CASES.values()} >= set(libraries.QUANTS)


def test_kernel_summary_reads_a_zoo_trace() -> None:
    trace = Path(__file__).parents[1] / "fixtures/zoo/llama-sdpa-bf16/trace.json.gz"
    rows = library_cases.kernel_summary(trace)
    assert rows and all(r["count"] == sum(r["regions"].values()) for r in rows)
    regions = {reg for r in rows for reg in r["regions"]}
    assert {"qkv_proj", "norm", "rope"} <= regions


def test_the_runner_records_a_failed_case(tmp_path: Path) -> None:
    """GIVEN a case that cannot run on the CPU WHEN the runner captures it THEN the manifest says
    failed with the error quoted, and the exit status is 1."""
    rc = library_cases.main(
        [str(tmp_path), "--only", "int4-wo-llama-bf16", "--device", "cpu", "--timeout", "120"]
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    case = manifest["cases"]["int4-wo-llama-bf16"]
    assert rc == 1 and case["status"] == "failed"
    assert "runs on a GPU only" in case["error"]
    import tarfile

    packed = library_cases.pack(tmp_path, tmp_path / "out")
    assert sorted(p.name for p in packed) == ["manifest.json", "quant.tar.xz"]
    with tarfile.open(tmp_path / "out" / "quant.tar.xz") as tar:
        assert "int4-wo-llama-bf16/log.txt" in tar.getnames()


def test_the_runner_past_its_deadline_starts_nothing(tmp_path: Path) -> None:
    rc = library_cases.main(
        [str(tmp_path), "--only", "int8-pack-llama-bf16,fla-qwen3-5-bf16", "--deadline", "0"]
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert rc == 1 and manifest["cases"] == {}
    assert manifest["not_started"] == ["fla-qwen3-5-bf16", "int8-pack-llama-bf16"]  # linear attention first
