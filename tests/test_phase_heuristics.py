"""Unit tests on hand-built values for the step heuristics of analyzer/analyses/phases/.

They pin what must stay true of each heuristic (a Llama-like SDPA run, the nesting rules of engine
annotations), not its known failures: the generalization work may replace a heuristic together with
its tests, saying so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.analyses.phases import (
    PREFILL_WORK_RATIO,
    StepAnnotation,
    StepLabel,
    _depth_models,
    _every_token_scored,
    _is_packed,
    _label_from_signature,
    _padded_or_replayed,
    forward_starts,
    merge_nested,
    packed_decode_tokens,
    phase_from_shape,
    unshaped_prefill_runs,
)

ROOT = Path(__file__).resolve().parents[1]

LAYER = ["norm", "qkv_gemm", "rope", "kv_cache_store", "flash_attention", "o_gemm", "residual_add"]
LAYER += ["norm", "gate_up_gemm", "activation", "down_gemm", "residual_add"]


def forward(layers: int, embedding: bool = True) -> list[str]:
    head = ["embedding"] if embedding else []
    return head + LAYER * layers + ["norm", "lm_head_gemm", "sampling"]


def ann(
    start: int, end: int, phase: str = "unknown", tokens: int | None = None, name: str = "s"
) -> StepAnnotation:
    return StepAnnotation(start, end, "cpu", phase, tokens, name, 0, 0)


# --------------------------------------------------------------------------- forward_starts


def test_each_embedding_starts_a_forward() -> None:
    # GIVEN three forwards of a two-layer model, each opening with an embedding lookup
    stages = np.array(forward(2) * 3)
    # WHEN the forward starts are found
    got = forward_starts(stages)
    # THEN there is one per forward, at its embedding
    n = len(forward(2))
    assert got.tolist() == [0, n, 2 * n]


def test_consecutive_embedding_kernels_start_one_forward() -> None:
    # a gather followed by a scale kernel, both embedding: one forward, not two
    one = ["embedding", *forward(1)]
    stages = np.array(one * 2)
    assert forward_starts(stages).tolist() == [0, len(one)]


def test_a_position_lookup_after_the_mask_work_starts_no_forward() -> None:
    # GIVEN forwards that look up tokens, build the mask, then look up learned positions (OPT)
    one = ["embedding", "elementwise", "elementwise", "embedding", *forward(1)[1:]]
    stages = np.array(one * 2)
    # THEN each forward starts once, at its token lookup
    assert forward_starts(stages).tolist() == [0, len(one)]


def test_without_embedding_a_forward_starts_after_lm_head() -> None:
    # GIVEN forwards without an embedding kernel (e.g. a graph that starts at the first norm)
    stages = np.array(forward(2, embedding=False) * 3)
    # WHEN the forward starts are found
    got = forward_starts(stages)
    # THEN the first kernel and the first norm/QKV/attention after every lm_head GEMM start one
    n = len(forward(2, embedding=False))
    assert got.tolist() == [0, n, 2 * n]


def test_an_lm_head_misread_inside_a_forward_opens_no_forward() -> None:
    # GIVEN three forwards, each opening with a lookup and ending in its LM head, where the walk
    # misread a GEMM inside the first forward's layers as an LM head (DeepSeek-V4's)
    one = forward(2)
    n, mid = len(one), len(forward(1)) - 1
    first = list(one)
    first[mid] = "lm_head_gemm"
    stages = np.array(first + one * 2)
    # WHEN the forward starts are found
    got = forward_starts(stages)
    # THEN only the lookups start forwards: the misread head is not the forward's last
    assert got.tolist() == [0, n, 2 * n]
    # AND where the forwards run without lookups of their own (graph replays), every LM head still
    # ends one
    bare = np.array(forward(2, embedding=False) * 3)
    assert len(forward_starts(bare)) == 3


def test_a_lookup_inside_the_layers_starts_no_forward() -> None:
    # GIVEN three forwards whose second layer gathers its tokens with an op the hints call an
    # embedding lookup (a MoE block's index_select), each forward ending in its LM head
    one = ["embedding"] + LAYER + ["embedding"] + LAYER + ["norm", "lm_head_gemm", "sampling"]
    stages = np.array(one * 3)
    # WHEN the forward starts are found
    dropped: list[int] = []
    got = forward_starts(stages, dropped)
    # THEN only each forward's first lookup starts one (PHS037), and the inner ones are reported
    n, inner = len(one), 1 + len(LAYER)
    assert got.tolist() == [0, n, 2 * n]
    assert dropped == [inner, n + inner, 2 * n + inner]
    # AND without LM heads (the layers alone) every lookup still starts a forward
    bare = np.array([s for s in one if s != "lm_head_gemm"] * 2)
    assert len(forward_starts(bare)) == 4


def test_no_attention_no_embedding_means_no_forward() -> None:
    stages = np.array(["gemm", "elementwise", "gemm"])
    assert forward_starts(stages).tolist() == []


def test_an_lm_head_at_the_very_end_starts_nothing() -> None:
    stages = np.array(forward(1, embedding=False))
    assert forward_starts(stages).tolist() == [0]


# --------------------------------------------------------------------------- merge_nested


def test_an_annotation_inside_another_is_one_step() -> None:
    # GIVEN an engine's outer range and its inner step range, the inner one knowing the phase
    outer = ann(0, 1000, "unknown", None, "execute_model")
    inner = ann(10, 990, "decode", 8, "step[decode]")
    # WHEN merged
    (got,) = merge_nested([outer, inner])
    # THEN one step: the outer range, the known phase and tokens, the shorter name
    assert (got.start_ns, got.end_ns, got.phase, got.tokens, got.name) == (
        0,
        1000,
        "decode",
        8,
        "step[decode]",
    )


def test_disagreeing_phases_of_one_step_are_mixed() -> None:
    (got,) = merge_nested([ann(0, 100, "prefill", 40), ann(0, 100, "decode", 8)])
    assert got.phase == "mixed"
    assert got.tokens == 40  # the first known count wins


def test_annotations_that_barely_overlap_stay_apart() -> None:
    # overlap below half of the shorter range: consecutive steps, not one step
    got = merge_nested([ann(0, 100, "prefill"), ann(90, 200, "decode")])
    assert [(a.start_ns, a.end_ns, a.phase) for a in got] == [(0, 100, "prefill"), (90, 200, "decode")]


def test_back_to_back_steps_stay_apart() -> None:
    steps = [ann(i * 100, i * 100 + 100, "decode", 1) for i in range(5)]
    assert merge_nested(steps) == steps


def test_merge_is_empty_on_empty() -> None:
    assert merge_nested([]) == []


# --------------------------------------------------------------------------- signature labeller


def signature_frame(durations: list[list[float]]) -> tuple[list[np.ndarray], pd.DataFrame]:
    """Segments of kernels, each kernel heavy (a GEMM/attention) with the given duration."""
    dur, segments, at = [], [], 0
    for seg in durations:
        dur.extend(seg)
        segments.append(np.arange(at, at + len(seg)))
        at += len(seg)
    df = pd.DataFrame({"dur": np.asarray(dur, float), "is_heavy": np.ones(len(dur), bool)})
    return segments, df


def test_one_long_step_before_short_ones_is_prefill() -> None:
    # GIVEN a prompt step whose heavy kernels run 20x longer than those of the steps after it
    segments, df = signature_frame([[200.0] * 4] + [[10.0] * 4] * 6)
    # WHEN labelled by signature
    got = _label_from_signature(segments, df)[0]
    # THEN that step is prefill and the rest decode
    assert got == ["prefill"] + ["decode"] * 6


def test_steps_of_similar_work_are_all_decode() -> None:
    segments, df = signature_frame([[10.0, 11.0]] * 5)
    assert _label_from_signature(segments, df)[0] == ["decode"] * 5


def test_work_just_below_the_ratio_is_not_prefill() -> None:
    base = 10.0
    segments, df = signature_frame([[base * PREFILL_WORK_RATIO * 0.99]] + [[base]] * 4)
    assert _label_from_signature(segments, df)[0] == ["decode"] * 5


def test_a_single_step_is_never_decided_by_its_position() -> None:
    # a lone forward may be a prefill, a decode step cut from a longer run or a scoring pass: with no
    # shapes and no kernel that engines run in one phase only, it has no phase (PHS027)
    segments, df = signature_frame([[50.0, 60.0]])
    phases, rules = _label_from_signature(segments, df)
    assert phases == ["unknown"] and rules == ["PHS027"]


def test_a_step_under_names_the_other_steps_never_run_is_prefill() -> None:
    # GIVEN a small model whose prompt step is hardly slower but picks other GEMM tiles
    segments, df = signature_frame([[11.0] * 4] + [[10.0] * 4] * 5)
    df["name"] = np.where(np.arange(len(df)) < 4, 1, 0)
    # THEN the step with novel kernel names is prefill, the repeated ones decode
    assert _label_from_signature(segments, df)[0] == ["prefill"] + ["decode"] * 5


def test_a_rare_kernel_name_in_a_decode_step_does_not_make_it_prefill() -> None:
    segments, df = signature_frame([[10.0] * 10] * 5)
    df["name"] = 0
    df.loc[25, "name"] = 7  # one kernel of ten in step 2 under another name
    assert _label_from_signature(segments, df)[0] == ["decode"] * 5


def test_query_layouts_decide_decode_verify_and_prefill() -> None:
    assert phase_from_shape(2, 1, 49) == "decode"
    assert phase_from_shape(1, 2, 50) == "decode"  # a speculation being verified
    assert phase_from_shape(2, 48, 48) == "prefill"
    assert phase_from_shape(1, 48, 96) == "prefill"  # a long chunk appended to the cache
    assert phase_from_shape(1, 2, -1) == "prefill"  # no key length: not a continuation


def test_a_sink_column_in_composed_scores_is_no_cached_context() -> None:
    # GIVEN a composed attention's softmax over [scores | one sink column] (gpt-oss): a 16-token
    # prefill shows 17 columns, its decodes 18, 19 ...
    # THEN the prefill is a prefill, not a verify of 16 candidates over a one-token context
    assert phase_from_shape(2, 16, 17, 16, scores=True) == "prefill"
    assert phase_from_shape(2, 1, 18, 16, scores=True) == "decode"
    # AND a verify of 4 candidates over 12 cached keys (plus the sink) is still a verify
    assert phase_from_shape(1, 4, 17, 16, scores=True) == "decode"
    # AND keys read from the keys themselves (not the scores) keep the one-token-context reading
    assert phase_from_shape(2, 16, 17, 16) == "decode"


def test_light_kernels_do_not_decide_when_heavy_ones_exist() -> None:
    # GIVEN steps whose heavy kernels agree but one step also ran a long light kernel
    segments, df = signature_frame([[10.0, 500.0]] + [[10.0, 1.0]] * 4)
    df.loc[1, "is_heavy"] = False
    for seg in segments[1:]:
        df.loc[seg[1], "is_heavy"] = False
    # THEN the light kernel's time does not make it prefill
    assert _label_from_signature(segments, df)[0] == ["decode"] * 5


# --------------------------------------------------------------------------- packed steps


def test_packed_steps_count_decodes_by_request_bookkeeping() -> None:
    # GIVEN a continuous batcher with a 48-token budget over prompts of 56, 24, 40 and 72 tokens:
    # (queries, keys, LM-head rows) of each step, the first one unpacked (one request)
    steps = [(48, 48, 1), (48, 96, 3), (48, 144, 4), (48, 192, 4), (8, 200, 4), (4, 204, 4)]
    packed = [False, True, True, True, True, True]
    # THEN the step after a full one continues its cut prompt (pure chunked prefill), later steps
    # decode every continued request but the one cut, and one token per row is decode
    assert packed_decode_tokens(steps, packed) == [None, 0, 2, 3, 3, 4]


def test_packed_steps_stay_undecided_when_requests_left_or_counts_contradict() -> None:
    # GIVEN keys less queries that are not the previous step's keys: some request finished between
    assert packed_decode_tokens([(48, 96, 3), (40, 120, 4)], [True, True])[1] is None
    # GIVEN fewer LM-head rows than the requests the cached context says continue
    assert packed_decode_tokens([(10, 10, 5), (20, 30, 3)], [True, True]) == [0, None]
    # GIVEN no cached context: a prefill of new prompts, whatever came before
    assert packed_decode_tokens([(1, 50, 1), (30, 30, 3)], [False, True]) == [None, 0]


def test_back_to_back_prefills_without_token_counts_are_in_doubt() -> None:
    # GIVEN steps told from kernels alone (no token counts): three prefills in a row, then decodes
    told = [StepLabel("prefill"), StepLabel("prefill"), StepLabel("prefill"), StepLabel("decode")]
    # THEN the two that follow a prefill may be mixed; one prefill before decodes, prefills whose
    # shapes gave their tokens, and a draft's prefill before its target's are not in doubt
    assert unshaped_prefill_runs(told) == [1, 2]
    assert unshaped_prefill_runs([StepLabel("prefill"), StepLabel("decode"), StepLabel("prefill")]) == []
    assert unshaped_prefill_runs([StepLabel("prefill", 48), StepLabel("prefill", 48, 48, 0)]) == []
    draft_then_target = [StepLabel("prefill", model="draft"), StepLabel("prefill", model="target")]
    assert unshaped_prefill_runs(draft_then_target) == []


def test_a_batchers_steps_without_shapes_leave_prompt_chunks_unknown() -> None:
    # GIVEN a continuous batcher's run captured without shapes: two prompt chunks, three steps of
    # chunks beside decodes (mixed), then decodes
    from analyzer.cli.check_cmd import analyze_stripped

    path = ROOT / "fixtures" / "zoo" / "qwen2-cb-paged-eager-bf16" / "trace.json.gz"
    a = analyze_stripped(str(path), False, (), None, None)
    # THEN the first step is a prefill, the decodes are decode, and the steps between, which
    # kernels alone cannot tell from mixed ones, are unknown with a warning saying why
    assert a.steps["phase"].tolist() == ["prefill"] + ["unknown"] * 4 + ["decode"] * 5
    assert any("4 steps run a prefill's kernels right after another prefill step" in w for w in a.warnings)


def test_padded_packed_steps_and_their_graph_replays_have_no_phase() -> None:
    # GIVEN a continuous batcher's steps: two eager packed steps whose key length is the cache's
    # size both times (padded for its CUDA graph), then two graph replays without shapes
    segments = [np.arange(0, 2), np.arange(2, 4), np.arange(4, 6), np.arange(6, 8)]
    df = {"graph": np.array([False] * 4 + [True] * 4)}
    hits = [(1, 48, 1680, (2, 32)), (1, 48, 1680, (2, 32)), None, None]
    # THEN none of them is labelled
    assert _padded_or_replayed(segments, df, hits, [True, True, False, False]) == [0, 1, 2, 3]
    # GIVEN packed steps whose key length grows (real, unpadded): only the replays are undecided
    hits = [(1, 48, 96, (2, 32)), (1, 48, 144, (2, 32)), None, None]
    assert _padded_or_replayed(segments, df, hits, [True, True, False, False]) == [2, 3]
    # GIVEN no packed step at all (static batching): graph replays keep their decode label
    assert _padded_or_replayed(segments, df, [(2, 48, 48, (2, 32)), None, None, None], [False] * 4) == []


def test_packing_is_more_lm_head_rows_than_sequences_but_fewer_than_tokens() -> None:
    assert _is_packed(1, 48, 4)  # four requests' 48 tokens in one attention call
    assert not _is_packed(1, 48, 48)  # a prefill scoring every position (full logits)
    assert not _is_packed(1, 2, 2)  # a speculation's verify scoring both candidates
    assert not _is_packed(2, 32, 64)  # two sequences, every position scored
    assert not _is_packed(4, 1, 4)  # plain batched decode


def test_identical_prefills_and_unknown_key_lengths_are_not_padding() -> None:
    segments = [np.arange(0, 2), np.arange(2, 4)]
    df = {"graph": np.zeros(4, bool)}
    # GIVEN two packed prefills of new prompts (keys as long as the queries) or unknown key lengths
    for kv in (48, -1):
        hits = [(1, 48, kv, (2, 32)), (1, 48, kv, (2, 32))]
        # THEN they are not padded steps of a graph
        assert _padded_or_replayed(segments, df, hits, [True, True]) == []


def test_a_full_step_without_a_budget_cap_leaves_the_split_undecided() -> None:
    # GIVEN prompts A + B in one 80-token step (the largest step, reached once), then A and B
    # continue beside a new 40-token prompt: cut or not, both readings fit
    assert packed_decode_tokens([(80, 80, 2), (42, 122, 3)], [True, True]) == [0, None]


def test_two_alternating_depths_are_draft_and_target() -> None:
    assert _depth_models([1, 2, 1, 2, 1, 2]) == ["draft", "target"] * 3
    assert _depth_models([2, 2, 2, 2]) is None  # one model
    assert _depth_models([1, 2, 2, 2, 1, 1]) is None  # two switches: phases of one run, not a pair
    assert _depth_models([3, 4, 3, 4, 3, 4]) is None  # similar depths: not a draft beside a target
    assert _depth_models([1, 2, 0, 1, 2, 1, 2]) == ["draft", "target", "target"] + ["draft", "target"] * 2


def test_one_sequence_scoring_every_token_over_a_cache_is_flagged() -> None:
    # GIVEN steps as (batch, queries, keys, model key) and the LM-head rows: a batcher's step of 24
    # decodes packed into one sequence; a prefill of one sequence with every logit kept (no cache);
    # a batch of two sequences; a step scoring one row
    hits = [(1, 24, 400, (2, 32)), (1, 48, 48, (2, 32)), (2, 3, 60, (2, 32)), (1, 24, 400, (2, 32))]
    # THEN only the first scores every token of one sequence over a cached context
    assert _every_token_scored(hits, [24, 48, 6, 1]) == [True, False, False, False]
    assert _every_token_scored([None], [5]) == [False]
