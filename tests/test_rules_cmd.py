"""The ``rules`` command: list and explain every kind of rule, finding ids, and the ``--set`` examples
printed by ``--help``."""

from __future__ import annotations

import json
import re

import pytest

from analyzer.analyses.findings import CHECKS
from analyzer.cli import cli, main
from analyzer.knowledge import rule_catalogue as catalogue
from analyzer.knowledge.finding_settings import load_finding_settings
from analyzer.knowledge.rule_catalogue import KINDS
from tests.conftest import FIXTURES, H200_DENSE
from tests.runs import analyze_paths


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


# --------------------------------------------------------------------------- every kind of rule

ZOO_MOE = FIXTURES / "zoo" / "qwen3-moe-grouped-bf16" / "trace.json.gz"


def _listed(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    code, out, err = run(capsys, "rules", "list", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_rules_list_json_has_unique_ids_and_the_seven_kinds(capsys) -> None:
    # WHEN every rule is listed as JSON
    rows = _listed(capsys)
    ids = [r["id"] for r in rows]
    # THEN ids are unique, every kind is there and each row has a one-line summary
    assert len(ids) == len(set(ids))
    assert {r["kind"] for r in rows} == set(KINDS) == {
        "kernel", "op", "annotation", "attention_op", "work_op", "structure", "phase", "finding"
    }  # fmt: skip
    assert all(r["summary"] and "\n" not in r["summary"] for r in rows)
    by_id = {r["id"]: r for r in rows}
    # AND each kind carries its own fields
    assert {"stage", "provider", "pattern"} <= by_id["ATT001"].keys()
    assert by_id["UNCLASSIFIED"]["fallback"] and by_id["MEM_KIND"]["fallback"]
    assert by_id["OPH001"]["stage"] == "embedding" and "aten::embedding" in by_id["OPH001"]["ops"]
    assert by_id["STR001"]["kind"] == "structure" and by_id["PHS001"]["kind"] == "phase"
    for k in ("contract", "decides", "needs", "source", "added", "reads"):
        assert by_id["STR001"][k]
    assert by_id["lkm"]["kind"] == "annotation" and by_id["sdpa-bhld"]["kind"] == "attention_op"
    assert by_id["WRK008"]["kind"] == "work_op" and by_id["WRK008"]["names"] == ["aten::_grouped_mm"]
    assert by_id["F006"]["check"] == "decode_gpu_idle"


def test_rules_list_kind_filters(capsys) -> None:
    # WHEN the list is cut to one kind
    rows = _listed(capsys, "--kind", "phase")
    code, out, _ = run(capsys, "rules", "list", "--kind", "op", "--kind", "annotation")
    # THEN only that kind (those kinds) is shown
    assert rows and {r["kind"] for r in rows} == {"phase"}
    lines = out.splitlines()[:-1]
    assert code == 0 and lines and all(line.split()[1] in ("op", "annotation") for line in lines)
    assert run(capsys, "rules", "list", "--kind", "nonsense")[0] == 2


def test_rules_list_text_shows_each_rules_kind(capsys) -> None:
    # WHEN the list is printed as text
    code, out, _ = run(capsys, "rules", "list")
    lines = out.splitlines()
    # THEN kernel rules keep id, stage, provider, pattern; every other line names its kind
    assert code == 0 and lines[0].split()[:2] == ["MEM001", "kernel"]
    assert any(line.startswith("MEM_KIND") and "fallback" in line for line in lines)
    assert {line.split()[1] for line in lines if line[:1].isalnum() and len(line.split()) > 1} >= set(KINDS)
    assert "unmatched kernel names -> stage other" in out


def test_every_listed_rule_is_explained(capsys) -> None:
    # GIVEN every id of every kind
    for r in _listed(capsys):
        # WHEN it is explained THEN it succeeds and names the id
        code, out, err = run(capsys, "rules", "explain", r["id"])
        assert code == 0, f"{r['id']}: {err}"
        assert r["id"] in out.splitlines()[0]


def test_explain_a_structure_rule_shows_contract_reads_and_thresholds(capsys) -> None:
    # WHEN a structure rule that reads a threshold is explained
    code, out, _ = run(capsys, "rules", "explain", "str001")
    # THEN it shows its registry fields, its vocabulary with values, thresholds with range and --set
    assert code == 0 and out.startswith("STR001: embedding-lookup (structure rule")
    for k in ("contract:", "decides: stage", "needs: host_ops", "source:", "added:"):
        assert k in out
    assert "vocabulary gather_ops: aten::gather" in out
    assert re.search(
        r"threshold embedding_min_rows = 8192 \(range 1\.\.\d+; --set structure\.embedding_min_rows=", out
    )


def test_explain_lists_the_cases_that_name_the_rule(capsys, tmp_path, monkeypatch) -> None:
    # GIVEN no cases directory
    monkeypatch.setattr(catalogue, "CASES_DIR", tmp_path / "cases")
    code, out, _ = run(capsys, "rules", "explain", "PHS001")
    # THEN the explanation says so
    assert code == 0 and "cases: none yet" in out
    # GIVEN case files naming PHS001 as firing and as not firing, one unrelated and one not JSON
    d = tmp_path / "cases" / "phases"
    d.mkdir(parents=True)
    (d / "a.json").write_text(json.dumps({"name": "vllm steps", "fires": ["PHS001"], "not_fires": []}))
    (d / "b.json").write_text(json.dumps({"name": "no annotations", "fires": [], "not_fires": ["PHS001"]}))
    (d / "c.json").write_text(json.dumps({"name": "other", "fires": ["STR001"], "not_fires": []}))
    (d / "d.json").write_text("not json")
    code, out, _ = run(capsys, "rules", "explain", "PHS001")
    # THEN both cases are listed with their role, the others are not
    assert code == 0
    assert "case (fires): vllm steps (tests/cases/phases/a.json)" in out
    assert "case (not_fires): no annotations (tests/cases/phases/b.json)" in out
    assert "other" not in out.split("cases")[-1] and "none yet" not in out


def test_explain_unknown_id_is_one_line_exit_2(capsys) -> None:
    code, out, err = run(capsys, "rules", "explain", "STR999")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1 and "STR999" in err


def test_every_rule_a_run_records_is_explained(capsys) -> None:
    # GIVEN the stage_rule of every kernel and the phase_rule / evidence of every step of a zoo case
    a = analyze_paths([str(ZOO_MOE)])
    ids = set(a.kernels["stage_rule"].combine_chunks().dictionary.to_pylist())
    ids |= set(a.steps["phase_rule"].dropna()) | {x for ev in a.steps["phase_evidence"] for x in ev}
    ids |= set(a.layer_rules)
    assert any(i.startswith("STR") for i in ids) and any(i.startswith("PHS") or i == "lkm" for i in ids)
    for rid in sorted(ids):
        # THEN `rules explain` knows each
        code, _, err = run(capsys, "rules", "explain", rid)
        assert code == 0, f"{rid}: {err}"
