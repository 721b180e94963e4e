"""``--compare`` (analyzer/compare.py, text.render_compare): summaries set side by side, ratios over
the first input. Hand-built summaries for the arithmetic, the same SGLang decode step on MI300X and
on B300 for the real thing."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.report import text
from analyzer.results.compare import FORMAT_VERSION, compare_summaries, input_labels
from analyzer.results.summary import build_summary
from tests.conftest import H200_TP2, shared
from tests.runs import analyze_paths

PAIR = "sglang-deepseek-llama8b-decode-mi300x-vs-b300"


def fake(
    gpu: str | None, decode: dict[str, int], path: str = "x.json.gz", stages: list[tuple[str, str, int]] = ()
) -> dict[str, Any]:
    """A minimal summary: decode-phase category times (ns) and (stage, provider, ns) rows."""
    total = sum(decode.values())
    return {
        "inputs": [{"trace_id": 0, "path": path, "format": "kineto", "sha256": "0" * 64, "rank": 0}],
        "gpu": {"name": gpu, "arch": None, "peaks": {}, "reason": None if gpu else "no match"},
        "totals": {
            "wall_ns": total,
            "busy_ns": total,
            "idle_fraction": 0.0,
            "kernel_ns": total,
            "kernels": 3,
        },
        "phases": {
            "decode": {
                "steps": 1,
                "kernel_ns": total,
                "step_ns": {"p50": total},
                "tokens": 16,
                "idle_fraction": 0.0,
                "profile": [
                    {"category": c, "label": c.title(), "time_ns": t, "share": t / total}
                    for c, t in decode.items()
                ],
            }
        },  # fmt: skip
        "stages": [
            {"phase": "decode", "stage": s, "category": "dense_gemm", "provider": p, "time_ns": t}
            for s, p, t in stages
        ],  # fmt: skip
    }


def test_ratios_are_over_the_first_input() -> None:
    # GIVEN two inputs where B spends half of A's GEMM time and some attention A does not have
    a = fake("GPU-A", {"dense_gemm": 800, "norm": 200}, stages=[("qkv_gemm", "hipblaslt", 800)])
    b = fake(
        "GPU-B",
        {"dense_gemm": 400, "attention": 100},
        stages=[("qkv_gemm", "cublas", 300), ("qkv_gemm", "cutlass", 100)],
    )
    # WHEN compared
    r = compare_summaries([a, b])
    # THEN the result is versioned, keyed A/B, and every ratio is B over A (None where A has none)
    assert r["format_version"] == FORMAT_VERSION and r["kind"] == "compare"
    assert [i["key"] for i in r["inputs"]] == ["A", "B"]
    cats = {c["category"]: c for c in r["categories"]}
    assert cats["dense_gemm"]["time_ns"] == [800, 400] and cats["dense_gemm"]["ratio"] == [1.0, 0.5]
    assert cats["attention"]["ratio"] == [None, None] and cats["norm"]["time_ns"] == [200, 0]
    assert cats["dense_gemm"]["share"] == [0.8, 0.8]
    (ph,) = r["phases"]
    assert ph["kernel_ratio"] == [1.0, 0.5] and ph["step_p50_ns"] == [1000, 500]
    (st,) = r["stages"]
    assert st["time_ns"] == [800, 400] and st["providers"] == [["hipblaslt"], ["cublas", "cutlass"]]
    assert r["inputs"][1]["phases"]["decode"]["shares"]["dense_gemm"] == 0.8


def test_labels_tell_inputs_apart() -> None:
    assert input_labels([fake("H200", {"x": 1}), fake("B200", {"x": 1})]) == ["H200", "B200"]
    same = input_labels([fake("H200", {"x": 1}, "a/base.json"), fake("H200", {"x": 1}, "b/cand.json")])
    assert same == ["H200, base.json", "H200, cand.json"]
    assert len(set(input_labels([fake(None, {"x": 1})] * 3))) == 3


def test_compare_needs_an_input() -> None:
    with pytest.raises(ValueError):
        compare_summaries([])


def test_render_compare_prints_columns_and_ratios() -> None:
    r = compare_summaries([fake("GPU-A", {"dense_gemm": 800}), fake(None, {"dense_gemm": 1600})])
    out = io.StringIO()
    text.render_compare(r, out)
    s = out.getvalue()
    assert "A: GPU-A" in s and "B: unknown GPU (no match)" in s
    assert "B/A" in s and "2.00x" in s


@pytest.fixture(scope="module")
def pair_summaries() -> list[dict[str, Any]]:
    root = shared(PAIR)
    paths = sorted(root.glob("MI300/*.json.gz")) + sorted(root.glob("B300/*.json.gz"))
    return [build_summary(analyze_paths([str(p)])) for p in paths]


def test_same_decode_step_on_mi300x_and_b300(pair_summaries: list[dict[str, Any]]) -> None:
    # GIVEN the same SGLang decode step (bs=16, Llama-8B) on MI300X and on B300
    r = compare_summaries(pair_summaries)
    a, b = r["inputs"]
    assert "MI300X" in a["gpu"]["name"] and "B300" in b["gpu"]["name"]
    # THEN category times add up to each phase's kernel time, and ratios are B over A
    decode = next(p for p in r["phases"] if p["phase"] == "decode")
    assert decode["steps"] == [1, 1]
    cats = [c for c in r["categories"] if c["phase"] == "decode"]
    for i in range(2):
        assert sum(c["time_ns"][i] for c in cats) == decode["kernel_ns"][i]
        assert sum(c["share"][i] for c in cats) == pytest.approx(1.0)
    for c in cats:
        if c["time_ns"][0]:
            assert c["ratio"][1] == pytest.approx(c["time_ns"][1] / c["time_ns"][0])
    gemm = next(c for c in cats if c["category"] == "dense_gemm")
    assert gemm["time_ns"][0] > 0 and gemm["time_ns"][1] > 0
    # AND the stage rows carry each vendor's GEMM library
    qkv = next(s for s in r["stages"] if s["phase"] == "decode" and s["stage"] == "qkv_gemm")
    assert qkv["providers"][0] != qkv["providers"][1]


def test_analyze_compare_cli(tmp_path: Path) -> None:
    root = shared(PAIR)
    paths = [str(p) for p in sorted(root.glob("MI300/*.json.gz")) + sorted(root.glob("B300/*.json.gz"))]
    out_json, out_html = tmp_path / "cmp.json", tmp_path / "cmp.html"
    res = CliRunner().invoke(cli, ["analyze", *paths, "--compare", "--json", str(out_json), "--html", str(out_html)],
                             standalone_mode=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "B/A" in res.output and "MI300X" in res.output
    assert json.loads(out_json.read_text())["kind"] == "compare"
    # the files written are named on stderr, as analyze does without --compare
    assert f"wrote {out_json}" in res.stderr and f"wrote {out_html}" in res.stderr
    page = out_html.read_text()
    assert page.count('class="fig"') >= 1 and "B300" in page
    res = CliRunner().invoke(cli, ["report", *paths, "--compare", "--cdn", "-o", str(tmp_path / "r.html")],
                             standalone_mode=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.html").stat().st_size < 1_000_000


def _render(summaries: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    text.render_compare(compare_summaries(summaries), out)
    return out.getvalue()


def test_a_summary_only_input_has_no_wall_busy_or_idle() -> None:
    # GIVEN a totals-only input (nsys cuda_gpu_kern_sum) beside a trace
    totals_only = fake("GPU-A", {"dense_gemm": 100})
    totals_only["totals"].update(wall_ns=0, busy_ns=0, idle_fraction=0.0, aggregate_rows=3)
    s = _render([totals_only, fake("GPU-B", {"dense_gemm": 200})])
    # THEN its wall, busy and idle print as unknown, as analyze prints them, not as 0 ns and 0.0%
    row_a = next(line for line in s.splitlines() if line.strip().startswith("A "))
    assert row_a.split()[1:4] == ["—", "—", "—"] and " 0 ns" not in row_a


def test_the_text_comparison_lists_each_inputs_top_kernels_and_findings() -> None:
    a, b = fake("GPU-A", {"dense_gemm": 100}), fake("GPU-B", {"dense_gemm": 200})
    a["top_kernels"] = [{"group_key": "g", "norm_name": "gemm_a", "stage": "qkv_gemm", "provider": "ck",
                         "phase": "decode", "count": 2, "time_ns": 100, "share": 1.0}]  # fmt: skip
    b["findings"] = [
        {"id": "F006", "severity": "critical", "phase": "decode", "title": "GPU idle", "suggestion": "x"}
    ]
    s = _render([a, b])
    assert "A: top kernels" in s and "gemm_a" in s
    assert "B: findings (1)" in s and "[critical] F006 decode: GPU idle" in s


def test_nsys_totals_beside_a_trace_compare_without_zero_walls() -> None:
    summary_only = shared("nsys-stats-csv-deepseek-ocr-rtx5090/decode")
    res = CliRunner().invoke(
        cli, ["analyze", "--compare", str(summary_only), str(H200_TP2[0])], standalone_mode=False
    )
    assert res.exit_code == 0, res.output
    row_a = next(line for line in res.stdout.splitlines() if line.strip().startswith("A "))
    assert row_a.split()[1:4] == ["—", "—", "—"]
    assert "A: top kernels" in res.stdout and "B: findings" in res.stdout


# --------------------------------------------------------------------------- matched by layer role

ROLE_GEMM = ("qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm")
ROLE_ATTENTION = ("flash_attention", "paged_attention", "mla_attention", "attention_reduce")


def _roles_by_hand(kernels: Any) -> Any:
    """Each layer kernel of a GEMM, attention or norm stage with its role, found here in pandas: the
    GEMM's stage, ``attention``, or a norm before / after its layer instance's first attention kernel."""
    k = kernels.select(
        ["trace_id", "rank", "step", "layer", "stage", "phase", "start_ns", "dur_ns", "pct_of_peak"]
    )
    df = k.to_pandas()
    df["stage"], df["phase"] = df["stage"].astype(str), df["phase"].astype(str)
    df = df[df["layer"].notna() & (df["layer"] >= 0)]
    inst = ["trace_id", "rank", "step", "layer"]
    first = df[df["stage"].isin(ROLE_ATTENTION[:3])].groupby(inst)["start_ns"].min().rename("att")
    df = df.join(first, on=inst)
    df = df[df["stage"].isin((*ROLE_GEMM, *ROLE_ATTENTION, "norm"))].copy()
    df["role"] = df["stage"].where(~df["stage"].isin(ROLE_ATTENTION), "attention")
    norm = df["stage"] == "norm"
    df.loc[norm, "role"] = (df.loc[norm, "start_ns"] < df.loc[norm, "att"]).map(
        {True: "norm before attention", False: "norm after attention"}
    )
    df.loc[norm & df["att"].isna(), "role"] = "norm in a layer without attention"
    return df


def test_role_matched_compare_pairs_every_attention_gemm_and_norm_kernel_of_a_layer() -> None:
    # GIVEN the same SGLang decode step on MI300X and B300, each analysed on its own
    root = shared(PAIR)
    paths = sorted(root.glob("MI300/*.json.gz")) + sorted(root.glob("B300/*.json.gz"))
    runs = [analyze_paths([str(p)]) for p in paths]
    # WHEN compared (twice: the matching is deterministic)
    r = compare_summaries([build_summary(a) for a in runs])
    again = compare_summaries([build_summary(a) for a in runs])
    assert json.dumps(r["roles"], sort_keys=True) == json.dumps(again["roles"], sort_keys=True)
    rows = {(x["phase"], x["role"]): x for x in r["roles"]["rows"]}
    # THEN every attention, GEMM and norm kernel of a layer, on either GPU, lands in a paired row
    hand = [_roles_by_hand(a.kernels) for a in runs]
    for side, df in enumerate(hand):
        assert (
            len(df) and df["role"].str.startswith("norm before").any() and (df["role"] == "attention").any()
        )
        for (phase, role), _ in df.groupby(["phase", "role"]):
            row = rows[(phase, role)]
            assert row["paired"], (side, phase, role, row)
    # AND each side's time in those rows is its own kernels' (roles outside layers too: the whole frame)
    for side, a in enumerate(runs):
        every = a.kernels.select(["phase", "stage", "dur_ns"]).to_pandas()
        for (phase, role), row in rows.items():
            if role in ROLE_GEMM:
                want = every[(every["phase"] == phase) & (every["stage"] == role)]["dur_ns"].sum()
                assert row["time_ns"][side] == want, (side, phase, role)
            elif role == "attention":
                want = every[(every["phase"] == phase) & every["stage"].isin(ROLE_ATTENTION)]["dur_ns"].sum()
                assert row["time_ns"][side] == want, (side, phase, role)
        norms = hand[side][hand[side]["stage"] == "norm"]
        for (phase, role), g in norms.groupby(["phase", "role"]):
            assert rows[(phase, role)]["time_ns"][side] == g["dur_ns"].sum()
            rated = g[g["pct_of_peak"].notna()]
            got = rows[(phase, role)]["pct_of_peak"][side]
            if len(rated):
                want = (rated["pct_of_peak"] * rated["dur_ns"]).sum() / rated["dur_ns"].sum()
                assert got == pytest.approx(want, rel=1e-9)
            else:
                assert got is None
    # AND the ratio is B's time over A's
    for row in rows.values():
        if row["paired"]:
            assert row["ratio"][1] == pytest.approx(row["time_ns"][1] / row["time_ns"][0])


def test_compare_text_prints_the_role_table() -> None:
    root = shared(PAIR)
    paths = sorted(root.glob("MI300/*.json.gz")) + sorted(root.glob("B300/*.json.gz"))
    r = compare_summaries([build_summary(analyze_paths([str(p)])) for p in paths])
    out = io.StringIO()
    text.render_compare(r, out)
    assert "decode: time by layer role" in out.getvalue()
    assert "norm before attention" in out.getvalue() and "attention_reduce" in out.getvalue()
