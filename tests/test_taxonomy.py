"""The closed vocabularies and the stage/phase sets derived from rules/taxonomy.toml, and the knowledge
loaders (one error style naming the file and the key; one parse per file's bytes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.analyses.walk import grammar, registry
from analyzer.errors import InputError
from analyzer.knowledge import loader
from analyzer.knowledge.annotations import load_annotation_patterns
from analyzer.knowledge.finding_settings import load_finding_settings
from analyzer.knowledge.op_hints import load_op_hints
from analyzer.knowledge.taxonomy import (
    ALL_GEMM_STAGES,
    ATTENTION_KERNEL_STAGES,
    ATTENTION_STAGES,
    DENSE_GEMM_STAGES,
    LABELLED_PHASES,
    MEMORY_STAGES,
    PHASES,
    ROLE_GEMM_STAGES,
    TAXONOMY,
    TAXONOMY_TOML,
    load_taxonomy,
)
from analyzer.paths import RULES_DIR
from analyzer.results import baseline

# --- the derived sets keep exactly the members the Python constants had before they were derived ---------

# the constants as they were typed in Python before issue 19 (member for member, in their order)
OLD_PHASES = ("prefill", "decode", "mixed", "unknown")  # gate, baseline, summary, phases, compare
OLD_CLASSIFY_GEMM_STAGES = frozenset(
    ("qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm", "lm_head_gemm", "moe_gate_gemm") + ("gemm",)
)
OLD_BASELINE_GEMM_ROLES = (
    "qkv_gemm",
    "o_gemm",
    "gate_up_gemm",
    "down_gemm",
    "lm_head_gemm",
    "moe_gate_gemm",
    "moe_expert_gemm",
)
OLD_PHASES_GEMMS = (
    "qkv_gemm",
    "o_gemm",
    "gate_up_gemm",
    "down_gemm",
    "lm_head_gemm",
    "moe_gate_gemm",
    "gemm",
    "moe_expert_gemm",
)
OLD_ATTENTION = ("flash_attention", "paged_attention", "mla_attention")  # classify (as a set) and phases


def test_phases_are_the_four_in_display_order():
    assert PHASES == OLD_PHASES
    assert LABELLED_PHASES == OLD_PHASES[:3]  # the findings' per-phase loops


def test_dense_gemm_stages_are_the_dense_gemm_category():
    assert DENSE_GEMM_STAGES == TAXONOMY.category_stages("dense_gemm")
    assert frozenset(DENSE_GEMM_STAGES) == OLD_CLASSIFY_GEMM_STAGES == registry.GEMM_STAGES
    assert len(DENSE_GEMM_STAGES) == 7


def test_role_gemm_stages_are_what_the_baseline_records():
    # dense_gemm minus the generic gemm plus moe_expert_gemm, in the baseline's order
    assert ROLE_GEMM_STAGES == OLD_BASELINE_GEMM_ROLES
    assert baseline.GEMM_ROLES == OLD_BASELINE_GEMM_ROLES


def test_all_gemm_stages_keep_the_phases_order():
    assert ALL_GEMM_STAGES == OLD_PHASES_GEMMS


def test_attention_kernel_stages_are_the_category_without_the_combine():
    # linear_attention (a hybrid model's Mamba / Gated DeltaNet mixer) joined the category in issue 24
    assert ATTENTION_KERNEL_STAGES == (*OLD_ATTENTION, "linear_attention")
    assert frozenset(ATTENTION_KERNEL_STAGES) == registry.ATTENTION
    assert ATTENTION_STAGES == (
        "flash_attention", "paged_attention", "attention_reduce", "mla_attention", "linear_attention"
    )  # fmt: skip


def test_memory_stages_are_the_activity_kinds():
    assert MEMORY_STAGES == ("memcpy", "memset")  # classify.classify_by_name before: ["memcpy", "memset"]


def test_walk_heuristic_groups_name_taxonomy_stages():
    for group in (registry.GENERIC, registry.SAMPLING_LIKE, grammar._MOE_ROUTING):
        assert group <= set(TAXONOMY.stage_category)


def test_gate_role_check_is_unchanged():
    # GIVEN a baseline's recorded roles and a candidate's, as the gate compares them
    # (analyzer/regressions.py: `gemm_roles` sets of the two comparability blocks)
    stages = ["gemm", "qkv_gemm", "moe_expert_gemm", "norm", "flash_attention", "o_gemm"]
    # WHEN the roles are taken from the stages seen (baseline.py: set(stages) & set(GEMM_ROLES))
    roles = sorted(set(stages) & set(baseline.GEMM_ROLES))
    # THEN the generic gemm and the non-GEMM stages are no role, expert GEMMs are
    assert (
        roles
        == sorted(set(stages) & set(OLD_BASELINE_GEMM_ROLES))
        == ["moe_expert_gemm", "o_gemm", "qkv_gemm"]
    )


# --- taxonomy.toml validation ---------------------------------------------------------------------------


def _taxonomy_with(tmp_path: Path, old: str, new: str) -> Path:
    text = TAXONOMY_TOML.read_text()
    assert old in text
    f = tmp_path / "taxonomy.toml"
    f.write_text(text.replace(old, new))
    return f


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        (
            'phases = ["prefill", "decode", "mixed", "unknown"]',
            'phases = ["prefill", "decode"]',
            "phases: must list",
        ),
        (
            'phases = ["prefill", "decode", "mixed", "unknown"]',
            'phases = ["decode", "decode", "unknown"]',
            "phases:",
        ),
        ('phases = ["prefill", "decode", "mixed", "unknown"]', "", "phases:"),
        ("format_version = 1", "format_version = 1\ncolour = 'red'", "colour: unknown top-level key"),
    ],
)
def test_bad_taxonomy_names_file_and_key(tmp_path, old, new, needle):
    # GIVEN a taxonomy file with a bad phases list or key
    f = _taxonomy_with(tmp_path, old, new)
    # WHEN it is loaded THEN one line names the file and the key
    with pytest.raises(InputError) as e:
        load_taxonomy(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: ") and needle in msg and "\n" not in msg


def test_builtin_taxonomy_loads():
    assert load_taxonomy().phases == PHASES


# --- the loader --------------------------------------------------------------------------------------------


def test_builtin_files_are_named_rules_slash_name_and_user_files_as_given(tmp_path):
    assert loader.display(RULES_DIR / "ops.toml") == "rules/ops.toml"
    assert loader.display(tmp_path / "ops.toml") == str(tmp_path / "ops.toml")


def test_unreadable_and_invalid_files_fail_with_one_line(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        loader.load(tmp_path / "absent.toml", lambda doc, path: doc)
    bad = tmp_path / "bad.toml"
    bad.write_text("x = [")
    with pytest.raises(InputError, match=r"bad\.toml: cannot read: invalid TOML"):
        loader.load(bad, lambda doc, path: doc)


def test_same_bytes_are_parsed_once_changed_bytes_again(tmp_path):
    # GIVEN a file and a validator that counts its calls
    calls = []

    def validate(doc, path):
        calls.append(path)
        return doc["x"]

    f = tmp_path / "k.toml"
    f.write_text("x = 1")
    # WHEN it is loaded twice THEN it is validated once
    assert loader.load(f, validate) == loader.load(f, validate) == 1
    assert len(calls) == 1
    # WHEN the file changes THEN the new content is read
    f.write_text("x = 2")
    assert loader.load(f, validate) == 2 and len(calls) == 2


# --- op hints, annotations, finding settings ------------------------------------------------------------


def test_op_hints_map_ops_to_taxonomy_stages():
    hints = load_op_hints()
    assert hints["aten::silu"] == "activation" and hints["aten::topk"] == "sampling"
    assert set(hints.values()) <= set(TAXONOMY.stage_category)


_HINT = '[[hint]]\nid = "OPH001"\nnote = "n"\n'


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_HINT + 'stage = "foo"\nops = ["aten::x"]\n', "hint OPH001.stage: unknown stage 'foo'"),
        (_HINT + 'stage = "norm"\nops = "aten::x"\n', "hint OPH001.ops: must be a list"),
        (
            _HINT + 'stage = "norm"\nops = ["aten::x"]\n[[hint]]\nid = "OPH002"\nnote = "n"\n'
            'stage = "rope"\nops = ["aten::x"]\n',
            "already listed under 'norm'",
        ),
        (_HINT.replace("OPH001", "X1") + 'stage = "norm"\nops = ["aten::x"]\n', "distinct OPH###"),
        ("[other]\nx = 1\n", "other: unknown top-level key"),
    ],
)
def test_bad_op_hints_name_file_and_key(tmp_path, body, needle):
    f = tmp_path / "ops.toml"
    f.write_text(body)
    with pytest.raises(InputError) as e:
        load_op_hints(f)
    assert str(e.value).startswith(f"{f}: ") and needle in str(e.value)


def test_annotation_patterns_keep_their_shape():
    pats = load_annotation_patterns()
    assert [p["id"] for p in pats][:2] == ["lkm", "sglang"]
    assert all({"id", "note", "pattern", "kind", "regex"} <= p.keys() for p in pats)
    assert pats[0]["regex"].search("lkm::step phase=decode q=1 bs=8")


_ANN = "[[annotation]]\nid = 'x'\nnote = 'n'\n"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_ANN + "pattern = '^x'\n", "annotation x: missing key(s) kind"),
        (_ANN + "pattern = '^x'\nkind = 'fixed'\nphase = 'warmup'\n", "needs phase"),
        (_ANN + "pattern = '^x'\nkind = 'sometimes'\n", "unknown kind"),
        (_ANN + "pattern = '^x'\nkind = 'outer'\ncolour = 'red'\n", "unknown key(s) colour"),
        (_ANN + "pattern = '^(a+)+$'\nkind = 'outer'\n", "pattern rejected: nested quantifier"),
        (_ANN + "pattern = '^x('\nkind = 'outer'\n", "pattern rejected: does not compile"),
        (
            _ANN + "pattern = '^(?P<word>x)'\nkind = 'word'\nwords = { warmup = ['x'] }\n",
            "words.warmup: unknown phase",
        ),
        (_ANN + "pattern = '^x'\nkind = 'word'\nwords = { decode = ['x'] }\n", "needs a (?P<word>...) group"),
        (
            _ANN + "pattern = '^x'\nkind = 'outer'\n" + _ANN + "pattern = '^y'\nkind = 'outer'\n",
            "id defined twice",
        ),
    ],
)
def test_bad_annotations_name_file_and_key(tmp_path, body, needle):
    f = tmp_path / "annotations.toml"
    f.write_text(body)
    with pytest.raises(InputError) as e:
        load_annotation_patterns(f)
    assert str(e.value).startswith(f"{f}: ") and needle in str(e.value)


def test_finding_settings_are_a_fresh_copy_per_call():
    # GIVEN one run's --set override
    first = load_finding_settings({"decode_gpu_idle.max_idle": "0.9"})
    first["decode_gpu_idle"]["severity"] = "info"
    # WHEN another run loads the settings THEN it sees the file's defaults
    again = load_finding_settings()
    assert again["decode_gpu_idle"]["max_idle"] == 0.20 and again["decode_gpu_idle"]["severity"] == "critical"
