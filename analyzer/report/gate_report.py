"""Renderers of a gate result (:func:`analyzer.gate.compare`): text, Markdown, JUnit XML and JSON.

Each renderer takes the result dict and a text stream and writes one document; none reads a trace
or opens a file. Text is the CI log, Markdown the job summary / PR comment (a table of what got
slower, by how much, and the kernels responsible), JUnit one test case per gated phase and stage
(plus failing kernel groups), JSON the result itself.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any, TextIO

import orjson

FORMATS = ("text", "markdown", "junit", "json")
_EXTENSIONS = {".md": "markdown", ".markdown": "markdown", ".xml": "junit", ".json": "json", ".txt": "text"}
NAME_WIDTH = 90
_SHOWN = ("regression", "new", "improvement", "vanished")
_TITLES = {"regression": "Slower", "new": "New", "improvement": "Faster", "vanished": "Vanished"}


def format_for_path(path: str, default: str = "text") -> str:
    """The renderer an output file's extension asks for (``default`` when it names none)."""
    for ext, fmt in _EXTENSIONS.items():
        if path.lower().endswith(ext):
            return fmt
    return default


def render(result: dict[str, Any], out: TextIO, fmt: str = "text") -> None:
    """Write ``result`` to ``out`` in ``fmt`` (one of :data:`FORMATS`)."""
    renderers: dict[str, Callable[[dict[str, Any], TextIO], None]] = {
        "text": render_text,
        "markdown": render_markdown,
        "junit": render_junit,
        "json": render_json,
    }
    renderers[fmt](result, out)


# ------------------------------------------------------------------------------------- helpers


def fmt_ns(ns: float | int | None) -> str:
    """Human duration: 812 ns, 12.3 us, 4.56 ms, 1.23 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1e3:
        return f"{sign}{ns:.0f} ns"
    if ns < 1e6:
        return f"{sign}{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{sign}{ns / 1e6:.2f} ms"
    return f"{sign}{ns / 1e9:.2f} s"


def fmt_change(row: dict[str, Any]) -> str:
    d = row["delta_ns"]
    if row["status"] in ("new", "vanished") or row.get("change") is None:
        return ("+" if (d or 0) >= 0 else "") + fmt_ns(d)
    return f"{'+' if d >= 0 else ''}{fmt_ns(d)} ({row['change']:+.1%})"


def short(name: str | None, width: int = NAME_WIDTH) -> str:
    """One line, at most ``width`` characters; the middle goes (tile and split-K sit at the end)."""
    name = " ".join(str(name or "").split())
    if len(name) <= width:
        return name
    tail = min(30, width // 3)
    return name[: width - tail - 3] + "..." + name[-tail:]


def _subject(row: dict[str, Any], width: int = 70) -> str:
    if row["level"] == "phase":
        return f"{row['phase']} (all kernels)"
    if row["level"] == "stage":
        return f"{row['phase']}.{row['stage']}"
    return f"{row['phase']}.{row['stage']}: {short(row['group_key'], width)}"


def headline(result: dict[str, Any]) -> str:
    t = result["thresholds"]
    c = result["counts"]
    rule = f"threshold {t['threshold']:.0%}, floor {fmt_ns(t['min_delta_ns'])}/step"
    if result["status"] == "pass":
        extra = f"; {c['improvement']} faster" if c["improvement"] else ""
        return f"PASS: nothing slower ({rule}{extra})"
    failed = result["failed"]
    named = [f for f in failed if f["level"] != "kernel"] or failed
    parts = [f"{short(f['id'], 60)} {_change_of(f)}" for f in named[:3]]
    more = f" and {len(named) - 3} more" if len(named) > 3 else ""
    return f"FAIL: slower: {', '.join(parts)}{more} ({rule})"


def _change_of(f: dict[str, Any]) -> str:
    if f.get("change") is None:
        return f"({f['status']}, +{fmt_ns(f['delta_ns'])})"
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
            f"{fmt_ns(k['baseline'])} -> {fmt_ns(k['candidate'])}; step time p50 "
            f"{fmt_ns(p['step_ns_p50']['baseline'])} -> {fmt_ns(p['step_ns_p50']['candidate'])}\n"
        )
    for status in _SHOWN:
        rows = _shown(result, status)
        if not rows:
            continue
        out.write(f"\n{_TITLES[status]} (per-step {'median' if status != 'new' else 'time'})\n")
        for r in rows:
            mark = "FAIL " if r["fails"] else "     "
            out.write(
                f"  {mark}{_subject(r)}: {fmt_ns(r['baseline_ns'])} -> {fmt_ns(r['candidate_ns'])}  "
                f"{fmt_change(r)}  [threshold {r['threshold']:.0%}"
                f"{' from ' + r['threshold_from'] if r['threshold_from'] else ''}]\n"
            )
            for k in r.get("kernels") or []:
                out.write(f"         {fmt_change(k):>22}  {short(k['group_key'], 110)}\n")
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
            f"| {p['phase']} | {s['baseline']} / {s['candidate']} | {fmt_ns(k['baseline'])} → "
            f"{fmt_ns(k['candidate'])} | {fmt_ns(w['baseline'])} → {fmt_ns(w['candidate'])} | "
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
            what = _md_code(f"{r['phase']}.{r['stage']}") if r["stage"] else f"{r['phase']} (all kernels)"
            if r["level"] == "kernel":
                what = f"{what} kernel {_md_code(short(r['group_key'], 110))}"
            kernels = "<br>".join(
                f"{_md_code(short(k['group_key'], 110))} {_md(fmt_change(k))}" for k in r.get("kernels") or []
            )
            out.write(
                f"| {mark} | {what} | {fmt_ns(r['baseline_ns'])} | {fmt_ns(r['candidate_ns'])} | "
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
        f"{_subject(r)}: {fmt_ns(r['baseline_ns'])} -> {fmt_ns(r['candidate_ns'])} per step ({r['statistic']}), "
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
