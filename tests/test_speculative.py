"""Speculative decoding's steps on the zoo's assisted-generation capture (a 1-layer draft beside a
2-layer target), with and without the host ops' recorded shapes; the truth is the capture's own
step annotations (``model=draft`` marks the draft's steps)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from analyzer.cli.check_cmd import analyze_stripped

ZOO = Path(__file__).resolve().parents[1] / "fixtures" / "zoo"
CASE = ZOO / "llama-assisted-bf16"
NOSHAPE_CASE = ZOO / "llama-assisted-noshape-bf16"  # captured without record_shapes
SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")


def truth_models(case: Path = CASE) -> list[str]:
    steps = json.loads((case / "meta.json").read_text(encoding="utf-8"))["steps"]
    return ["draft" if re.search(r"\bmodel=draft\b", s) else "target" for s in steps]


@pytest.fixture(scope="module")
def without_shapes(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The capture with every recorded shape removed, as a trace captured without record_shapes."""
    with gzip.open(CASE / "trace.json.gz", "rt", encoding="utf-8") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        args = e.get("args")
        if isinstance(args, dict):
            for k in SHAPE_ARGS:
                args.pop(k, None)
    out = tmp_path_factory.mktemp("noshape") / "trace.json.gz"
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    return str(out)


def test_draft_and_target_steps_with_shapes_and_the_verify_width() -> None:
    steps = analyze_stripped(str(CASE / "trace.json.gz"), False, (), None, None).steps
    assert steps["model"].tolist() == truth_models()
    target = steps[(steps["model"] == "target") & (steps["phase"] == "decode")]
    # the target verifies the draft's candidates: its multi-token decode steps carry their width,
    # a one-token decode step none
    multi = target[target["tokens"] > 1]
    assert len(multi) and (multi["verify_k"] == multi["tokens"]).all()
    assert target[target["tokens"] == 1]["verify_k"].isna().all()
    assert steps[steps["model"] == "draft"]["verify_k"].isna().all()


def test_draft_and_target_steps_without_shapes_from_the_layer_count(without_shapes: str) -> None:
    steps = analyze_stripped(without_shapes, False, (), None, None).steps
    assert steps["model"].tolist() == truth_models()
    # no shapes: no token counts, so no verify width is claimed
    assert steps["verify_k"].isna().all()


def test_draft_and_target_steps_of_a_capture_without_shapes() -> None:
    steps = analyze_stripped(str(NOSHAPE_CASE / "trace.json.gz"), False, (), None, None).steps
    assert steps["model"].tolist() == truth_models(NOSHAPE_CASE)
    assert "draft" in steps["model"].tolist()
