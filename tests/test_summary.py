"""Summary numbers are recomputable: totals and stage times against an independent reading."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from analyzer.cli import main
from analyzer.results.summary import FORMAT_VERSION, build_summary
from tests import rawtrace
from tests.conftest import FIXTURES, H200_DENSE, H200_TP2, shared
from tests.runs import analyze_paths


@pytest.fixture(scope="module")
def dense():
    a = analyze_paths([str(H200_DENSE)])
    return a, build_summary(a)


def test_skeleton(dense) -> None:
    _, s = dense
    for key in (
        "format_version",
        "inputs",
        "rules_sha256",
        "gpu",
        "totals",
        "phases",
        "stages",
        "groups",
        "steps",
        "findings",
        "warnings",
    ):
        assert key in s
    assert s["format_version"] == FORMAT_VERSION
    assert len(s["inputs"][0]["sha256"]) == 64 and len(s["rules_sha256"]) == 64
    assert s["gpu"]["name"].startswith("NVIDIA H200")


def test_totals_match_raw_json(dense) -> None:
    _, s = dense
    events = rawtrace.gpu_events(rawtrace.load(H200_DENSE))
    t = s["totals"]
    assert t["kernels"] == len(events)
    assert t["kernel_ns"] == sum(rawtrace.ns(e["dur"]) for e in events)
    start = min(rawtrace.ns(e["ts"]) for e in events)
    end = max(rawtrace.ns(e["ts"]) + rawtrace.ns(e["dur"]) for e in events)
    assert t["wall_ns"] == end - start
    # one device, one stream here: busy = union of intervals
    assert t["busy_ns"] == sum(rawtrace.stream_busy(events).values())
    assert t["idle_fraction"] == pytest.approx(1 - t["busy_ns"] / t["wall_ns"])


def test_stage_and_phase_times_sum_to_total(dense) -> None:
    _, s = dense
    total = s["totals"]["kernel_ns"]
    assert sum(r["time_ns"] for r in s["stages"]) == total
    assert sum(r["time_ns"] for r in s["providers"]) == total
    assert sum(p["kernel_ns"] for p in s["phases"].values()) == total
    for p in s["phases"].values():
        assert sum(r["time_ns"] for r in p["profile"]) == p["kernel_ns"]


def test_groups_rates_recomputable(dense) -> None:
    a, s = dense
    k = a.kernels.to_pandas()
    for g in s["groups"][:20]:
        sub = k[(k["group_key"] == g["group_key"]) & (k["phase"] == g["phase"]) & (k["stage"] == g["stage"])]
        assert g["time_ns"] == int(sub["dur_ns"].sum())
        if g["flops"] is not None:
            assert g["flops"] == pytest.approx(sub["flops"].sum())


def test_multi_rank_run_keeps_ranks() -> None:
    a = analyze_paths([str(p) for p in H200_TP2])
    s = build_summary(a)
    assert [i["rank"] for i in s["inputs"]] == [0, 1]
    k = a.kernels.to_pandas()
    assert set(k["rank"]) == {0, 1} and set(k["trace_id"]) == {0, 1}
    assert s["totals"]["devices"] == 2
    assert {st["rank"] for st in s["steps"]} == {0, 1}
    # idle over several GPUs is what a reader computes from the printed numbers: 1 - busy / (2 x wall)
    t = s["totals"]
    assert t["idle_fraction"] == pytest.approx(1 - t["busy_ns"] / (2 * t["wall_ns"]))
    assert 0.30 < t["idle_fraction"] < 0.37  # rank 1 starts 137 ms late; it was printed as 5.5%
    # each rank's own idle share, over its own wall
    for r in s["ranks"]["per_rank"]:
        assert r["idle_fraction"] == pytest.approx(1 - r["busy_ns"] / r["wall_ns"])


def test_rocm_sglang_pair_phases() -> None:
    pre = shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz")
    dec = shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_decode.json.gz")
    s = build_summary(analyze_paths([str(pre), str(dec)]))
    assert s["phases"]["prefill"]["tokens"] == 15360 and s["phases"]["decode"]["tokens"] == 32
    assert s["gpu"]["name"] == "AMD Instinct MI300X"
    labels = [r["label"] for r in s["phases"]["decode"]["profile"]]
    assert labels[0] == "Dense GEMM" and "Attention" in labels[:3]
    assert np.isclose(sum(r["share"] for r in s["phases"]["prefill"]["profile"]), 1.0)
    # two files of one profile, one GPU: counted once, not "summed over 2 GPUs"
    assert s["totals"]["devices"] == 1


def test_dropping_host_ops_after_the_roofline_changes_nothing(dense) -> None:
    """The CLI frees host ops once the roofline has used them: every number stays the same."""
    from analyzer.pipeline import analyze_trace
    from tests.runs import load_inputs

    kept, s_kept = dense
    a = analyze_trace(load_inputs([str(H200_DENSE)]), keep_host_ops=False)
    assert a.trace.host_ops.num_rows == 0 and kept.trace.host_ops.num_rows > 0
    assert a.kernels.equals(kept.kernels)
    s = build_summary(a)
    for key in ("totals", "phases", "stages", "providers", "groups", "top_kernels", "findings", "warnings"):
        assert s[key] == s_kept[key], key


def test_analysis_string_columns_are_dictionary_encoded(dense) -> None:
    import pyarrow as pa

    a, _ = dense
    for col in ("stage", "category", "provider", "rule_id", "group_key", "phase", "flops_source", "bound"):
        assert a.kernels.schema.field(col).type == pa.dictionary(pa.int32(), pa.string()), col
    # each row reads as its value: the encoding is storage only
    stages = a.kernels["stage"].to_pylist()
    assert stages[:5] == a.kernels["stage"].cast(pa.string()).to_pylist()[:5] and None not in stages


def _group_rows(phases: list[str], nbytes: list[float | None]) -> pd.DataFrame:
    n = len(phases)
    return pd.DataFrame(
        {
            "group_key": ["g"] * n,
            "norm_name": ["gemm"] * n,
            "stage": ["lm_head_gemm"] * n,
            "provider": ["cublas"] * n,
            "rule_id": ["R"] * n,
            "category": ["dense_gemm"] * n,
            "phase": phases,
            "count": [1] * n,
            "dur_ns": [1000] * n,
            "flops": [None] * n,
            "bytes": nbytes,
            "pct_of_peak": [0.5 if b else None for b in nbytes],
            "bound": ["memory" if b else "unknown" for b in nbytes],
            "tile_m": [None] * n,
            "tile_n": [None] * n,
            "tile_k": [None] * n,
            "split_k": [None] * n,
        }
    )


def test_a_top_kernel_rate_says_which_phase_it_is_from() -> None:
    from analyzer.results import summary as summary_mod

    # GIVEN a configuration that runs mostly in decode, with numbers only for its prefill launch
    df = _group_rows(["decode", "decode", "decode", "prefill"], [None, None, None, 2e6])
    (r,) = summary_mod.top_kernels(df, 4000)
    # THEN the row names the phase its rate comes from, and gives the rate per phase
    assert r["phase"] == "decode" and r["rate_phases"] == ["prefill"]
    assert [p["phase"] for p in r["phase_rates"]] == ["prefill"]
    assert r["phase_rates"][0]["achieved_tbps"] == pytest.approx(2.0)
    # ... and with numbers in both phases, each phase has its own rate
    (both,) = summary_mod.top_kernels(_group_rows(["decode", "prefill"], [1e6, 3e6]), 2000)
    assert both["rate_phases"] == ["decode", "prefill"]
    assert [p["achieved_tbps"] for p in both["phase_rates"]] == pytest.approx([1.0, 3.0])


def test_tp2_lm_head_rate_covers_the_decode_replays(capsys) -> None:
    # the decode LM head replays from a CUDA graph (no shapes): the sizes found in the eager
    # prefill's shapes count them, so the row's rate is no longer the prefill's alone
    from analyzer.cli import main

    assert main(["analyze", *map(str, H200_TP2)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "nvjet_sm90_tst_256x8_64x6" in line)
    assert "decode 96.9% (+prefill)" in row and "TB/s (88%)" in row and "in prefill" not in row


# --------------------------------------------------------------------------- provenance (issue 30)


@pytest.mark.parametrize("trace", [H200_DENSE, FIXTURES / "zoo" / "qwen3-moe-grouped-bf16" / "trace.json.gz"])
def test_by_rule_sums_to_kernel_time_and_matches_the_exported_kernels(trace, tmp_path) -> None:
    # GIVEN a run's summary and its kernels table exported to Parquet by the CLI
    a = analyze_paths([str(trace)])
    s = build_summary(a)
    out = tmp_path / "k.parquet"
    assert main(["export", str(trace), "-o", str(out)]) == 0
    k = pq.read_table(out, columns=["stage_rule", "dur_ns"]).to_pandas()
    by_rule = s["classification"]["by_rule"]
    # THEN by_rule holds every id with time, largest first, summing to the kernel time
    assert sum(by_rule.values()) == s["totals"]["kernel_ns"] == int(k["dur_ns"].sum())
    assert all(isinstance(v, int) and v > 0 for v in by_rule.values())
    assert list(by_rule.values()) == sorted(by_rule.values(), reverse=True)
    # AND it is the exported table's time per stage_rule
    want = k.groupby(k["stage_rule"].astype(str))["dur_ns"].sum()
    assert by_rule == {r: int(t) for r, t in want.items() if t > 0}
    # AND the four shares and the layer-only rules are kept
    c = s["classification"]
    assert {"by_name_rule", "by_shapes", "by_structure", "role_free"} <= c.keys()
    assert c["layer_rules"] == a.layer_rules


def test_step_rows_carry_the_phase_rule(dense) -> None:
    # GIVEN the summary of an annotated run and its steps table
    a, s = dense
    # THEN every step row names the rule that decided its phase and the evidence it used
    assert s["steps"] and len(s["steps"]) == len(a.steps)
    for row, (rule, evidence) in zip(
        s["steps"], a.steps[["phase_rule", "phase_evidence"]].itertuples(index=False), strict=True
    ):
        assert row["phase_rule"] == rule and row["phase_evidence"] == list(evidence)
        assert isinstance(row["phase_rule"], str) and all(isinstance(x, str) for x in row["phase_evidence"])
