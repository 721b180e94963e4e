"""Reporters: each turns one result (a summary, a comparison, a gate result, the kernels table) into
one output format, written to a stream it is handed (the protocol: :mod:`analyzer.report.base`).

Reporters never read traces, open files or compute analysis numbers; they format what the result
holds. The registries below name every reporter by output name and file extension; the reporter
modules are imported only when one is created (this package imports no pyarrow, pandas or plotly).

==========  =====================================  ==========================================
registry    data                                   reporters (extensions)
==========  =====================================  ==========================================
SUMMARY     summary dict (``build_summary``)       text (.txt), json (.json), html (.html .htm)
COMPARE     ``compare_summaries`` result           text (.txt), json (.json), html (.html .htm)
GATE        ``gate.compare`` result                text (.txt), markdown (.md .markdown),
                                                   junit (.xml), json (.json)
TABLES      kernels table (``pyarrow.Table``)      csv (.csv), parquet (.parquet)
            ``perfetto.PerfettoExport`` (the table,   perfetto (.perfetto.json)
            steps, the inputs' raw events)
==========  =====================================  ==========================================
"""

from __future__ import annotations

from analyzer.report.base import Registry, Reporter, ReporterSpec

__all__ = ["COMPARE", "GATE", "SUMMARY", "TABLES", "Registry", "Reporter", "ReporterSpec"]

_HTML = (".html", ".htm")

SUMMARY = Registry(
    "summary",
    ReporterSpec("text", (".txt",), False, "analyzer.report.text:TextReporter"),
    ReporterSpec("json", (".json",), True, "analyzer.report.json_report:JsonReporter"),
    ReporterSpec("html", _HTML, False, "analyzer.report.html:HtmlReporter"),
)

COMPARE = Registry(
    "comparison",
    ReporterSpec("text", (".txt",), False, "analyzer.report.text:CompareTextReporter"),
    ReporterSpec("json", (".json",), True, "analyzer.report.json_report:JsonReporter"),
    ReporterSpec("html", _HTML, False, "analyzer.report.html_compare:CompareHtmlReporter"),
)

GATE = Registry(
    "gate report",
    ReporterSpec("text", (".txt",), False, "analyzer.report.gate_report:GateTextReporter"),
    ReporterSpec("markdown", (".md", ".markdown"), False, "analyzer.report.gate_report:GateMarkdownReporter"),
    ReporterSpec("junit", (".xml",), False, "analyzer.report.gate_report:GateJunitReporter"),
    ReporterSpec("json", (".json",), False, "analyzer.report.gate_report:GateJsonReporter"),
)

TABLES = Registry(
    "kernels table",
    ReporterSpec("csv", (".csv",), True, "analyzer.report.tables:CsvReporter"),
    ReporterSpec("parquet", (".parquet",), True, "analyzer.report.tables:ParquetReporter"),
    ReporterSpec("perfetto", (".perfetto.json",), True, "analyzer.report.perfetto:PerfettoReporter"),
)
