"""The ``rules`` command on finding ids, and the ``--set`` examples printed by ``--help``."""

from __future__ import annotations

import re

import pytest

from analyzer.analyses.findings import CHECKS
from analyzer.cli import cli, main
from analyzer.knowledge.finding_settings import load_finding_settings
from tests.conftest import H200_DENSE


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_rules_explain_a_finding_id(capsys) -> None:
    # WHEN a finding id is explained
    code, out, err = run(capsys, "rules", "explain", "F006")
    # THEN it names the check, its severity, what it looks at and its thresholds with --set keys
    assert code == 0, err
    assert out.startswith("F006: finding decode_gpu_idle (severity critical)")
    assert "idle" in out and "decode_gpu_idle.max_idle = 0.2" in out
    assert "--set decode_gpu_idle.max_idle=" in out


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_every_finding_is_explained_by_id_and_by_name(capsys, check) -> None:
    fid = load_finding_settings()[check]["id"]
    code, by_id, _ = run(capsys, "rules", "explain", fid.lower())
    assert code == 0 and check in by_id
    assert len(by_id.splitlines()) >= 3  # the check's docstring is part of it
    code, by_name, _ = run(capsys, "rules", "explain", check)
    assert code == 0 and by_name == by_id


def test_rules_explain_unknown_id_is_a_usage_error(capsys) -> None:
    code, _, err = run(capsys, "rules", "explain", "F999")
    assert code == 2 and "F999" in err


def _help_texts() -> list[str]:
    """The --help text of every command and subcommand."""
    import click

    out = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        ctx = click.Context(cmd, info_name=" ".join(path))
        out.append(cmd.get_help(ctx))
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(cli, ["llm-kernel-map"])
    return out


def test_every_set_example_in_the_help_works(capsys) -> None:
    # GIVEN every `--set KEY=VALUE` example printed by any --help
    examples = {
        m.group(1)
        for text in _help_texts()
        for m in re.finditer(r"--set\s+([a-z_][a-z0-9_.]*=[^\s,;)]+)", " ".join(text.split()))
    }
    examples = {e.rstrip(".") for e in examples}
    assert examples, "no --set example in the help"
    for ex in sorted(examples):
        # THEN each parses as a known setting and a run with it succeeds
        key, value = ex.split("=", 1)
        load_finding_settings({key: value})
        code, _, err = run(capsys, "analyze", H200_DENSE, "--set", ex)
        assert code == 0, f"--set {ex}: {err}"


# --- kernel names as users see them (issue 36) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "stage", "provider", "rule"),
    [
        # FlashInfer names without their namespace, as profiler summaries print them
        ("BatchPrefillWithPagedKVCacheKernel", "flash_attention", "flashinfer", "ATT722"),
        ("BatchDecodeWithPagedKVCacheKernel", "paged_attention", "flashinfer", "ATT721"),
        ("BatchMLAPagedAttentionKernel", "mla_attention", "flashinfer", "ATT720"),
        # aiter assembly kernels by their code-object file
        ("fmha_fwd_hd128_bf16_causal.co", "flash_attention", "aiter", "ATT723"),
        ("pa_bf16_pertokenFp8_gqa10_1tg_4w_mtp3_msk1.co", "paged_attention", "aiter", "ATT724"),
        ("fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_32x128.co", "moe_expert_gemm", "aiter", "MOE515"),
        # DeepEP's Hybrid-EP namespace, DeepGEMM v1's spelled-out grouped GemmType
        (
            "void hybrid_ep::device_sync_kernel<8>(unsigned int*, unsigned int*, unsigned int*)",
            "communication",
            "deepep",
            "COM504",
        ),
        (
            "void deep_gemm::fp8_gemm_kernel<7168u, 4096u, 128u, 64u, 128u, 1u, 5u, 128u, 128u, "
            "deep_gemm::GemmType::GroupedMasked>(float*, int*, unsigned int)",
            "moe_expert_gemm",
            "deepgemm",
            "MOE019",
        ),
        # a name several libraries ship: by name alone the provider is unknown (README, providers.toml)
        ("fused_moe_kernel", "moe_expert_gemm", "unknown", "MOE018"),
        # ... unless a marker in the name says who
        ("void vllm::moe::moe_align_block_size_kernel<int>(int*)", "moe_sort", "vllm", "MOE010"),
    ],
)
def test_rules_classify_names_as_users_see_them(name: str, stage: str, provider: str, rule: str) -> None:
    from click.testing import CliRunner

    # WHEN a name is classified from the command line
    result = CliRunner().invoke(cli, ["rules", "classify", name])
    # THEN its stage, provider and rule are the library's
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if ln.strip().startswith("stage:"))
    assert f"stage: {stage} " in line and f"provider: {provider} " in line and f"rule: {rule}" in line, line
