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


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_corrupt_byte_is_reported_at_its_offset_in_the_file(tmp_path, capsys, monkeypatch, jobs) -> None:
    import gzip
    import re

    from tests.conftest import H200_DENSE

    # GIVEN a real trace with one byte broken far past the first chunk
    raw = gzip.decompress(H200_DENSE.read_bytes())
    at = raw.index(b'"name"', len(raw) * 2 // 3)
    bad = tmp_path / "corrupt.json"
    bad.write_bytes(raw[:at] + b"\x01" + raw[at + 1 :])
    monkeypatch.setenv("LKM_READ_JOBS", jobs)
    # WHEN it is analysed (read here, or by chunk workers that hand it back to the exact reader)
    assert main(["analyze", str(bad), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # THEN the one line names the byte where the file breaks
    assert len(err) == 1 and re.search(rf"\(byte {at}\)", err[0]), err
