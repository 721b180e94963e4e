"""``analyzer.capture.sweep``: which model types it sweeps, the layer cut read from config attributes,
the size cap; and the truth regions of the kinds the sweep brought in (mixers, expert-weight gathers).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="capture needs torch")

from analyzer.capture import sweep  # noqa: E402

# ----------------------------------------------------------------------------- the layer cut


@pytest.mark.parametrize(
    ("config", "layers"),
    [
        ({"num_hidden_layers": 32}, 2),  # one kind of layer: two of them
        (
            {"num_hidden_layers": 26, "layer_types": (["s"] * 5 + ["f"]) * 4 + ["s"] * 2},
            6,
        ),  # 5 local : 1 global
        ({"num_hidden_layers": 61, "first_k_dense_replace": 3}, 4),  # dense-then-MoE: 3 dense + 1 MoE
        ({"num_hidden_layers": 32, "attn_layer_period": 8, "expert_layer_period": 2}, 8),  # periods
        ({"num_hidden_layers": 40, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]}, 5),
        ({"num_hidden_layers": 36, "no_rope_layers": [1, 1, 1, 0] * 9, "no_rope_layer_interval": 4}, 4),
        ({"num_hidden_layers": 26, "block_types": ["recurrent", "recurrent", "attention"]}, 3),  # a cycle
        ({"num_hidden_layers": 10, "hybrid_override_pattern": "M-M*-M-M*-"}, 5),  # a pattern string
        ({"num_hidden_layers": 32, "transformers_version": "5.17.0"}, 2),  # a word is no pattern
    ],
)
def test_the_cut_holds_one_full_period_of_the_layer_pattern(config, layers) -> None:
    assert sweep.layer_plan(config)["layers"] == layers


def test_the_cut_cuts_per_layer_lists_and_index_lists() -> None:
    d = {"num_hidden_layers": 40, "layer_types": ["a", "b"] * 20, "moe_layers": list(range(1, 40, 2))}
    over = sweep.layer_plan(d)["overrides"]
    assert over == {"num_hidden_layers": 2, "layer_types": ["a", "b"], "moe_layers": [1]}


def test_an_irregular_tail_does_not_stretch_the_cut() -> None:
    # a hybrid whose attention layers come every 6 layers, then closer together at the end (Zamba2)
    ids = [6, 12, 18, 24, 30, 36, 42, 47, 51]
    d = {"num_hidden_layers": 54, "hybrid_layer_ids": ids}
    assert sweep.layer_plan(d)["layers"] == 7


def test_trailing_layers_get_one_period_of_their_own() -> None:
    d = {"num_hidden_layers": 35, "layer_types": (["s"] * 4 + ["f"]) * 7, "num_kv_shared_layers": 15}
    plan = sweep.layer_plan(d)
    assert plan["layers"] == 10 and plan["overrides"]["num_kv_shared_layers"] == 5


def test_a_layer_count_that_counts_sub_layers_follows_the_layer_list() -> None:
    # num_layers counts the decoder's layers, num_hidden_layers its attention blocks (two a layer)
    over = sweep.layer_plan({"num_hidden_layers": 56, "num_layers": 28})["overrides"]
    assert over == {"num_layers": 2, "num_hidden_layers": 4}


def test_cut_length_needs_every_kind() -> None:
    assert sweep.cut_length(["d", "d", "d", "m", "m", "m"]) == (4, 1)
    assert sweep.cut_length(["a"]) == (1, 1)


# ----------------------------------------------------------------------------- the size cap


def test_width_scaling_keeps_head_dim_and_the_gqa_ratio() -> None:
    d = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}
    over = sweep.scale_widths(d, 0.5)
    assert over["num_key_value_heads"] == 4 and over["num_attention_heads"] == 16
    assert over["hidden_size"] == 2048 and over["intermediate_size"] == 7168


def test_width_scaling_keeps_an_ssm_consistent() -> None:
    # Mamba-2 asks hidden * expand == num_heads * head_dim
    d = {"hidden_size": 4096, "num_heads": 128, "head_dim": 64, "expand": 2}
    over = sweep.scale_widths(d, 0.3)
    assert over["hidden_size"] * 2 == over["num_heads"] * 64


def test_expert_cap_keeps_groups_and_top_k() -> None:
    d = {"n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8}
    over = sweep.cap_experts(d, 20)
    assert over["n_routed_experts"] % 8 == 0 and over["n_routed_experts"] >= 16


def test_vocab_cap_moves_token_ids_inside() -> None:
    over = sweep.cap_vocab({"vocab_size": 163840, "pad_token_id": 163839, "bos_token_id": 1}, 1024)
    assert over == {"vocab_size": 1024, "pad_token_id": 1023}


# ----------------------------------------------------------------------------- which types


def test_types_are_classified_by_the_auto_mappings() -> None:
    pytest.importorskip("transformers")
    assert sweep.classify_type("llama") == ("sweep", "")
    assert sweep.classify_type("bart")[1] == "encoder-decoder"
    assert sweep.classify_type("bert")[1].startswith("encoder-only")
    assert sweep.classify_type("gemma3")[1].startswith("multimodal-only")
    assert sweep.classify_type("gpt-sw3") == ("alias", "gpt2")


def test_plan_builds_a_capped_config_on_the_meta_device() -> None:
    pytest.importorskip("transformers")
    row = sweep.plan("qwen3_moe", tiny=True)
    assert row["status"] == "planned" and row["layers"] == 2
    assert row["params_per_layer"] <= sweep.CAPS["tiny"]["params_per_layer"] * 4
    assert row["config"]["num_local_experts"] == 16  # twice the top-k (8): the floor


# ----------------------------------------------------------------------------- truth of the new kinds


def _regions(model_type: str) -> dict[str, str]:
    import torch
    import transformers

    from analyzer.capture.truth import module_regions

    cfg = dict(sweep.plan(model_type, tiny=True)["config"])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {name: module_regions(model).get(m, "") for name, m in model.named_modules()}


def test_a_gated_deltanet_mixer_has_its_projections_norm_and_core() -> None:
    pytest.importorskip("transformers")
    r = _regions("qwen3_next")
    assert r["model.layers.0.linear_attn"] == "mixer"
    assert r["model.layers.0.linear_attn.in_proj_qkvz"] == "mixer_in_proj"
    assert r["model.layers.0.linear_attn.out_proj"] == "mixer_out_proj"
    assert r["model.layers.0.linear_attn.norm"] == "mixer_norm"
    assert r["model.layers.0.linear_attn.conv1d"] == ""  # the core: the mixer's own region
    assert r["model.layers.3.self_attn"] == "attention_module"  # the hybrid's attention layer


def test_a_mamba_mixer_calls_every_projection_but_the_output_an_input() -> None:
    pytest.importorskip("transformers")
    r = _regions("mamba")
    assert r["backbone.layers.0.mixer"] == "mixer"
    assert {r[f"backbone.layers.0.mixer.{p}"] for p in ("in_proj", "x_proj", "dt_proj")} == {"mixer_in_proj"}
    assert r["backbone.layers.0.mixer.out_proj"] == "mixer_out_proj"
    assert r["backbone.layers.0.mixer.act"] == ""  # the SiLU between conv and scan is core


def test_an_mlp_key_and_value_are_not_attention_projections() -> None:
    pytest.importorskip("transformers")
    r = _regions("rwkv")
    assert r["rwkv.blocks.0.attention"] == "mixer"  # time mixing
    assert r["rwkv.blocks.0.feed_forward.key"] == ""  # channel mixing: the MLP's own GEMM


def test_expert_weight_gathers_get_their_own_range(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from analyzer.capture.hf import CaptureSpec, capture

    cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 128,
           "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    out = tmp_path / "t.json.gz"
    capture(
        CaptureSpec(config=cfg, output=str(out), device="cpu", experts="batched_mm", prompt=4, new_tokens=2)
    )
    with gzip.open(out, "rt", encoding="utf-8") as f:
        ev = json.load(f)["traceEvents"]
    ranges = [e for e in ev if e.get("name") == "lkm::truth region=expert_weights"]
    assert len(ranges) == 4  # gate_up and down, prefill and decode
    inside = {
        e["name"]
        for e in ev
        if e.get("cat") == "cpu_op" and any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in ranges)
    }
    assert "aten::index" in inside and not any("mm" in n for n in inside)


@pytest.mark.parametrize(
    ("model_type", "head"), [("biogpt", "output_projection"), ("bert-generation", "lm_head.decoder")]
)
def test_the_lm_head_is_the_output_embedding_whatever_its_name(model_type: str, head: str) -> None:
    pytest.importorskip("transformers")
    assert _regions(model_type)[head] == "lm_head"


# ----------------------------------------------------------------------------- storing a run


def test_storing_a_partial_run_keeps_the_other_types_rows(tmp_path: Path) -> None:
    import lzma

    # GIVEN a stored sweep of two types, the second with a note on stale truth
    dst, src = tmp_path / "fixtures", tmp_path / "run"
    dst.mkdir()
    rows = [
        {"model_type": "a", "status": "captured", "trace": "trace.json.xz"},
        {"model_type": "b", "status": "captured", "trace": "trace.json.xz", "truth_note": "stale"},
    ]
    (dst / sweep.SWEEP_JSON).write_text(json.dumps({"format_version": 1, "types": rows}))
    # AND a run of type b alone (`--only b`)
    (src / "b").mkdir(parents=True)
    (src / "b" / "trace.json.xz").write_bytes(lzma.compress(b'{"traceEvents": []}'))
    (src / "b" / "meta.json").write_text("{}")
    run = {"format_version": 1, "types": [{"model_type": "b", "status": "captured"}]}
    (src / sweep.SWEEP_JSON).write_text(json.dumps(run))
    # WHEN stored
    sweep.store(src, dst)
    # THEN both types are listed, b's row is the new one (its stale note gone) and a's is kept
    doc = json.loads((dst / sweep.SWEEP_JSON).read_text())
    assert [r["model_type"] for r in doc["types"]] == ["a", "b"]
    assert "truth_note" not in doc["types"][1] and (dst / "b" / "trace.json.xz").is_file()
    assert doc["types"][0] == rows[0]
