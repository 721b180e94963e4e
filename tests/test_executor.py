"""Executors: a Dask cluster parses the traces into the same tables and summary as a local run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.errors import InputError, UsageError
from analyzer.model import Trace
from analyzer.pipeline import analyze_trace
from analyzer.results.summary import build_summary
from analyzer.runtime import loading, pools
from tests.conftest import H200_TP2
from tests.runs import analyze_run, load_inputs

PATHS = [str(p) for p in H200_TP2]


def same(a: Trace, b: Trace) -> None:
    for name in ("kernels", "host_ops", "annotations"):
        assert getattr(a, name).equals(getattr(b, name)), name
    assert [m.to_dict() for m in a.inputs] == [m.to_dict() for m in b.inputs]
    assert a.warnings == b.warnings


@pytest.fixture(scope="module")
def local() -> Trace:
    return load_inputs(PATHS, jobs=1, cache=False)


def test_ipc_round_trip_keeps_everything(local: Trace) -> None:
    back = loading.from_ipc(loading.to_ipc(local))
    same(local, back)


@pytest.mark.skipif(not pools.can_fork(), reason="fork start method needs Linux")
def test_workers_are_forked_only_from_a_process_without_other_threads() -> None:
    import threading

    # GIVEN this process alone: the workers are forked (every module already imported)
    assert pools._start_method() == "fork"
    # WHEN another thread runs (a notebook, a Dask client), THEN the workers start clean instead
    release = threading.Event()
    other = threading.Thread(target=release.wait, args=(10,))
    other.start()
    try:
        assert pools._start_method() in ("forkserver", "spawn")
    finally:
        release.set()
        other.join()


def test_unknown_executor_and_bad_jobs_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown executor"):
        loading.read_traces(PATHS, executor="ray")
    with pytest.raises(UsageError, match="at least 1"):
        loading.read_traces(PATHS, jobs=0)
    with pytest.raises(UsageError, match="needs --executor dask"):
        loading.read_traces(PATHS, scheduler="tcp://127.0.0.1:1")


def test_small_inputs_stay_in_process_unless_jobs_is_given() -> None:
    assert pools.plan_jobs(PATHS, None) == 1  # 1.4 MB of gzip: workers would cost more than they save
    assert pools.plan_jobs(PATHS, 2) == 2
    assert pools.plan_jobs(PATHS, 8) == 2  # never more processes than files


# --------------------------------------------------------------------------------------- dask

distributed = pytest.importorskip("dask.distributed")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
    ) as c:
        yield c


def test_dask_with_shared_cache_matches_local(cluster, local: Trace, tmp_path: Path) -> None:
    # GIVEN a cluster whose workers share the cache folder with this process
    # WHEN the traces are parsed there
    got = load_inputs(PATHS, executor="dask", scheduler=cluster.scheduler_address, cache=tmp_path)
    # THEN the tables are the local ones, and the workers left one Parquet entry per trace
    same(local, got)
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2
    again = load_inputs(PATHS, executor="dask", scheduler=cluster.scheduler_address, cache=tmp_path)
    same(local, again)


def test_dask_without_cache_sends_arrow_ipc(cluster, local: Trace) -> None:
    got = load_inputs(PATHS, executor="dask", scheduler=cluster.scheduler_address, cache=False)
    same(local, got)


def test_dask_summary_equals_local_summary(cluster, local: Trace) -> None:
    a = build_summary(analyze_trace(local))
    b = build_summary(analyze_trace(load_inputs(PATHS, executor="dask", scheduler=cluster.scheduler_address)))
    assert a["totals"] == b["totals"]
    assert a["ranks"] == b["ranks"]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_dask_workers_analyse_each_input_like_a_local_run(cluster) -> None:
    from tests.test_parts import assert_same_analysis, serial

    # GIVEN rank traces analysed input by input on the cluster (the CLI's path with --executor dask)
    got = analyze_run(PATHS, executor="dask", scheduler=cluster.scheduler_address)
    # THEN every number is the local serial run's
    assert_same_analysis(serial(PATHS), got)


def test_dask_cache_not_visible_here_falls_back_to_ipc(
    cluster, local: Trace, tmp_path: Path, monkeypatch
) -> None:
    # a worker's entry this process cannot see (no shared folder): the tables are sent instead
    monkeypatch.setattr(loading, "_from_dask", _hide_entries(loading._from_dask))
    got = load_inputs(PATHS, executor="dask", scheduler=cluster.scheduler_address, cache=tmp_path)
    same(local, got)


def _hide_entries(real):
    def from_dask(path, result):
        if result[0] == "entry":
            return None
        return real(path, result)

    return from_dask


def test_dask_bad_input_is_one_clean_error(cluster, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [], "schemaVersion": 1}')
    with pytest.raises(InputError, match="bad.json"):
        load_inputs([PATHS[0], str(bad)], executor="dask", scheduler=cluster.scheduler_address, cache=False)


def test_dask_unreachable_scheduler_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="cannot reach the Dask scheduler"):
        with pools.dask_client("tcp://127.0.0.1:1", 1, timeout="2s"):
            pass


def test_cli_on_dask_prints_what_a_local_run_prints(cluster, capsys, monkeypatch, tmp_path: Path) -> None:
    from analyzer.cli import main

    monkeypatch.setenv("LKM_CACHE_DIR", str(tmp_path))
    assert main(["analyze", *PATHS, "--no-cache"]) == 0
    plain = capsys.readouterr().out
    assert main(["analyze", *PATHS, "--executor", "dask", "--scheduler", cluster.scheduler_address]) == 0
    assert capsys.readouterr().out == plain
    assert (
        main(["analyze", *PATHS, "--scheduler", cluster.scheduler_address, "--no-cache"]) == 0
    )  # implies dask
    assert capsys.readouterr().out == plain


@pytest.mark.slow
def test_dask_without_scheduler_starts_a_local_cluster(local: Trace) -> None:
    same(local, load_inputs(PATHS, executor="dask", jobs=2, cache=False))
