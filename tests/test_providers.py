"""Provider attribution where kernel names collide (analyzer/analyses/providers.py, rules/providers.toml)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from analyzer.analyses.providers import providers_from_context, run_providers
from analyzer.errors import InputError
from analyzer.knowledge.provider_ops import load_provider_facts
from analyzer.tables.dictionaries import pylist
from tests.conftest import shared
from tests.runs import load_inputs

FACTS = load_provider_facts()


def _attribute(rows: list[tuple], run: dict | None = None) -> list[str]:
    """rows: (trace_id, rule_id, norm_name, provider by name, launching host op or None)."""
    t, r, n, p, o = (list(c) for c in zip(*rows, strict=True))
    return pylist(providers_from_context(pa.array(t, pa.int16()), r, n, p, o, run or {}, FACTS))


def test_facts_read_op_namespaces_and_exact_names() -> None:
    assert FACTS.op_provider("_C::rms_norm") == "vllm"
    assert FACTS.op_provider("vllm::unified_attention") == "vllm"
    assert FACTS.op_provider("sgl_kernel::moe_align_block_size") == "sglang"
    assert FACTS.op_provider("sglang_profiler::forward_batch_info_compute_position_triton_340") == "sglang"
    assert FACTS.op_provider("aten::_flash_attention_forward") == "pytorch"
    assert FACTS.op_provider("aiter::rmsnorm") == "aiter"
    assert FACTS.op_provider("my_engine::op") is None and FACTS.op_provider(None) is None
    assert {"MOE010", "MOE003", "MOE018", "ATT008"} <= set(FACTS.shared)


def test_shared_names_take_the_provider_of_their_context() -> None:
    got = _attribute(
        [
            # the name says it (vLLM's namespace)
            (0, "MOE010", "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*)", "vllm", None),
            # sgl-kernel's global-namespace copy, launched by its op
            (
                0,
                "MOE010",
                "void moe_align_block_size_kernel<int>(int const*, int*)",
                "vllm",
                "sgl_kernel::moe_align_block_size",
            ),
            # the same name launched by vLLM's extension op
            (
                0,
                "MOE010",
                "void moe_align_block_size_kernel<int>(int const*, int*)",
                "vllm",
                "_moe_C::moe_align_block_size",
            ),
            # Triton fused MoE inside vLLM's custom op / under SGLang's profiler range
            (0, "MOE018", "fused_moe_kernel", "vllm", "vllm::moe_forward"),
            (0, "MOE018", "fused_moe_kernel", "vllm", "sglang_profiler::fused_experts_impl_1290"),
            # AOTriton under ROCm PyTorch SDPA
            (0, "ATT008", "attn_fwd", "pytorch", "aten::_flash_attention_forward"),
            # an op whose provider is not a candidate decides nothing; no op, no run evidence: unknown
            (0, "MOE018", "fused_moe_kernel", "vllm", "aten::empty"),
            (
                0,
                "MOE003",
                "void topkGatingSoftmax<4, 128, 4, 16>(float const*, bool const*, float*, int, int*)",
                "vllm",
                None,
            ),
            # other rules keep the name's provider whatever launched them
            (
                0,
                "GEM003",
                "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x16x64_MI16x16x1_SN",
                "hipblaslt",
                "sgl_kernel::x",
            ),
        ]
    )
    assert got == ["vllm", "sglang", "vllm", "vllm", "sglang", "pytorch", "unknown", "unknown", "hipblaslt"]


def test_the_run_decides_when_it_names_exactly_one_candidate() -> None:
    rows = [(0, "MOE018", "fused_moe_kernel", "vllm", None), (1, "MOE018", "fused_moe_kernel", "vllm", None)]
    run = {0: frozenset({"sglang", "aiter"}), 1: frozenset({"sglang", "vllm"})}
    assert _attribute(rows, run) == ["sglang", "unknown"]


def test_a_run_without_engine_ops_runs_the_library_of_origin() -> None:
    """GIVEN flash-linear-attention's kernel names (vendored by vLLM, SGLang and TRT-LLM) WHEN the run's
    host ops name no candidate but are recorded (transformers: aten:: only) THEN fla's own; an
    engine's op or run names the engine; a run without host ops stays unknown."""
    name = "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"
    rows = [(0, "ATT038", name, "fla", None), (1, "ATT038", name, "fla", None), (2, "ATT038", name, "fla", None),
            (3, "ATT038", name, "fla", "vllm::gdn_attention_core")]  # fmt: skip
    run = {0: frozenset({"pytorch"}), 1: frozenset({"pytorch", "vllm"}), 3: frozenset({"pytorch"})}
    assert _attribute(rows, run) == ["fla", "vllm", "unknown", "vllm"]
    assert FACTS.shared["NRM011"].origin == "fla" and FACTS.shared["MOE018"].origin is None


def test_no_shared_rule_leaves_the_column_as_it_was() -> None:
    got = _attribute([(0, "NRM001", "aiter::rmsnorm_kernel", "aiter", "sgl_kernel::rmsnorm")])
    assert got == ["aiter"]


def test_real_sglang_trace_names_its_engine_and_keeps_its_providers() -> None:
    # GIVEN a real SGLang + aiter trace on MI300X (sgl_kernel::, sglang::, aiter:: ops)
    trace = load_inputs([str(shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz"))])
    run = run_providers(trace.host_ops, FACTS)
    # THEN its host ops name SGLang, aiter and PyTorch, not vLLM
    assert {"sglang", "aiter", "pytorch"} <= run[0] and "vllm" not in run[0]
    # AND a shared name in it without a launching op would be SGLang's: the run names one candidate
    assert _attribute([(0, "MOE018", "fused_moe_kernel", "vllm", None)], run) == ["sglang"]
    # AND the analysis of the trace keeps every provider its names give (no shared kernel in it)
    from analyzer.pipeline import analyze_trace

    k = analyze_trace(trace).kernels
    pairs = set(zip(pylist(k["rule_id"]), pylist(k["provider"]), strict=True))
    assert ("ROP005", "sglang") in pairs and ("NRM001", "aiter") in pairs and ("GEM003", "hipblaslt") in pairs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[ops]\nnobody = ["x::"]\n', "unknown provider 'nobody'"),
        ('[ops]\nvllm = ["_C::"]\nsglang = ["_C::"]\n', "already listed"),
        ('[[shared]]\nrule = "XXX999"\nproviders = ["vllm", "sglang"]\nnote = "n"\n', "no rule id"),
        ('[[shared]]\nrule = "MOE018"\nproviders = ["vllm"]\nnote = "n"\n', "at least two"),
        (
            '[[shared]]\nrule = "MOE018"\nproviders = ["vllm", "sglang"]\nnamed = { aiter = "a" }\nnote = "n"\n',
            "not one of",
        ),
        (
            '[[shared]]\nrule = "MOE018"\nproviders = ["vllm", "sglang"]\norigin = "fla"\nnote = "n"\n',
            "origin 'fla'",
        ),
    ],
)
def test_bad_facts_fail_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "providers.toml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=message):
        load_provider_facts(p)
