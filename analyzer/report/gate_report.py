"""Renderers of a gate result (:func:`analyzer.regressions.compare`): text, Markdown, JUnit XML and JSON.

Each renderer takes the result dict and a text stream and writes one document; none reads a trace
or opens a file. Text is the CI log, Markdown the job summary / PR comment (a table of what got
slower, by how much, and the kernels responsible), JUnit one test case per gated phase and stage
(plus failing kernel groups), JSON the result itself.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import PurePath
from typing import Any, ClassVar, TextIO

import orjson

from analyzer.errors import UsageError
from analyzer.report import GATE
from analyzer.report.formatting import fmt_signed_ns, shorten_middle

FORMATS = GATE.names  # ("text", "markdown", "junit", "json")
_SHOWN = ("regression", "new", "improvement", "vanished")
_TITLES = {"regression": "Slower", "new": "New", "improvement": "Faster", "vanished": "Vanished"}


def format_for_path(path: str, default: str = "text") -> str:
    """The renderer an output file's extension asks for: ``default`` when the name has no
    extension, a :class:`UsageError` when its extension names no gate report format."""
    spec = GATE.for_path(path)
    if spec is not None:
        return spec.name
    suffix = PurePath(str(path)).suffix
    if suffix:
        raise UsageError(
            f"-o {path}: {suffix} names no gate report format "
            f"(one of {', '.join(GATE.extensions)}; a name without extension gets --format)"
        )
    return default


def render(result: dict[str, Any], out: TextIO, fmt: str = "text") -> None:
    """Write ``result`` to ``out`` in ``fmt`` (one of :data:`FORMATS`)."""
    GATE.create(fmt).render(result, out)


# ------------------------------------------------------------------------------------ reporters


class GateTextReporter:
    """The CI log."""

    name: ClassVar[str] = "text"
    extensions: ClassVar[tuple[str, ...]] = (".txt",)
    binary: ClassVar[bool] = False

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        render_text(data, stream)


class GateMarkdownReporter:
    """The job summary / PR comment."""

    name: ClassVar[str] = "markdown"
    extensions: ClassVar[tuple[str, ...]] = (".md", ".markdown")
    binary: ClassVar[bool] = False

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        render_markdown(data, stream)


class GateJunitReporter:
    """JUnit XML: one test case per gated phase and stage, plus failing kernel groups."""

    name: ClassVar[str] = "junit"
    extensions: ClassVar[tuple[str, ...]] = (".xml",)
    binary: ClassVar[bool] = False

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        render_junit(data, stream)


class GateJsonReporter:
    """The gate result itself, as indented JSON."""

    name: ClassVar[str] = "json"
    extensions: ClassVar[tuple[str, ...]] = (".json",)
    binary: ClassVar[bool] = False

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        render_json(data, stream)


# ------------------------------------------------------------------------------------- helpers


def fmt_change(row: dict[str, Any]) -> str:
    d = row["delta_ns"]
    if row["status"] in ("new", "vanished") or row.get("change") is None:
        return ("+" if (d or 0) >= 0 else "") + fmt_signed_ns(d)
    return f"{'+' if d >= 0 else ''}{fmt_signed_ns(d)} ({row['change']:+.1%})"


def _subject(row: dict[str, Any], width: int = 70) -> str:
    if row["level"] == "phase":
        return f"{row['phase']} (all kernels)"
    if row["level"] == "step":
        return f"{row['phase']} step time {row['statistic']}"
    if row["level"] == "stage":
        return f"{row['phase']}.{row['stage']}"
    return f"{row['phase']}.{row['stage']}: {shorten_middle(row['group_key'], width)}"


def headline(result: dict[str, Any]) -> str:
    t = result["thresholds"]
    c = result["counts"]
    step = f", step time {t['step_threshold']:.0%}" if t.get("step_threshold") is not None else ""
    rule = f"threshold {t['threshold']:.0%}{step}, floor {fmt_signed_ns(t['min_delta_ns'])}/step"
    if result["status"] == "pass":
        extra = f"; {c['improvement']} faster" if c["improvement"] else ""
        return f"PASS: nothing slower ({rule}{extra})"
    failed = result["failed"]
    named = [f for f in failed if f["level"] != "kernel"] or failed
    parts = [f"{shorten_middle(f['id'], 60)} {_change_of(f)}" for f in named[:3]]
    more = f" and {len(named) - 3} more" if len(named) > 3 else ""
    return f"FAIL: slower: {', '.join(parts)}{more} ({rule})"


def _change_of(f: dict[str, Any]) -> str:
    if f.get("change") is None:
        return f"({f['status']}, +{fmt_signed_ns(f['delta_ns'])})"
    return f"({f['change']:+.1%})"


def _shown(result: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """Gated rows of one status worth a line (new/vanished: above the floor).

    A kernel group is folded into its stage's line (as a kernel responsible) when that stage is
    listed with the same status.
    """
    floor = result["thresholds"]["min_delta_ns"]
    rows = [r for r in result["rows"] if r["gated"] and r["status"] == status]
    if status in ("new", "vanished"):
        rows = [r for r in rows if abs(r["delta_ns"] or 0) > floor]
    stages = {(r["phase"], r["stage"]) for r in rows if r["level"] == "stage"}
    return [r for r in rows if r["level"] != "kernel" or (r["phase"], r["stage"]) not in stages]


def _pair_text(pair: dict[str, Any] | None) -> str:
    pair = pair or {}
    return f"{fmt_signed_ns(pair.get('baseline'))} -> {fmt_signed_ns(pair.get('candidate'))}"


def _inputs(side: dict[str, Any]) -> str:
    paths = ", ".join(str(i["path"]) for i in side["inputs"])
    return f"{paths} ({side['gpu'] or 'unknown GPU'})"


# ----------------------------------------------------------------------------------------- text


def render_text(result: dict[str, Any], out: TextIO) -> None:
    out.write(f"llm-kernel-map gate: {headline(result)}\n")
    out.write(f"  baseline:  {_inputs(result['baseline'])}\n")
    out.write(f"  candidate: {_inputs(result['candidate'])}\n")
    for p in result["phases"]:
        s, k = p["steps"], p["kernel_ns_p50"]
        state = "gated" if p["gated"] else "not gated"
        out.write(
            f"  {p['phase']}: {s['baseline']} vs {s['candidate']} steps ({state}); kernel time/step "
            f"{fmt_signed_ns(k['baseline'])} -> {fmt_signed_ns(k['candidate'])}; step time p50 "
            f"{fmt_signed_ns(p['step_ns_p50']['baseline'])} -> {fmt_signed_ns(p['step_ns_p50']['candidate'])}"
            f", p90 {_pair_text(p.get('step_ns_p90'))}\n"
        )
    for status in _SHOWN:
        rows = _shown(result, status)
        if not rows:
            continue
        out.write(f"\n{_TITLES[status]} (per-step {'median' if status != 'new' else 'time'})\n")
        for r in rows:
            mark = "FAIL " if r["fails"] else "     "
            out.write(
                f"  {mark}{_subject(r)}: {fmt_signed_ns(r['baseline_ns'])} -> {fmt_signed_ns(r['candidate_ns'])}  "
                f"{fmt_change(r)}  [threshold {r['threshold']:.0%}"
                f"{' from ' + r['threshold_from'] if r['threshold_from'] else ''}]\n"
            )
            for k in r.get("kernels") or []:
                out.write(f"         {fmt_change(k):>22}  {shorten_middle(k['group_key'], 110)}\n")
    if result["notes"]:
        out.write("\nNotes\n")
        for n in result["notes"]:
            out.write(f"  - {n}\n")


# ------------------------------------------------------------------------------------- markdown


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _md(text: Any) -> str:
    """A table cell: pipes escaped, markup characters neutralised, one line."""
    s = _CONTROL.sub("?", " ".join(str(text).split()))
    s = s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([*_`\[\]])", r"\\\1", s)


def _md_code(text: str) -> str:
    s = _CONTROL.sub("?", " ".join(str(text).split())).replace("`", "'").replace("|", "\\|")
    return f"`{s}`"


def render_markdown(result: dict[str, Any], out: TextIO) -> None:
    icon = "✅" if result["status"] == "pass" else "❌"
    out.write(f"### {icon} llm-kernel-map gate: {_md(headline(result))}\n\n")
    out.write(
        f"Baseline: {_md(_inputs(result['baseline']))}  \nCandidate: {_md(_inputs(result['candidate']))}\n\n"
    )
    out.write("| Phase | Steps (baseline / candidate) | Kernel time per step | Step time p50 | Gated |\n")
    out.write("|---|---:|---:|---:|---|\n")
    for p in result["phases"]:
        s, k, w = p["steps"], p["kernel_ns_p50"], p["step_ns_p50"]
        out.write(
            f"| {p['phase']} | {s['baseline']} / {s['candidate']} | {fmt_signed_ns(k['baseline'])} → "
            f"{fmt_signed_ns(k['candidate'])} | {fmt_signed_ns(w['baseline'])} → {fmt_signed_ns(w['candidate'])} | "
            f"{'yes' if p['gated'] else 'no'} |\n"
        )
    for status in _SHOWN:
        rows = _shown(result, status)
        if not rows:
            continue
        out.write(f"\n#### {_TITLES[status]}\n\n")
        out.write(
            "| | What | Baseline /step | Candidate /step | Change | Threshold | Kernels responsible |\n"
        )
        out.write("|---|---|---:|---:|---:|---:|---|\n")
        for r in rows:
            mark = "❌" if r["fails"] else ""
            what = _md_code(f"{r['phase']}.{r['stage']}") if r["stage"] else _md(_subject(r))
            if r["level"] == "kernel":
                what = f"{what} kernel {_md_code(shorten_middle(r['group_key'], 110))}"
            kernels = "<br>".join(
                f"{_md_code(shorten_middle(k['group_key'], 110))} {_md(fmt_change(k))}"
                for k in r.get("kernels") or []
            )
            out.write(
                f"| {mark} | {what} | {fmt_signed_ns(r['baseline_ns'])} | {fmt_signed_ns(r['candidate_ns'])} | "
                f"{_md(fmt_change(r))} | {r['threshold']:.0%} | {kernels} |\n"
            )
    if result["notes"]:
        out.write("\n")
        for n in result["notes"]:
            out.write(f"- {_md(n)}\n")


# ---------------------------------------------------------------------------------------- junit

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _x(text: Any) -> str:
    return _XML_BAD.sub("?", str(text))


def _detail(r: dict[str, Any]) -> str:
    lines = [
        f"{_subject(r)}: {fmt_signed_ns(r['baseline_ns'])} -> {fmt_signed_ns(r['candidate_ns'])} per step ({r['statistic']}), "
        f"{fmt_change(r)}; threshold {r['threshold']:.0%}"
    ]
    lines += [f"  {fmt_change(k)}  {k['group_key']}" for k in r.get("kernels") or []]
    return "\n".join(lines)


def render_junit(result: dict[str, Any], out: TextIO) -> None:
    """One testsuite per phase; a test case per phase row, stage row and failing kernel group."""
    root = ET.Element("testsuites", name="llm-kernel-map gate")
    total = failures = skipped = 0
    for p in result["phases"]:
        suite = ET.SubElement(root, "testsuite", name=_x(f"gate.{p['phase']}"))
        n_fail = n_skip = 0
        if not p["gated"]:
            rows = [r for r in result["rows"] if r["phase"] == p["phase"] and r["level"] == "phase"]
        else:
            rows = [
                r
                for r in result["rows"]
                if r["phase"] == p["phase"] and (r["level"] != "kernel" or r["fails"])
            ]
        for r in rows:
            name = r["id"]
            case = ET.SubElement(
                suite, "testcase", classname=_x(f"gate.{p['phase']}"), name=_x(name), time="0"
            )
            if not r["gated"]:
                ET.SubElement(case, "skipped", message=_x(p["reason"] or "not gated"))
                n_skip += 1
            elif r["fails"]:
                el = ET.SubElement(
                    case, "failure", type=r["status"], message=_x(f"{_subject(r)} {fmt_change(r)} per step")
                )
                el.text = _x(_detail(r))
                n_fail += 1
            else:
                out_el = ET.SubElement(case, "system-out")
                out_el.text = _x(f"{r['status']}: {_detail(r)}")
        suite.set("tests", str(len(rows)))
        suite.set("failures", str(n_fail))
        suite.set("errors", "0")
        suite.set("skipped", str(n_skip))
        total, failures, skipped = total + len(rows), failures + n_fail, skipped + n_skip
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", "0")
    root.set("skipped", str(skipped))
    ET.indent(root)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ET.tostring(root, encoding="unicode"))
    out.write("\n")


# ----------------------------------------------------------------------------------------- json


def render_json(result: dict[str, Any], out: TextIO) -> None:
    out.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    out.write("\n")
