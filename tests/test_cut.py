"""``cut``: a structure-rule case from a real trace (analyzer/cli/cut_cmd.py, analyzer/results/cases.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.readers.case import read_case
from analyzer.results.cases import case_outcome, parse_steps, score_case
from tests.test_cli import run

ROOT = Path(__file__).resolve().parents[1]
ZOO_LLAMA = ROOT / "fixtures" / "zoo" / "llama-sdpa-bf16" / "trace.json.gz"


def test_cut_one_layer_of_a_decode_step_keeps_its_truth(capsys, tmp_path: Path) -> None:
    # GIVEN a zoo trace with truth ranges WHEN layer 1 of decode step 1 is cut
    out = tmp_path / "case.json"
    code, _, err = run(capsys, "cut", str(ZOO_LLAMA), "--step", "1", "--layer", "1", "-o", str(out))
    assert code == 0 and "wrote" in err
    trace, meta = read_case(out)
    # THEN the case holds that layer and the forward's work outside every layer, truth expectations,
    # and the cut alone still answers as the truth says
    assert meta["expect_from"] == {"stage": "truth", "phase": "truth", "layer": "pinned"}
    assert set(meta["expect"]["phase"]) == {"decode"}
    assert set(meta["expect"]["layer"]) <= {-1, 0}
    _, got, fired = case_outcome(trace)
    assert score_case(got, meta["expect"]) == {"wrong": 0, "undecided": 0}
    assert set(meta["fires"]) == fired and "STR007" in fired


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--step", "x"), "expected N or A-B"),
        (("--step", "3-1"), "ends before it starts"),
        (("--step", "0", "--layer", "99"), "no kernel of the selected steps"),
        (("--step", "999"), "no kernels in the selected steps"),
    ],
)
def test_bad_cuts_exit_2_with_one_line(capsys, tmp_path: Path, args, needle) -> None:
    code, _, err = run(capsys, "cut", str(ZOO_LLAMA), *args, "-o", str(tmp_path / "c.json"))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_parse_steps():
    assert parse_steps("4") == (4, 4) and parse_steps("2-5") == (2, 5)
