"""The sweep's fixtures (``fixtures/sweep``, docs/accuracy.md): the index covers every type of the mapping
with a status and a reason, the traces stay small, and a representative subset holds its pinned
floors (the whole sweep runs from ``benchmarks/accuracy.py --sweep``).
"""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "fixtures" / "sweep"
INDEX = json.loads((SWEEP / "sweep.json").read_text(encoding="utf-8"))
PINS = json.loads((ROOT / "tests" / "data" / "sweep_accuracy.json").read_text(encoding="utf-8"))
CAPTURED = sorted(t["model_type"] for t in INDEX["types"] if t["status"] == "captured")
#: one of each kind the sweep brought in: dense, sliding-window pattern, parallel residual, MoE with
#: expert-weight gathers, MLA dense-then-MoE, Mamba-2, Gated DeltaNet + attention + MoE, Mamba +
#: attention + MoE, RG-LRU + local attention
SUBSET = [
    "llama", "gemma3_text", "gpt_neox", "qwen3_moe", "deepseek_v3", "mamba2", "qwen3_next", "jamba",
    "recurrent_gemma",
]  # fmt: skip


def test_the_index_gives_every_type_a_status_and_every_skip_a_reason() -> None:
    statuses = {t["status"] for t in INDEX["types"]}
    assert statuses <= {"captured", "skipped", "excluded", "alias"}
    assert len(CAPTURED) >= 110
    for t in INDEX["types"]:
        if t["status"] == "captured":
            assert (SWEEP / t["model_type"] / "trace.json.xz").is_file()
            assert (SWEEP / t["model_type"] / "meta.json").is_file()
            assert t["config"]["model_type"] == t["model_type"] and t["params"] > 0
        else:
            assert t["reason"], t["model_type"]
        if t["status"] == "skipped":  # the only reasons a swept type may be skipped for
            assert t["reason"].startswith(("fails to", "needs a")) and t["error"], t
    assert set(PINS) == set(CAPTURED), "re-pin: python benchmarks/accuracy.py --sweep --pin"


def test_the_index_covers_the_installed_mapping() -> None:
    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != INDEX["versions"]["transformers"]:
        pytest.skip(f"the sweep is of transformers {INDEX['versions']['transformers']}")
    from analyzer.capture.sweep import model_types

    assert {t["model_type"] for t in INDEX["types"]} == set(model_types())


def test_the_traces_stay_small() -> None:
    sizes = {t: (SWEEP / t / "trace.json.xz").stat().st_size for t in CAPTURED}
    assert max(sizes.values()) <= 1_000_000
    assert sum(p.stat().st_size for p in SWEEP.rglob("*") if p.is_file()) <= 13_000_000


@pytest.mark.parametrize("model_type", SUBSET)
def test_a_swept_type_holds_its_pinned_floor(model_type: str, tmp_path: Path) -> None:
    from analyzer.cli.check_cmd import check_trace

    # GIVEN a swept trace, decompressed as the readers take it (benchmarks/accuracy.py does the same)
    path = tmp_path / "trace.json"
    with lzma.open(SWEEP / model_type / "trace.json.xz", "rb") as f, open(path, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    # WHEN checked against its truth THEN it is at least as right as pinned
    r = check_trace(str(path))
    assert r["unmatched"] == 0
    for k in ("stage", "category", "phase"):
        floor, got = PINS[model_type][k], r[k]["agreement"]
        assert floor is None or (got is not None and got >= floor - 1e-6), (
            f"{model_type} {k}: {got} < {floor}"
        )
    floor, got = PINS[model_type]["phase_decided"], r["phase"]["decided_agreement"]
    assert floor is None or (got is not None and got >= floor - 1e-6), (
        f"{model_type} decided: {got} < {floor}"
    )
    ceiling = PINS[model_type]["phase_undecided"] or 0.0
    assert (r["phase"]["undecided"] or 0.0) <= ceiling + 1e-6
