"""The reporter protocol (analyzer/report/base.py, report/__init__.py), the kernel-table and JSON
reporters, the shared formatting helpers (report/formatting.py), and the output layer that owns the
file (output.py ``write_report``)."""

from __future__ import annotations

import builtins
import io
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, ClassVar

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analyzer.errors import UsageError
from analyzer.output import write_json, write_report
from analyzer.report import COMPARE, GATE, SUMMARY, TABLES, Registry, Reporter, ReporterSpec
from analyzer.report import formatting as fm
from analyzer.report.json_report import JsonReporter
from analyzer.report.tables import CsvReporter, ParquetReporter
from analyzer.report.text import TextReporter
from tests.conftest import ROOT

REGISTRIES = {"summary": SUMMARY, "compare": COMPARE, "gate": GATE, "tables": TABLES}
SPECS = [(k, s) for k, r in REGISTRIES.items() for s in r]


def kernels() -> pa.Table:
    return pa.table(
        {
            "name": pa.array(["gemm_a", "gemm_a", "rms_norm"]).dictionary_encode(),
            "dur_ns": pa.array([1200, 800, 300], pa.int64()),
        }
    )


def tiny_summary() -> dict[str, Any]:
    return {
        "format_version": 1,
        "inputs": [{"trace_id": 0, "path": "x.json", "format": "kineto"}],
        "gpu": {},
        "totals": {
            "wall_ns": 5_000,
            "busy_ns": 2_300,
            "idle_fraction": 0.54,
            "kernel_ns": 2_300,
            "kernels": 3,
        },
        "stages": [],
        "providers": [],
        "top_kernels": [],
        "unclassified": [],
    }


# ------------------------------------------------------------------------------------ registry


@pytest.mark.parametrize(("registry", "spec"), SPECS, ids=[f"{k}-{s.name}" for k, s in SPECS])
def test_every_registered_reporter_keeps_the_protocol(registry: str, spec: ReporterSpec) -> None:
    # GIVEN a registry entry WHEN its class is imported THEN it answers to what the entry says
    cls = spec.load()
    assert (cls.name, cls.extensions, cls.binary) == (spec.name, spec.extensions, spec.binary)
    assert callable(cls.render)
    assert all(e.startswith(".") and e == e.lower() for e in spec.extensions)


def test_registry_picks_by_name_and_by_extension() -> None:
    assert GATE.names == ("text", "markdown", "junit", "json")
    assert GATE.get("junit").target.endswith(":GateJunitReporter")
    assert GATE.for_path("out/summary.MD").name == "markdown"
    assert GATE.for_path("x/results.markdown").name == "markdown"
    assert GATE.for_path("junit.xml").name == "junit"
    # an extension naming no format: nothing, or the default asked for
    assert GATE.for_path("report.log") is None
    assert GATE.for_path("report.pdf", default="json").name == "json"
    assert TABLES.for_path("k.parquet").name == "parquet"
    assert TABLES.extensions == (".csv", ".parquet", ".perfetto.json")
    assert SUMMARY.for_path("r.htm").name == "html" and COMPARE.for_path("c.json").name == "json"
    assert "text" in SUMMARY and "pdf" not in SUMMARY


def test_unknown_name_is_a_usage_error_naming_the_choices() -> None:
    with pytest.raises(
        UsageError, match=r"no gate report format 'pdf' \(one of text, markdown, junit, json\)"
    ):
        GATE.get("pdf")
    assert UsageError("x").exit_code == 2


def test_registry_imports_a_reporter_only_when_created() -> None:
    reg = Registry("test", ReporterSpec("nope", (".nope",), False, "analyzer.report.no_such_module:X"))
    assert reg.for_path("a.nope").name == "nope"  # looked up without importing
    with pytest.raises(ModuleNotFoundError):
        reg.create("nope")


def test_report_package_and_light_reporters_import_no_heavy_dependency() -> None:
    code = (
        "import sys, analyzer.report, analyzer.report.text, analyzer.report.gate_report, "
        "analyzer.report.json_report, analyzer.output\n"
        "heavy = [m for m in ('pyarrow', 'pandas', 'numpy', 'plotly') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# ----------------------------------------------------------------------------------- reporters


def test_csv_reporter_writes_plain_strings_to_a_binary_stream() -> None:
    buf = io.BytesIO()
    CsvReporter().render(kernels(), buf)
    assert buf.getvalue().decode().splitlines() == [
        '"name","dur_ns"',
        '"gemm_a",1200',
        '"gemm_a",800',
        '"rms_norm",300',
    ]


def test_parquet_reporter_keeps_the_table() -> None:
    buf = io.BytesIO()
    ParquetReporter().render(kernels(), buf)
    back = pq.read_table(io.BytesIO(buf.getvalue()))
    assert back.column("dur_ns").to_pylist() == [1200, 800, 300]
    assert back.column("name").to_pylist() == ["gemm_a", "gemm_a", "rms_norm"]


def test_json_reporter_writes_the_result_with_its_format_version() -> None:
    buf = io.BytesIO()
    JsonReporter().render({"format_version": 1, "counts": {3: "x"}}, buf)
    assert buf.getvalue().endswith(b"}\n")
    assert orjson.loads(buf.getvalue()) == {"format_version": 1, "counts": {"3": "x"}}
    with pytest.raises(TypeError):  # the baseline's writer keeps string keys only
        JsonReporter(non_str_keys=False).render({3: "x"}, io.BytesIO())


def test_text_reporter_writes_to_a_text_stream() -> None:
    buf = io.StringIO()
    TextReporter(top=5).render(tiny_summary(), buf)
    out = buf.getvalue()
    assert out.startswith("llm-kernel-map analysis\n  input 0: x.json (kineto)\n")
    assert "wall 5.0 us, GPU busy 2.3 us" in out and "idle 54.0%" in out


def test_reporters_never_open_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN open() that fails WHEN the stream reporters render THEN none of them needed it
    def no_open(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a reporter opened {args[:1]}")

    table, summary = kernels(), tiny_summary()
    monkeypatch.setattr(builtins, "open", no_open)
    CsvReporter().render(table, io.BytesIO())
    ParquetReporter().render(table, io.BytesIO())
    JsonReporter().render(summary, io.BytesIO())
    TextReporter().render(summary, io.StringIO())


# -------------------------------------------------------------------------------- output layer


class Failing:
    """Writes half a document, then breaks."""

    name: ClassVar[str] = "failing"
    extensions: ClassVar[tuple[str, ...]] = (".txt",)
    binary: ClassVar[bool] = False

    def render(self, data: Any, stream: IO[str]) -> None:
        stream.write("half a report\n")
        raise RuntimeError("broke half-way")


def test_a_failing_reporter_leaves_no_half_written_file(tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "report.txt"
    assert isinstance(Failing(), Reporter)
    with pytest.raises(RuntimeError, match="half-way"):
        write_report(Failing(), {}, out)
    assert not out.exists()
    assert out.parent.is_dir()  # the folders are made before the reporter runs


def test_write_report_opens_text_or_binary_as_the_reporter_writes(tmp_path: Path) -> None:
    write_report(TextReporter(), tiny_summary(), tmp_path / "s.txt")
    write_report(CsvReporter(), kernels(), tmp_path / "k.csv")
    write_json(tiny_summary(), tmp_path / "s.json")
    assert (tmp_path / "s.txt").read_text().startswith("llm-kernel-map analysis")
    assert (tmp_path / "k.csv").read_bytes().startswith(b'"name","dur_ns"')
    assert orjson.loads((tmp_path / "s.json").read_bytes())["format_version"] == 1


def test_an_unwritable_destination_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot write"):
        write_report(TextReporter(), tiny_summary(), blocker / "s.txt")


# ---------------------------------------------------------------------------------- formatting


def test_durations_plain_and_signed_agree_except_below_zero() -> None:
    for ns in (0, 812, 12_345, 4_560_000, 1_230_000_000, None):
        assert fm.fmt_ns(ns) == fm.fmt_signed_ns(ns)
    assert fm.fmt_ns(812) == "812 ns" and fm.fmt_ns(12_345) == "12.3 us" and fm.fmt_ns(None) == "-"
    assert fm.fmt_signed_ns(-4_560_000) == "-4.56 ms"
    assert fm.fmt_ns(-4_560_000) == "-4560000 ns"  # the plain form keeps its unit rule


def test_percent_ratio_and_names() -> None:
    assert fm.fmt_pct(0.1234) == "12.3%" and fm.fmt_pct(None) == "-"
    assert fm.fmt_ratio(1.9) == "1.90x" and fm.fmt_ratio(None) == "-"
    assert fm.shorten("a\n  b", 80) == "a b"
    assert fm.shorten("x" * 20, 10) == "x" * 7 + "..."
    cut = fm.shorten_middle("a" * 50 + "_tile128x64", 30)
    assert len(cut) == 30 and cut.endswith("tile128x64") and "..." in cut
    assert fm.shorten_middle(None, 10) == ""


def test_text_table_right_aligns_numbers() -> None:
    buf = io.StringIO()
    fm.write_table(buf, ["stage", "time"], [["qkv_gemm", "1.0 ms"], ["norm", "12.3 us"]])
    assert buf.getvalue() == "  stage     time\n  qkv_gemm   1.0 ms\n  norm      12.3 us\n"
