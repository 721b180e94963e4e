"""The text of a ``check`` report (:func:`analyzer.results.accuracy.agreement`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, TextIO

#: rule ids listed per kind in the text, worst first
WORST_RULES = 5


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def short_name(name: str, width: int = 70) -> str:
    """A kernel name cut to ``width`` characters (template arguments first to go)."""
    s = re.sub(r"<.*>", "<…>", name) if len(name) > width else name
    return s if len(s) <= width else s[: width - 1] + "…"


def worst_rules(by_rule: Mapping[str, Mapping[str, Any]], n: int = WORST_RULES) -> list[tuple[str, Any]]:
    """The ``n`` rule ids with the most disagreeing time (only those with some), worst first."""
    bad = [(rid, v) for rid, v in by_rule.items() if v["time_ns"] > v["agree_ns"]]
    bad.sort(key=lambda kv: (kv[1]["agree_ns"] - kv[1]["time_ns"], kv[0]))
    return bad[:n]


def render_text(report: Mapping[str, Any], stream: Any) -> None:
    """The report as a few lines of text."""
    w = stream.write
    w(f"{report.get('trace', '')}: {report['kernels']} kernels, {report['kernel_ns'] / 1e6:.3f} ms"
      f"{' (step annotations kept)' if report.get('keep_steps') else ''}\n")  # fmt: skip
    for k in ("stage", "category", "phase"):
        v = report[k]
        w(f"  {k:<9} {_pct(v['agreement']):>7} of {v['time_ns'] / 1e6:.3f} ms with truth "
          f"({v['kernels']} kernels, {_pct(v['coverage'])} of kernel time)\n")  # fmt: skip
        if k == "phase" and v.get("undecided"):
            w(f"            {_pct(v['undecided'])} left unknown (the analysis says it cannot tell); "
              f"{_pct(v.get('decided_agreement'))} where a phase was given\n")  # fmt: skip
    st = report.get("steps")
    if st:
        f = st["fields"]
        wrong = ", ".join(f"{k} {v['wrong']}" for k, v in f.items() if v["wrong"])
        unsaid = ", ".join(f"{k} {v['not_given']}" for k, v in f.items() if v["not_given"])
        w(f"  steps     {st['paired']} of {st['truth']} truth steps paired ({st['found']} found); "
          f"fields wrong: {wrong or 'none'}; not given: {unsaid or 'none'}\n")  # fmt: skip
    if report.get("unmatched"):
        w(f"  warning: {report['unmatched']} analysed kernels have no raw-trace match\n")
    if report["regions"]:
        w("  by region (stage agreement):\n")
        for r in report["regions"]:
            w(
                f"    {r['region']:<24} {_pct(r['stage_agreement']):>7}  {r['time_ns'] / 1e6:9.3f} ms  {r['kernels']:>6}\n"
            )
    for k in ("stage", "phase"):
        bad = worst_rules(report[k].get("by_rule") or {})
        if bad:
            w(
                f"  {k} rules behind disagreements (rule: agreement of its time with truth; `rules explain ID`):\n"
            )
            for rid, v in bad:
                wrong = (v["time_ns"] - v["agree_ns"]) / 1e6
                w(
                    f"    {rid:<14} {_pct(v['agreement']):>7}  {wrong:9.3f} ms wrong of {v['time_ns'] / 1e6:.3f} ms\n"
                )
    if report["disagreements"]["stage"]:
        w("  largest stage disagreements (kernel: analyzer -> accepted):\n")
        for d in report["disagreements"]["stage"]:
            w(f"    {_pct(d['share']):>6}  {short_name(d['kernel'])}: {d['analyzer']} -> "
              f"{'|'.join(d['accepted'])} [{d['region']}]\n")  # fmt: skip
    if report["disagreements"]["phase"]:
        w("  largest phase disagreements (kernel: analyzer -> truth):\n")
        for d in report["disagreements"]["phase"]:
            w(f"    {_pct(d['share']):>6}  {short_name(d['kernel'])}: {d['analyzer']} -> {d['truth']}\n")


class AccuracyTextReporter:
    """``check``'s report as a few lines of text."""

    name: ClassVar[str] = "text"
    extensions: ClassVar[tuple[str, ...]] = (".txt",)
    binary: ClassVar[bool] = False

    def render(self, data: Mapping[str, Any], stream: TextIO) -> None:
        render_text(data, stream)
