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


# --- values out of range (issue 36) ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["5", "-0.1", "1.5"])
def test_a_threshold_out_of_its_range_is_refused(value: str) -> None:
    from analyzer.errors import UsageError
    from analyzer.knowledge.finding_settings import load_finding_settings

    with pytest.raises(UsageError) as e:
        load_finding_settings({"decode_gpu_idle.max_idle": value})
    assert "out of range [0, 1]" in str(e.value) and "decode_gpu_idle.max_idle" in str(e.value)


def test_every_numeric_threshold_states_its_range_and_its_default_lies_in_it() -> None:
    from analyzer.knowledge.finding_settings import finding_ranges, load_finding_settings

    ranges = finding_ranges()
    for check, cfg in load_finding_settings().items():
        for key, value in cfg.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                low, high = ranges[check][key]
                assert low <= value <= high, (check, key)


def test_set_out_of_range_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    # GIVEN a valid trace WHEN a threshold is set outside its range THEN one line and exit 2
    path = kineto(tmp_path)
    assert main(["analyze", str(path), "--set", "decode_gpu_idle.max_idle=5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decode_gpu_idle.max_idle: 5 is out of range [0, 1]" in err[0]


def test_export_format_that_contradicts_the_extension_is_refused(tmp_path, capsys) -> None:
    # GIVEN CSV asked for a .parquet name WHEN exported THEN exit 2, one line, no file written
    path, out = kineto(tmp_path), tmp_path / "x.parquet"
    assert main(["export", str(path), "--format", "csv", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--format csv does not match the extension" in err[0]
    assert not out.exists()
    # AND a matching or an unknown extension is fine
    assert main(["export", str(path), "--format", "csv", "-o", str(tmp_path / "x.csv")]) == 0
    assert main(["export", str(path), "--format", "csv", "-o", str(tmp_path / "x.txt")]) == 0
