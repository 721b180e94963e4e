"""Multi-rank analysis: collectives matched across ranks, split into transfer and waiting for a slower rank."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from analyzer.analyses.ranks import rank_summary
from analyzer.pipeline import analyze_trace
from analyzer.report.ranks_text import render_ranks
from analyzer.results.summary import build_summary
from tests import rawtrace
from tests.conftest import H200_TP2
from tests.runs import load_inputs

PREFILL_ALLREDUCES = 16  # 8 layers x 2 all-reduces (after attention and after the MLP), eager prefill


@pytest.fixture(scope="module")
def tp2():
    analysis = analyze_trace(load_inputs([str(p) for p in H200_TP2], cache=False))
    return analysis, build_summary(analysis)


def raw_collectives() -> list[list[tuple[int, int]]]:
    """(start ns, dur ns) of every ncclDevKernel_* kernel event, in order, per rank (stdlib JSON)."""
    out = []
    for path in H200_TP2:
        obj = rawtrace.load(path)
        base = int(obj.get("baseTimeNanoseconds", 0))
        ev = [
            e
            for e in obj["traceEvents"]
            if e.get("ph") == "X"
            and e.get("cat") == "kernel"
            and str(e.get("name", "")).startswith("ncclDevKernel_")
        ]
        ev.sort(key=lambda e: float(e["ts"]))
        out.append([(base + rawtrace.ns(e["ts"]), rawtrace.ns(e["dur"])) for e in ev])
    return out


def test_tp2_first_prefill_allreduce_is_rank0_waiting_for_rank1(tp2) -> None:
    # GIVEN the raw events, read independently of the reader
    r0, r1 = raw_collectives()
    assert len(r0) == len(r1) == 528
    (s0, d0), (s1, d1) = r0[0], r1[0]
    # the first all-reduce takes ~138 ms on rank 0 and rank 1 starts it ~138 ms later
    assert 130e6 < d0 < 145e6 and 130e6 < s1 - s0 < 145e6 and d1 < 1e6
    expected_wait = min(d0, s1 - s0)
    # WHEN the analysis splits it
    _, s = tp2
    ranks = s["ranks"]
    assert ranks["ranks"] == [0, 1] and ranks["matching"] == "order" and ranks["matched_collectives"] == 528
    first = ranks["skew_events"][0]
    # THEN it is that collective, rank 1 arrived last, and rank 0 spent it waiting
    assert first["index"] == 0 and first["phase"] == "prefill" and first["last_rank"] == 1
    w0, w1 = first["ranks"]
    assert abs(w0["start_ns"] - s0) <= 2 and abs(w1["start_ns"] - s1) <= 2
    assert abs(w0["dur_ns"] - d0) <= 2 and abs(w1["dur_ns"] - d1) <= 2
    assert abs(w0["wait_ns"] - expected_wait) <= 4 and w1["wait_ns"] == 0
    assert w0["wait_ns"] > 0.99 * w0["dur_ns"]  # ~137.9 of its ~138.3 ms
    assert abs(first["skew_ns"] - (s1 - s0)) <= 4


def test_tp2_other_prefill_allreduces_are_transfers(tp2) -> None:
    r0, r1 = raw_collectives()
    for i in range(1, PREFILL_ALLREDUCES):
        (s0, d0), (s1, d1) = r0[i], r1[i]
        assert 200e3 < d0 < 300e3 and 200e3 < d1 < 300e3  # ~250 us on both ranks
        last = max(s0, s1)
        for s, d in ((s0, d0), (s1, d1)):
            assert min(d, max(0, last - s)) < 0.15 * d  # mostly transfer
    _, s = tp2
    stats = {(c["name"].split("(")[0], c["phase"]): c for c in s["ranks"]["collectives"]}
    pre = stats[("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "prefill")]
    assert pre["count"] == PREFILL_ALLREDUCES
    # everything but the first collective's wait is transfer
    first_wait = s["ranks"]["skew_events"][0]["ranks"][0]["wait_ns"]
    assert pre["wait_ns"] - first_wait < 0.1 * (pre["transfer_ns"])
    assert 200e3 < pre["transfer_p50_ns"] < 300e3


def test_tp2_per_rank_totals_match_independent_split(tp2) -> None:
    r0, r1 = raw_collectives()
    start = np.array([[a[0] for a in r0], [b[0] for b in r1]]).T
    dur = np.array([[a[1] for a in r0], [b[1] for b in r1]]).T
    wait = np.minimum(dur, np.maximum(0, start.max(axis=1, keepdims=True) - start))
    _, s = tp2
    for j, row in enumerate(s["ranks"]["per_rank"]):
        assert row["rank"] == j
        assert abs(row["comm_ns"] - int(dur[:, j].sum())) <= 2 * len(dur)
        assert abs(row["comm_wait_ns"] - int(wait[:, j].sum())) <= 4 * len(dur)
        assert row["comm_wait_ns"] + row["comm_transfer_ns"] == row["comm_ns"]
        assert row["comm_unmatched_ns"] == 0
        assert sum(st["time_ns"] for st in row["stages"]) == row["kernel_ns"]
    assert s["ranks"]["per_rank"][0]["comm_wait_ns"] > 137e6
    assert s["ranks"]["per_rank"][1]["comm_wait_ns"] < 1e6


def test_tp2_slowest_rank_of_the_prefill_step_is_rank1(tp2) -> None:
    _, s = tp2
    steps = s["ranks"]["steps"]
    prefill = [st for st in steps if st["phase"] == "prefill"]
    assert len(prefill) == 1 and prefill[0]["slowest_rank"] == 1
    assert prefill[0]["collectives"] == PREFILL_ALLREDUCES and prefill[0]["others_wait_ns"] > 137e6
    assert sum(st["collectives"] for st in steps) == 528


def test_tp2_text_section(tp2) -> None:
    _, s = tp2
    out = io.StringIO()
    render_ranks(s, out)
    text = out.getvalue()
    assert "Ranks (2)" in text and "waiting" in text and "528 collectives matched" in text
    assert "137.92 ms" in text  # the first all-reduce's wait on rank 0
    assert "prefill      1  rank 1 in 1/1" in text


def test_single_rank_has_no_ranks_section() -> None:
    s = build_summary(analyze_trace(load_inputs([str(H200_TP2[0])], cache=False)))
    assert s["ranks"] is None
    out = io.StringIO()
    render_ranks(s, out)
    assert out.getvalue() == ""


# --------------------------------------------------------------------------------------- synthetic


def table(rows: list[tuple]) -> pd.DataFrame:
    """rows: (rank, stream, name, start, dur, stage, phase, step)."""
    df = pd.DataFrame(
        rows, columns=["rank", "stream", "norm_name", "start_ns", "dur_ns", "stage", "phase", "step"]
    )
    df["trace_id"] = df["rank"]
    df["device"] = 0
    df["aggregate"] = False
    return df


def test_wait_is_capped_at_duration_and_split_sums() -> None:
    # GIVEN rank 1 starts a 100 ns collective 5 us after rank 0 (ranks on hosts with different clocks),
    # and the second one 20 ns after it
    df = table(
        [
            (0, 7, "ar", 1000, 100, "communication", "decode", 1),
            (1, 9, "ar", 6000, 100, "communication", "decode", 1),
            (0, 7, "ar", 9000, 100, "communication", "decode", 1),
            (1, 9, "ar", 9020, 80, "communication", "decode", 1),
            (0, 1, "gemm", 0, 50, "qkv_gemm", "decode", 1),
        ]
    )
    r = rank_summary(df)
    assert r is not None and r["matching"] == "order"
    p0, p1 = r["per_rank"]
    assert p0["comm_wait_ns"] == 100 + 20 and p0["comm_transfer_ns"] == 80
    assert p1["comm_wait_ns"] == 0 and p1["comm_transfer_ns"] == 180
    assert p0["stages"][0] == {"stage": "communication", "time_ns": 200, "share": 200 / 250}
    assert r["steps"][0]["slowest_rank"] == 1 and r["steps"][0]["others_wait_ns"] == 120
    # a collective that ends on rank 0 before rank 1 starts it: flagged as a clock problem (1 of 2)
    assert any("clocks" in n for n in r["notes"])


def test_different_sequences_are_matched_by_name_and_said_so() -> None:
    df = table(
        [
            (0, 1, "ar", 100, 10, "communication", "decode", 0),
            (0, 1, "ag", 200, 10, "communication", "decode", 0),
            (0, 1, "ar", 300, 10, "communication", "decode", 0),
            (1, 1, "ar", 105, 10, "communication", "decode", 0),
            (1, 1, "ar", 302, 10, "communication", "decode", 0),
        ]
    )
    r = rank_summary(df)
    assert r["matching"] == "name" and r["matched_collectives"] == 2
    assert any("matched by name and order" in n and "1 kernel(s) left unmatched" in n for n in r["notes"])
    assert r["per_rank"][0]["comm_unmatched_ns"] == 10
    assert r["per_rank"][0]["comm_wait_ns"] == 5 + 2


def test_unmatchable_collectives_are_said_so() -> None:
    df = table(
        [
            (0, 1, "ar", 100, 10, "communication", "decode", 0),
            (1, 1, "gemm", 100, 10, "qkv_gemm", "decode", 0),
        ]
    )
    r = rank_summary(df)
    assert r["matching"] == "none" and r["matched_collectives"] == 0
    assert any("cannot be matched" in n and "[1]" in n for n in r["notes"])
    assert r["skew_events"] == [] and r["steps"] == []
    assert r["per_rank"][0]["comm_unmatched_ns"] == 10
    df2 = table(
        [
            (0, 1, "ar", 100, 10, "communication", "decode", 0),
            (1, 1, "ag", 100, 10, "communication", "decode", 0),
        ]
    )
    r2 = rank_summary(df2)
    assert r2["matching"] == "none" and any("no kernel name is common" in n for n in r2["notes"])


def test_one_rank_gives_none() -> None:
    assert rank_summary(table([(0, 1, "ar", 100, 10, "communication", "decode", 0)])) is None
