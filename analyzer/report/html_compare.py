"""The ``--compare`` HTML page (:class:`CompareHtmlReporter`): the inputs side by side, phases,
categories, stages and the kernels matched by layer role, built with the page blocks of
:mod:`analyzer.report.html` (every trace-derived string escaped there) and written to the text stream
the caller opened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TextIO

from analyzer.report import figures
from analyzer.report.formatting import fmt_ns, fmt_pct, fmt_ratio
from analyzer.report.html import MIN_FIGURE_SHARE, Markup, Page, _input_details, _warnings, esc, table
from analyzer.version import __version__


class CompareHtmlReporter:
    """The side-by-side page of ``--compare``: ``render(compare_result, stream)``; ``summaries`` (the
    compared inputs' summaries, in order) supply the warnings."""

    name: ClassVar[str] = "html"
    extensions: ClassVar[tuple[str, ...]] = (".html", ".htm")
    binary: ClassVar[bool] = False

    def __init__(self, summaries: Sequence[dict[str, Any]], cdn: bool = False) -> None:
        self.summaries = list(summaries)
        self.cdn = cdn

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        stream.write(compare_page(data, self.summaries, self.cdn))


def compare_page(r: dict[str, Any], summaries: Sequence[dict[str, Any]], cdn: bool = False) -> str:
    """The side-by-side page of the ``compare_summaries`` result ``r`` of ``summaries``."""
    ins = r["inputs"]
    keys = [i["key"] for i in ins]
    page = Page("llm-kernel-map comparison")
    page.section("inputs", "Inputs")
    rows = []
    for i in ins:
        g = i["gpu"]
        gpu = g.get("name") or f"unknown GPU ({g.get('reason') or 'not detected'})"
        paths = Markup("<br>".join(f"<code>{esc(p)}</code>" for p in i["paths"]))
        t = i["totals"]
        rows.append([i["key"], i["label"], gpu, g.get("arch"), ", ".join(i["formats"]), paths, fmt_ns(t.get("wall_ns")),
                     fmt_ns(t.get("busy_ns")), fmt_pct(t.get("idle_fraction")), fmt_ns(t.get("kernel_ns")),
                     f"{t.get('kernels', 0):,}"])  # fmt: skip
    page.add(table(["", "label", "GPU", "arch", "format", "paths", "wall", "GPU busy", "idle", "kernel time",
                    "kernels"], rows, num=range(6, 11)))  # fmt: skip
    ratio_heads = [f"{k}/{keys[0]}" for k in keys[1:]]

    def ratios(values: list[float | None]) -> list[str]:
        return [fmt_ratio(v) for v in values[1:]]

    page.section("phases", "Phases")
    rows = []
    for p in r["phases"]:
        rows.append([p["phase"], "kernel time", *map(fmt_ns, p["kernel_ns"]), *ratios(p["kernel_ratio"])])
        if any(p["steps"]):
            rows.append([p["phase"], "step p50", *[fmt_ns(v) if n else "-" for v, n in zip(p["step_p50_ns"], p["steps"], strict=True)],
                         *ratios(p["step_p50_ratio"])])  # fmt: skip
        rows.append([p["phase"], "steps", *p["steps"], *["" for _ in ratio_heads]])
    page.add(table(["phase", "metric", *keys, *ratio_heads], rows, num=range(2, 2 + 2 * len(keys))))
    for p in r["phases"]:
        ph = p["phase"]
        page.section(f"phase-{ph}", f"{ph}: categories and stages")
        if any(t["kernel_ns"] and k >= MIN_FIGURE_SHARE * t["kernel_ns"]
               for k, t in zip(p["kernel_ns"], (i["totals"] for i in ins), strict=True)):  # fmt: skip
            page.figure(figures.compare_categories(r, ph))
        cats = [c for c in r["categories"] if c["phase"] == ph]
        page.add(table(["Category", *[f"{k} time" for k in keys], *[f"{k} share" for k in keys], *ratio_heads],
                       [[c["label"], *map(fmt_ns, c["time_ns"]), *map(fmt_pct, c["share"]), *ratios(c["ratio"])]
                        for c in cats], num=range(1, 1 + 3 * len(keys))))  # fmt: skip
        stages = [c for c in r["stages"] if c["phase"] == ph]
        page.add(table(["stage", *[f"{k} time" for k in keys], *[f"{k} providers" for k in keys], *ratio_heads],
                       [[c["stage"], *map(fmt_ns, c["time_ns"]), *["+".join(pr) or "-" for pr in c["providers"]],
                         *ratios(c["ratio"])] for c in stages],
                       num=[*range(1, 1 + len(keys)), *range(1 + 2 * len(keys), 1 + 3 * len(keys))]))  # fmt: skip
        roles = [c for c in (r.get("roles") or {}).get("rows", []) if c["phase"] == ph]
        if roles:
            from analyzer.report.text import role_cells, role_stages

            page.add(
                f"<h3>{esc(ph)}: kernels matched by layer role (each input's share of its own roof)</h3>"
            )
            page.add(table(["role", *keys, *ratio_heads, "stages"],
                           [[c["role"], *role_cells(c), *ratios(c["ratio"]), role_stages(c)] for c in roles],
                           num=range(1, 1 + 2 * len(keys) - 1)))  # fmt: skip
    for i, s in zip(ins, summaries, strict=True):
        _input_details(page, i["key"], i["label"], s)
    warnings = [
        f"{i['key']}: {w}" for i, s in zip(ins, summaries, strict=True) for w in s.get("warnings") or []
    ]
    _warnings(page, warnings)
    return page.html(cdn, subtitle=f"{len(ins)} inputs analysed separately; ratios over input {keys[0]} | "
                              f"llm-kernel-map {__version__}")  # fmt: skip
