"""Engine traces without their annotations (analyzer/results/engine_phases.py): the phases their own
kernels give, scored against the annotations they had (docs/accuracy.md, "Engine traces")."""

from __future__ import annotations

import pytest

from analyzer.results.engine_phases import engine_phase_agreement, without_annotations
from analyzer.runtime.driver import load_inputs
from tests.conftest import shared

DECODE_BY_KERNELS = [
    # (trace, the rule whose family says decode)
    (
        "sglang-deepseek-llama8b-decode-mi300x-vs-b300/MI300/1782841132.2905657-TP-0-DECODE.trace.json.gz",
        "ATT715",
    ),
    (
        "sglang-deepseek-llama8b-decode-mi300x-vs-b300/B300/1782843274.7730265-TP-0-DECODE.trace.json.gz",
        "ATT030",
    ),
    ("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_decode.json.gz", "ATT715"),
]
NO_EVIDENCE = [
    # one step whose attention families engines run in both phases: never decided by its position
    "mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz",
    "mi300x-vllm-gptoss-decode-fullgraph/graph_execution.json.gz",
]


@pytest.mark.parametrize(
    ("rel", "rule"), DECODE_BY_KERNELS, ids=[r[0].split("/")[-1][:24] for r in DECODE_BY_KERNELS]
)
def test_a_decode_step_without_annotations_is_decode_by_its_kernels(rel, rule):
    # GIVEN an engine's decode step with every annotation but ProfilerStep removed
    trace = load_inputs([str(shared(rel))])
    r = engine_phase_agreement(trace)
    # THEN its own kernels decide it: decode, as the annotation said, and nothing is wrong
    assert r["agreement"] >= 0.99 and r["wrong"] == 0.0, r
    assert r["phase_rules"] == ["PHS025"]
    from analyzer.pipeline import analyze_trace

    k = analyze_trace(without_annotations(trace)).kernels
    assert rule in set(k["rule_id"].combine_chunks().cast("string").to_pylist())


@pytest.mark.parametrize("rel", NO_EVIDENCE, ids=[r.split("/")[-1][:24] for r in NO_EVIDENCE])
def test_a_lone_step_without_evidence_is_unknown_never_a_guess(rel):
    trace = load_inputs([str(shared(rel))])
    r = engine_phase_agreement(trace)
    assert r["wrong"] == 0.0 and r["undecided"] > 0.99, r
    assert r["phase_rules"] == ["PHS027"]
