"""Every structure and phase rule of rules/structure.toml against its cases (tests/cases/*.json).

A case is a cut of a real trace (``llm-kernel-map cut``) or one derived from such a cut by a
documented change (tests/cases/derive.py). Each names the rules that fire on it and those that
must not; its expectations come from the trace's truth ranges or engine annotations, or are the
analysis' own answers where the case says ``pinned``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analyzer.errors import InputError, UsageError
from analyzer.knowledge.structure_rules import load_structure, with_overrides
from analyzer.options import Options
from analyzer.pipeline import analyze_trace
from analyzer.readers.case import read_case
from analyzer.results.cases import case_outcome, score_case

ROOT = Path(__file__).resolve().parents[1]
CASES = sorted((ROOT / "tests" / "cases").glob("*.json.xz"))
REGISTRY = load_structure()


@pytest.fixture(scope="module")
def outcomes():
    """Each case's trace, fields, answers and fired rules (analysed once per module)."""
    out = {}
    for path in CASES:
        trace, meta = read_case(path)
        _, got, fired = case_outcome(trace)
        out[path.name] = (meta, got, fired)
    return out


def test_cases_exist():
    assert len(CASES) >= 20


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_answers_and_rules(path, outcomes):
    # GIVEN a case cut from a real trace WHEN its kernels are analysed alone
    meta, got, fired = outcomes[path.name]
    # THEN every rule it says fires fires, none it says must not fire fires
    assert set(meta["fires"]) <= fired, f"expected to fire but did not: {set(meta['fires']) - fired}"
    assert not (set(meta["not_fires"]) & fired), f"must not fire: {set(meta['not_fires']) & fired}"
    # AND no more kernels are answered wrong (or left unknown) than when the case was cut
    score = score_case(got, meta["expect"])
    assert score["wrong"] <= meta["known_wrong"], score
    assert score["undecided"] <= meta["undecided"], score
    assert set(meta["expect_from"].values()) <= {"truth", "annotations", "pinned"}


def test_every_rule_has_a_case_where_it_fires_and_one_where_it_must_not(outcomes):
    fires = {i for meta, _, _ in outcomes.values() for i in meta["fires"]}
    not_fires = {i for meta, _, _ in outcomes.values() for i in meta["not_fires"]}
    ids = {r.id for r in REGISTRY.rules}
    assert ids - fires == set(), "rules without a case where they fire"
    assert ids - not_fires == set(), "rules without a case where they must not fire"


def test_cases_name_their_source():
    for path in CASES:
        _, meta = read_case(path)
        assert meta["name"] == path.name.removesuffix(".json.xz") and meta["description"]
        assert meta["source"].get("trace")


# --------------------------------------------------------------------------- the registry


def test_registry_ids_are_ordered_distinct_and_of_their_kind():
    ids = [r.id for r in REGISTRY.rules]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"(STR|PHS)\d{3}", i) for i in ids)
    for r in REGISTRY.rules:
        assert r.kind == ("structure" if r.id.startswith("STR") else "phase")
        assert r.contract.endswith(".") and r.source and r.decides and r.needs


def test_every_rule_was_added_by_a_changelog_entry():
    headings = set(re.findall(r"^### (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M))
    missing = {r.id: r.added for r in REGISTRY.rules if r.added not in headings}
    assert missing == {}


def test_every_vocabulary_and_threshold_is_read_by_a_rule():
    read = {k for r in REGISTRY.rules for k in r.reads}
    data = set(REGISTRY.vocabulary) | set(REGISTRY.thresholds.as_dict())
    # the stage groups the walk reads everywhere are shared by all its rules
    shared = {"generic_stages", "sampling_like_stages", "moe_routing_stages", "norm_words"}
    assert data - read - shared == set()


def test_every_rule_is_looked_up_by_the_code():
    # every module of the analyses (a rule's code is looked up where the rule is applied)
    src = "".join(
        p.read_text(encoding="utf-8") for p in sorted((ROOT / "analyzer" / "analyses").rglob("*.py"))
    )
    names = {r.name for r in REGISTRY.rules}
    looked_up = set(re.findall(r'(?:_ID|code_of|id_of)\("([a-z0-9-]+)"\)', src))
    regions = {f"region-{reg.replace('_', '-')}" for reg in REGISTRY.regions if reg != "moe_experts"}
    assert names - looked_up - regions == set()


# --------------------------------------------------------------------------- thresholds


def test_a_threshold_override_changes_the_answer():
    # GIVEN a speculative run whose target verifies two candidates per step
    trace, _ = read_case(ROOT / "tests" / "cases" / "llama-assisted-verify.json.xz")
    before = analyze_trace(trace).steps
    # WHEN a decode step may score at most one token per sequence
    after = analyze_trace(trace, Options(settings={"structure.max_verify_tokens": "1"})).steps
    # THEN the verify steps are prefills of two tokens, and the rule that said so is named
    assert (before["phase_rule"] == "PHS008").any()
    assert not (after["phase_rule"] == "PHS008").any()


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("structure.max_verify_tokens", "0", "out of range"),
        ("structure.prefill_work_ratio", "fast", "must be a number"),
        ("structure.no_such", "1", "no such threshold"),
    ],
)
def test_bad_threshold_overrides_are_usage_errors(key, value, needle):
    with pytest.raises(UsageError, match=needle):
        with_overrides(REGISTRY, {key: value})


def test_a_file_that_is_no_case_is_bad_input(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(InputError, match="not a structure-rule case"):
        read_case(bad)


def test_a_case_round_trips_plain_and_compressed(tmp_path):
    from analyzer.readers.case import case_document, write_case

    # GIVEN a committed case WHEN written again, plain and xz-compressed, and read back
    trace, meta = read_case(CASES[0])
    doc = case_document(trace, **meta)
    for name in ("a.json", "a.json.xz"):
        write_case(doc, tmp_path / name)
        again, rest = read_case(tmp_path / name)
        # THEN the tables and the expectations are the same
        assert again.kernels.equals(trace.kernels) and rest == meta
    # AND a corrupt compressed file is bad input, not a traceback
    (tmp_path / "b.json.xz").write_bytes(b"not xz")
    with pytest.raises(InputError, match="cannot read case"):
        read_case(tmp_path / "b.json.xz")


def test_a_retired_rule_is_explained_as_retired(capsys):
    from analyzer.cli import main

    assert main(["rules", "explain", "PHS016"]) == 0
    out = capsys.readouterr().out
    assert "PHS016 is retired" in out and "PHS027" in out
