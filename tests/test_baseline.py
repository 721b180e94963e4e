"""Baselines (analyzer/baseline.py, the `baseline` command): per-step times recomputed from the kernels."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.cli import main
from analyzer.errors import InputError
from analyzer.results.baseline import FORMAT_VERSION, KIND, build_baseline, check_baseline, group_hash
from tests.conftest import FIXTURES, H200_DENSE
from tests.runs import analyze_paths

SAVED = sorted(FIXTURES.glob("*/baseline.json"))


@pytest.fixture(scope="module")
def dense():
    analysis = analyze_paths([str(H200_DENSE)])
    return analysis, build_baseline(analysis)


def _decode_attention_per_step(analysis) -> np.ndarray:
    df = analysis.kernels.to_pandas()
    steps = analysis.steps[analysis.steps["phase"] == "decode"]["step"].to_numpy()
    sel = df[(df["phase"] == "decode") & (df["stage"].astype(str) == "flash_attention")]
    per = sel.groupby("step")["dur_ns"].sum()
    return per.reindex(steps, fill_value=0).to_numpy(np.float64)


def test_dense_baseline_provenance_and_comparability(dense) -> None:
    # GIVEN the dense HF-generate trace (8 layers, batch 4, 512-token prompts: 1 prefill + 23 decode steps)
    _, b = dense
    # THEN the baseline is versioned, names its input by sha256, and records what must match
    assert b["format_version"] == FORMAT_VERSION and b["kind"] == KIND
    (inp,) = b["inputs"]
    assert inp["sha256"] == hashlib.sha256(H200_DENSE.read_bytes()).hexdigest()
    assert inp["format"] == "kineto" and inp["rank"] == 0
    assert len(b["rules_sha256"]) == 64
    comp = b["comparability"]
    assert comp["gpu"]["key"] == "h200" and comp["gpu"]["arch"] == "sm_90"
    assert comp["model"]["layers_seen"] == 8 and comp["model"]["hidden_size"] is None
    assert {"qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm", "lm_head_gemm"} <= set(
        comp["model"]["gemm_roles"]
    )
    assert "gemm" not in comp["model"]["gemm_roles"]  # role unknown: says nothing about the model
    assert comp["phases"]["decode"] == {"steps": 23, "tokens_per_step": 4, "batch": 4}
    assert comp["phases"]["prefill"] == {"steps": 1, "tokens_per_step": 2048, "batch": None}


def test_stage_times_are_per_step_medians_and_means(dense) -> None:
    analysis, b = dense
    # WHEN the decode attention time of every step is summed independently from the kernels table
    per = _decode_attention_per_step(analysis)
    (row,) = [r for r in b["stages"] if r["phase"] == "decode" and r["stage"] == "flash_attention"]
    # THEN the baseline keeps their median and mean, per token too
    assert row["p50_ns"] == int(round(np.median(per)))
    assert row["mean_ns"] == int(round(per.mean()))
    assert row["present"] == 23 and row["count_per_step"] == 8.0
    assert row["per_token_ns"] == pytest.approx(np.median(per) / 4, abs=0.1)


def test_stage_means_add_up_to_the_phase(dense) -> None:
    _, b = dense
    for phase, entry in b["phases"].items():
        total = sum(r["mean_ns"] for r in b["stages"] if r["phase"] == phase)
        assert abs(total - entry["kernel_ns"]["mean"]) <= len(b["stages"])  # rounding of each row only


def test_top_groups_cover_the_share_and_the_tail_is_hashed(dense) -> None:
    analysis, b = dense
    df = analysis.kernels.to_pandas()
    for phase in b["phases"]:
        top = [r for r in b["groups"] if r["phase"] == phase]
        tail = b["tail_groups"].get(phase, {"groups": 0, "mean_ns": 0, "keys": {}})
        covered = sum(r["mean_ns"] for r in top)
        assert covered >= 0.95 * (covered + tail["mean_ns"])
        sub = df[df["phase"] == phase]
        n_groups = len(sub.groupby(["group_key", "stage"], observed=True))
        assert len(top) + tail["groups"] == n_groups
        assert len(tail["keys"]) == tail["groups"]
        assert not {group_hash(r["stage"], r["group_key"]) for r in top} & set(tail["keys"])


def test_kernels_outside_steps_are_totals_only(dense) -> None:
    analysis, b = dense
    df = analysis.kernels.to_pandas()
    assert b["not_in_steps"]["kernel_ns"] == int(df.loc[df["step"] < 0, "dur_ns"].sum()) > 0
    assert "unknown" not in b["phases"]


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.parent.name)
def test_saved_fixture_baselines_match_their_traces(path: Path) -> None:
    # GIVEN a committed fixture baseline (written by `make baselines`)
    b = check_baseline(json.loads(path.read_text()), str(path))
    # THEN every input it names is the trace next to it, byte for byte
    for inp in b["inputs"]:
        trace = FIXTURES.parent / inp["path"]
        assert trace.parent == path.parent
        assert hashlib.sha256(trace.read_bytes()).hexdigest() == inp["sha256"], (
            f"{trace} changed: regenerate {path} with `llm-kernel-map baseline`"
        )
    assert path.stat().st_size < 100_000


def test_saved_baselines_tell_the_models_apart() -> None:
    by_name = {p.parent.name: json.loads(p.read_text())["comparability"] for p in SAVED}
    moe = by_name["h200-qwen3-30b-a3b-moe"]
    assert moe["model"]["layers_seen"] == 4
    assert {"moe_expert_gemm", "moe_gate_gemm"} <= set(moe["model"]["gemm_roles"])
    assert moe["phases"]["decode"]["tokens_per_step"] == 8
    tp2 = by_name["h200-tp2-llama3-8b-graph"]
    assert tp2["ranks"] == [0, 1] and tp2["world_size"] == 2
    assert tp2["phases"]["decode"]["steps"] == 32


def test_cli_writes_the_same_object(capsys, tmp_path: Path, dense) -> None:
    out = tmp_path / "fixtures" / "dense" / "baseline.json"
    code = main(["baseline", str(H200_DENSE), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0
    assert "decode 23 steps" in err
    assert json.loads(out.read_text()) == json.loads(json.dumps(dense[1]))


@pytest.mark.parametrize(
    "edit,msg",
    [
        (lambda b: {"format_version": 1, "inputs": [], "totals": {}, "phases": {}}, "analyze --json"),
        (lambda b: {**b, "format_version": FORMAT_VERSION + 1}, "newer than this tool reads"),
        (lambda b: {k: v for k, v in b.items() if k != "stages"}, "lacks 'stages'"),
        (lambda b: [1, 2], "not a llm-kernel-map baseline"),
    ],
)
def test_check_baseline_rejects_what_it_cannot_read(dense, edit, msg) -> None:
    with pytest.raises(InputError, match=msg):
        check_baseline(edit(copy.deepcopy(dense[1])), "b.json")
