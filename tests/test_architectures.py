"""Tests for analyzer/architectures.py and rules/models.toml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.errors import InputError
from analyzer.knowledge.architectures import (
    ModelArch,
    from_hf_config,
    from_meta_arch,
    load_builtin_models,
    load_model,
)

BUILTINS = load_builtin_models()
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.mark.parametrize("key", sorted(BUILTINS))
def test_every_builtin_loads_and_is_sourced(key):
    m = BUILTINS[key]
    assert load_model(key) == m
    assert load_model(m.name) == m
    assert "config.json" in m.source
    assert m.hidden_size > 0 and m.num_hidden_layers > 0 and m.vocab_size > 0
    assert m.num_attention_heads % m.num_key_value_heads == 0
    if m.is_moe:
        assert 0 < m.num_experts_per_tok <= m.num_experts


def test_required_builtins_present():
    names = {m.name for m in BUILTINS.values()}
    assert {
        "Qwen3-30B-A3B",
        "Qwen3-235B-A22B",
        "DeepSeek-V3",
        "Llama-3-70B",
        "Llama-3-8B",
        "Llama-3.2-1B",
        "Qwen3-8B",
        "gpt-oss-20b",
        "gpt-oss-120b",
    } <= names


# The seeds' "Architecture Params Quick Reference" table.
@pytest.mark.parametrize(
    ("name", "hidden", "layers", "heads", "kv_heads", "head_dim", "experts", "topk"),
    [
        ("Qwen3-30B-A3B", 2048, 48, 32, 4, 128, 128, 8),
        ("Qwen3-235B-A22B", 4096, 94, 64, 4, 128, 128, 8),
        ("DeepSeek-V3", 7168, 61, 128, 128, 128, 256, 8),
        ("Llama-3-70B", 8192, 80, 64, 8, 128, 0, 0),
    ],
)
def test_seed_table_values(name, hidden, layers, heads, kv_heads, head_dim, experts, topk):
    m = load_model(name)
    assert (m.hidden_size, m.num_hidden_layers, m.num_attention_heads) == (hidden, layers, heads)
    assert (m.num_key_value_heads, m.head_dim) == (kv_heads, head_dim)
    assert (m.num_experts, m.num_experts_per_tok) == (experts, topk)


def test_deepseek_mla_fields():
    m = load_model("deepseek-v3")
    assert m.is_mla and m.is_moe
    assert (m.q_lora_rank, m.kv_lora_rank) == (1536, 512)
    assert (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (128, 64, 128)
    assert (m.n_shared_experts, m.first_k_dense_replace, m.moe_intermediate_size) == (1, 3, 2048)
    assert (m.dense_layers, m.moe_layers) == (3, 58)
    assert m.qkv_out_features == 1536 + 512 + 64
    assert m.gemm_shapes()["kv_b_proj"] == (512, 128 * (128 + 128))


@pytest.mark.parametrize(
    ("name", "dtype_bytes", "expected"),
    [
        ("Llama-3-8B", 2, 2 * 32 * 8 * 128 * 2),
        ("Llama-3-70B", 2, 2 * 80 * 8 * 128 * 2),
        ("Qwen3-30B-A3B", 2, 2 * 48 * 4 * 128 * 2),
        ("Qwen3-30B-A3B", 1, 2 * 48 * 4 * 128),  # fp8 KV cache
        ("DeepSeek-V3", 2, (512 + 64) * 61 * 2),  # MLA latent
        ("gpt-oss-20b", 2, 2 * 24 * 8 * 64 * 2),
    ],
)
def test_kv_bytes_per_token(name, dtype_bytes, expected):
    assert load_model(name).kv_bytes_per_token(dtype_bytes) == expected


# Published totals (total / active, billions) check every shape in the table at once.
@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        ("Llama-3-8B", 8.03, 8.03),
        ("Llama-3-70B", 70.6, 70.6),
        ("Llama-3.2-1B", 1.24, 1.24),
        ("Qwen3-8B", 8.2, 8.2),
        ("Qwen3-30B-A3B", 30.5, 3.3),
        ("Qwen3-235B-A22B", 235, 22),
        ("DeepSeek-V3", 671, 37),
        ("gpt-oss-20b", 20.9, None),
        ("gpt-oss-120b", 116.8, None),
    ],
)
def test_param_counts_match_published(name, total, active):
    m = load_model(name)
    assert m.param_count() / 1e9 == pytest.approx(total, rel=0.03)
    if active is not None:
        assert m.param_count(active=True) / 1e9 == pytest.approx(active, rel=0.05)


def test_gemm_shapes_dense_llama():
    m = load_model("llama-3-8b")
    s = m.gemm_shapes()
    assert s["qkv_gemm"] == (4096, (32 + 2 * 8) * 128) == (4096, m.qkv_out_features)
    assert s["o_gemm"] == (4096, 4096)
    assert s["gate_up_gemm"] == (4096, 2 * 14336) == (4096, m.gate_up_out_features)
    assert s["down_gemm"] == (14336, 4096)
    assert s["lm_head_gemm"] == (4096, 128256)
    assert "moe_gate_gemm" not in s
    assert m.weight_bytes("qkv_gemm", 2) == 4096 * 6144 * 2
    assert (m.q_dim, m.kv_dim) == (4096, 1024)


def test_gemm_shapes_moe():
    m = load_model("qwen3-30b-a3b")
    s = m.gemm_shapes()
    assert s["moe_gate_gemm"] == (2048, 128)
    assert s["moe_expert_gate_up"] == (2048, 2 * 768)
    assert s["moe_expert_down"] == (768, 2048)
    assert "gate_up_gemm" not in s, "every Qwen3-MoE layer is MoE"
    g = load_model("gpt-oss-20b")
    assert g.expert_intermediate_size == 2880 and g.gemm_shapes()["moe_expert_down"] == (2880, 2880)
    assert g.quant_method == "mxfp4"


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("llama-3-8b", "Llama-3-8B"),
        ("meta-llama/Meta-Llama-3-8B", "Llama-3-8B"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "Llama-3-8B"),
        ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),
        ("QWEN3_235B_A22B", "Qwen3-235B-A22B"),
        ("deepseek-ai/DeepSeek-V3", "DeepSeek-V3"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("llama3.2-1b", "Llama-3.2-1B"),
    ],
)
def test_load_model_aliases(alias, name):
    assert load_model(alias).name == name


def test_load_model_unknown_is_one_line_input_error():
    with pytest.raises(InputError) as err:
        load_model("not-a-model-xyz")
    assert "unknown model 'not-a-model-xyz'" in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------ config.json


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_hf_config_json(tmp_path):
    path = _write(
        tmp_path,
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 4,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "tie_word_embeddings": True,
            "torch_dtype": "float16",
        },
    )
    m = load_model(str(path))
    assert isinstance(m, ModelArch)
    assert (m.head_dim, m.num_key_value_heads, m.dtype) == (64, 4, "float16")
    assert m.tie_word_embeddings and not m.is_moe
    assert m.kv_bytes_per_token(2) == 2 * 4 * 4 * 64 * 2
    assert load_model(str(tmp_path)) == m, "a directory holding config.json works too"


def test_hf_config_nested_text_config_and_expert_keys(tmp_path):
    path = _write(
        tmp_path,
        {
            "model_type": "llava_like",
            "text_config": {
                "model_type": "mixtral",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "num_local_experts": 8,
                "num_experts_per_tok": 2,
            },
        },
    )
    m = load_model(str(path))
    assert (m.model_type, m.num_experts, m.num_experts_per_tok) == ("mixtral", 8, 2)
    assert m.expert_intermediate_size == 14336 and m.dense_layers == 0


def test_hf_config_deepseek_style():
    m = from_hf_config(
        {
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "head_dim": 64,  # newer transformers store the RoPE width here
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "first_k_dense_replace": 3,
            "vocab_size": 129280,
            "quantization_config": {"quant_method": "fp8"},
        }
    )
    builtin = load_model("DeepSeek-V3")
    assert m.head_dim == 128 and m.quant_method == "fp8"
    assert m.kv_bytes_per_token(2) == builtin.kv_bytes_per_token(2)
    assert m.param_count() == builtin.param_count()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read model config"),
        ("[1, 2]", "not a JSON object"),
        ('{"hidden_size": 8}', "num_attention_heads"),
        (
            json.dumps(dict(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, vocab_size=10)),
            "intermediate_size",
        ),
    ],
)
def test_bad_config_json(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message) as err:
        load_model(str(path))
    assert "\n" not in str(err.value)


# -------------------------------------------------------------------------------- meta.json


@pytest.mark.parametrize(
    ("folder", "layers", "moe_layers", "kv_bytes"),
    [
        ("h200-llama3-8b-dense", 8, 0, 2 * 8 * 8 * 128 * 2),
        ("h200-qwen3-30b-a3b-moe", 4, 4, 2 * 4 * 4 * 128 * 2),
        ("h200-tp2-llama3-8b-graph", 8, 0, 2 * 8 * 8 * 128 * 2),
    ],
)
def test_meta_json_archs(folder, layers, moe_layers, kv_bytes):
    meta = SHARED / folder / "meta.json"
    if not meta.exists():
        pytest.skip(f"{meta} absent (../shared not beside the checkout)")
    m = from_meta_arch(json.loads(meta.read_text())["arch"])
    assert (m.num_hidden_layers, m.moe_layers) == (layers, moe_layers)
    assert m.kv_bytes_per_token(2) == kv_bytes
    full = load_model("qwen3-30b-a3b" if moe_layers else "llama-3-8b")
    # Same shapes per layer as the full model the fixture imitates.
    assert m.gemm_shapes() == full.gemm_shapes()
