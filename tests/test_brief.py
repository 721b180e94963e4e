"""The prefill-vs-decode brief (analyzer/analyses/brief): every value against the capture's own config
and annotations, never against numbers written down from a run."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analyzer.analyses.brief import headroom
from analyzer.cli import main
from analyzer.options import Options
from analyzer.results.summary import build_summary
from tests.conftest import FIXTURES
from tests.runs import analyze_run

ZOO = FIXTURES / "zoo"
CASES = sorted(p.name for p in ZOO.iterdir() if (p / "meta.json").exists())

# HF config spellings of one size across model families (the capture writes each family's own)
ALIASES = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "multi_query_group_num"),
    "layers": ("num_hidden_layers", "n_layer"),
    "ffn": ("intermediate_size", "ffn_dim", "n_inner"),
    "vocab": ("vocab_size",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok",),
    "expert_ffn": ("moe_intermediate_size",),
}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _config_value(cfg: dict[str, Any], key: str) -> int | None:
    for k in ALIASES.get(key, ()):
        if cfg.get(k) is not None:
            return int(cfg[k])
    return None


def _expected(cfg: dict[str, Any]) -> dict[str, int | None]:
    """What the config says, with HF's defaults: KV heads = heads, head size = hidden / heads."""
    out = {k: _config_value(cfg, k) for k in ALIASES}
    if out["kv_heads"] is None and out["heads"] and not cfg.get("kv_lora_rank"):
        out["kv_heads"] = 1 if cfg.get("multi_query") else out["heads"]
    hd = cfg.get("head_dim")
    out["head_dim"] = (
        int(hd) if hd else (out["hidden"] // out["heads"] if out["hidden"] and out["heads"] else None)
    )
    if cfg.get("kv_lora_rank"):  # MLA: the attention's heads and head size are its own, not the config's
        out["kv_heads"] = out["head_dim"] = None
    if out["experts"]:
        out["ffn"] = None  # MoE configs name a dense width some layers may not use
    return out


@cache
def _summary(case: str, **settings: str) -> dict[str, Any]:
    a = analyze_run([str(ZOO / case / "trace.json.gz")], Options(settings=settings))
    return build_summary(a)


def _meta(case: str) -> dict[str, Any]:
    return json.loads((ZOO / case / "meta.json").read_text())


@pytest.mark.parametrize("case", CASES)
def test_zoo_dimensions_match_the_capture_config(case: str) -> None:
    # GIVEN a zoo capture and the config it was made from
    cfg = _meta(case)["config"]
    want = _expected(cfg)
    # WHEN the brief reads the model's dimensions from the trace
    dims = _summary(case)["brief"]["model"]["per_rank"]
    # THEN each one it states is the config's, and each one it cannot state says why
    for key, item in dims.items():
        if item["value"] is None:
            assert item.get("unknown") or item.get("evidence"), (case, key)
            continue
        assert item["evidence"], (case, key)
        if want.get(key) is not None:
            assert item["value"] == want[key], (case, key, item)


@pytest.mark.parametrize("case", CASES)
def test_zoo_kv_bytes_per_token_follow_the_config(case: str) -> None:
    meta = _meta(case)
    want = _expected(meta["config"])
    item = _summary(case)["brief"]["kv_cache"]["bytes_per_token"]
    if item["value"] is None:
        assert item["unknown"]
        return
    cfg, b = meta["config"], DTYPE_BYTES[meta["dtype"]]
    if cfg.get("kv_lora_rank"):  # MLA run by HF: the cache holds every head's expanded keys and values
        k_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        assert item["value"] == want["layers"] * want["heads"] * (k_head + cfg["v_head_dim"]) * b
    else:
        assert item["value"] == 2 * want["layers"] * want["kv_heads"] * want["head_dim"] * b


def test_dimensions_are_found_on_most_zoo_cases() -> None:
    # the brief is worth reading only where it knows the sizes: the hidden size on every case with
    # shapes recorded and one draft-free model
    known = [
        c
        for c in CASES
        if _meta(c)["record_shapes"] and not _meta(c)["assistant"]
        for _ in [0]
        if _summary(c)["brief"]["model"]["per_rank"]["hidden"]["value"] is not None
    ]
    with_shapes = [c for c in CASES if _meta(c)["record_shapes"] and not _meta(c)["assistant"]]
    assert len(known) == len(with_shapes)


def _annotation_fields(text: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", text))


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("llama-assisted")])
def test_verify_width_is_the_annotated_query_length(case: str) -> None:
    # GIVEN the capture's own step annotations: the target's decode steps score q tokens
    steps = [_annotation_fields(s) for s in _meta(case)["steps"]]
    verify = [
        int(s["q"])
        for s in steps
        if s.get("phase") == "decode" and s.get("model") != "draft" and int(s["q"]) > 1
    ]
    drafts = sum(1 for s in steps if s.get("model") == "draft")
    # WHEN the brief reads the speculation
    brief = _summary(case)["brief"]
    spec = brief["speculative"]["value"]
    # THEN the verify width and the draft steps are the annotations'
    assert spec["draft_steps"] == drafts
    assert spec["verify_steps"] == len(verify)
    w = spec["verify_width"]
    assert (w["p50"], w["max"]) == (np.percentile(verify, 50), max(verify))
    assert brief["tokens"]["verify_width"]["value"]["max"] == max(verify)
    # the shapes of two models mixed: not stated as the target's
    assert brief["model"]["per_rank"]["hidden"]["value"] is None
    if _meta(case)["record_shapes"]:
        assert "draft" in brief["model"]["per_rank"]["hidden"]["unknown"]


@pytest.mark.parametrize("case", ["llama-cb-paged-sdpa-bf16", "qwen2-cb-paged-eager-bf16"])
def test_token_distributions_are_the_annotated_ones(case: str) -> None:
    steps = [_annotation_fields(s) for s in _meta(case)["steps"]]
    tok = _summary(case)["brief"]["tokens"]

    def q_times_bs(phase: str) -> list[int]:
        return [int(s["q"]) * int(s["bs"]) for s in steps if s["phase"] == phase]

    pre = [int(s["q"]) * int(s["bs"]) for s in steps if s["phase"] == "prefill"]
    assert tok["prefill_per_step"]["value"]["max"] == max(pre)
    assert tok["decode_per_step"]["value"]["max"] == max(q_times_bs("decode"))
    mixed = [int(s["prefill_tokens"]) + int(s["decode_tokens"]) for s in steps if s["phase"] == "mixed"]
    assert tok["mixed_per_step"]["value"]["p50"] == np.percentile(mixed, 50)


def test_a_paged_continuous_batching_cache_is_named_paged() -> None:
    for case in [c for c in CASES if _meta(c)["attn"].startswith("paged") and _meta(c)["record_shapes"]]:
        assert _summary(case)["brief"]["kv_cache"]["layout"]["value"] == "paged", case
    for case in [c for c in CASES if _meta(c)["mode"] == "static-cache" and _meta(c)["record_shapes"]]:
        assert _summary(case)["brief"]["kv_cache"]["layout"]["value"] in ("contiguous", None), case


# --------------------------------------------------------------------------- headroom


def test_headroom_of_known_rates_is_exact() -> None:
    # GIVEN kernels with known times and shares of their roofs
    frame = pd.DataFrame(
        {
            "phase": ["decode", "decode", "prefill", "prefill", "decode"],
            "stage": ["qkv_gemm", "qkv_gemm", "down_gemm", "norm", "norm"],
            "dur_ns": [1000, 3000, 2000, 500, 700],
            "pct_of_peak": [0.2, 0.4, 0.9, np.nan, 0.1],
            "count": [1, 1, 1, 1, 1],
            "uncounted": [None, None, None, "no_shapes", None],
            "bound": ["memory", "memory", "compute", "unknown", "latency"],
        }
    )
    # WHEN the headroom at a target of 0.5 is computed
    h = headroom.headroom(frame, {"name": "x"}, 0.5)
    rows = {(r["phase"], r["stage"]): r for r in h["rows"]}
    # THEN each kernel below the target saves t x (1 - pct / target); one above it saves nothing
    assert rows[("decode", "qkv_gemm")]["saved_ns"] == round(1000 * (1 - 0.2 / 0.5) + 3000 * (1 - 0.4 / 0.5))
    assert rows[("prefill", "down_gemm")]["saved_ns"] == 0
    assert rows[("decode", "norm")]["saved_ns"] == round(700 * (1 - 0.1 / 0.5))
    assert [r["rank"] for r in h["rows"]] == [1, 2, 3]
    assert h["rows"][0]["stage"] == "qkv_gemm"  # the largest saving first
    # and the kernel without a rate is listed apart with its reason
    assert h["uncounted"] == [
        {"phase": "prefill", "stage": "norm", "time_ns": 500, "kernels": 1, "reasons": ["no_shapes"]}
    ]


def test_roof_target_setting_reaches_the_headroom() -> None:
    h = _summary("llama-sdpa-bf16", **{"brief.roof_target": "0.5"})["brief"]["headroom"]
    assert h["roof_target"] == 0.5


# --------------------------------------------------------------------------- CLI and HTML


def test_analyze_brief_prints_each_value_with_its_evidence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(ZOO / "llama-cb-paged-sdpa-bf16" / "trace.json.gz"), "--brief"]) == 0
    out = capsys.readouterr().out
    assert "Brief:" in out and "KV heads" in out and "headroom" in out
    assert "unknown" in out and "because" in out  # the accumulator at least


@pytest.mark.parametrize("value", ["0", "1.5", "x"])
def test_a_bad_roof_target_is_bad_input(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["analyze", str(ZOO / "llama-sdpa-bf16" / "trace.json.gz"), "--set", f"brief.roof_target={value}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "brief.roof_target" in err


def test_html_report_has_the_brief_escaped(tmp_path: Path) -> None:
    from analyzer.report.html import HtmlReporter

    a = analyze_run([str(ZOO / "llama-cb-paged-sdpa-bf16" / "trace.json.gz")])
    s = build_summary(a)
    s["brief"]["phases"]["prefill"]["evidence"] = "<script>alert(1)</script>"
    out = tmp_path / "r.html"
    with out.open("w") as f:
        HtmlReporter(a.kernels).render(s, f)
    html = out.read_text()
    assert 'id="brief"' in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# --------------------------------------------------------------------------- F001's token regime


def test_both_phase_findings_state_each_phase_token_regime() -> None:
    # GIVEN the bundled H200 dense run, whose lm_head configuration serves both phases
    from tests.conftest import H200_DENSE

    a = analyze_run([str(H200_DENSE)])
    s = build_summary(a)
    found = [f for f in s["findings"] if f["id"] == "F001"]
    assert found
    df = a.frame
    steps = pd.DataFrame(s["steps"]).set_index("step")
    for f in found:
        # WHEN the tokens per step of each phase are read independently: the steps its kernels ran in
        g = df[df["group_key"].isin(f["group_keys"])]
        want = {}
        for phase in ("prefill", "decode"):
            ran = sorted(set(g.loc[g["phase"] == phase, "step"].astype(int)))
            want[phase] = float(np.median(steps.loc[ran, "tokens"].dropna())) if ran else None
        # THEN its title names both
        text = f"{want['prefill']:,.0f} tokens in prefill, {want['decode']:,.0f} in decode"
        assert text in f["title"], (f["title"], text)


# --------------------------------------------------------------------------- continuous-batching interference

CB_CASES = [c for c in CASES if "-cb-" in c]


def _raw_step_times(case: str, stage_of: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    """Per ``lkm::step`` annotation of the trace JSON itself: its phase, its prefill and decode token
    counts (``prefill_tokens=`` / ``decode_tokens=``, else ``tokens=``, else q x bs of its phase: a
    ragged batch states its total) and the kernel time
    per stage of the GPU activities launched inside it on its thread (by correlation id); the stage
    of an activity is the analyzer's, found by (correlation, order within it)."""
    import gzip

    events = json.loads(gzip.open(ZOO / case / "trace.json.gz").read())["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("lkm::step ")]
    launches = [
        e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    ]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_corr: dict[int, list[dict[str, Any]]] = {}
    for e in sorted(gpu, key=lambda e: e["ts"]):
        by_corr.setdefault(int(e["args"]["correlation"]), []).append(e)
    out = []
    for a in steps:
        f = _annotation_fields(a["name"])
        if f.get("model") == "draft":
            continue
        n = int(f.get("tokens", int(f["q"]) * int(f["bs"])))
        pre = int(f.get("prefill_tokens", n if f["phase"] == "prefill" else 0))
        dec = int(f.get("decode_tokens", n if f["phase"] == "decode" else 0))
        per: dict[str, float] = {}
        for ln in launches:
            if (ln["pid"], ln["tid"]) != (a["pid"], a["tid"]) or not a["ts"] <= ln["ts"] <= a["ts"] + a[
                "dur"
            ]:
                continue
            corr = int(ln["args"]["correlation"])
            for i, g in enumerate(by_corr.get(corr, [])):
                st = stage_of[(corr, i)]
                per[st] = per.get(st, 0.0) + round(g["dur"] * 1000)
        out.append({"phase": f["phase"], "prefill": pre, "decode": dec, "time": per})
    return out


def _stages_by_correlation(kernels: Any) -> dict[tuple[int, int], str]:
    k = kernels.select(["correlation", "start_ns", "stage"]).to_pandas()
    k = k.sort_values(["correlation", "start_ns"], kind="stable")
    k["i"] = k.groupby("correlation").cumcount()
    return {(int(c), int(i)): str(s) for c, i, s in zip(k["correlation"], k["i"], k["stage"], strict=True)}


@pytest.mark.parametrize("case", CB_CASES)
def test_interference_is_the_annotated_steps_time_per_token(case: str) -> None:
    # GIVEN a continuous-batching capture: its raw step annotations and the kernels launched in each
    a = analyze_run([str(ZOO / case / "trace.json.gz")])
    raw = _raw_step_times(case, _stages_by_correlation(a.kernels))
    assert raw and all(s["time"] for s in raw)
    # WHEN the brief compares mixed steps against pure ones
    inter = build_summary(a)["brief"]["interference"]
    # THEN per side, in total and per stage: the sum of the kind's kernel time over the sum of its tokens
    for side, pure in (("decode", "decode"), ("prefill", "prefill")):
        mixed = [s for s in raw if s["phase"] == "mixed"]
        alone = [s for s in raw if s["phase"] == pure]
        item = inter[side]
        if not mixed or not alone:
            assert item["value"] is None and item["unknown"], (case, side)
            continue
        v = item["value"]
        assert (v["mixed_steps"], v["pure_steps"]) == (len(mixed), len(alone))
        m_tok, p_tok = sum(s[side] for s in mixed), sum(s[side] for s in alone)
        assert (v["mixed_tokens"], v["pure_tokens"]) == (m_tok, p_tok)

        def per_token(steps: list[dict[str, Any]], tokens: int, stage: str | None) -> float:
            return sum(t for s in steps for st, t in s["time"].items() if stage in (None, st)) / tokens

        assert v["total"]["mixed_ns_per_token"] == pytest.approx(per_token(mixed, m_tok, None), rel=1e-9)
        assert v["total"]["pure_ns_per_token"] == pytest.approx(per_token(alone, p_tok, None), rel=1e-9)
        stages = {st for s in mixed + alone for st in s["time"]}
        assert {r["stage"] for r in v["stages"]} == stages
        for r in v["stages"]:
            want_m, want_p = per_token(mixed, m_tok, r["stage"]), per_token(alone, p_tok, r["stage"])
            assert r["mixed_ns_per_token"] == pytest.approx(want_m, rel=1e-9), (case, side, r)
            assert r["pure_ns_per_token"] == pytest.approx(want_p, rel=1e-9), (case, side, r)
            assert r["ratio"] == (pytest.approx(want_m / want_p, rel=1e-9) if want_p else None)


def test_interference_is_unknown_without_mixed_steps() -> None:
    # GIVEN a static-batch capture (no step mixes prefill and decode tokens)
    case = next(c for c in CASES if _meta(c)["mode"] == "static-cache")
    assert not any("phase=mixed" in s for s in _meta(case)["steps"])
    inter = _summary(case)["brief"]["interference"]
    # THEN neither side is guessed
    for side in ("decode", "prefill"):
        assert inter[side]["value"] is None and "no mixed steps" in inter[side]["unknown"]


def test_interference_leaves_out_steps_without_token_counts() -> None:
    from analyzer.analyses.brief.interference import interference

    # GIVEN three steps (mixed, pure decode, pure prefill) of kernels of two stages, and the decode
    # step's token count unknown
    rng = np.random.default_rng(0)
    step = np.repeat([0, 1, 2], 4).astype(np.int32)
    frame = pd.DataFrame(
        {
            "trace_id": np.zeros(12, np.int16),
            "rank": np.zeros(12, np.int16),
            "step": step,
            "stage": pd.Categorical(np.tile(["a", "b"], 6)),
            "dur_ns": rng.integers(1, 1000, 12),
        }
    )
    steps = pd.DataFrame(
        {
            "trace_id": [0, 0, 0],
            "rank": [0, 0, 0],
            "step": [0, 1, 2],
            "phase": ["mixed", "decode", "prefill"],
            "prefill_tokens": [30, 0, 64],
            "decode_tokens": [2, None, 0],
        }
    )
    got = interference(frame, steps, lambda st: "test")
    # THEN the decode side has no pure step with a count: unknown, saying why
    assert got["decode"]["value"] is None and "token counts" in got["decode"]["unknown"]
    # and the prefill side is step 0's time over 30 tokens against step 2's over 64
    v = got["prefill"]["value"]
    per = frame.groupby("step")["dur_ns"].sum()
    assert v["total"]["mixed_ns_per_token"] == per[0] / 30
    assert v["total"]["pure_ns_per_token"] == per[2] / 64
    assert v["steps_without_tokens"] == 0 and (v["mixed_steps"], v["pure_steps"]) == (1, 1)
    # AND without its pure prefill step, the prefill side is unknown too, saying so
    got = interference(frame[frame["step"] < 2], steps.iloc[:2], lambda st: "test")
    assert got["prefill"]["value"] is None and "no pure prefill steps" in got["prefill"]["unknown"]


def test_analyze_brief_prints_the_interference_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(ZOO / CB_CASES[0] / "trace.json.gz"), "--brief"]) == 0
    out = capsys.readouterr().out
    assert "continuous batching" in out and "per decode token: mixed vs pure" in out
    assert "mixed / pure" in out
