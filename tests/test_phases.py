"""Phases: the analyser's own prefill/decode split against ground-truth labels, and annotations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from analyzer.analyses import phases
from analyzer.knowledge.annotations import load_annotation_patterns
from analyzer.model import ANNOTATION_SCHEMA, table_from_columns
from analyzer.pipeline import analyze_trace
from tests import gt
from tests.conftest import H200_TRACES, shared
from tests.runs import load_inputs


@pytest.mark.parametrize("path", H200_TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_split_matches_ground_truth(path) -> None:
    # GIVEN an H200 trace with its gt_phase labels removed before analysis
    trace, labels = gt.strip_labels(load_inputs([str(path)]))
    assert labels.num_rows > 0
    a = analyze_trace(trace)
    k = a.kernels
    want, want_step = gt.labelled_phases(k, labels)
    got = np.array(k["phase"].to_pylist(), dtype=object)
    dur = k["dur_ns"].to_numpy()
    labelled = want != None  # noqa: E711 - object array
    # THEN >= 99.5% of labelled kernel time has the labelled phase
    match = dur[labelled & (got == want)].sum() / dur[labelled].sum()
    assert match >= 0.995, match
    # and every labelled step boundary has an analyser step boundary within one kernel
    order = np.argsort(k["start_ns"].to_numpy(), kind="stable")
    ws, gs = want_step[order], k["step"].to_numpy(zero_copy_only=False)[order]
    want_b = [i for i in np.flatnonzero(np.diff(ws) != 0) + 1 if ws[i] >= 0]
    got_b = set((np.flatnonzero(np.diff(gs) != 0) + 1).tolist())
    tol = 1
    missed = [b for b in want_b if not (set(range(b - tol, b + tol + 1)) & got_b)]
    assert not missed, missed
    # one analyser step per labelled forward
    assert a.steps["step"].nunique() == labels.num_rows


def test_tp2_graph_steps_open_with_their_buffer_fills() -> None:
    # The TP engine resets its static input buffers (eager fills) right before replaying the decode
    # graph: those fills open the decode step, the step boundary is not the graph launch itself.
    trace, _ = gt.strip_labels(load_inputs([str(H200_TRACES[2])]))
    a = analyze_trace(trace)
    k = a.kernels.to_pandas().sort_values("start_ns", kind="stable")
    for _, g in k[k["phase"] == "decode"].groupby("step"):
        first = g.iloc[0]
        assert not first["graph_launch"] and "FillFunctor" in str(first["norm_name"])


def test_phase_summary_numbers() -> None:
    from analyzer.results.summary import build_summary

    trace, _ = gt.strip_labels(load_inputs([str(H200_TRACES[0])]))
    s = build_summary(analyze_trace(trace))
    pre, dec = s["phases"]["prefill"], s["phases"]["decode"]
    assert (pre["steps"], dec["steps"]) == (1, 23)
    assert pre["tokens"] == 4 * 512 and dec["tokens"] == 23 * 4
    # decode step p50 is the inter-token latency: recompute from the steps list
    d = sorted(x["dur_ns"] for x in s["steps"] if x["phase"] == "decode")
    assert dec["step_ns"]["p50"] == int(np.percentile(d, 50))
    shares = sum(r["share"] for r in dec["profile"])
    assert shares == pytest.approx(1.0)


@pytest.mark.parametrize(
    "name,expect",
    [
        ("step[EXTEND bs=15 toks=15360]", ("sglang", "prefill", 15360)),
        ("step[DECODE bs=32]", ("sglang", "decode", 32)),
        ("step[MIXED bs=8 toks=300]", ("sglang", "mixed", 300)),
        (
            "execute_15360_context_15(sq15360sk15360sqsq15360sqsk15360)_generation_0(sq0sk0sqsq0sqsk0)",
            ("vllm-detailed", "prefill", 15360),
        ),
        (
            "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk7000sqsq1sqsk7000)",
            ("vllm-detailed", "decode", 32),
        ),
        ("execute_40_context_1(sq8sk8)_generation_32(sq32sk900)", ("vllm-detailed", "mixed", 40)),
        ("execute_new_4_cached_0", ("vllm", "prefill", None)),
        ("execute_new_0_cached_16", ("vllm", "decode", None)),
        ("execute_new_2_cached_6", ("vllm", "mixed", None)),
        ("prefill[bs=4]", ("atom", "prefill", None)),
        ("decode[bs=64]", ("atom", "decode", None)),
        ("lkm::step phase=prefill q=512 bs=4 kv=512", ("lkm", "prefill", 2048)),
        ("lkm::step phase=decode q=1 bs=4 kv=513", ("lkm", "decode", 4)),
        ("decode_step", ("range", "decode", None)),
        ("capture_32_DECODE", ("graph-capture", None, None)),
    ],
)
def test_engine_annotations(name: str, expect: tuple) -> None:
    got = phases.parse_annotation(name, load_annotation_patterns())
    assert got is not None and (got.engine, got.phase, got.tokens) == expect


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        # (prefill_tokens, decode_tokens, model, verify_k)
        ("lkm::step phase=prefill q=48 bs=2 kv=48", (96, 0, "target", None)),
        ("lkm::step phase=mixed q=12 bs=4 kv=57 prefill_tokens=46 decode_tokens=2", (46, 2, "target", None)),
        ("lkm::step phase=decode q=2 bs=1 kv=49 model=draft", (0, 2, "draft", None)),
        ("lkm::step phase=decode q=2 bs=1 kv=50", (0, 2, "target", 2)),
        ("lkm::step phase=decode q=1 bs=4 kv=73", (0, 4, "target", None)),
        ("lkm::step phase=prefill q=5 bs=1 kv=5 tokens=9", (9, 0, "target", None)),
        ("execute_new_2_cached_6", (None, None, "target", None)),
    ],
)
def test_annotation_token_kinds_model_and_verify_width(name: str, expect: tuple) -> None:
    got = phases.parse_annotation(name, load_annotation_patterns())
    assert got is not None and (got.prefill_tokens, got.decode_tokens, got.model, got.verify_k) == expect


@pytest.mark.parametrize(
    "name", ["ProfilerStep#3", "aten::mm", "gt_phase::prefill::q512", "nccl:all_reduce", "my_decoder_block"]
)
def test_not_step_annotations(name: str) -> None:
    assert phases.parse_annotation(name, load_annotation_patterns()) is None


def test_sglang_annotated_steps_are_used_exactly() -> None:
    paths = [
        shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz"),
        shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_decode.json.gz"),
    ]
    a = analyze_trace(load_inputs([str(p) for p in paths]))
    k = a.kernels.to_pandas()
    assert set(a.annotations_found) >= {"sglang"}
    # every kernel launched inside the annotated step gets its phase: 100% consistent
    assert set(k.loc[k["trace_id"] == 0, "phase"]) == {"prefill"}
    assert set(k.loc[k["trace_id"] == 1, "phase"]) == {"decode"}
    st = a.steps
    assert list(st["tokens"]) == [15360, 32]


def _ann(rows: list[tuple[str, int, int, str]]) -> pa.Table:
    return table_from_columns(
        {
            "trace_id": [0] * len(rows),
            "rank": [0] * len(rows),
            "name": [r[0] for r in rows],
            "start_ns": [r[1] for r in rows],
            "end_ns": [r[2] for r in rows],
            "side": [r[3] for r in rows],
        },
        ANNOTATION_SCHEMA,
    )


def test_bad_annotations_warn_and_never_drop_kernels() -> None:
    trace, _ = gt.strip_labels(load_inputs([str(H200_TRACES[1])]))
    k = trace.kernels
    t0 = int(k["start_ns"][0].as_py())
    t1 = int(k["start_ns"][k.num_rows // 2].as_py())
    anns = _ann(
        [
            ("step[EXTEND bs=8 toks=2048]", t0, t1, "gpu"),
            ("step[DECODE bs=8]", t1 - 1000, t1 + 10**7, "gpu"),  # overlaps the first
            ("step[DECODE bs=8]", t0 - 10**9, t0 - 10**8, "gpu"),
        ]
    )  # holds no kernel
    a = analyze_trace(dataclasses.replace(trace, annotations=anns))
    text = " ".join(a.warnings)
    assert "overlapping" in text and "holds no kernel" in text and "outside every step" in text
    assert a.kernels.num_rows == trace.kernels.num_rows
    assert set(a.kernels["phase"].to_pylist()) >= {"prefill", "unknown"}


def test_capture_only_trace_warns() -> None:
    a = analyze_trace(load_inputs([str(shared("mi300x-sglang-qwen3-8b/bs_32_rank0.json.gz"))]))
    assert any("graph-capture" in w for w in a.warnings)


def test_graph_capture_kernels_never_form_a_step() -> None:
    # the two kernels that run while SGLang captures its decode graph (buffer fills) are no step:
    # they once made an 11 us "prefill step" that pulled the run's step percentiles down
    a = analyze_trace(load_inputs([str(shared("mi300x-sglang-qwen3-8b/bs_32_rank0.json.gz"))]))
    assert len(a.steps) == 0
    assert set(a.kernels["phase"].to_pylist()) == {"unknown"} and set(a.kernels["step"].to_pylist()) == {-1}


def test_kernels_inside_a_capture_range_stay_outside_steps() -> None:
    # GIVEN an annotated prefill step and, after it, a graph-capture range holding kernels
    trace, _ = gt.strip_labels(load_inputs([str(H200_TRACES[0])]))
    k = trace.kernels
    t0, t1 = int(k["start_ns"][0].as_py()), int(k["start_ns"][k.num_rows // 2].as_py())
    t2 = int(k["start_ns"][k.num_rows - 1].as_py()) + 1
    anns = _ann([("step[EXTEND bs=4 toks=2048]", t0, t1, "gpu"), ("capture_4_DECODE", t1, t2, "gpu")])
    a = analyze_trace(dataclasses.replace(trace, annotations=anns))
    # THEN only the annotated step is a step; the captured half is outside every step
    assert len(a.steps) == 1 and a.steps["phase"].tolist() == ["prefill"]
    inside = np.asarray(a.kernels["start_ns"].to_pylist()) >= t1
    assert set(np.asarray(a.kernels["step"].to_pylist())[inside]) == {-1}


def test_attention_op_layouts_are_data_per_op(tmp_path) -> None:
    from analyzer.errors import InputError
    from analyzer.knowledge.attention_ops import load_attention_ops

    t = load_attention_ops()
    # the SDPA front end holds the query length in dim 2, the flash kernel below it in dim 1
    assert t.layout("aten::scaled_dot_product_attention").q_dim == 2
    assert t.layout("aten::_flash_attention_forward").q_dim == 1
    assert t.layout("triton_tem_fused_flex_attention_0") is not None and t.layout("aten::mm") is None
    bad = tmp_path / "a.toml"
    bad.write_text('[[op]]\nid = "x"\nnote = "n"\nnames = ["o"]\nquery = 0\nrank = 3\nq_dim = 3\n')
    with pytest.raises(InputError, match="q_dim = 3 is not a dimension"):
        load_attention_ops(bad)
    # a softmax is an attention op only inside a composed attention; the SDPA ops always are
    assert t.layout("aten::_softmax").composed and not t.layout("aten::scaled_dot_product_attention").composed
    bad.write_text(
        '[[op]]\nid = "x"\nnote = "n"\nnames = ["o"]\nquery = 0\nrank = 3\nq_dim = 1\ncomposed = 1\n'
    )
    with pytest.raises(InputError, match="composed must be true or false"):
        load_attention_ops(bad)


def test_a_softmax_outside_attention_gives_no_step_shapes() -> None:
    # GIVEN host ops: a router's softmax (its kernel is no attention) and an eager attention's
    # softmax over (batch 2, heads 4, 48 queries, 48 keys), launched by its own kernel
    import pyarrow as pa

    from analyzer.analyses.phases import attention_shapes
    from analyzer.knowledge.attention_ops import load_attention_ops
    from analyzer.model import HOST_OP_SCHEMA

    rows = {
        "trace_id": [0, 0], "rank": [0, 0], "name": ["aten::_softmax", "aten::_softmax"],
        "start_ns": [100, 200], "dur_ns": [10, 10], "external_id": [1, 2],
        "input_dims": [[[2, 4, 48, 8], [], []], [[2, 4, 48, 48], [], []]],
        "input_types": [["float"], ["float"]], "category": ["cpu_op", "cpu_op"], "tid": [1, 1],
        "correlation": [None, None], "shape_id": [None, None],
    }  # fmt: skip
    host = pa.Table.from_pydict(rows, HOST_OP_SCHEMA)
    # WHEN only the second launched an attention kernel
    got = attention_shapes(host, load_attention_ops(), np.array([1]))
    # THEN only it gives the step's shapes: batch 2, 48 queries, 48 keys
    assert got[0]["batch"].tolist() == [2] and got[0]["q"].tolist() == [48] and got[0]["kv"].tolist() == [48]


def test_a_softmax_over_merged_batch_and_heads_gives_step_shapes() -> None:
    # GIVEN an eager attention that merges batch and heads (XGLM: bmm over (B * H, L, D)): its
    # softmax over (32, 16, 16) in the prefill and (32, 1, 17) in a decode step
    import pyarrow as pa

    from analyzer.analyses.phases import attention_shapes, phase_from_shape
    from analyzer.knowledge.attention_ops import load_attention_ops
    from analyzer.model import HOST_OP_SCHEMA

    rows = {
        "trace_id": [0, 0], "rank": [0, 0], "name": ["aten::_softmax", "aten::_softmax"],
        "start_ns": [100, 200], "dur_ns": [10, 10], "external_id": [1, 2],
        "input_dims": [[[32, 16, 16], [], []], [[32, 1, 17], [], []]],
        "input_types": [["float"], ["float"]], "category": ["cpu_op", "cpu_op"], "tid": [1, 1],
        "correlation": [None, None], "shape_id": [None, None],
    }  # fmt: skip
    host = pa.Table.from_pydict(rows, HOST_OP_SCHEMA)
    got = attention_shapes(host, load_attention_ops(), np.array([0, 1]))[0]
    # THEN both are read: 16 queries over 16 keys, then one over 17, one row per sequence's head
    assert got["q"].tolist() == [16, 1] and got["kv"].tolist() == [16, 17]
    assert got["batch"].tolist() == [32, 32]
    assert [
        phase_from_shape(b, q, kv) for b, q, kv in zip(got["batch"], got["q"], got["kv"], strict=True)
    ] == [
        "prefill",
        "decode",
    ]
