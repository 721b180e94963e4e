"""Inputs are joined into one run only when they can be one run (README.md 'Commands'); otherwise exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from analyzer.cli import main
from analyzer.errors import InputError
from analyzer.model import (
    ANNOTATION_SCHEMA,
    HOST_OP_SCHEMA,
    KERNEL_SCHEMA,
    InputMeta,
    Trace,
    table_from_columns,
)
from analyzer.runtime.joining import one_run_problem, session_difference
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2, shared
from tests.runs import analyze_paths

B300_VS_MI300 = "sglang-deepseek-llama8b-decode-mi300x-vs-b300"


def test_ranks_of_one_run_join() -> None:
    a = analyze_paths([str(p) for p in H200_TP2])
    assert sorted(m.rank for m in a.trace.inputs) == [0, 1]


def test_two_captures_of_one_rank_from_different_sessions_are_not_one_run() -> None:
    # two models profiled apart: their times do not overlap, but they are two runs, not one
    with pytest.raises(InputError, match=r"both claim rank 0 but come from different profiling sessions"):
        analyze_paths([str(H200_DENSE), str(H200_MOE)])


def test_separate_captures_of_one_rank_are_refused_with_the_compare_hint(capsys) -> None:
    # GIVEN SGLang's prefill and decode extracts of one profile beside a graph-capture trace of the
    # same rank-0 GPU, captured minutes earlier by another profiler session (same process and clock)
    folder = shared("mi300x-sglang-qwen3-8b")
    # WHEN the folder is analysed as one run
    assert main(["analyze", str(folder)]) == 2
    # THEN one line names the two sessions and suggests --compare
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bs_32_rank0" in err[0] and "profiling sessions" in err[0]
    assert "--compare" in err[0]


def _meta(tid: int, **extra: object) -> InputMeta:
    return InputMeta(trace_id=tid, path=f"in{tid}", extra=dict(extra))


@pytest.mark.parametrize(
    ("a", "b", "differ"),
    [
        (
            {"pid": 7, "clock_base_ns": 5, "trace_id": "S1"},
            {"pid": 7, "clock_base_ns": 5, "trace_id": "S1"},
            None,
        ),
        ({"pid": 7}, {"pid": 8}, "process id 7 vs 8"),
        ({"pid": 7, "clock_base_ns": 5}, {"pid": 7, "clock_base_ns": 6}, "clock base 5 vs 6"),
        ({"pid": 7, "trace_id": "S1"}, {"pid": 7, "trace_id": "S2"}, "profiler session id S1 vs S2"),
        ({"pid": 7}, {"trace_id": "S2"}, None),  # nothing both record: judged by time alone
        ({}, {}, None),
    ],
)
def test_sessions_differ_only_on_what_both_inputs_record(a, b, differ) -> None:
    assert session_difference(_meta(0, **a), _meta(1, **b)) == differ


def test_inputs_of_one_rank_from_two_sessions_are_refused_even_apart_in_time() -> None:
    # GIVEN two synthetic inputs of rank 0, one after the other, written by two processes
    trace = _two_inputs_one_after_the_other({"pid": 1}, {"pid": 2})
    # THEN they are not one run; from one process they are
    assert "different profiling sessions (process id 1 vs 2)" in (one_run_problem(trace) or "")
    assert one_run_problem(_two_inputs_one_after_the_other({"pid": 1}, {"pid": 1})) is None


def _two_inputs_one_after_the_other(extra_a: dict, extra_b: dict) -> Trace:
    n = 4
    kernels = table_from_columns(
        {
            "trace_id": [0, 0, 1, 1],
            "rank": [0] * n,
            "name": ["k"] * n,
            "norm_name": ["k"] * n,
            "kind": ["kernel"] * n,
            "start_ns": [0, 100, 10_000, 10_100],
            "dur_ns": [50] * n,
            "device": [0] * n,
            "count": [1] * n,
            "aggregate": [False] * n,
            "graph_launch": [False] * n,
        },
        KERNEL_SCHEMA,
    )
    inputs = [_meta(0, **extra_a), _meta(1, **extra_b)]
    return Trace(kernels, HOST_OP_SCHEMA.empty_table(), ANNOTATION_SCHEMA.empty_table(), inputs)


def test_extracts_of_one_profile_that_interleave_only_at_their_edges_join() -> None:
    # the prefill and the decode step of one SGLang run, saved apart: their windows overlap, their
    # GPU activity does not (a few microseconds at the edges)
    folder = shared("mi300x-sglang-qwen3-8b")
    pre, dec = folder / "sglang_Qwen3-8B_prefilldecode.json.gz", folder / "sglang_Qwen3-8B_decode.json.gz"
    a = analyze_paths([str(pre), str(dec)])
    assert {s["phase"] for s in a.steps.to_dict("records")} == {"prefill", "decode"}


def test_the_same_capture_twice_is_not_one_run(tmp_path: Path) -> None:
    copy = tmp_path / "again.json.gz"
    shutil.copy(H200_DENSE, copy)
    with pytest.raises(InputError, match=r"both claim rank 0 over overlapping time.*--compare"):
        analyze_paths([str(H200_DENSE), str(copy)])


def test_different_gpus_are_not_one_run() -> None:
    folder = shared(B300_VS_MI300)
    with pytest.raises(
        InputError, match=r"B300.*MI300X.*ran on different GPUs|MI300X.*B300.*ran on different GPUs"
    ):
        analyze_paths([str(folder)])


def test_different_world_sizes_are_not_one_run() -> None:
    with pytest.raises(InputError, match="different world sizes"):
        analyze_paths([str(H200_DENSE), str(H200_TP2[0])])


def test_summary_files_whose_totals_overlap_are_not_one_run() -> None:
    # an nsys stats folder: the all-stage, decode and prefill summaries of one workload
    folder = shared("nsys-stats-csv-deepseek-ocr-rtx5090")
    with pytest.raises(InputError, match="summary-only inputs whose totals would overlap"):
        analyze_paths([str(folder)])


def test_the_cli_says_it_in_one_line_with_exit_2(capsys) -> None:
    folder = shared(B300_VS_MI300)
    assert main(["analyze", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compare" in err[0] and "different GPUs" in err[0]


def test_the_whole_shared_folder_is_not_one_run(capsys) -> None:
    # 18 inputs of 8 GPU types: refused, not joined into one run labelled with the first GPU
    assert main(["analyze", str(shared(""))]) == 2
    assert "not one run" in capsys.readouterr().err


def test_compare_of_a_folder_compares_each_trace_in_it(capsys) -> None:
    # GIVEN the folder that is refused as one run
    folder = shared(B300_VS_MI300)
    # WHEN it is compared instead
    assert main(["analyze", "--compare", str(folder)]) == 0
    out = capsys.readouterr().out
    # THEN each of its traces is one side of the comparison
    assert "B300" in out and "MI300X" in out
