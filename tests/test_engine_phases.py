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
    # one graph-replayed step whose attention families engines run in both phases and whose
    # launches record no grid: never decided by its position
    "mi300x-vllm-gptoss-decode-fullgraph/graph_execution.json.gz",
]
EXTEND = "mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz"


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


def test_a_lone_extend_step_is_prefill_by_its_attention_grid():
    # GIVEN SGLang's extend step (ck_tile batch prefill on MI300X) with its annotations removed
    trace = load_inputs([str(shared(EXTEND))])
    r = engine_phase_agreement(trace)
    # THEN the attention launch's grid (query tiles >= 2 on both of its rule's axes) says prefill
    assert r["agreement"] >= 0.99 and r["wrong"] == 0.0, r
    assert r["phase_rules"] == ["PHS030"]


def test_the_grid_evidence_needs_every_query_tile_axis_at_two_or_more():
    # GIVEN the same step with the attention launches' query-tile axis (z: group mode) set to 1, as a
    # decode launch (one query token per sequence) of the same family has it
    import dataclasses

    import pyarrow as pa
    import pyarrow.compute as pc

    from analyzer.pipeline import analyze_trace

    trace = without_annotations(load_inputs([str(shared(EXTEND))]))
    k = trace.kernels
    ck = pc.match_substring(k["name"].cast(pa.string()), "FmhaBatchPrefill")
    assert pc.sum(ck.cast(pa.int64())).as_py() > 0
    z = pc.if_else(ck, pa.scalar(1, k["grid_z"].type), k["grid_z"])
    flat = dataclasses.replace(trace, kernels=k.set_column(k.schema.get_field_index("grid_z"), "grid_z", z))
    steps = analyze_trace(flat).steps
    # THEN no kernel says prefill any more: the lone step is unknown, never a guess
    assert steps["phase"].tolist() == ["unknown"] and steps["phase_rule"].tolist() == ["PHS027"]


def test_an_eager_decode_counts_its_tokens_from_the_decode_kernels_grid():
    # GIVEN the MI300X SGLang decode step as an eager capture records it (tests/cases/derive.py:
    # aiter's ll4mi paged attention launches (sequences, partitions, KV heads)), no annotations
    from analyzer.pipeline import analyze_trace
    from analyzer.readers.case import read_case
    from tests.conftest import ROOT

    derived, _ = read_case(ROOT / "tests/cases/derived-eager-decode-grids.json.xz")
    steps = analyze_trace(derived).steps
    # THEN the grid gives the step's tokens: 16, as the engine's annotation said
    truth = analyze_trace(load_inputs([str(shared(DECODE_BY_KERNELS[0][0]))])).steps
    assert truth["decode_tokens"].tolist() == [16]
    assert steps["phase"].tolist() == ["decode"] and steps["tokens"].tolist() == [16]
    assert "PHS031" in steps["phase_evidence"].iloc[0]


def test_two_streams_interleaving_in_one_forward_are_one_step():
    # GIVEN (synthetic, from a real zoo capture) Qwen2-MoE's prefill and decode steps without
    # annotations, with every attention kernel moved to a second stream and started halfway into
    # the kernel before it, as engines overlap work on two streams within one forward
    import dataclasses

    import numpy as np
    import pyarrow as pa

    from analyzer.pipeline import analyze_trace
    from tests.conftest import ROOT

    trace = without_annotations(load_inputs([str(ROOT / "fixtures/zoo/qwen2-moe-bmm-bf16/trace.json.gz")]))
    base = analyze_trace(trace)
    k = trace.kernels
    order = np.argsort(k["start_ns"].to_numpy(zero_copy_only=False), kind="stable")
    stage = np.asarray(base.kernels["stage"].cast(pa.string()).to_pylist(), object)
    start = k["start_ns"].to_numpy(zero_copy_only=False).copy()
    dur = k["dur_ns"].to_numpy(zero_copy_only=False)
    stream = k["stream"].to_numpy(zero_copy_only=False).copy()
    moved = 0
    for prev, i in zip(order[:-1], order[1:], strict=True):
        if stage[i] in ("flash_attention", "attention") and dur[prev] > 1:
            start[i] = start[prev] + dur[prev] // 2
            stream[i] = stream[i] + 1
            moved += 1
    assert moved >= 4
    k = k.set_column(k.schema.get_field_index("start_ns"), "start_ns", pa.array(start, k["start_ns"].type))
    k = k.set_column(k.schema.get_field_index("stream"), "stream", pa.array(stream, k["stream"].type))
    got = analyze_trace(dataclasses.replace(trace, kernels=k))
    # THEN the steps are those of the one-stream capture: the overlap cuts no step, phases stay
    assert len(got.steps) == len(base.steps)
    assert got.steps["phase"].tolist() == base.steps["phase"].tolist()
    assert got.kernels["step"].to_pylist() == base.kernels["step"].to_pylist()
