"""Inputs analysed apart in worker processes and joined give the serial run's every number."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analyzer.errors import InputError, UsageError
from analyzer.pipeline import Analysis, Options, analyze_trace
from analyzer.results.summary import build_summary
from analyzer.runtime import rank_workers
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2, shared
from tests.runs import analyze_run, load_inputs

TP2 = [str(p) for p in H200_TP2]


def serial(paths: list[str], options: Options | None = None) -> Analysis:
    return analyze_trace(load_inputs(paths, jobs=1, cache=False), options, keep_host_ops=False)


def assert_same_analysis(a: Analysis, b: Analysis) -> None:
    assert json.dumps(build_summary(a), sort_keys=True) == json.dumps(build_summary(b), sort_keys=True)
    assert a.kernels.column_names == b.kernels.column_names
    for name in a.kernels.column_names:  # values; a dictionary may list its values in another order
        assert a.kernels[name].to_pylist() == b.kernels[name].to_pylist(), name
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.warnings == b.warnings
    assert a.findings == b.findings
    assert a.annotations_found == b.annotations_found
    assert json.dumps(a.gpu, sort_keys=True) == json.dumps(b.gpu, sort_keys=True)
    assert a.rules_sha256 == b.rules_sha256
    assert [m.to_dict() for m in a.trace.inputs] == [m.to_dict() for m in b.trace.inputs]


def test_two_ranks_analysed_in_workers_equal_the_serial_run() -> None:
    # GIVEN the two rank traces of a tensor-parallel run
    # WHEN each is parsed and analysed in its own worker process and the results joined
    got = rank_workers.analyze_parts(TP2, Options(), jobs=2)
    assert got is not None and got.trace.host_ops.num_rows == 0
    # THEN, with the run-wide warnings and findings added, every number is the serial run's
    from analyzer.pipeline import finish_run

    got = finish_run(got, Options())
    want = serial(TP2)
    assert_same_analysis(want, got)
    assert sorted(set(got.kernels["trace_id"].to_pylist())) == [0, 1]
    assert got.steps["trace_id"].unique().tolist() == [0, 1]


def test_options_reach_the_workers() -> None:
    options = Options(gpu="h100-sxm", model="llama-3-8b")
    assert_same_analysis(serial(TP2, options), analyze_run(TP2, options, jobs=2))


def test_captures_of_one_rank_from_two_sessions_are_refused_on_either_path() -> None:
    # one GPU type and world size, but two models profiled apart: not one run (README.md 'Commands')
    paths = [str(H200_DENSE), str(H200_MOE)]
    for run in (lambda: serial(paths), lambda: analyze_run(paths, jobs=2)):
        with pytest.raises(InputError, match="different profiling sessions"):
            run()


def test_amd_inputs_of_one_profile_join() -> None:
    folder = shared("mi300x-sglang-qwen3-8b")
    paths = [str(folder / f"sglang_Qwen3-8B_{n}.json.gz") for n in ("prefilldecode", "decode")]
    assert_same_analysis(serial(paths), analyze_run(paths, jobs=2))


def test_inputs_of_other_world_sizes_take_the_serial_path() -> None:
    # the roofline splits collective bytes by the run's world size: a single-GPU trace joined with
    # two ranks of world size 2 must be measured with 2, which its own worker could not know
    paths = [str(H200_DENSE), *TP2]
    assert rank_workers.analyze_parts(paths, Options(), jobs=2) is None
    # ... and they are not one run at all (README.md 'Commands'): exit 2 on either path
    for run in (lambda: serial(paths), lambda: analyze_run(paths, jobs=2)):
        with pytest.raises(InputError, match="different world sizes"):
            run()


def test_inputs_of_other_gpus_take_the_serial_path() -> None:
    amd = shared("mi300x-vllm-gptoss-decode-fullgraph")
    paths = [str(H200_DENSE), str(amd)]
    assert rank_workers.analyze_parts(paths, Options(), jobs=2) is None
    # ... and they are not one run at all (README.md 'Commands'): exit 2 on either path
    for run in (lambda: serial(paths), lambda: analyze_run(paths, jobs=2)):
        with pytest.raises(InputError, match="ran on different GPUs"):
            run()


def test_small_inputs_without_jobs_stay_in_this_process() -> None:
    assert rank_workers.analyze_parts(TP2, Options()) is None  # 1.4 MB: workers cost more than they save


def test_bad_input_is_one_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [], "schemaVersion": 1}')
    with pytest.raises(InputError, match="bad.json"):
        analyze_run([TP2[0], str(bad)], jobs=2)


def test_bad_options_fail_before_any_worker_starts(monkeypatch) -> None:
    def no_pool(*args, **kwargs):
        raise AssertionError("a worker pool was started")

    monkeypatch.setattr(rank_workers.executor_mod, "pool_map", no_pool)
    with pytest.raises(UsageError, match="not in rules/hardware.toml"):
        rank_workers.analyze_parts(TP2, Options(gpu="no-such-gpu"), jobs=2)
    with pytest.raises(UsageError, match="unknown executor"):
        rank_workers.analyze_parts(TP2, Options(), executor="ray")


def test_cli_prints_the_same_with_and_without_workers(capsys, tmp_path: Path, monkeypatch) -> None:
    from analyzer.cli import main

    monkeypatch.setenv("LKM_CACHE_DIR", str(tmp_path / "cache"))
    out1, out2 = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["analyze", *TP2, "--jobs", "1", "--json", str(out1)]) == 0
    plain = capsys.readouterr().out
    # the second run also fills and then reads the cache from the workers
    assert main(["analyze", *TP2, "--jobs", "2", "--json", str(out2)]) == 0
    assert capsys.readouterr().out == plain
    assert json.loads(out1.read_text()) == json.loads(out2.read_text())


_REAL_PART = rank_workers.analyze_part


def recording_part(path: str, index: int, cache_dir: str | None, *rest):
    """analyze_part, leaving a file named after the process that ran it in the run's cache folder
    (the one argument every worker gets that the test chooses, whatever the start method)."""
    import os

    assert cache_dir is not None
    pids = Path(cache_dir) / "pids"
    pids.mkdir(exist_ok=True)
    (pids / f"{index}-{os.getpid()}").touch()
    return _REAL_PART(path, index, cache_dir, *rest)


def test_the_inputs_are_analysed_in_worker_processes(tmp_path: Path, monkeypatch) -> None:
    import os

    # GIVEN a spy on the worker task
    monkeypatch.setattr(rank_workers, "analyze_part", recording_part)
    # WHEN a run of two ranks is analysed with two jobs
    got = rank_workers.analyze_parts(TP2, Options(), jobs=2, cache=tmp_path)
    # THEN each input was analysed once, in a process other than this one
    assert got is not None
    ran = sorted(p.name.split("-") for p in (tmp_path / "pids").iterdir())
    assert [int(i) for i, _ in ran] == [0, 1]
    assert all(int(pid) != os.getpid() for _, pid in ran)
