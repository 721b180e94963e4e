"""The rule table as data: one parametrized check per rule, the ReDoS guard, user rules, total classification."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.errors import InputError
from analyzer.knowledge.kernel_rules import (
    BARRIER_RULE_ID,
    KERNELS_TOML,
    RULES_DIR,
    TRUNCATED_RULE_ID,
    classify_names,
    default_rules,
    load_rules,
    load_taxonomy,
)
from analyzer.knowledge.names import normalize_name
from analyzer.knowledge.patterns import MAX_PATTERN_LENGTH, redos_problem, required_literals

RULESET = default_rules()
TAXONOMY = RULESET.taxonomy
ID_RE = re.compile(r"^[A-Z]{3}\d{3}$")
ALL_EXAMPLES = sorted({ex for r in RULESET.rules for ex in r.examples})


# --- every rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULESET.rules, ids=lambda r: r.id)
def test_rule(rule):
    # schema and vocabularies
    assert ID_RE.match(rule.id)
    assert rule.stage in TAXONOMY.stage_category
    # a rule that says 'other' classifies nothing; the one exception names what is no kernel at all
    assert rule.stage != TAXONOMY.unclassified_stage or rule.id == BARRIER_RULE_ID, "a rule of stage 'other'"
    assert rule.provider in TAXONOMY.providers
    assert rule.note.strip() and rule.examples
    assert set(rule.flags) <= {"i"}
    # the pattern compiles and passes the ReDoS guard
    flags = re.IGNORECASE if "i" in rule.flags else 0
    re.compile(rule.pattern, flags)
    assert redos_problem(rule.pattern, flags) is None
    # the literal prefilter is a necessary condition: it never hides a match of an example
    for ex in rule.examples:
        for text in (normalize_name(ex), ex):
            if rule.regex.search(text) and rule.literals is not None:
                assert any(lit in text for lit in rule.literals), (rule.literals, text[:120])
    # every example is classified by THIS rule: it matches, and no earlier rule shadows it
    for ex in rule.examples:
        hit = RULESET.first_rule(normalize_name(ex), ex)
        assert hit is rule, f"{ex[:160]!r} -> {hit.id if hit else 'UNCLASSIFIED'}, expected {rule.id}"
    # no not_example matches it
    for ex in rule.not_examples:
        assert not rule.hits(normalize_name(ex), ex), f"not_example {ex[:160]!r} matches {rule.id}"


def test_rule_ids_are_unique_and_aliases_resolve():
    ids = [r.id for r in RULESET.rules]
    assert len(ids) == len(set(ids))
    for old, new in RULESET.aliases.items():
        assert old not in ids
        assert RULESET.rule(old) is not None, f"alias {old} -> {new} resolves to nothing"


def test_readme_lists_every_rule_id():
    readme = (RULES_DIR / "README.md").read_text(encoding="utf-8")
    missing = [r.id for r in RULESET.rules if f"`{r.id}`" not in readme]
    assert not missing, f"rules/README.md rule table lacks {missing}"


def test_taxonomy_matches_design():
    tx = load_taxonomy()
    assert list(tx.category_labels) == [
        "moe_expert_gemm", "dense_gemm", "attention", "norm", "rope_kv", "moe_gate_sort",
        "activation", "communication", "sampling", "memory", "other",
    ]  # fmt: skip
    assert tx.stage_category["gemm"] == "dense_gemm"
    assert tx.stage_category["attention_reduce"] == "attention"
    assert tx.stage_category["elementwise"] == "other"
    assert len(tx.stages) == 30  # + optimizer (issue 21: training traces), + linear_attention (issue 24)
    assert tx.stage_category["optimizer"] == "other"
    assert tx.stage_category["linear_attention"] == "attention"
    assert tx.unclassified_stage == "other" and tx.unclassified_provider == "unknown"
    assert "unknown" in tx.providers and "runtime" in tx.providers


# --- the ReDoS guard -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [
        r"(a+)+",
        r"(.*)*",
        r"(x|x)*",
        r"(a|ab)+",
        r"(?:a?b)+",
        r"(\w+\s?)*$",
        r"(?:a{2})+",
        r"^(\d+)*x",
        r"(?i)(?:Ab|aC)+",
        r"(?i:Ab|aC)+",
        r"(a|a?)+",
        r"(\d+)\1",
        "a" * (MAX_PATTERN_LENGTH + 1),
    ],
)
def test_redos_guard_rejects(pattern):
    assert redos_problem(pattern) is not None


@pytest.mark.parametrize(
    "pattern",
    [
        r"nvjet_",
        r"^Cijk_\w*?_(?:UserArgs|Bias)_",
        r"(?:ab|cd)+",
        r"[a-z]+_(?:x|y)",
        r"aiter(?:::|\d+)\w*?mla_",
    ],
)
def test_redos_guard_accepts(pattern):
    assert redos_problem(pattern) is None


def test_loader_rejects_a_dangerous_pattern(tmp_path):
    # GIVEN a user rule with a nested quantifier WHEN loading THEN one line naming file and rule
    f = tmp_path / "bad.toml"
    f.write_text(_rule_toml("USR001", r"(a+)+b", "gemm", "cublas", ["aab"]))
    with pytest.raises(InputError) as e:
        load_rules([f])
    msg = str(e.value)
    assert "USR001" in msg and str(f) in msg and "\n" not in msg


def test_required_literals():
    assert required_literals(r"^Cijk_") == ("Cijk_",)
    assert required_literals(r"(?<![A-Za-z_])store_kvcache|sglang(?:::|\d+)kv") == ("store_kvcache", "sglang")
    assert required_literals(r"foo|\d+") is None
    assert required_literals(r"abc", re.IGNORECASE) is None
    assert required_literals(r"(?i:nvjet)") is None


# --- user rules ------------------------------------------------------------------------------------------


def _rule_toml(rid, pattern, stage, provider, examples, extra=""):
    ex = ", ".join(repr(e).replace("'", '"') for e in examples)
    return (
        f"[[rule]]\nid = '{rid}'\npattern = '{pattern}'\nstage = '{stage}'\nprovider = '{provider}'\n"
        f"examples = [{ex}]\nnote = 'test rule'\n{extra}"
    )


def test_extra_rules_take_precedence(tmp_path):
    name = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    assert RULESET.match(normalize_name(name), name).rule_id == "GEM009"
    # GIVEN a user file that calls this nvjet kernel the QKV projection
    f = tmp_path / "extra.toml"
    f.write_text(_rule_toml("USR001", "^nvjet_sm90_tst_64x8_", "qkv_gemm", "cublas", [name]))
    # WHEN it is loaded as an extra rule file THEN its rule wins over the built-in table
    rs = load_rules([f])
    m = rs.match(normalize_name(name), name)
    assert (m.rule_id, m.stage, m.category, m.provider) == ("USR001", "qkv_gemm", "dense_gemm", "cublas")
    assert rs.rules[0].id == "USR001" and len(rs.rules) == len(RULESET.rules) + 1
    assert rs.sha256 != RULESET.sha256
    # and the built-in rules still classify everything else
    other = "Memset (Device)"
    assert rs.match(other, other).rule_id == "MEM002"


def test_the_same_rule_files_are_parsed_once_and_an_edited_file_again(tmp_path):
    name = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    f = tmp_path / "extra.toml"
    f.write_text(_rule_toml("USR001", "^nvjet_sm90_tst_64x8_", "qkv_gemm", "cublas", [name]))
    # GIVEN rules loaded once, WHEN the same files are loaded again THEN the same RuleSet comes back
    first = load_rules([f])
    assert load_rules([f]) is first
    # WHEN the file changes (same path) THEN it is parsed again and the change takes effect
    f.write_text(_rule_toml("USR001", "^nvjet_sm90_tst_64x8_", "o_gemm", "cublas", [name]))
    edited = load_rules([f])
    assert edited is not first and edited.sha256 != first.sha256
    assert edited.match(normalize_name(name), name).stage == "o_gemm"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_rule_toml("GEM009", "^nvjet_", "gemm", "cublas", ["nvjet_x"]), "already used"),
        (_rule_toml("USR001", "^x", "warp_gemm", "cublas", ["x"]), "unknown stage"),
        (_rule_toml("USR001", "^x", "gemm", "openblas", ["x"]), "unknown provider"),
        (_rule_toml("USR001", "^x", "gemm", "cublas", ["y"]), "does not match its own pattern"),
        (_rule_toml("USR001", "^x", "gemm", "cublas", ["x"], "not_examples = ['xy']\n"), "not_example"),
        (_rule_toml("USR001", "^x", "gemm", "cublas", ["x"], "colour = 'red'\n"), "unknown key"),
        (_rule_toml("usr1", "^x", "gemm", "cublas", ["x"]), "id must be"),
        (_rule_toml("USR001", "^x(", "gemm", "cublas", ["x"]), "does not compile"),
        (_rule_toml("USR001", "^x", "gemm", "cublas", ["x"], "phases = 'decode'\n"), "phases_source must"),
        (
            _rule_toml(
                "USR001", "^x", "gemm", "cublas", ["x"], "phases = 'sometimes'\nphases_source = 's'\n"
            ),
            "phases must be one of",
        ),
        # launch-grid and tile facts: their values, what they need and their sources
        (
            _rule_toml(
                "USR001", "^x", "gemm", "cublas", ["x"], "query_tile_axes = ['w']\ngrid_source = 's'\n"
            ),
            "query_tile_axes must be",
        ),
        (
            _rule_toml("USR001", "^x", "gemm", "cublas", ["x"], "query_tile_axes = ['x']\n"),
            "grid_source must",
        ),
        (
            _rule_toml(
                "USR001",
                "^x",
                "gemm",
                "cublas",
                ["x"],
                "query_tile_axes = ['x']\ngrid_source = 's'\nphases = 'decode'\nphases_source = 's'\n",
            ),
            "needs phases = 'either'",
        ),
        (
            _rule_toml("USR001", "^x", "gemm", "cublas", ["x"], "sequences_axis = 'x'\ngrid_source = 's'\n"),
            "needs phases = 'decode'",
        ),
        (
            _rule_toml(
                "USR001", "^x", "gemm", "cublas", ["x"], "token_tile = 'k'\ntoken_tile_source = 's'\n"
            ),
            "token_tile must be",
        ),
        (_rule_toml("USR001", "^x", "gemm", "cublas", ["x"], "token_tile = 'n'\n"), "token_tile_source must"),
        ("[[rule]]\nid = 'USR001'\n", "missing key"),
        ("rule = [", "invalid TOML"),
    ],
)
def test_invalid_user_rules_fail_with_one_line(tmp_path, body, needle):
    f = tmp_path / "extra.toml"
    f.write_text(body)
    with pytest.raises(InputError) as e:
        load_rules([f])
    msg = str(e.value)
    assert needle in msg and str(f) in msg and "\n" not in msg


def test_missing_rule_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError):
        load_rules([tmp_path / "absent.toml"])


def test_builtin_table_loads_from_its_path():
    assert load_rules(kernels_file=KERNELS_TOML).sha256 == RULESET.sha256


# --- classification is total and deterministic -----------------------------------------------------------

_names = st.one_of(
    st.text(max_size=300),
    st.sampled_from(ALL_EXAMPLES),
    st.tuples(st.sampled_from(ALL_EXAMPLES), st.integers(0, 400), st.text(max_size=20)).map(
        lambda t: t[0][: t[1]] + t[2]
    ),
    st.text(alphabet="_ZNILEvT0123456789abcdefgkmnst", max_size=120).map(lambda s: "_Z" + s),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_names, max_size=8))
def test_classification_is_total_and_deterministic(names):
    first = classify_names(names, RULESET)
    again = classify_names(list(names), RULESET)
    assert first == again
    assert [r["name"] for r in first] == list(dict.fromkeys(names))
    for r in first:
        assert r["stage"] in TAXONOMY.stage_category
        assert r["category"] == TAXONOMY.stage_category[r["stage"]]
        assert r["provider"] in TAXONOMY.providers
        pseudo = (TAXONOMY.unclassified_rule_id, TRUNCATED_RULE_ID)
        assert r["rule_id"] in pseudo or RULESET.rule(r["rule_id"]) is not None
        if r["rule_id"] == TAXONOMY.unclassified_rule_id:
            assert (r["stage"], r["provider"]) == ("other", "unknown")
        if r["rule_id"] == TRUNCATED_RULE_ID:  # a cut name whose visible prefix decides no stage
            assert r["stage"] == "other" and r["norm_name"].endswith("\u2026")
        assert isinstance(r["group_key"], str) and r["group_key"].startswith(r["norm_name"])


def test_unclassified_is_explicit():
    rows = classify_names(["some_future_kernel_nobody_wrote"], RULESET)
    assert rows[0]["rule_id"] == "UNCLASSIFIED"
    assert (rows[0]["stage"], rows[0]["category"], rows[0]["provider"]) == ("other", "other", "unknown")


def test_classify_names_one_entry_per_unique_name():
    names = ["Memset (Device)", "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", "Memset (Device)"]
    rows = classify_names(names, RULESET)
    assert [r["name"] for r in rows] == names[:2]
    nv = rows[1]
    assert (nv["stage"], nv["provider"], nv["rule_id"]) == ("gemm", "cublas", "GEM009")
    assert (nv["tile_m"], nv["tile_n"], nv["tile_k"], nv["split_k"]) == (64, 8, 64, -1)
    expected = {"name", "norm_name", "stage", "category", "provider", "rule_id"}
    expected |= {"tile_m", "tile_n", "tile_k", "split_k", "group_key"}
    assert set(nv) == expected


def test_rules_match_identifiers_inside_unmangleable_names():
    # clang's Tn mangling defeats the demangler; the rule matches the raw name
    raw = "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i"
    assert normalize_name(raw) == raw
    m = RULESET.match(normalize_name(raw), raw)
    assert (m.stage, m.provider) == ("activation", "sglang")


def test_rules_dir_has_the_data_files():
    assert Path(RULES_DIR / "kernels.toml").is_file() and Path(RULES_DIR / "taxonomy.toml").is_file()


# --- every problem of a rule file in one run (issue 36) -----------------------------------------------


def test_overlapping_alternatives_are_rejected_as_overlapping_not_as_empty():
    # Python's parser turns (a|aa) into a(?:|a): the empty alternative there is an overlap
    for pattern in (r"(a|aa)+$", r"(a|ab)+", r"(x|x)*"):
        problem = redos_problem(pattern)
        assert problem is not None and problem.startswith("overlapping alternatives"), (pattern, problem)
    # a repeated group that can match empty is that
    for pattern in (r"(a|)+", r"(a?|b)+"):
        problem = redos_problem(pattern)
        assert problem is not None and "can match empty" in problem, (pattern, problem)


def test_every_problem_of_a_user_rule_file_is_reported_in_one_run(tmp_path, capsys):
    from analyzer.cli import main

    # GIVEN a user file with three bad rules (a dangerous pattern, an unknown stage, an example that
    # misses) and one good one
    f = tmp_path / "extra.toml"
    f.write_text(
        _rule_toml("USR001", "(a|aa)+$", "gemm", "cublas", ["aa"])
        + _rule_toml("USR002", "^x", "warp_gemm", "cublas", ["x"])
        + _rule_toml("USR003", "^x", "gemm", "cublas", ["y"])
        + _rule_toml("USR004", "^nvjet_sm90_tst_64x8_", "qkv_gemm", "cublas", ["nvjet_sm90_tst_64x8_64x16"])
    )
    # WHEN it is checked
    code = main(["rules", "check", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    # THEN exit 2, each problem on its own line naming the file and the rule, then one summary line
    assert code == 2
    assert len(err) == 4, err
    assert "USR001" in err[0] and "overlapping alternatives" in err[0]
    assert "USR002" in err[1] and "unknown stage 'warp_gemm'" in err[1]
    assert "USR003" in err[2] and "does not match its own pattern" in err[2]
    assert all(str(f) in line or "extra.toml" in line for line in err)
    assert "3 problems" in err[3] and "USR" not in err[3]
    # AND the API raises one InputError that carries the lines
    with pytest.raises(InputError) as e:
        load_rules([f])
    assert len(e.value.details) == 3 and "3 problems" in str(e.value)
