"""The structure driver keeps the registry's order, and a rule's decisions reach the kernels only
through the driver (analyses/structure_run.py, analyses/walk/decisions.py, walk/grammar.py)."""

from __future__ import annotations

import array
from collections import Counter

import numpy as np

from analyzer.analyses.structure_run import PASSES_AFTER_WALK, PASSES_BEFORE_WALK, StructureRun
from analyzer.analyses.walk.decisions import Decisions
from analyzer.analyses.walk.grammar import WALK_STEPS
from analyzer.analyses.walk.registry import KNOWLEDGE


def _steps() -> list[tuple[str, ...]]:
    """Every step of the structure pass in the order the code runs it: the embedding lookup (with
    the op hints, before the structure pass), the passes before the walk, the walk's steps, its
    self-check, the passes after it, then the run-wide checks of what the walk cannot explain and
    the shape roles."""
    return [
        ("embedding-lookup",),
        *[(p.rule,) for p in PASSES_BEFORE_WALK],
        *WALK_STEPS,
        ("structure-self-check",),
        *[(p.rule,) for p in PASSES_AFTER_WALK],
        ("foreign-op-in-region",),
        ("activation-in-attention-input",),
        ("gemm-without-role-in-layer",),
        ("attention-outside-layers",),
        ("shape-roles",),
    ]


def test_the_driver_applies_the_rules_in_the_registrys_order() -> None:
    # GIVEN every step of the structure pass, by the rules it applies
    steps = _steps()
    codes = [sorted(KNOWLEDGE.code_of(name) for name in step) for step in steps]
    # THEN each step's rules are one stretch of the registry, and the stretches follow each other in
    # the order the steps run: the registry's order is the order the code applies them
    for step, c in zip(steps, codes, strict=True):
        assert c == list(range(c[0], c[0] + len(c))), f"{step} is not one stretch of the registry"
    firsts = [c[0] for c in codes]
    assert firsts == sorted(firsts)
    # AND every structure rule of the registry is run by exactly one step
    named = Counter(name for step in steps for name in step)
    structure = {r.name for r in KNOWLEDGE.rules if r.kind == "structure"}
    assert set(named) == structure and max(named.values()) == 1


def test_every_rule_group_is_decided_and_gates_registered_rules() -> None:
    # GIVEN the registry's groups WHEN the driver decides their preconditions on an empty run
    run = StructureRun(
        [], array.array("h"), [], {}, [], np.zeros(0, np.int64), *[np.zeros(0, bool)] * 6, None, None,
        np.zeros(0, np.int64),
    )  # fmt: skip
    import pyarrow as pa

    run.decide_groups(KNOWLEDGE, pa.array([], pa.string()).dictionary_encode(), {})
    # THEN every group has an answer (nothing launched: none holds), and a rule of a group that
    # did not hold does not run while a rule of no group always does
    assert set(run.groups) == {g.name for g in KNOWLEDGE.groups}
    assert not any(run.groups.values())
    for g in KNOWLEDGE.groups:
        assert all(not run.runs(rule) for rule in g.rules)
    assert run.runs("role-qkv") and run.runs("region-attn-in")


def test_a_rules_decisions_reach_the_kernels_only_when_applied() -> None:
    # GIVEN a stage list, its typed rule codes and a rule's decisions over them
    stage = ["elementwise", "gemm", "elementwise", "norm"]
    why = array.array("h", [0, 0, 0, 0])
    d = Decisions(stage, why)
    # WHEN the rule decides: one kernel alone, then a run of kernels, then a code-only run
    d.stage[0] = "rope"
    d.why[0] = 7
    d.label([2, 3], "residual_add", 9)
    d.label(np.array([1]), None, 4)
    d.count(5, 2)
    # THEN it reads its own decision and the kernels' stage elsewhere, and nothing is written yet
    assert d.stage[0] == "rope" and d.stage[1] == "gemm"
    assert stage == ["elementwise", "gemm", "elementwise", "norm"] and list(why) == [0, 0, 0, 0]
    # WHEN the driver applies them
    counts: Counter = Counter()
    d.apply(stage, why, counts)
    # THEN every decision is written, a code-only run keeps the stage, and the counts are added
    assert stage == ["rope", "gemm", "residual_add", "residual_add"]
    assert list(why) == [7, 4, 9, 9] and counts == Counter({5: 2})


def test_an_empty_decision_set_is_falsy_and_changes_nothing() -> None:
    stage, why = ["gemm"], {0: 1}
    d = Decisions(stage, why)
    assert not d
    d.apply(stage, why)
    assert stage == ["gemm"] and why == {0: 1}
