"""Inputs are joined into one run only when they can be one run (DESIGN §6); otherwise exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from analyzer.cli import main
from analyzer.errors import InputError
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2, shared
from tests.runs import analyze_paths

B300_VS_MI300 = "sglang-deepseek-llama8b-decode-mi300x-vs-b300"


def test_ranks_of_one_run_join() -> None:
    a = analyze_paths([str(p) for p in H200_TP2])
    assert sorted(m.rank for m in a.trace.inputs) == [0, 1]


def test_two_captures_of_one_rank_at_different_times_join() -> None:
    a = analyze_paths([str(H200_DENSE), str(H200_MOE)])
    assert len(a.trace.inputs) == 2


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
