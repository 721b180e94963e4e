"""``analyzer.results.accuracy``, ``analyzer.knowledge.truth`` and ``check``: the truth table's schema, truth extraction from raw events,
the zoo's pinned agreement (floors: a case may only get better), identical kernels tables with and
without truth ranges, and the zoo's coverage of configurations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.cli import main
from analyzer.errors import InputError
from analyzer.knowledge.truth import load_taxonomy, load_truth_table, truth_table_from
from analyzer.results.accuracy import _Sweep, agreement, extract_truth, strip_annotations

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "fixtures" / "zoo"
PINS = json.loads((ROOT / "tests" / "data" / "zoo_accuracy.json").read_text(encoding="utf-8"))
CASES = sorted(p.name for p in ZOO.iterdir() if (p / "trace.json.gz").is_file())
NO_TRUTH = ROOT / "fixtures" / "h200-capture-llama3-8b" / "trace.json.gz"


@pytest.fixture(scope="module")
def table():
    return load_truth_table()


# ----------------------------------------------------------------------------- the table


def test_truth_table_covers_every_region_capture_writes(table) -> None:
    truth = pytest.importorskip("analyzer.capture.truth", reason="capture needs torch")
    # five places are not ranges capture writes (module_output: an mlp / inline attention's kernel
    # after the module's last GEMM): outside_forward, attention_inline (an
    # attention_module range that entered no attention-interface function), attention_gate (a
    # gate_up_proj range inside an attention module) and embedding_arithmetic (an embedding's
    # kernel launched by no lookup op)
    places = {
        "outside_forward",
        "attention_inline",
        "attention_gate",
        "embedding_arithmetic",
        "module_output",
    }
    assert set(truth.REGIONS) | places == set(table.regions)


def test_attention_module_without_an_attention_range_is_inline_attention(table) -> None:
    def ev(name, ts, dur, cat="user_annotation", corr=None):
        e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
        if corr is not None:
            e["args"] = {"correlation": corr}
        return e

    events = [
        # module A: its own code computes attention (no attention range inside)
        ev("lkm::truth region=attention_module", 0, 10),
        ev("cudaLaunchKernel", 2, 1, "cuda_runtime", 1),
        ev("softmax_warp_forward", 20, 1, "kernel", 1),
        # module B: calls the attention interface; its own copy kernel stays attention_module
        ev("lkm::truth region=attention_module", 30, 10),
        ev("lkm::truth region=attention", 33, 3),
        ev("cudaLaunchKernel", 31, 1, "cuda_runtime", 2),
        ev("direct_copy_kernel", 50, 1, "kernel", 2),
    ]
    for e in events[2::]:
        if e["cat"] == "kernel":
            e["pid"], e["tid"] = 0, 7
    got = extract_truth({"traceEvents": events}, table).to_pydict()
    regions = dict(zip(got["correlation"], got["region"], strict=True))
    assert regions == {1: "attention_inline", 2: "attention_module"}
    accepted = dict(zip(got["correlation"], got["accepted"], strict=True))
    assert "flash_attention" in accepted[1] and "flash_attention" not in accepted[2]


def ev(name, ts, dur, cat="user_annotation", corr=None, tid=1):
    """One raw trace event of the extraction tests (launch calls and kernels joined by ``corr``)."""
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_a_gate_projection_inside_an_attention_module_is_the_attentions(table) -> None:
    # GIVEN a gate_proj inside an attention module, and an MLP's gate_proj after it
    events = [
        ev("lkm::truth region=attention_module", 0, 20),
        ev("lkm::truth region=attention", 12, 3),
        ev("lkm::truth region=gate_up_proj", 2, 4),
        ev("aten::mm", 2.5, 3, "cpu_op"),
        ev("cudaLaunchKernel", 3, 1, "cuda_runtime", 1),
        ev("lkm::truth region=gate_up_proj", 30, 4),
        ev("aten::mm", 30.5, 3, "cpu_op"),
        ev("cudaLaunchKernel", 31, 1, "cuda_runtime", 2),
        ev("nvjet_gemm", 40, 1, "kernel", 1, tid=7),
        ev("nvjet_gemm", 50, 1, "kernel", 2, tid=7),
    ]
    got = extract_truth({"traceEvents": events}, table).to_pydict()
    regions = dict(zip(got["correlation"], got["region"], strict=True))
    # THEN the first is the attention's gate (an input projection), the second the MLP's
    assert regions == {1: "attention_gate", 2: "gate_up_proj"}
    accepted = dict(zip(got["correlation"], got["accepted"], strict=True))
    assert "qkv_gemm" in accepted[1] and "gate_up_gemm" not in accepted[1]
    assert accepted[2] == ["gate_up_gemm"]


def test_a_modules_residual_add_after_its_output_projection_is_a_place_of_its_own(table) -> None:
    # GIVEN an MLP range whose module adds the residual itself after its down projection (Bloom's
    # dropout_add), and an inline attention whose last GEMM is P @ V (no output projection)
    events = [
        ev("lkm::truth region=mlp", 0, 100),
        ev("lkm::truth region=down_proj", 10, 10),
        ev("aten::mm", 11, 5, "cpu_op"),
        ev("cudaLaunchKernel", 12, 1, "cuda_runtime", 1),
        ev("aten::add", 30, 5, "cpu_op"),
        ev("cudaLaunchKernel", 31, 1, "cuda_runtime", 2),
        ev("lkm::truth region=attention_inline", 200, 100),
        ev("aten::bmm", 210, 5, "cpu_op"),
        ev("cudaLaunchKernel", 211, 1, "cuda_runtime", 3),
        ev("aten::copy_", 230, 5, "cpu_op"),
        ev("cudaLaunchKernel", 231, 1, "cuda_runtime", 4),
        *[ev("kernel", 400 + 10 * c, 1, "kernel", c, tid=7) for c in (1, 2, 3, 4)],
    ]
    got = extract_truth({"traceEvents": events}, table).to_pydict()
    regions = dict(zip(got["correlation"], got["region"], strict=True))
    accepted = dict(zip(got["correlation"], got["accepted"], strict=True))
    # THEN the add after the down projection may be the residual add; the copy after P @ V stays
    # the attention's own
    assert regions == {1: "down_proj", 2: "module_output", 3: "attention_inline", 4: "attention_inline"}
    assert "residual_add" in accepted[2]


def test_an_embeddings_own_arithmetic_is_a_place_of_its_own(table) -> None:
    # GIVEN an embedding range whose module looks its rows up (aten::embedding) and computes a
    # relative position bucket (aten::log) on the same thread
    events = [
        ev("lkm::truth region=embedding", 0, 100, "user_annotation"),
        ev("aten::embedding", 10, 10, "cpu_op"),
        ev("cudaLaunchKernel", 12, 1, "cuda_runtime", 1),
        ev("aten::log", 30, 10, "cpu_op"),
        ev("cudaLaunchKernel", 32, 1, "cuda_runtime", 2),
        ev("indexSelectLargeIndex", 40, 1, "kernel", 1, tid=7),
        ev("vectorized_elementwise_kernel", 50, 1, "kernel", 2, tid=7),
    ]
    got = extract_truth({"traceEvents": events}, table).to_pydict()
    regions = dict(zip(got["correlation"], got["region"], strict=True))
    accepted = dict(zip(got["correlation"], got["accepted"], strict=True))
    # THEN the lookup is the embedding's only; the arithmetic may be generic work or the embedding's
    assert regions == {1: "embedding", 2: "embedding_arithmetic"}
    assert accepted[1] == ["embedding"] and {"elementwise", "embedding"} <= set(accepted[2])


def test_truth_table_routes_gemm_and_kinds(table) -> None:
    assert table.stages("moe_router", True, "kernel") == ("moe_gate_gemm",)
    assert table.stages("moe_router", False, "kernel") == ("moe_topk",)
    assert table.stages("qkv_proj", False, "kernel") == ("elementwise", "quantize")
    assert table.stages("quantize", False, "kernel") == ("quantize",)
    assert table.stages("norm", True, "kernel") == ("norm",)  # no gemm list: same as other
    assert table.stages("norm", False, "memcpy") == ("memcpy",)
    assert "sampling" in table.stages("outside_forward", False, "kernel")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"defaults": {"gemm_ops": ["aten::mm"]}, "region": [{"region": "norm", "other": ["nrm"]}]}, "unknown stage"),
        ({"defaults": {"gemm_ops": ["aten::mm"]}, "region": [{"region": "norm", "other": ["norm"]}] * 2}, "twice"),
        ({"defaults": {"gemm_ops": ["aten::mm"]}, "region": [{"region": "norm", "other": ["norm"]}]}, "outside_forward"),
        ({"defaults": {}, "region": []}, "gemm_ops"),
        ({"defaults": {"gemm_ops": ["aten::mm"]}, "region": [{"region": "norm", "other": ["norm"], "x": 1}]}, "unknown keys"),
    ],
)  # fmt: skip
def test_bad_truth_table_is_one_input_error(doc, message) -> None:
    with pytest.raises(InputError, match=message):
        truth_table_from(doc, load_taxonomy())


# ----------------------------------------------------------------------------- extraction


def test_sweep_finds_the_innermost_range() -> None:
    s = _Sweep([(0, 100, "model"), (10, 20, "q"), (30, 60, "attn"), (40, 50, "inner")])
    assert s.innermost([5, 15, 25, 45, 55, 99, 101]) == [
        "model",
        "q",
        "model",
        "inner",
        "attn",
        "model",
        None,
    ]


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _doc():
    """GIVEN a prefill step with a q_proj GEMM, a norm kernel and a sampling kernel, then a decode
    step replayed from a CUDA graph, and a kernel on another thread outside every range."""
    ev = [
        _x("user_annotation", "lkm::step phase=prefill q=4 bs=1 kv=4", 0, 100),
        _x("user_annotation", "lkm::truth region=model", 1, 80),
        _x("user_annotation", "lkm::truth region=qkv_proj", 2, 10),
        _x("cpu_op", "aten::linear", 2.5, 8),
        _x("cpu_op", "aten::addmm", 3, 6),
        _x("cuda_runtime", "cudaLaunchKernel", 4, 1, correlation=1),
        _x("user_annotation", "lkm::truth region=norm", 20, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 21, 1, correlation=2),
        _x("cuda_runtime", "cudaLaunchKernel", 90, 1, correlation=3),
        _x("user_annotation", "lkm::step phase=decode q=1 bs=1 kv=5", 100, 50),
        _x("cuda_runtime", "cudaGraphLaunch", 101, 1, correlation=4),
        _x("cuda_runtime", "cudaMemcpyAsync", 5, 1, tid=2, correlation=5),
    ]
    gpu = [
        _x("kernel", "sm90_gemm", 10, 2, tid=7, correlation=1),
        _x("kernel", "rms", 30, 1, tid=7, correlation=2),
        _x("kernel", "argmax", 95, 1, tid=7, correlation=3),
        _x("kernel", "graph_a", 110, 1, tid=7, correlation=4),
        _x("kernel", "graph_b", 112, 1, tid=7, correlation=4),
        _x("gpu_memcpy", "Memcpy HtoD", 6, 1, tid=7, correlation=5),
    ]
    return {"traceEvents": ev + gpu, "baseTimeNanoseconds": 1000}


def test_extract_truth_by_launch_thread_and_correlation(table) -> None:
    t = extract_truth(_doc(), table).to_pydict()
    assert t["region"] == ["qkv_proj", "norm", "outside_forward", None, None, "outside_forward"]
    assert t["phase"] == ["prefill", "prefill", "prefill", "decode", "decode", None]
    assert t["gemm_op"][0] and not t["gemm_op"][1]
    assert t["accepted"][0] == ["qkv_gemm"] and t["accepted"][3] == []
    assert t["graph"] == [False, False, False, True, True, False]
    assert t["start_ns"][0] == 10_000 + 1000 and t["kind"][5] == "memcpy"


def _kernels(truth, extra=None):
    """Analysed kernels of the small truth document: one wrong stage (the norm kernel left
    elementwise), one wrong phase (argmax said decode in a prefill step); ``extra`` columns added."""
    import pyarrow as pa

    return pa.table(
        {
            "correlation": [1, 2, 3, 4, 4, 5],
            "start_ns": truth["start_ns"].to_pylist(),
            "dur_ns": [2000, 1000, 1000, 1000, 1000, 1000],
            "name": truth["name"].to_pylist(),
            "stage": ["qkv_gemm", "elementwise", "sampling", "gemm", "gemm", "memcpy"],
            "category": ["dense_gemm", "other", "sampling", "dense_gemm", "dense_gemm", "memory"],
            "phase": ["prefill", "prefill", "decode", "decode", "decode", "prefill"],
            **(extra or {}),
        }
    )


def test_agreement_is_time_weighted(table) -> None:

    truth = extract_truth(_doc(), table)
    kernels = _kernels(truth)
    r = agreement(kernels, truth, table)
    assert r["stage"]["agreement"] == pytest.approx(4000 / 5000)  # the norm kernel is wrong
    assert r["phase"]["agreement"] == pytest.approx(5000 / 6000)  # argmax was prefill
    assert r["unmatched"] == 0
    assert r["disagreements"]["stage"][0]["kernel"] == "rms"


def test_strip_annotations_keeps_other_ranges() -> None:
    import pyarrow as pa

    names = [
        "lkm::truth region=norm",
        "lkm::step phase=decode q=1 bs=1",
        "ProfilerStep#1",
        "lkm::truth region=model",
    ]
    ann = pa.table({"name": names, "side": ["cpu", "gpu", "cpu", "gpu"]})
    assert strip_annotations(ann)["name"].to_pylist() == ["ProfilerStep#1"]
    assert strip_annotations(ann, keep_steps=True)["name"].to_pylist() == names[1:3]


# ----------------------------------------------------------------------------- the zoo


def test_zoo_covers_the_configurations() -> None:
    metas = [json.loads((ZOO / c / "meta.json").read_text(encoding="utf-8")) for c in CASES]
    assert len(CASES) >= 24
    assert len({m["model_type"] for m in metas}) >= 10
    assert sum(not m["record_shapes"] for m in metas) * 4 >= len(metas)
    assert {"generate", "continuous-batching", "static-cache", "forward"} <= {m["mode"] for m in metas}
    assert {"eager", "sdpa", "flex_attention", "paged|sdpa", "paged|eager"} <= {m["attn"] for m in metas}
    assert {"flash", "efficient", "cudnn", "math"} <= {m["sdpa_backend"] for m in metas}
    assert {"fp32", "fp16", "bf16"} <= {m["dtype"] for m in metas}
    assert any(m["sampling"] for m in metas) and any(m["assistant"] for m in metas)
    assert all(m["truth"] and m["gpu"] == "NVIDIA H200" for m in metas)
    sizes = [(ZOO / c / "trace.json.gz").stat().st_size for c in CASES]
    assert max(sizes) <= 1_500_000 and sum(sizes) <= 30_000_000
    assert set(PINS) == set(CASES), "re-pin: python benchmarks/accuracy.py --pin"
    assert json.loads((ZOO / "identity.json").read_text(encoding="utf-8"))["same_kernel_sequence"]


@pytest.mark.parametrize("case", CASES)
def test_zoo_accuracy_holds_its_pinned_floor(case: str) -> None:
    from analyzer.cli.check_cmd import check_trace

    r = check_trace(str(ZOO / case / "trace.json.gz"))
    assert r["unmatched"] == 0
    for k in ("stage", "category", "phase"):
        floor = PINS[case][k]
        got = r[k]["agreement"]
        assert floor is None or (got is not None and got >= floor - 1e-6), (
            f"{case} {k}: {got} < pinned {floor}"
        )
    # where the analysis gives a phase it stays as right as pinned, and what it leaves unknown
    # does not grow: abstaining must not turn into guessing, nor guessing into silence
    floor = PINS[case].get("phase_decided")
    got = r["phase"]["decided_agreement"]
    assert floor is None or (got is not None and got >= floor - 1e-6), f"{case} decided: {got} < {floor}"
    ceiling = PINS[case].get("phase_undecided") or 0.0
    assert (r["phase"]["undecided"] or 0.0) <= ceiling + 1e-6, f"{case} undecided above {ceiling}"
    # each truth step is paired with one step row, and its fields (phase, token counts, model,
    # verify width) are not wrong more often than pinned: null is allowed, a wrong value is not
    assert r["steps"]["paired"] == r["steps"]["truth"], r["steps"]
    wrong = {k: v["wrong"] for k, v in r["steps"]["fields"].items() if v["wrong"]}
    assert sum(wrong.values()) <= PINS[case].get("steps_wrong", 0), f"{case} step fields wrong: {wrong}"
    unsaid = sum(v["not_given"] for v in r["steps"]["fields"].values())
    assert unsaid <= PINS[case].get("steps_not_given", 0), f"{case}: {unsaid} step fields not given"


@pytest.mark.parametrize("case", CASES)
def test_the_annotated_path_follows_the_step_annotations_exactly(case: str) -> None:
    # GIVEN a capture whose lkm::step ranges enclose nested truth ranges (the GPU copies of the step
    # ranges then cover only the kernels outside every nested range)
    from analyzer.cli.check_cmd import check_trace

    # WHEN it is analysed with its step annotations kept
    r = check_trace(str(ZOO / case / "trace.json.gz"), keep_steps=True)
    # THEN every kernel with phase truth gets its step's phase
    assert r["phase"]["agreement"] is not None and r["phase"]["agreement"] >= 0.999, r["phase"]


@pytest.mark.parametrize("case", CASES)
def test_truth_ranges_do_not_change_the_analysis(case: str) -> None:
    """GIVEN a zoo trace WHEN analysed with and without its truth ranges THEN the kernels tables are equal."""
    from analyzer.cli.check_cmd import analyze_stripped

    path = str(ZOO / case / "trace.json.gz")
    with_truth = _analyze_plain(path)
    without = analyze_stripped(path, True, (), None, None)
    assert with_truth.kernels.equals(without.kernels)


def _analyze_plain(path: str):
    from analyzer.pipeline import Options, analyze_trace
    from tests.runs import load_inputs

    return analyze_trace(load_inputs([path]), Options())


# ----------------------------------------------------------------------------- the command


def test_check_prints_the_agreement_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    rc = main(["check", str(ZOO / "llama-sdpa-bf16" / "trace.json.gz"), "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "stage" in text and "category" in text and "phase" in text
    r = json.loads(out.read_text(encoding="utf-8"))
    assert r["format_version"] == 1 and r["keep_steps"] is False and r["stage"]["agreement"] > 0.5


def test_check_keep_steps_measures_the_annotated_path(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", str(ZOO / "llama-forward-bf16" / "trace.json.gz"), "--keep-steps"])
    out = capsys.readouterr().out
    assert rc == 0 and "(step annotations kept)" in out


def test_check_without_truth_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", str(NO_TRUTH)])
    err = capsys.readouterr().err
    assert rc == 2 and "no lkm::truth ranges" in err and len(err.strip().splitlines()) == 1


def test_check_stays_distinct_from_rules_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    assert "truth" in capsys.readouterr().out
    assert main(["rules", "--help"]) == 0


# ----------------------------------------------------------------------------- agreement per rule


def test_agreement_per_rule_names_the_rule_of_a_wrong_answer(table) -> None:
    import pandas as pd

    # GIVEN the small truth and kernels whose stage and step rules are known
    truth = extract_truth(_doc(), table)
    kernels = _kernels(
        truth,
        {
            "stage_rule": ["STR007", "ATN099", "OPH005", "GEM001", "GEM001", "MEM001"],
            "trace_id": [0] * 6,
            "step": [0, 0, 0, 1, 1, -1],
        },
    )
    steps = pd.DataFrame({"trace_id": [0, 0], "step": [0, 1], "phase_rule": ["PHS007", "lkm"]})
    # WHEN agreement is measured with the steps
    r = agreement(kernels, truth, table, steps=steps)
    # THEN the wrong stage (the norm kernel left elementwise) is charged to its rule
    st = r["stage"]["by_rule"]
    assert st["ATN099"] == {"time_ns": 1000, "agree_ns": 0, "kernels": 1, "agreement": 0.0}
    assert st["STR007"]["agreement"] == 1.0 and list(st)[0] == "STR007"  # most time first
    assert sum(v["time_ns"] for v in st.values()) == r["stage"]["time_ns"]
    # AND the wrong phase (argmax said decode in a prefill step) to the rule of its step
    ph = r["phase"]["by_rule"]
    assert ph["PHS007"] == {"time_ns": 4000, "agree_ns": 3000, "kernels": 3, "agreement": 0.75}
    assert ph["lkm"]["agreement"] == 1.0
    assert sum(v["time_ns"] for v in ph.values()) == r["phase"]["time_ns"]
    # AND without the columns there is nothing per rule, the rest unchanged
    bare = agreement(kernels.drop(["stage_rule", "trace_id", "step"]), truth, table)
    assert bare["stage"]["by_rule"] == {} and bare["phase"]["by_rule"] == {}
    assert bare["stage"]["agreement"] == r["stage"]["agreement"]


def test_check_by_rule_recomputed_independently() -> None:

    from analyzer.cli.check_cmd import analyze_stripped, check_trace
    from analyzer.readers.raw_json import read_json

    # GIVEN a zoo case whose phase the analysis partly leaves unknown, its truth and its analysis
    path = str(ZOO / "qwen2-cb-paged-eager-bf16" / "trace.json.gz")
    tt = load_truth_table()
    truth = extract_truth(read_json(path), tt).to_pandas()
    a = analyze_stripped(path, False, (), None, None)
    k = a.kernels.select(
        ["correlation", "start_ns", "dur_ns", "stage", "phase", "stage_rule", "trace_id", "step"]
    )
    k = k.to_pandas().astype({"stage": str, "phase": str, "stage_rule": str})
    m = k.merge(truth, on=["correlation", "start_ns"], suffixes=("", "_truth"))
    m = m.merge(a.steps[["trace_id", "step", "phase_rule"]], on=["trace_id", "step"], how="left")
    m["phase_rule"] = m["phase_rule"].fillna("(no step)")
    # WHEN check measures it
    r = check_trace(path)
    # THEN per stage_rule: the time with stage truth and the time whose stage is accepted
    s = m[m["accepted"].map(len) > 0].copy()
    s["ok"] = [st in acc for st, acc in zip(s["stage"], s["accepted"], strict=True)]
    want = {
        rid: (int(g["dur_ns"].sum()), int(g["dur_ns"][g["ok"]].sum()), len(g))
        for rid, g in s.groupby("stage_rule")
    }
    got = {rid: (v["time_ns"], v["agree_ns"], v["kernels"]) for rid, v in r["stage"]["by_rule"].items()}
    assert got == want
    # AND per phase_rule of each kernel's step, over the kernels with phase truth
    p = m[m["phase_truth"].notna()]
    want = {
        rid: (int(g["dur_ns"].sum()), int(g["dur_ns"][g["phase"] == g["phase_truth"]].sum()), len(g))
        for rid, g in p.groupby("phase_rule")
    }
    got = {rid: (v["time_ns"], v["agree_ns"], v["kernels"]) for rid, v in r["phase"]["by_rule"].items()}
    assert got == want
    # AND the phases left unknown are charged to a rule (the one that abstained)
    assert any(agree < t for t, agree, _ in got.values())


def test_check_text_names_the_rules_behind_disagreements(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a case with phase disagreements WHEN check prints its report
    rc = main(["check", str(ZOO / "qwen2-cb-paged-eager-bf16" / "trace.json.gz")])
    out = capsys.readouterr().out
    # THEN the rule ids behind them are listed, each one `rules explain` knows
    assert rc == 0 and "phase rules behind disagreements" in out
    block = out.split("phase rules behind disagreements")[1].splitlines()[1:]
    ids = [line.split()[0] for line in block if line.startswith("    ") and "ms wrong of" in line]
    assert ids
    for rid in ids:
        assert main(["rules", "explain", rid]) == 0
