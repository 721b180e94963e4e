"""Numbers out of range or of the wrong kind in a trace: one clear line naming them, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.cli import main


def kineto(tmp_path: Path, **kernel: object) -> Path:
    k = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10.0, "dur": 5.0,
         "args": {"device": 0, "stream": 7, "correlation": 1, "grid": [1, 1, 1], "block": [128, 1, 1]}}  # fmt: skip
    for key, v in kernel.items():
        if key in ("grid", "block"):
            k["args"][key] = v
        else:
            k[key] = v
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [k], "schemaVersion": 1}).replace('"__BIG__"', "1e300"))
    return p


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ts", "__BIG__", r"ts 1e\+300 .*out of range"),
        ("dur", 10**30, r"dur 1e\+30 .*out of range"),
        ("ts", "soon", r"ts 'soon' is not a number"),
        ("dur", "long", r"dur 'long' is not a number"),
    ],
)
def test_times_that_overflow_or_are_not_numbers_are_named(tmp_path, capsys, field, value, message) -> None:
    path = kineto(tmp_path, **{field: value})
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0]
    import re

    assert re.search(message, err[0]), err[0]


@pytest.mark.parametrize("dims", [{"grid": [-1, 1, 1]}, {"block": [128, -4, 1]}])
def test_negative_launch_dimensions_are_an_error(tmp_path, capsys, dims) -> None:
    path = kineto(tmp_path, **dims)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "negative" in err[0] and str(path) in err[0], err
