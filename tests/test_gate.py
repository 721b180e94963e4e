"""The regression gate (analyzer/regressions.py, report/gate_report.py, the `gate` command) on the real H200 traces."""

from __future__ import annotations

import copy
import gzip
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
import pytest

from analyzer import regressions as gate
from analyzer.cli import main
from analyzer.errors import UsageError
from analyzer.report import gate_report
from analyzer.results.baseline import build_baseline
from tests.conftest import FIXTURES, H200_DENSE, H200_MOE, H200_TP2
from tests.runs import analyze_paths

DENSE_BASELINE = FIXTURES / "h200-llama3-8b-dense" / "baseline.json"
MOE_BASELINE = FIXTURES / "h200-qwen3-30b-a3b-moe" / "baseline.json"
TP2_BASELINE = FIXTURES / "h200-tp2-llama3-8b-graph" / "baseline.json"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def dense():
    analysis = analyze_paths([str(H200_DENSE)])
    return analysis, build_baseline(analysis)


@pytest.fixture(scope="module")
def decode_attention(dense) -> dict[tuple[int, str], None]:
    """(correlation, name) of the decode attention kernels, found by the analyser itself."""
    df = dense[0].kernels.to_pandas()
    sel = df[(df["phase"] == "decode") & (df["stage"].astype(str) == "flash_attention")]
    assert len(sel) == 23 * 8
    return {(int(c), str(n)): None for c, n in zip(sel["correlation"], sel["name"], strict=True)}


@pytest.fixture(scope="module")
def slower(tmp_path_factory, decode_attention):
    """A copy of the dense trace whose decode attention kernels take ``factor`` times as long."""
    doc = orjson.loads(gzip.decompress(H200_DENSE.read_bytes()))
    hits = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "kernel" and (e["args"].get("correlation"), e["name"]) in decode_attention
    ]
    assert len(hits) == len(decode_attention)
    original = [e["dur"] for e in hits]
    made: dict[float, Path] = {}

    def make(factor: float) -> Path:
        if factor not in made:
            for e, dur in zip(hits, original, strict=True):
                e["dur"] = dur * factor
            p = tmp_path_factory.mktemp("slower") / f"dense-x{factor}.json"
            p.write_bytes(orjson.dumps(doc))
            made[factor] = p
        return made[factor]

    return make


# ------------------------------------------------------------------------- real traces, CLI


@pytest.mark.parametrize(
    "traces,baseline",
    [([H200_DENSE], DENSE_BASELINE), ([H200_MOE], MOE_BASELINE), (H200_TP2, TP2_BASELINE)],
    ids=["dense", "moe", "tp2"],
)
def test_each_fixture_passes_against_its_own_baseline(capsys, traces, baseline) -> None:
    code, out, err = run(capsys, "gate", *traces, "--baseline", baseline)
    assert code == 0, f"{out}{err}\n(stale? regenerate {baseline} with `make baselines`)"
    assert out.startswith("llm-kernel-map gate: PASS")
    assert "decode:" in out and "(gated)" in out


def test_slower_decode_attention_fails_and_names_stage_and_kernels(
    capsys, tmp_path, slower, decode_attention
):
    # GIVEN the dense trace with its decode attention kernels 20% slower
    cand = slower(1.2)
    md, xml, js = tmp_path / "gate.md", tmp_path / "junit.xml", tmp_path / "gate.json"
    # WHEN it is gated against the saved baseline
    code, out, err = run(capsys, "gate", cand, "--baseline", DENSE_BASELINE, "-o", md, "-o", xml, "-o", js)
    # THEN exit 1, and the stage and its kernels are named
    assert code == 1, out + err
    kernel = next(iter({n for _, n in decode_attention}))
    assert kernel.startswith("cudnn_generated_fort_native_sdpa_")
    assert "FAIL: slower: decode.flash_attention (+20.0%)" in out
    assert kernel[:60] in out
    result = json.loads(js.read_text())
    assert result["status"] == "fail"
    stage = next(r for r in result["rows"] if r["id"] == "decode.flash_attention")
    assert stage["status"] == "regression" and stage["fails"]
    assert stage["change"] == pytest.approx(0.20, abs=0.01)
    assert [k["group_key"].split(" [")[0] for k in stage["kernels"]] == [kernel]
    # only that stage (and its kernel group) failed; nothing else moved beyond the floor
    assert {f["id"].split("/")[0] for f in result["failed"]} == {"decode.flash_attention"}
    # the Markdown table names it; the JUnit XML parses and carries the failure
    text = md.read_text()
    assert "| ❌ | `decode.flash_attention` |" in text and kernel[:60] in text
    _check_markdown_tables(text)
    root = ET.parse(xml).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "2"
    failed = [c.get("name") for c in root.iter("testcase") if c.find("failure") is not None]
    assert "decode.flash_attention" in failed
    assert any(
        kernel in (c.find("failure").text or "")
        for c in root.iter("testcase")
        if c.find("failure") is not None
    )


def test_change_within_threshold_passes(capsys, slower) -> None:
    # +3% is under the 10% threshold even with no absolute floor at all
    code, out, err = run(
        capsys,
        "gate",
        slower(1.03),
        "--baseline",
        DENSE_BASELINE,
        "--min-delta-us",
        "0",
        "--format",
        "markdown",
    )
    assert code == 0, out + err
    assert out.startswith("### ✅ llm-kernel-map gate: PASS")
    _check_markdown_tables(out)


def test_other_model_is_not_comparable(capsys) -> None:
    code, out, err = run(capsys, "gate", H200_MOE, "--baseline", DENSE_BASELINE)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: not comparable: ")
    assert "8 layers seen in the baseline, 4 in the candidate" in err
    assert "GEMM roles differ" in err and "moe_expert_gemm" in err
    assert "tokens per step in decode: baseline 4, candidate 8" in err


def test_other_gpu_is_not_comparable(capsys) -> None:
    code, out, err = run(capsys, "gate", H200_DENSE, "--baseline", DENSE_BASELINE, "--gpu", "b200")
    assert code == 2, out + err
    assert err.startswith("error: not comparable: other GPU: baseline NVIDIA H200")
    assert "candidate NVIDIA B200" in err and err.count("\n") == 1


def test_thresholds_from_pyproject_and_command_line(capsys, tmp_path, monkeypatch, slower) -> None:
    # GIVEN a project whose pyproject lets decode attention be 30% slower
    (tmp_path / "pyproject.toml").write_text(
        "[tool.llm-kernel-map.gate]\nthreshold = 0.1\nmin_delta_us = 5\n"
        'stage_thresholds = {"decode.flash_attention" = 0.3, "decode.flash_attention/*" = 0.3}\n'
    )
    sub = tmp_path / "ci"
    sub.mkdir()
    monkeypatch.chdir(sub)
    # WHEN the +20% trace is gated from a folder below it, THEN the nearest pyproject applies
    code, out, err = run(capsys, "gate", slower(1.2), "--baseline", DENSE_BASELINE, "--format", "json")
    assert code == 0, out + err
    result = json.loads(out)
    stage = next(r for r in result["rows"] if r["id"] == "decode.flash_attention")
    assert stage["threshold"] == 0.3 and stage["threshold_from"] == "decode.flash_attention"
    assert stage["status"] == "unchanged"


def test_trace_as_baseline_and_unknown_config_key(capsys, tmp_path, monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.llm-kernel-map.gate]\nthresold = 0.1\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "gate", H200_DENSE, "--baseline", H200_DENSE)
    assert code == 2 and "unknown key 'thresold'" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def host_slower(tmp_path_factory) -> Path:
    """A copy of the dense trace whose steps last ~6x as long with the same kernels: every
    timestamp stretched around the first, host events' durations too, kernels' durations kept."""
    doc = orjson.loads(gzip.decompress(H200_DENSE.read_bytes()))
    events = [e for e in doc["traceEvents"] if isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in events)
    factor = 91.32 / 14.88
    for e in events:
        e["ts"] = t0 + (e["ts"] - t0) * factor
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset") and isinstance(
            e.get("dur"), int | float
        ):
            e["dur"] = e["dur"] * factor
    p = tmp_path_factory.mktemp("host") / "dense-host-slower.json"
    p.write_bytes(orjson.dumps(doc))
    return p


def test_slower_decode_steps_fail_though_kernels_did_not_change(capsys, tmp_path, host_slower) -> None:
    # GIVEN the dense trace whose decode steps take ~91 ms instead of ~14.9 ms, same kernels
    js = tmp_path / "gate.json"
    # WHEN it is gated against the saved baseline
    code, out, err = run(capsys, "gate", host_slower, "--baseline", DENSE_BASELINE, "-o", js)
    # THEN it fails on the decode step time (p50 and p90), not on any stage
    assert code == 1, out + err
    result = json.loads(js.read_text())
    failed = {f["id"] for f in result["failed"]}
    assert {"decode.step_p50", "decode.step_p90"} <= failed
    assert not any(f["level"] == "stage" for f in result["failed"])
    row = next(r for r in result["rows"] if r["id"] == "decode.step_p50")
    assert row["level"] == "step" and row["baseline_ns"] == 14_880_844
    assert row["candidate_ns"] == pytest.approx(91.32e6, rel=0.05)
    assert row["threshold"] == gate.DEFAULT_STEP_THRESHOLD and result["thresholds"]["step_threshold"]
    assert "decode step time p50" in out and "FAIL" in out


def test_step_threshold_from_option_and_pyproject(capsys, tmp_path, monkeypatch, dense) -> None:
    b = dense[1]
    c = copy.deepcopy(b)
    c["phases"]["decode"]["step_ns"]["p50"] = int(b["phases"]["decode"]["step_ns"]["p50"] * 1.15)
    # +15% of step time: under the default step threshold, over a 10% one
    assert gate.compare(b, c)["status"] == "pass"
    r = gate.compare(b, c, gate.make_thresholds(step_threshold=0.1))
    assert r["status"] == "fail" and [f["id"] for f in r["failed"]] == ["decode.step_p50"]
    # kernel-time threshold does not move the step threshold, and vice versa
    assert gate.compare(b, c, gate.make_thresholds(threshold=0.01))["status"] == "pass"
    t = gate.make_thresholds({"step_threshold": "10%"})
    assert t.step_threshold == 0.1 and t.threshold == gate.DEFAULT_THRESHOLD
    # the command line and pyproject both set it
    base, cand = tmp_path / "b.json", tmp_path / "c.json"
    base.write_bytes(orjson.dumps(b))
    cand.write_bytes(orjson.dumps(c))
    assert run(capsys, "gate", cand, "--baseline", base)[0] == 0
    assert run(capsys, "gate", cand, "--baseline", base, "--step-threshold", "0.1")[0] == 1
    (tmp_path / "pyproject.toml").write_text("[tool.llm-kernel-map.gate]\nstep_threshold = 0.1\n")
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "gate", cand, "--baseline", base)[0] == 1
    assert run(capsys, "gate", cand, "--baseline", base, "--step-threshold", "0.5")[0] == 0


def test_old_baseline_without_step_times_is_gated_on_kernels_with_a_note(dense) -> None:
    b = copy.deepcopy(dense[1])
    for e in b["phases"].values():
        del e["step_ns"]
    r = gate.compare(b, dense[1])
    assert r["status"] == "pass"
    assert not any(x["level"] == "step" for x in r["rows"])
    assert any("decode: the baseline has no step times" in n for n in r["notes"])
    b = copy.deepcopy(dense[1])
    del b["phases"]["decode"]["step_ns"]["p90"]
    r = gate.compare(b, dense[1])
    assert [x["id"] for x in r["rows"] if x["level"] == "step" and x["phase"] == "decode"] == [
        "decode.step_p50"
    ]
    assert any("decode: the baseline has no step time p90" in n for n in r["notes"])
    for fmt in ("text", "markdown", "junit", "json"):
        assert _render(r, fmt)


@pytest.mark.parametrize("name", ["gate.pdf", "gate.html", "gate.csv"])
def test_output_with_an_unknown_format_is_a_usage_error(capsys, tmp_path, name) -> None:
    target = tmp_path / name
    code, out, err = run(capsys, "gate", H200_DENSE, "--baseline", DENSE_BASELINE, "-o", target)
    assert code == 2 and err.count("\n") == 1 and name in err and ".md" in err
    assert not target.exists() and out == ""


# -------------------------------------------------------------------- pure comparison rules


def _stage(obj, phase, stage):
    return next(r for r in obj["stages"] if r["phase"] == phase and r["stage"] == stage)


def _scaled(b, phase, stage, factor):
    """A copy of baseline ``b`` with one stage (and its kernel groups) ``factor`` times as long."""
    c = copy.deepcopy(b)
    for r in [_stage(c, phase, stage)] + [
        g for g in c["groups"] if g["phase"] == phase and g["stage"] == stage
    ]:
        for k in ("p50_ns", "mean_ns"):
            r[k] = int(r[k] * factor)
    return c


def test_identical_runs_pass_with_nothing_moved(dense) -> None:
    r = gate.compare(dense[1], dense[1])
    assert r["status"] == "pass" and r["failures"] == 0
    assert r["counts"]["regression"] == r["counts"]["improvement"] == r["counts"]["new"] == 0
    assert {p["phase"]: p["gated"] for p in r["phases"]} == {"prefill": False, "decode": True}
    assert any("prefill: 1 step in the baseline" in n for n in r["notes"])


def test_small_stage_doubling_stays_under_the_floor(dense) -> None:
    # decode memset takes ~12.7 us per step: doubling it is +12.7 us, over the 5 us floor;
    # decode embedding (~3.7 us) doubling is under it
    b = dense[1]
    assert _stage(b, "decode", "embedding")["p50_ns"] < 5_000
    r = gate.compare(b, _scaled(b, "decode", "embedding", 2.0))
    assert r["status"] == "pass"
    r = gate.compare(b, _scaled(b, "decode", "memset", 2.0))
    assert r["status"] == "fail" and r["failed"][0]["id"] == "decode.memset"


def test_improvements_are_reported_not_failed(dense) -> None:
    b = dense[1]
    r = gate.compare(b, _scaled(b, "decode", "gate_up_gemm", 0.5))
    assert r["status"] == "pass" and r["counts"]["improvement"] >= 1
    row = next(x for x in r["rows"] if x["id"] == "decode.gate_up_gemm")
    assert row["status"] == "improvement" and row["change"] == pytest.approx(-0.5, abs=0.01)
    out = _render(r, "text")
    assert "Faster" in out and "decode.gate_up_gemm" in out


def test_new_and_vanished_stages_and_groups(dense) -> None:
    b = dense[1]
    c = copy.deepcopy(b)
    # a new stage above the floor fails; a new kernel group is listed and counts toward its stage
    c["stages"].append(
        {
            "phase": "decode",
            "stage": "moe_sort",
            "category": "moe_gate_sort",
            "p50_ns": 40_000,
            "mean_ns": 40_000,
            "present": 23,
            "count_per_step": 8,
            "per_token_ns": None,
        }
    )
    c["groups"].append(
        {
            "phase": "decode",
            "stage": "moe_sort",
            "group_key": "new_sort_kernel",
            "provider": "vllm",
            "p50_ns": 40_000,
            "mean_ns": 40_000,
            "present": 23,
            "count_per_step": 8,
            "per_token_ns": None,
        }
    )
    # a whole stage vanishes
    c["stages"] = [s for s in c["stages"] if not (s["phase"] == "decode" and s["stage"] == "activation")]
    c["groups"] = [g for g in c["groups"] if not (g["phase"] == "decode" and g["stage"] == "activation")]
    c["tail_groups"]["decode"]["keys"] = {}
    r = gate.compare(b, c)
    rows = {x["id"]: x for x in r["rows"]}
    assert rows["decode.moe_sort"]["status"] == "new" and rows["decode.moe_sort"]["fails"]
    assert rows["decode.moe_sort/new_sort_kernel"]["status"] == "new"
    assert not rows["decode.moe_sort/new_sort_kernel"]["fails"]
    assert rows["decode.moe_sort"]["kernels"][0]["group_key"] == "new_sort_kernel"
    assert rows["decode.activation"]["status"] == "vanished" and not rows["decode.activation"]["fails"]
    out = _render(r, "markdown")
    assert "#### New" in out and "#### Vanished" in out and "new\\_sort\\_kernel" not in out
    assert "`new_sort_kernel`" in out


def test_group_that_grows_out_of_the_tail_is_compared_with_its_mean(dense) -> None:
    b = dense[1]
    c = copy.deepcopy(b)
    key, mean = next(iter(b["tail_groups"]["decode"]["keys"].items()))
    # find the tail group's name from the analysis and put it in the candidate's top, much slower
    df = dense[0].kernels.to_pandas()
    from analyzer.results.baseline import group_hash

    sub = df[df["phase"] == "decode"].drop_duplicates(["stage", "group_key"])
    stage, gk = next(
        (s, g) for s, g in zip(sub["stage"], sub["group_key"], strict=True) if group_hash(s, g) == key
    )
    del c["tail_groups"]["decode"]["keys"][key]
    c["groups"].append(
        {
            "phase": "decode",
            "stage": stage,
            "group_key": gk,
            "provider": "x",
            "p50_ns": 0,
            "mean_ns": mean + 50_000,
            "present": 5,
            "count_per_step": 1,
            "per_token_ns": None,
        }
    )
    r = gate.compare(b, c)
    row = next(x for x in r["rows"] if x["group_key"] == gk)
    assert row["status"] == "regression" and row["statistic"] == "mean" and row["baseline_ns"] == mean


def test_too_few_steps(dense) -> None:
    b = dense[1]
    with pytest.raises(gate.NotComparableError, match=r"too few steps: no phase has --min-steps 30"):
        gate.compare(b, b, gate.Thresholds(min_steps=30))
    assert gate.compare(b, b, gate.Thresholds(min_steps=30, allow_few_steps=True))["status"] == "pass"
    c = copy.deepcopy(b)
    c["phases"]["decode"]["steps"] = 2
    with pytest.raises(gate.NotComparableError, match=r"too few decode steps: baseline 23, candidate 2"):
        gate.compare(b, c)


def test_other_batch_is_not_comparable_but_close_tokens_are(dense) -> None:
    b = dense[1]
    c = copy.deepcopy(b)
    c["comparability"]["phases"]["prefill"]["tokens_per_step"] = 2100  # 2.5% apart
    gate.compare(b, c)
    c["comparability"]["phases"]["decode"]["batch"] = 8
    with pytest.raises(gate.NotComparableError, match="other batch in decode: baseline 4, candidate 8"):
        gate.compare(b, c)


def test_override_precedence_and_parsing() -> None:
    t = gate.make_thresholds(
        {
            "threshold": 0.2,
            "min_delta_us": 2,
            "stage_thresholds": {"decode.flash_attention": 0.5, "decode": 0.3},
        },
        threshold=0.1,
        stage_thresholds=["decode.flash_attention=5%", "*.norm=0.01", "decode.qkv_gemm/nvjet*=0.4"],
    )
    assert t.threshold == 0.1 and t.min_delta_ns == 2_000 and t.min_steps == 3
    assert t.for_row("decode", "flash_attention") == (0.05, "decode.flash_attention")  # CLI beats pyproject
    assert t.for_row("decode", "rope") == (0.3, "decode")
    assert t.for_row("prefill", "norm") == (0.01, "*.norm")
    assert t.for_row("decode", "qkv_gemm", "nvjet_sm90_x") == (0.4, "decode.qkv_gemm/nvjet*")
    assert t.for_row("decode", "qkv_gemm", "cutlass_x") == (0.3, "decode")
    assert t.for_row("prefill") == (0.1, None)
    for bad in ("decoder.x=0.1", "decode.x", "decode.x=abc", "decode/x=0.1"):
        with pytest.raises(UsageError):
            gate.make_thresholds(stage_thresholds=[bad])
    with pytest.raises(UsageError, match="unknown key"):
        gate.make_thresholds({"thresold": 0.1})


def test_unused_override_is_noted(dense) -> None:
    r = gate.compare(
        dense[1], dense[1], gate.make_thresholds(stage_thresholds=["decode.paged_atention=0.05"])
    )
    assert any("decode.paged_atention" in n and "matched nothing" in n for n in r["notes"])


# ------------------------------------------------------------------------------- renderers


def _render(result, fmt: str) -> str:
    import io

    buf = io.StringIO()
    gate_report.render(result, buf, fmt)
    return buf.getvalue()


def _check_markdown_tables(text: str) -> None:
    """Every table row has as many cells as its header (pipes inside cells are escaped)."""
    import re

    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---"):
            width = len(re.split(r"(?<!\\)\|", lines[i - 1]))
            assert len(re.split(r"(?<!\\)\|", line)) == width
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert len(re.split(r"(?<!\\)\|", lines[j])) == width, lines[j]
                j += 1


def test_renderers_escape_hostile_kernel_names(dense) -> None:
    b = dense[1]
    c = copy.deepcopy(b)
    name = "evil|kernel<b>x</b>`tick`\x01 & co"
    c["stages"].append(
        {
            "phase": "decode",
            "stage": "other",
            "category": "other",
            "p50_ns": 90_000,
            "mean_ns": 90_000,
            "present": 23,
            "count_per_step": 1,
            "per_token_ns": None,
        }
    )
    c["groups"].append(
        {
            "phase": "decode",
            "stage": "other",
            "group_key": name,
            "provider": "unknown",
            "p50_ns": 90_000,
            "mean_ns": 90_000,
            "present": 23,
            "count_per_step": 1,
            "per_token_ns": None,
        }
    )
    r = gate.compare(b, c)
    assert r["status"] == "fail"
    md = _render(r, "markdown")
    _check_markdown_tables(md)
    assert "\x01" not in md and "evil\\|kernel" in md
    root = ET.fromstring(_render(r, "junit").split("\n", 1)[1])
    assert int(root.get("failures")) >= 1
    assert json.loads(_render(r, "json"))["failed"][0]["id"] == "decode.other"
    assert gate_report.format_for_path("x/summary.MD") == "markdown"
    assert gate_report.format_for_path("junit.xml") == "junit"
    assert gate_report.format_for_path("report", "json") == "json"
    for bad in ("x.pdf", "report.log"):
        with pytest.raises(UsageError, match=bad):
            gate_report.format_for_path(bad)
