"""CLI: exit codes, one-line errors, outputs (click's CliRunner through analyzer.cli.main)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from analyzer.cli import main
from analyzer.model import KERNEL_SCHEMA
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_analyze_prints_summary_and_writes_json(capsys, tmp_path: Path) -> None:
    out_json = tmp_path / "s.json"
    code, out, err = run(capsys, "analyze", str(H200_MOE), "--json", str(out_json))
    assert code == 0
    for text in (
        "NVIDIA H200",
        "Phases",
        "prefill",
        "decode",
        "Time by stage",
        "Time by provider",
        "Top kernels",
        "Unclassified",
        "Findings",
    ):
        assert text in out
    s = json.loads(out_json.read_text())
    assert s["format_version"] == 2 and s["totals"]["kernels"] == 5377


def test_export_csv_and_parquet(capsys, tmp_path: Path) -> None:
    csv, pqt = tmp_path / "k.csv", tmp_path / "k.parquet"
    assert run(capsys, "export", str(H200_MOE), "-o", str(csv))[0] == 0
    assert run(capsys, "export", str(H200_MOE), "-o", str(pqt))[0] == 0
    t = pacsv.read_csv(csv)
    p = pq.read_table(pqt)
    assert t.num_rows == p.num_rows == 5377
    for f in KERNEL_SCHEMA:
        assert f.name in t.column_names and p.schema.field(f.name).type == f.type
    for col in (
        "stage",
        "category",
        "provider",
        "rule_id",
        "tile_m",
        "split_k",
        "group_key",
        "layer",
        "phase",
        "step",
        "tokens",
        "flops",
        "bytes",
        "flops_source",
        "achieved_tflops",
        "achieved_tbps",
        "pct_of_peak",
        "intensity",
        "bound",
        "stage_source",
        "stage_rule",
    ):
        assert col in t.column_names
    # the rule that gave each kernel its stage travels in both formats, never empty
    assert t["stage_rule"].to_pylist() == p["stage_rule"].cast("string").to_pylist()
    assert t["stage_rule"].null_count == 0


@pytest.mark.parametrize(
    "make,msg",
    [
        (lambda d: d / "missing.json", "no such file"),
        (
            lambda d: (d / "empty.json").write_bytes(b"") and d / "empty.json" or d / "empty.json",
            "empty file",
        ),
        (lambda d: (d / "x.json").write_text("not json at all") and d / "x.json", "not a recognised trace"),
        (lambda d: (d / "y.json").write_text('{"a": [1, 2]}') and d / "y.json", "not a recognised trace"),
        (
            lambda d: (d / "z.json.gz").write_bytes(H200_DENSE.read_bytes()[:5000]) and d / "z.json.gz",
            "gzip|truncated",
        ),
        (
            lambda d: (
                (d / "nogpu.json").write_text(
                    '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}]}'
                )
                and d / "nogpu.json"
            ),
            "no GPU activity",
        ),
        (lambda d: (d / "sub").mkdir() or d / "sub", "holds no trace"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, tmp_path: Path, make, msg: str) -> None:
    import re

    path = make(tmp_path)
    code, out, err = run(capsys, "analyze", str(path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.search(msg, lines[0]), err
    assert "Traceback" not in err


def test_usage_errors_exit_2(capsys, tmp_path: Path) -> None:
    assert run(capsys, "analyze")[0] == 2
    assert run(capsys, "export", str(H200_MOE), "-o", str(tmp_path / "k.xlsx"))[0] == 2
    code, _, err = run(capsys, "analyze", str(H200_MOE), "--gpu", "no-such-gpu")
    assert code == 2 and "rules/hardware.toml" in err
    code, _, err = run(capsys, "analyze", str(H200_MOE), "--set", "nonsense")
    assert code == 2
    code, _, err = run(capsys, "analyze", str(H200_MOE), "--set", "f.x=1")
    assert code == 2 and "unknown setting" in err


def test_gpu_override_and_unknown_gpu(capsys) -> None:
    code, out, _ = run(capsys, "analyze", str(H200_MOE), "--gpu", "h100-sxm")
    assert code == 0 and "H100" in out


def test_rules_commands(capsys, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "rules", "list")
    assert code == 0 and "ATT" in out
    rid = out.split()[0]
    code, out, _ = run(capsys, "rules", "explain", rid)
    assert code == 0 and "pattern" in out
    assert run(capsys, "rules", "explain", "ZZZ999")[0] == 2
    code, out, _ = run(
        capsys,
        "rules",
        "classify",
        "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT",
        "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16EEEvv",
    )
    assert (
        code == 0 and "cublas" in out and "aiter" in out and "tile: 64x8x64" in out and "split_k: -1" in out
    )
    good = tmp_path / "r.toml"
    good.write_text(
        "[[rule]]\nid = 'USR001'\npattern = '^my_kernel'\nstage = 'norm'\nprovider = 'vllm'\n"
        "examples = ['my_kernel_v2']\nnote = 'test rule'\n"
    )
    assert run(capsys, "rules", "check", str(good))[0] == 0
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "[[rule]]\nid = 'USR002'\npattern = '(a+)+$'\nstage = 'norm'\nprovider = 'vllm'\n"
        "examples = ['aaa']\nnote = 'catastrophic'\n"
    )
    code, _, err = run(capsys, "rules", "check", str(bad))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_directory_input_is_one_run(capsys) -> None:
    code, out, _ = run(capsys, "analyze", str(H200_DENSE.parent.parent / "h200-tp2-llama3-8b-graph"))
    assert code == 0 and "rank 1/2" in out


def test_version_and_help(capsys) -> None:
    assert run(capsys, "--version")[0] == 0
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "analyze" in out


def test_console_entry_flushes_everything_and_keeps_exit_codes(capsys, tmp_path: Path) -> None:
    # the console script leaves through os._exit (no interpreter teardown): the printed summary,
    # the JSON file and the exit codes must still be whole
    import subprocess
    import sys

    out = tmp_path / "s.json"
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "analyze", str(H200_MOE), "--no-cache", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert main(["analyze", str(H200_MOE), "--no-cache"]) == 0
    assert run.stdout == capsys.readouterr().out  # every line, as printed in process
    assert json.loads(out.read_text())["totals"]["kernels"] > 0
    bad = subprocess.run(
        [sys.executable, "-m", "analyzer", "analyze", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "missing.json" in bad.stderr


@pytest.mark.parametrize("top", ["0", "-3"])
def test_top_must_be_at_least_one(capsys, top: str) -> None:
    code, _, err = run(capsys, "analyze", str(H200_DENSE), "--top", top)
    assert code == 2 and "--top" in err and len(err.strip().splitlines()) == 1


def _top_rows(out: str) -> list[str]:
    block = out.split("\nTop kernels\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line for line in block[1:] if line.strip()]


@pytest.mark.parametrize("top", [3, 20])
def test_top_is_honoured_in_the_text_and_the_json(capsys, tmp_path: Path, top: int) -> None:
    # GIVEN a trace with more kernel groups than the JSON's usual 15
    out_json = tmp_path / "s.json"
    code, out, _ = run(capsys, "analyze", str(H200_DENSE), "--top", str(top), "--json", str(out_json))
    assert code == 0
    # THEN the text lists N groups and the JSON keeps N (at least the contract's 15)
    assert len(_top_rows(out)) == top
    assert len(json.loads(out_json.read_text())["top_kernels"]) == max(top, 15)


def test_idle_of_several_gpus_prints_its_definition(capsys) -> None:
    code, out, _ = run(capsys, "analyze", *map(str, H200_TP2))
    assert code == 0
    assert "(sum over 2 GPUs), idle 33.5% (1 - busy / (2 GPUs x wall))" in out
    ranks = out.split("\nRanks (2)", 1)[1]
    assert "idle" in ranks.splitlines()[1] and "its own wall" in ranks
