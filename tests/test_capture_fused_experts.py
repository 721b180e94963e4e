"""Our fused-MoE experts (``analyzer/capture/fused_experts.py``) on the CPU: the sort/pad bookkeeping,
the pure-torch reference of the block-wise algorithm against transformers' eager experts loop,
registration through the experts interface, layouts it refuses, and the zoo case that uses it.
The Triton kernel itself runs on a GPU only (``python -m analyzer.capture.fused_experts --check``).

Skips when torch or transformers is not installed (the test command installs both).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="capture tests need torch (pip install torch)")
pytest.importorskip(
    "transformers", reason="capture tests need transformers (pip install transformers==5.17.0)"
)

from analyzer.capture import fused_experts as fe  # noqa: E402

QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
             "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
TOKENS = (1, 2, 5, 37)


@pytest.fixture(scope="module")
def experts_bf16():
    return fe.experts_module(QWEN3_MOE, torch.bfloat16, "cpu")


def _run(mod, tokens: int, dtype, forward):
    idx, w = fe.routing(tokens, mod.num_experts, QWEN3_MOE["num_experts_per_tok"], "cpu", seed=tokens)
    x = torch.randn(tokens, mod.gate_up_proj.shape[-1], generator=torch.Generator().manual_seed(tokens))
    with torch.inference_mode():
        return forward(mod, x.to(dtype), idx, w.to(dtype))


@pytest.mark.parametrize("tokens", TOKENS)
def test_reference_equals_the_eager_loop_in_bf16(experts_bf16, tokens: int) -> None:
    """GIVEN a tiny qwen3_moe experts module in bf16 WHEN the fused path runs on the CPU (the torch
    reference of the sorted, padded, block-wise algorithm) THEN it equals transformers' eager loop."""
    want = _run(experts_bf16, tokens, torch.bfloat16, fe.eager_experts_forward)
    got = _run(experts_bf16, tokens, torch.bfloat16, fe.triton_fused_experts_forward)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    assert float((got.float() - want.float()).abs().max()) <= fe.TOLERANCE["bf16"] * float(want.abs().max())


def test_reference_equals_the_eager_loop_in_fp32() -> None:
    mod = fe.experts_module(QWEN3_MOE, torch.float32, "cpu")
    for tokens in TOKENS:
        want = _run(mod, tokens, torch.float32, fe.eager_experts_forward)
        got = _run(mod, tokens, torch.float32, fe.triton_fused_experts_forward)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "block_m"), [(1, 4, 2, 16), (37, 4, 2, 16), (50, 7, 3, 8)]
)
def test_alignment_places_every_pair_once_in_its_experts_blocks(tokens, experts, top_k, block_m) -> None:
    idx, _ = fe.routing(tokens, experts, top_k, "cpu", seed=tokens)
    al = fe.align_block_size(idx, experts, block_m)
    pairs = tokens * top_k
    ids = al.sorted_ids.tolist()
    assert al.rows % block_m == 0 and al.rows >= pairs and len(al.block_expert) == al.rows // block_m
    assert sorted(p for p in ids if p != pairs) == list(range(pairs))  # every pair once, the rest padding
    flat = idx.reshape(-1).tolist()
    seen = []
    for b, e in enumerate(al.block_expert.tolist()):
        block = ids[b * block_m : (b + 1) * block_m]
        real = [p for p in block if p != pairs]
        if e < 0:
            assert not real  # blocks past the last expert's rows hold padding only
            continue
        assert real and all(flat[p] == e for p in real)
        assert block[: len(real)] == real  # an expert's rows first, its padding after
        seen.append(e)
    assert seen == sorted(seen)  # experts in order, each run starting at a block boundary
    assert sorted(set(seen)) == sorted(set(flat))  # an expert with no pair gets no block


def test_alignment_drops_sentinel_experts() -> None:
    """An expert id >= num_experts (an expert-parallel sentinel) gets no row and adds nothing."""
    idx = torch.tensor([[0, 3], [4, 1], [2, 9]])
    al = fe.align_block_size(idx, 4, 4)
    assert sorted(p for p in al.sorted_ids.tolist() if p != 6) == [0, 1, 3, 4]  # pairs 2 and 5 dropped
    mod = fe.experts_module(QWEN3_MOE, torch.float32, "cpu")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    w = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]])
    kept = torch.tensor([[0, 3], [0, 1], [2, 0]]), w * torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    with torch.inference_mode():
        got = fe.triton_fused_experts_forward(mod, x, idx, w)
        want = fe.eager_experts_forward(mod, x, *kept)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_padding_rows_are_ignored() -> None:
    """GIVEN the down projection's padded input WHEN its padding rows hold NaN THEN the output is the same."""
    mod = fe.experts_module(QWEN3_MOE, torch.float32, "cpu")
    idx, w = fe.routing(5, 4, 2, "cpu", seed=3)
    al = fe.align_block_size(idx, 4)
    down = fe._kn(mod.down_proj, False).detach()
    h = torch.randn(al.rows, down.shape[1], generator=torch.Generator().manual_seed(2))
    pad = al.sorted_ids == al.num_pairs
    assert pad.any()
    poisoned = h.clone()
    poisoned[pad] = float("nan")
    outs = [
        fe.reference_gemm(
            a,
            down,
            al,
            a_rows_by_token=False,
            out=torch.zeros(al.num_pairs, 64),
            out_rows_by_pair=True,
            weights=w.reshape(-1),
        )
        for a in (h, poisoned)
    ]
    assert torch.isfinite(outs[1]).all()
    torch.testing.assert_close(outs[1], outs[0])


class _TransposedExperts(torch.nn.Module):
    """A qwen3_moe experts module's weights stored transposed ((E, H, 2I) and (E, I, H))."""

    is_transposed, has_bias, has_gate = True, False, True

    def __init__(self, src) -> None:
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(src.gate_up_proj.detach().transpose(1, 2).contiguous())
        self.down_proj = torch.nn.Parameter(src.down_proj.detach().transpose(1, 2).contiguous())
        self.act_fn, self.num_experts = src.act_fn, src.num_experts

    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


def test_transposed_weights_give_the_same_result() -> None:
    mod = fe.experts_module(QWEN3_MOE, torch.float32, "cpu")
    want = _run(mod, 9, torch.float32, fe.eager_experts_forward)
    got = _run(_TransposedExperts(mod), 9, torch.float32, fe.triton_fused_experts_forward)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_unsupported_layouts_raise_a_clear_error() -> None:
    mod = fe.experts_module(QWEN3_MOE, torch.float32, "cpu")
    idx, w = fe.routing(3, 4, 2, "cpu")
    x = torch.randn(3, 64)
    mod.has_bias = True
    with pytest.raises(fe.FusedExpertsError, match="biased experts"):
        fe.triton_fused_experts_forward(mod, x, idx, w)
    mod.has_bias, mod.has_gate = False, False
    with pytest.raises(fe.FusedExpertsError, match="no fused gate_up_proj"):
        fe.triton_fused_experts_forward(mod, x, idx, w)
    mod.has_gate = True
    with pytest.raises(fe.FusedExpertsError, match="do not fit hidden size 32"):
        fe.triton_fused_experts_forward(mod, torch.randn(3, 32), idx, w)


def test_register_makes_the_implementation_buildable() -> None:
    """GIVEN register() WHEN a model is built with experts="triton_fused" THEN transformers accepts it
    and the model's logits equal the eager model's."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    from analyzer.capture.hf import build

    fe.register()
    fe.register()  # idempotent
    assert ALL_EXPERTS_FUNCTIONS[fe.NAME] is fe.triton_fused_experts_forward
    cfg = {**QWEN3_MOE, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "vocab_size": 96}  # fmt: skip
    kw = {"dtype": "fp32", "device": "cpu", "attn": "sdpa", "seed": 0}
    fused, eager = build(cfg, experts="triton_fused", **kw), build(cfg, experts="eager", **kw)
    assert fused.config._experts_implementation == "triton_fused"
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=1e-4, atol=1e-5)


def test_check_needs_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: --check would run")
    assert fe.main(["--check"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert fe.main([]) == 2  # no action: help


def test_the_zoo_case_uses_it(tmp_path: Path) -> None:
    from analyzer.capture.zoo import CASES, spec_for

    config, opts, covers = CASES["qwen3-moe-fused-bf16"]
    assert config["model_type"] == "qwen3_moe" and opts == {"experts": "triton_fused"}
    spec = spec_for("qwen3-moe-fused-bf16", tmp_path)
    got = (spec.experts, spec.attn, spec.dtype, spec.mode, spec.shapes)
    assert got == ("triton_fused", "sdpa", "bf16", "generate", True)
    assert "fused_moe_kernel" in covers


def test_truth_ranges_enclose_the_fused_experts(tmp_path: Path) -> None:
    """GIVEN a CPU capture with experts="triton_fused" WHEN its GEMM ops are matched to truth ranges
    THEN the experts' GEMMs lie in the experts region (the module stays; only its forward changes)."""
    from analyzer.capture.hf import CaptureSpec, capture

    cfg = {**QWEN3_MOE, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "vocab_size": 96}  # fmt: skip
    spec = CaptureSpec(config=cfg, output=str(tmp_path / "t.json.gz"), device="cpu", dtype="fp32",
                       experts="triton_fused", prompt=6, new_tokens=2)  # fmt: skip
    meta = capture(spec)
    assert meta["experts_implementation"] == "triton_fused"
    with gzip.open(spec.output, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    ranges = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith("lkm::truth region="):
            ranges[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"].split("=", 1)[1]))
    experts_mm = 0
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::matmul"):
            spans = [s for s in ranges[e["tid"]] if s[0] <= e["ts"] <= s[1]]
            assert spans, f"{e['name']} at {e['ts']} outside every truth range"
            experts_mm += max(spans, key=lambda s: s[0])[2] == "experts"
    # 2 layers x 2 steps x 2 projections, at least one block each
    assert experts_mm >= 8
