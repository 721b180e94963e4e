"""Truth ranges and step annotations of ``capture`` on the CPU (tiny HF configs): instrumentation
changes no op, ranges nest and cover every GEMM, step phases are exact in every mode, and the
continuous-batching thread is recorded. The GPU side is measured on the zoo (tests/test_accuracy.py).

Skips when torch or transformers is not installed (the test command installs both).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="capture tests need torch (pip install torch)")
pytest.importorskip(
    "transformers", reason="capture tests need transformers (pip install transformers==5.17.0)"
)

from analyzer.capture.hf import CaptureSpec, capture  # noqa: E402
from analyzer.capture.truth import REGIONS, module_regions  # noqa: E402

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 256, "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
DRAFT = {**LLAMA, "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 1}  # fmt: skip
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_grouped_mm"}
GEMM_REGIONS = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "moe_router", "experts",
                "shared_expert", "rope", "attention"}  # fmt: skip
STEP = re.compile(r"^lkm::step phase=(\w+) q=(\d+) bs=(\d+) kv=(\d+)(?: tokens=(\d+))?")


def _capture(tmp: Path, name: str, **kw) -> tuple[list[dict], dict]:
    spec = CaptureSpec(
        config=kw.pop("config", LLAMA),
        output=str(tmp / f"{name}.json.gz"),
        device="cpu",
        dtype="fp32",
        prompt=kw.pop("prompt", 8),
        new_tokens=kw.pop("new_tokens", 3),
        **kw,
    )
    meta = capture(spec)
    with gzip.open(spec.output, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"], meta


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("truth")


@pytest.fixture(scope="module")
def generate(tmp: Path):
    return _capture(tmp, "generate")


def _ranges(events: list[dict], prefix: str) -> dict:
    out = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith(prefix):
            out[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    return out


def _steps(events: list[dict]) -> list[str]:
    return [
        e["name"]
        for e in sorted(events, key=lambda e: e.get("ts", 0))
        if e.get("cat") == "user_annotation" and e["name"].startswith("lkm::step")
    ]


def test_truth_ranges_change_no_op(tmp: Path, generate) -> None:
    """GIVEN the same tiny model WHEN captured with and without --truth THEN the op sequences are equal."""
    plain, _ = _capture(tmp, "plain", truth=False)

    def ops(evs: list[dict]) -> list[str]:
        return [e["name"] for e in sorted(evs, key=lambda e: e["ts"]) if e.get("cat") == "cpu_op"]

    assert ops(generate[0]) == ops(plain)
    assert _steps(generate[0]) == _steps(plain)


def test_truth_ranges_nest_on_each_thread(generate) -> None:
    for spans in _ranges(generate[0], "lkm::").values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple] = []
        for s in spans:
            while stack and stack[-1][1] <= s[0]:
                stack.pop()
            assert not stack or s[1] <= stack[-1][1] + 1e-3, f"{s[2]} crosses {stack[-1][2]}"
            stack.append(s)


@pytest.mark.parametrize("config", [LLAMA, QWEN3_MOE], ids=["llama", "qwen3_moe"])
def test_every_gemm_launches_inside_a_gemm_region(tmp: Path, config: dict) -> None:
    events, _ = _capture(tmp, f"cover-{config['model_type']}", config=config)
    truth = _ranges(events, "lkm::truth region=")
    gemms = [e for e in events if e.get("cat") == "cpu_op" and e["name"] in GEMM_OPS]
    assert gemms
    for e in gemms:
        spans = [s for s in truth[(e["pid"], e["tid"])] if s[0] <= e["ts"] <= s[1]]
        assert spans, f"{e['name']} at {e['ts']} outside every truth range"
        inner = max(spans, key=lambda s: s[0])[2].split("=", 1)[1]
        assert inner in GEMM_REGIONS, f"{e['name']} innermost region {inner}"


def test_every_leaf_region_of_a_dense_model_appears(generate) -> None:
    names = {e["name"].split("=", 1)[1] for e in generate[0] if e.get("name", "").startswith("lkm::truth")}
    assert {"embedding", "norm", "rope", "qkv_proj", "o_proj", "attention", "kv_cache_update", "gate_up_proj",
            "down_proj", "activation", "lm_head", "attention_module", "mlp", "layer", "model"} <= names  # fmt: skip
    assert names <= set(REGIONS)


def test_module_regions_of_moe_blocks() -> None:
    import transformers

    cfg = transformers.AutoConfig.for_model(**QWEN3_MOE)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    by_name = {n: module_regions(model).get(m) for n, m in model.named_modules()}
    assert by_name["model.layers.0.mlp"] == "moe_block"
    assert by_name["model.layers.0.mlp.gate"] == "moe_router"
    assert by_name["model.layers.0.mlp.experts"] == "experts"
    assert by_name["model.layers.0.self_attn.q_norm"] == "norm"
    assert by_name["lm_head"] == "lm_head" and by_name[""] == "model"


def test_module_regions_of_bert_style_blocks_and_a_softmax_module() -> None:
    import transformers

    # GIVEN BERT-style decoder blocks (BertGeneration: `intermediate.dense`, `output.dense`, the
    # attention's `output` holding o_proj, the residual add and the norm) and CPM-Ant's attention,
    # whose softmax is an nn.Softmax module
    cfg = transformers.AutoConfig.for_model(
        "bert-generation", hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=128, vocab_size=128, is_decoder=True,
    )  # fmt: skip
    bert = transformers.AutoModelForCausalLM.from_config(cfg)
    by_name = {n: module_regions(bert).get(m) for n, m in bert.named_modules()}
    layer = "bert.encoder.layer.0."
    # THEN the MLP's dense layers are its projections and the attention's output block is the layer's
    assert by_name[layer + "intermediate.dense"] == "gate_up_proj"
    assert by_name[layer + "output.dense"] == "down_proj"
    assert by_name[layer + "attention.output"] == "layer"
    assert by_name[layer + "attention.output.dense"] == "o_proj"
    cfg = transformers.AutoConfig.for_model(
        "cpmant", hidden_size=64, num_hidden_layers=1, num_attention_heads=2, dim_head=32, dim_ff=128,
        vocab_size=128,
    )  # fmt: skip
    cpm = transformers.AutoModelForCausalLM.from_config(cfg)
    softmax = [n for n, m in cpm.named_modules() if type(m).__name__ == "Softmax"]
    # AND the attention's softmax module is the attention's own, no activation
    assert softmax and all(module_regions(cpm).get(dict(cpm.named_modules())[n]) is None for n in softmax)


def test_generate_steps_are_exact(generate) -> None:
    steps = _steps(generate[0])
    assert steps == generate[1]["steps"]
    assert steps == [
        "lkm::step phase=prefill q=8 bs=1 kv=8",
        "lkm::step phase=decode q=1 bs=1 kv=9",
        "lkm::step phase=decode q=1 bs=1 kv=10",
    ]


def test_forward_is_one_prefill_step(tmp: Path) -> None:
    events, _ = _capture(tmp, "forward", mode="forward", shapes=False)
    assert _steps(events) == ["lkm::step phase=prefill q=8 bs=1 kv=8"]
    assert not any(e.get("args", {}).get("Input Dims") for e in events if e.get("cat") == "cpu_op")


def test_static_cache_steps_are_exact(tmp: Path) -> None:
    events, _ = _capture(tmp, "static", mode="static-cache", batch=2)
    assert _steps(events) == [
        "lkm::step phase=prefill q=8 bs=2 kv=8",
        "lkm::step phase=decode q=1 bs=2 kv=9",
        "lkm::step phase=decode q=1 bs=2 kv=10",
    ]


def test_assisted_generation_marks_the_draft(tmp: Path) -> None:
    events, _ = _capture(tmp, "assisted", assistant=DRAFT, new_tokens=4)
    steps = _steps(events)
    draft = [s for s in steps if s.endswith("model=draft")]
    target = [s for s in steps if not s.endswith("model=draft")]
    assert draft and draft[0].startswith("lkm::step phase=prefill q=8")
    assert all("phase=decode" in s for s in draft[1:])
    assert target[0].startswith("lkm::step phase=prefill") and all("phase=decode" in s for s in target[1:])


def test_sampling_runs_multinomial(tmp: Path) -> None:
    events, meta = _capture(tmp, "sampling", sampling=True)
    assert meta["sampling"] and any(e.get("name") == "aten::multinomial" for e in events)


def test_continuous_batching_steps_on_the_batching_thread(tmp: Path) -> None:
    """GIVEN 4 requests of different prompt lengths WHEN batched continuously THEN each batch step
    is annotated on the batching thread, some steps are mixed, and the token counts add up."""
    events, meta = _capture(
        tmp, "cb", mode="continuous-batching", attn="paged|sdpa", requests=4, new_tokens=3
    )
    steps = _ranges(events, "lkm::step")
    assert len(steps) == 1 and meta["batching_threads"] == 1
    (thread,) = steps
    main_threads = {(e["pid"], e["tid"]) for e in events if e.get("cat") == "cpu_op"} - {thread}
    assert main_threads, "the profiler recorded one thread only"
    names = [s[2] for s in sorted(steps[thread])]
    assert names == meta["steps"]
    phases = [STEP.match(n).group(1) for n in names]
    assert "mixed" in phases and phases[-1] == "decode"
    tokens = 0
    for n in names:
        m = STEP.match(n)
        tokens += int(m.group(5)) if m.group(5) else int(m.group(2)) * int(m.group(3))
    prompts = sum(max(2, 8 // 2 + (8 * i) // 3) for i in range(4))
    assert tokens == prompts + 4 * (3 - 1)  # every prompt token once, then one token per decode step
    truth = _ranges(events, "lkm::truth region=model")
    assert thread in truth  # the forward's ranges are on the batching thread too


MAMBA = {"model_type": "mamba", "hidden_size": 64, "state_size": 8, "num_hidden_layers": 2, "vocab_size": 256,
         "expand": 2, "conv_kernel": 4, "time_step_rank": 8}  # fmt: skip


def test_a_projection_weight_used_outside_its_module_is_that_projection(tmp: Path) -> None:
    # GIVEN Mamba-1's torch path, which applies dt_proj's weight by a matmul in the mixer's code
    events, _ = _capture(tmp, "mamba", config=MAMBA, attn="eager")
    truth = _ranges(events, "lkm::truth region=")
    got: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::matmul":
            spans = [s for s in truth[(e["pid"], e["tid"])] if s[0] <= e["ts"] <= s[1]]
            got[max(spans, key=lambda s: s[0])[2].split("=", 1)[1]] += 1
    # THEN every step's dt_proj matmul runs inside an input projection's range (with in_proj and
    # x_proj, three per layer and step), not only in the mixer's core
    steps = len(_steps(events))
    assert got["mixer_in_proj"] == 3 * MAMBA["num_hidden_layers"] * steps


def test_items_of_a_list_of_attentions_are_that_attention() -> None:
    import transformers

    # GIVEN LongCat-Flash: two MLA attentions per layer in an nn.ModuleList `self_attn` (items `0`, `1`)
    cfg = transformers.AutoConfig.for_model(
        "longcat_flash", hidden_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128,
        ffn_hidden_size=128, expert_ffn_hidden_size=64, n_routed_experts=4, moe_topk=2, kv_lora_rank=16,
        q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    regions = module_regions(model)
    by_name = {n: regions.get(m) for n, m in model.named_modules()}
    # THEN the list and each of its items (the calls that run) are the attention module, no `layer`
    assert by_name["model.layers.0.self_attn"] == "attention_module"
    assert (
        by_name["model.layers.0.self_attn.0"] == by_name["model.layers.0.self_attn.1"] == "attention_module"
    )
    assert by_name["model.layers.0.self_attn.1.o_proj"] == "o_proj"
    # AND the layer itself is still a layer
    assert by_name["model.layers.0"] == "layer"


def test_a_mixture_of_attention_heads_and_experts_held_as_modules() -> None:
    import transformers

    # GIVEN JetMoE: its attention keeps a mixture of attention heads as `experts` (a router and two
    # parallel-experts projections), its MoE block keeps its experts as two parallel-experts modules
    cfg = transformers.AutoConfig.for_model(
        "jetmoe", hidden_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=128,
        intermediate_size=64, kv_channels=16, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    regions = module_regions(model)
    by_name = {n: regions.get(m) for n, m in model.named_modules()}
    # THEN the attention is the attention module, its mixture an MoE block with its router and experts
    assert by_name["model.layers.0.self_attention"] == "attention_module"
    assert by_name["model.layers.0.self_attention.experts"] == "moe_block"
    assert by_name["model.layers.0.self_attention.experts.router"] == "moe_router"
    assert by_name["model.layers.0.self_attention.experts.input_linear"] == "experts"
    assert by_name["model.layers.0.self_attention.kv_proj"] == "qkv_proj"
    # AND the MLP with expert modules of its own is an MoE block, not a dense MLP
    assert by_name["model.layers.0.mlp"] == "moe_block"
    assert by_name["model.layers.0.mlp.output_linear"] == "experts"
    assert by_name["model.layers.0.mlp.router"] == "moe_router"
