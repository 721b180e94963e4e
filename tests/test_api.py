"""The Python API (analyzer.analyze / compare / gate, Result), driven directly."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import analyzer
from analyzer.model import KERNEL_SCHEMA
from analyzer.regressions import NotComparableError
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2, ROOT


@pytest.fixture(scope="module")
def dense() -> analyzer.Result:
    return analyzer.analyze(H200_DENSE)


def test_the_result_holds_what_the_cli_prints(dense, tmp_path: Path) -> None:
    # GIVEN the CLI's JSON of the same trace
    out = tmp_path / "s.json"
    assert analyzer_cli(["analyze", str(H200_DENSE), "--json", str(out)]) == 0
    cli = json.loads(out.read_text())
    # THEN the API's summary is the same dict, inputs and all
    assert dense.summary == cli
    assert dense.findings == cli["findings"]


def test_kernels_have_the_design_columns_with_arrow_dtypes(dense) -> None:
    k = dense.kernels
    for col in (*KERNEL_SCHEMA.names, "stage", "category", "provider", "phase", "step", "bound"):
        assert col in k.columns, col
    assert all(isinstance(t, pd.ArrowDtype) for t in k.dtypes)
    assert int(k["dur_ns"].sum()) == dense.summary["totals"]["kernel_ns"]
    assert len(dense.steps) == len(dense.summary["steps"])


def test_files_are_written(dense, tmp_path: Path) -> None:
    html = dense.to_html(tmp_path / "r" / "report.html")
    assert html.read_text().startswith("<!DOCTYPE html>") or "<html" in html.read_text()[:200]
    pq_path = dense.to_parquet(tmp_path / "k.parquet")
    assert pq.read_table(pq_path).num_rows == len(dense.kernels)


def test_compare_and_gate(dense) -> None:
    moe = analyzer.analyze(H200_MOE)
    cmp = analyzer.compare([dense, moe])
    assert [i["label"] for i in cmp["inputs"]] and len(cmp["inputs"]) == 2
    verdict = analyzer.gate(dense, dense)
    assert verdict["status"] == "pass"
    with pytest.raises(NotComparableError):
        analyzer.gate(dense, moe)  # another model: the gate refuses, as the CLI does


def test_a_saved_baseline_gates_like_the_cli(dense) -> None:
    saved = ROOT / "fixtures" / "h200-llama3-8b-dense" / "baseline.json"
    assert analyzer.gate(saved, dense)["status"] == "pass"


def test_same_numbers_twice_and_from_a_thread(dense) -> None:
    again = analyzer.analyze(H200_DENSE)
    got: list[analyzer.Result] = []
    t = threading.Thread(target=lambda: got.append(analyzer.analyze(H200_DENSE)))
    t.start()
    t.join()
    for r in (again, got[0]):
        assert r.summary == dense.summary


def test_bad_input_and_usage_raise_the_cli_errors(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{")
    with pytest.raises(analyzer.InputError) as e:
        analyzer.analyze(bad)
    assert e.value.exit_code == 2
    with pytest.raises(analyzer.UsageError) as u:
        analyzer.analyze(H200_DENSE, gpu="no-such-gpu")
    assert u.value.exit_code == 2
    with pytest.raises(analyzer.UsageError):
        analyzer.analyze([])


def test_the_api_prints_nothing(capsys) -> None:
    analyzer.analyze(H200_DENSE, settings={"decode_gpu_idle.max_idle": 0.9})
    assert capsys.readouterr() == ("", "")


def test_off_the_main_thread_no_worker_process_starts(monkeypatch) -> None:
    from analyzer.runtime import pools

    started = []
    real = pools.pool_jobs
    monkeypatch.setattr(pools, "pool_jobs", lambda paths, jobs: started.append(jobs) or real(paths, jobs))
    t = threading.Thread(target=lambda: analyzer.analyze([str(p) for p in H200_TP2], jobs=2))
    t.start()
    t.join()
    assert started and all(j == 1 for j in started)


def test_the_notebook_example_runs(tmp_path: Path) -> None:
    script = ROOT / "docs" / "examples" / "notebook.py"
    p = subprocess.run(
        [sys.executable, str(script), str(H200_DENSE), str(tmp_path)], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Dense GEMM" in p.stdout and (tmp_path / "notebook-steps.html").exists()


def analyzer_cli(argv: list[str]) -> int:
    from analyzer.cli import main

    return main(argv)


def test_a_big_trace_read_off_the_main_thread_forks_no_chunk_worker(monkeypatch) -> None:
    from analyzer.runtime import chunked_kineto

    # GIVEN chunk workers that would start for any file size
    monkeypatch.setattr(chunked_kineto, "MIN_BYTES", 0)
    monkeypatch.delenv(chunked_kineto.ENV_JOBS, raising=False)
    on_main = chunked_kineto.jobs_for(1 << 30)
    got: list[int] = []
    # WHEN asked from another thread
    t = threading.Thread(target=lambda: got.append(chunked_kineto.jobs_for(1 << 30)))
    t.start()
    t.join()
    # THEN that thread reads the file itself
    assert got == [1]
    assert on_main >= 1


# --- API manners (issue 36) -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpu": "H999"}, "gpu='H999' is not in rules/hardware.toml"),
        ({"settings": {"no.such": 1}}, "settings['no.such']: unknown setting"),
        (
            {"settings": {"decode_gpu_idle.max_idle": 5}},
            "settings['decode_gpu_idle.max_idle']: 5 is out of range",
        ),
        ({"jobs": 0}, "jobs= must be at least 1"),
    ],
)
def test_api_errors_name_the_keyword_not_the_cli_flag(kwargs, needle) -> None:
    # WHEN the API is given a bad keyword value THEN the error names the keyword as the caller wrote it
    with pytest.raises(analyzer.UsageError) as e:
        analyzer.analyze(H200_DENSE, **kwargs)
    assert needle in str(e.value) and "--" not in str(e.value).split(":")[0]


def test_cli_errors_still_name_the_flag(capsys) -> None:
    from analyzer.cli import main

    assert main(["analyze", str(H200_DENSE), "--gpu", "H999"]) == 2
    assert capsys.readouterr().err.startswith("error: --gpu 'H999' is not in rules/hardware.toml")


def test_result_repr_is_one_short_line(dense) -> None:
    text = repr(dense)
    assert "\n" not in text and len(text) < 300, text
    assert text.startswith("<Result [") and "kernels=" in text and "steps=" in text and "H200" in text
