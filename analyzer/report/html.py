"""HTML reporters: one self-contained page per analysis (:class:`HtmlReporter`; the ``--compare`` page
is :mod:`analyzer.report.html_compare`'s, built from the blocks here), assembled from the summary's tables and the figures of
:mod:`analyzer.report.figures` and written to the text stream the caller opened.

Contract: the page works offline (plotly.js embedded once unless ``cdn``), needs no eval, and treats
every trace-derived string as untrusted: table cells go through ``html.escape``, figure text through
``figures.ftext``, and the figures' JSON sits in a ``<script type="application/json">`` with ``<``,
``>`` and ``&`` written as ``\\u003c`` ... so it cannot close the script.
"""

from __future__ import annotations

import html
import math
import os
import string
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Protocol, TextIO

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa

from analyzer.report import figures
from analyzer.report.formatting import PHASE_ORDER, fmt_ns, fmt_pct, one_line, shorten
from analyzer.version import __version__

CDN_URL = "https://cdn.plot.ly/plotly-{version}.min.js"
NAME_CELL = 90
MIN_FIGURE_SHARE = 0.01  # a compared phase this small (of every input's kernel time) gets tables only

PAGE = string.Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="llm-kernel-map $version">
<title>$title</title>
<style>$style</style>
$plotly
</head>
<body>
<main>
$body
</main>
<script type="application/json" id="lkm-figures">$figures</script>
<script>$boot</script>
</body>
</html>
""")

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;margin:0;background:#f6f7f9}
main{max-width:1280px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}.sub{color:#666;margin:0 0 8px}
nav a{margin-right:12px;color:#0b63c5;text-decoration:none}
table{border-collapse:collapse;background:#fff;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #e1e4e8;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.name{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all;max-width:640px}
.grid{display:flex;flex-wrap:wrap;gap:16px}.fig{background:#fff;border:1px solid #e1e4e8;margin:8px 0;min-height:120px}
.card{background:#fff;border:1px solid #e1e4e8;border-left:4px solid #999;padding:8px 12px;margin:10px 0}
.card.critical{border-left-color:#c62828}.card.warning{border-left-color:#ef8f00}.card.info{border-left-color:#1e88e5}
.sev{font-weight:600;text-transform:uppercase;font-size:11px;margin-right:6px}
.kv td:first-child{color:#555;white-space:nowrap}.note{color:#555}.warn li{color:#8a5300}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
"""

BOOT = """(function () {
  var figs = JSON.parse(document.getElementById("lkm-figures").textContent);
  var ids = Object.keys(figs);
  if (typeof Plotly === "undefined") {
    ids.forEach(function (id) {
      document.getElementById(id).textContent = "plotly.js did not load: the figures need it (open the report online or rebuild it without --cdn).";
    });
    return;
  }
  ids.forEach(function (id) {
    Plotly.newPlot(id, figs[id].data, figs[id].layout, {responsive: true, displaylogo: false});
  });
})();"""


class Markup(str):
    """HTML built here from escaped parts: table cells pass it through unescaped."""


def esc(value: Any) -> str:
    """Escape for HTML text and attributes; ``None`` shows as a dash."""
    if isinstance(value, Markup):
        return value
    return "-" if value is None else html.escape(str(value), quote=True)


def table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], num: Iterable[int] = (), name: Iterable[int] = ()
) -> str:
    """A table; every cell escaped unless it is :class:`Markup`. ``num``/``name``: column classes."""
    num, name = set(num), set(name)
    out = ["<table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in headers), "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>")
        for i, c in enumerate(r):
            cls = ' class="num"' if i in num else ' class="name"' if i in name else ""
            out.append(f"<td{cls}>{esc(c)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def name_cell(name: Any, width: int = NAME_CELL) -> Markup:
    """A long kernel name on one short line: its first ``width`` characters, the whole name on hover
    (an escaped ``title``), so a template name of 2,000 characters does not make its row a page tall."""
    s = one_line(name)
    if len(s) <= width:
        return Markup(esc(s))
    return Markup(f'<span title="{esc(s)}">{esc(shorten(s, width))}</span>')


def split_k_text(v: Any) -> str:
    """A split-K factor as a reader wants it: ``-1`` (split-K, factor not in the name) is ``yes (factor
    unknown)``; none is a dash."""
    if v is None:
        return "-"
    return "yes (factor unknown)" if int(v) < 0 else str(int(v))


#: a phase holding less than this share of the kernel time gets a line, not a chart and a roofline
#: (the ``unknown`` phase of a few stray kernels: 1.5 us on the TP2 trace)
MIN_CHART_SHARE = 0.001


def charted_phases(s: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The phases worth a chart, and the rest (too little kernel time to draw)."""
    phases = s.get("phases") or {}
    total = sum(int(ph.get("kernel_ns") or 0) for ph in phases.values())
    big, small = [], []
    for p in _ordered(phases):
        share = (phases[p].get("kernel_ns") or 0) / total if total else 0.0
        (big if share >= MIN_CHART_SHARE or phases[p].get("steps") else small).append(p)
    return big, small


def _small_phases_note(page: Page, s: dict[str, Any], small: list[str]) -> None:
    if not small:
        return
    phases = s.get("phases") or {}
    total = sum(int(ph.get("kernel_ns") or 0) for ph in phases.values()) or 1
    said = ", ".join(
        f"{p} {fmt_ns(phases[p].get('kernel_ns'))} ({fmt_pct((phases[p].get('kernel_ns') or 0) / total)})"
        for p in small
    )
    page.add(f'<p class="note">Not charted, too little kernel time to draw: {esc(said)}.</p>')


class Page:
    """Sections and figures of one page, in order; ``html()`` assembles them."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figs: list[tuple[str, go.Figure]] = []
        self.nav: list[tuple[str, str]] = []

    def add(self, *parts: str) -> None:
        self.parts.extend(parts)

    def section(self, anchor: str, title: str) -> None:
        self.nav.append((anchor, title))
        self.add(f'<h2 id="{anchor}">{esc(title)}</h2>')

    def figure(self, fig: go.Figure | None, missing: str = "") -> None:
        if fig is None:
            if missing:
                self.add(f'<p class="note">{esc(missing)}</p>')
            return
        fid = f"fig-{len(self.figs) + 1}"
        self.figs.append((fid, fig))
        self.add(f'<div class="fig" id="{fid}"></div>')

    def html(self, cdn: bool = False, subtitle: str = "") -> str:
        nav = " ".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in self.nav)
        head = f"<h1>{esc(self.title)}</h1>" + (f'<p class="sub">{esc(subtitle)}</p>' if subtitle else "")
        body = "\n".join([head, f"<nav>{nav}</nav>", *self.parts])
        figs = "{" + ",".join(f'"{fid}":{figures.figure_json(f)}' for fid, f in self.figs) + "}"
        return PAGE.substitute(version=esc(__version__), title=esc(self.title), style=STYLE, plotly=plotly_tag(cdn),
                               body=body, figures=figs, boot=BOOT)  # fmt: skip


def plotly_tag(cdn: bool) -> str:
    """plotly.js: one embedded copy (default, works offline) or a link to the CDN."""
    from plotly.offline import get_plotlyjs
    from plotly.offline.offline import get_plotlyjs_version

    if cdn:
        return (
            f'<script src="{esc(CDN_URL.format(version=get_plotlyjs_version()))}" charset="utf-8"></script>'
        )
    js = get_plotlyjs()
    if "</script" in js.lower():  # never seen; guards the page structure if plotly.js ever contains it
        js = js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    return f'<script>window.PlotlyConfig = {{MathJaxConfig: "local"}};</script>\n<script charset="utf-8">{js}</script>'


def _ordered(phases: dict[str, Any]) -> list[str]:
    return [p for p in PHASE_ORDER if p in phases] + sorted(p for p in phases if p not in PHASE_ORDER)


# --------------------------------------------------------------------------- reporters


class HtmlReporter:
    """The report page of one run: ``render(summary, stream)``; ``kernels`` (the analysed kernels
    table) feeds only the timeline; ``cdn`` links plotly.js instead of embedding it."""

    name: ClassVar[str] = "html"
    extensions: ClassVar[tuple[str, ...]] = (".html", ".htm")
    binary: ClassVar[bool] = False

    def __init__(self, kernels: pa.Table, cdn: bool = False) -> None:
        self.kernels = kernels
        self.cdn = cdn

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        stream.write(report_page(data, self.kernels, self.cdn))


# --------------------------------------------------------------------------- analysis page


class _HasKernels(Protocol):
    kernels: pa.Table


def render_report(analysis: _HasKernels, summary: dict[str, Any], cdn: bool = False) -> str:
    """The whole page for one analysis, as text. ``analysis.kernels`` feeds only the timeline."""
    return report_page(summary, analysis.kernels, cdn)


def report_page(summary: dict[str, Any], kernels: pa.Table, cdn: bool = False) -> str:
    """The whole page for one run's ``summary``, as text; ``kernels`` feeds only the timeline."""
    page = Page("llm-kernel-map report")
    _header(page, summary)
    _phases(page, summary)
    _brief(page, summary)
    _stages(page, summary)
    _ranks(page, summary)
    page.section("timeline", "Timeline")
    page.add('<p class="note">The first prefill step and the first two decode steps, one row per GPU stream; '
             "consecutive kernels of one stage are merged into one bar when a step has too many to draw "
             f"(at most {figures.TIMELINE_MAX_BARS:,} bars).</p>")  # fmt: skip
    page.figure(figures.timeline(kernels, summary.get("steps") or []), "No timed kernels to draw.")
    _roofline(page, summary)
    _top(page, summary)
    _findings(page, summary)
    _unclassified(page, summary)
    _warnings(page, summary.get("warnings") or [])
    names = ", ".join(os.path.basename(str(i["path"])) for i in summary.get("inputs", []))
    return page.html(
        cdn,
        subtitle=f"{names} | llm-kernel-map {__version__}, summary format "
        f"{summary.get('format_version')}, rules {str(summary.get('rules_sha256') or '')[:12]}",
    )


def _gpu_html(gpu: dict[str, Any]) -> str:
    if not gpu.get("name"):
        return f"<p><b>GPU:</b> unknown GPU ({esc(gpu.get('reason') or 'not detected')}): times only, no roofline.</p>"
    peaks = gpu.get("peaks") or {}
    shown = [
        (k, peaks[k])
        for k in ("bf16_tflops", "fp16_tflops", "fp8_tflops", "fp32_tflops", "hbm_tbps")
        if k in peaks
    ]
    arch = f" ({esc(gpu['arch'])})" if gpu.get("arch") else ""
    out = f"<p><b>GPU:</b> {esc(gpu['name'])}{arch}</p>"
    if shown:
        out += table([k for k, _ in shown], [[f"{v:g}" for _, v in shown]], num=range(len(shown)))
    if gpu.get("reason"):
        out += f'<p class="note">detected: {esc(gpu["reason"])}</p>'
    if gpu.get("source"):
        out += f'<p class="note">peaks from: {esc(gpu["source"])}</p>'
    return out


def _header(page: Page, s: dict[str, Any]) -> None:
    page.section("inputs", "Inputs")
    rows = [[i["trace_id"], Markup(f"<code>{esc(i['path'])}</code>"), i.get("format"),
             f"{i.get('rank', 0)}/{i.get('world_size', 1)}", i.get("gpu_name"), i.get("arch"),
             Markup(f'<code title="{esc(i.get("sha256"))}">{esc(str(i.get("sha256") or "")[:12])}</code>')]
            for i in s.get("inputs", [])]  # fmt: skip
    page.add(table(["trace", "path", "format", "rank/world", "GPU (trace)", "arch", "sha256"], rows, num=[0]))
    anns = s.get("annotations") or []
    page.add(
        f"<p><b>Engine annotations found:</b> {esc(', '.join(map(str, anns))) if anns else 'none (steps and phases from the kernels themselves)'}</p>"
    )
    page.add(_gpu_html(s.get("gpu") or {}))
    if s.get("model"):
        page.add(f"<p><b>Model:</b> {esc(s['model'])}</p>")
    t = s.get("totals") or {}
    timed = bool(t.get("wall_ns")) or not t.get("aggregate_rows")  # totals-only inputs have no timeline
    page.add(table(["wall", "GPU busy", "GPU idle", "kernel time", "GPU activities"],
                   [[*((fmt_ns(t.get("wall_ns")), fmt_ns(t.get("busy_ns")), fmt_pct(t.get("idle_fraction")))
                       if timed else ("—",) * 3),
                     fmt_ns(t.get("kernel_ns")), f"{t.get('kernels', 0):,}"]], num=range(5)))  # fmt: skip
    if t.get("aggregate_rows"):
        page.add(f'<p class="note">{t["aggregate_rows"]:,} rows are totals only (no timeline): phases, steps and '
                 "the timeline skip them.</p>")  # fmt: skip


def _phases(page: Page, s: dict[str, Any]) -> None:
    phases = s.get("phases") or {}
    page.section("phases", "Phases")
    if not phases:
        page.add('<p class="note">No phases.</p>')
        return
    rows = []
    for p in _ordered(phases):
        ph = phases[p]
        st, idle = ph.get("step_ns") or {}, ph.get("idle_fraction")
        rows.append([p, ph.get("steps", 0), fmt_ns(ph.get("kernel_ns")),
                     *[fmt_ns(st.get(q)) if ph.get("steps") else "-" for q in ("p50", "p90", "p99")], "-" if ph.get("tokens") is None else f"{ph['tokens']:,}",
                     fmt_pct(None if idle is None else 1 - idle), fmt_pct(idle)])  # fmt: skip
    page.add(table(["phase", "steps", "kernel time", "step p50", "step p90", "step p99", "tokens", "GPU busy",
                    "GPU idle"], rows, num=range(1, 9)))  # fmt: skip
    page.add("<h3>Profile template per phase</h3>", '<div class="grid">')
    for p in _ordered(phases):
        prof = phases[p].get("profile") or []
        rows = [[r["label"], fmt_pct(r["share"]), fmt_ns(r["time_ns"]), r.get("bound") or "-"] for r in prof]
        page.add(
            f"<div><h3>{esc(p)}</h3>",
            table(["Category", "Time%", "time", "Bound-by"], rows, num=[1, 2]),
            "</div>",
        )
    page.add("</div>")


def _brief(page: Page, s: dict[str, Any]) -> None:
    """The prefill-vs-decode brief: every value with its evidence, or why it is unknown."""
    brief = s.get("brief") or {}
    if not brief:
        return
    from analyzer.report.brief_text import INTERFERENCE_HEADER, brief_rows, interference_rows

    page.section("brief", "Brief: what to know before tuning a prefill or decode kernel")
    page.add('<p class="note">Each value with the evidence it rests on; a value the trace cannot tell is '
             "<b>unknown</b>, with the reason.</p>")  # fmt: skip
    page.add(table(["section", "what", "value", "evidence"], list(brief_rows(brief))))
    rows = interference_rows(brief.get("interference") or {}, top=15)
    if rows:
        page.add("<h3>Continuous batching: kernel time per token, mixed steps vs pure steps, by stage</h3>")
        page.add('<p class="note">A mixed step counts whole against each kind of token (its kernels '
                 "serve both at once).</p>")  # fmt: skip
        page.add(table(INTERFERENCE_HEADER, rows, num=[2, 3, 4]))
    h = brief.get("headroom") or {}
    if h.get("rows") or h.get("uncounted"):
        page.add(f"<h3>Headroom: time saved if every kernel reached {esc(fmt_pct(h.get('roof_target')))} "
                 "of its roof, ranked</h3>")  # fmt: skip
        if h.get("unknown"):
            page.add(f'<p class="note">unknown, because {esc(h["unknown"])}</p>')
        rows = [[r["rank"], r["phase"], r["stage"], fmt_ns(r["time_ns"]), fmt_pct(r["pct_of_peak"]),
                 fmt_ns(r["saved_ns"])] for r in h.get("rows", [])[:15]]  # fmt: skip
        page.add(table(["#", "phase", "stage", "time", "of roof", "saved"], rows, num=[0, 3, 4, 5]))
        un = h.get("uncounted") or []
        if un:
            page.add("<h3>Kernels without a rate (not in the ranking)</h3>")
            rows = [
                [r["phase"], r["stage"], fmt_ns(r["time_ns"]), r["kernels"], ", ".join(r["reasons"])]
                for r in un[:15]
            ]
            page.add(table(["phase", "stage", "time", "kernels", "why"], rows, num=[2, 3]))


def _stages(page: Page, s: dict[str, Any]) -> None:
    page.section("stages", "Stages and providers")
    big, small = charted_phases(s)
    for p in big:
        page.figure(figures.stage_breakdown(s, p))
    _small_phases_note(page, s, small)
    rows = [
        [r["provider"], fmt_ns(r["time_ns"]), fmt_pct(r["share"]), f"{r['count']:,}"]
        for r in s.get("providers", [])
    ]
    page.add(
        "<h3>Time by provider (all phases)</h3>",
        table(["provider", "time", "share", "count"], rows, num=[1, 2, 3]),
    )


def _ranks(page: Page, s: dict[str, Any]) -> None:
    """The text summary's Ranks section: per rank, communication split into transfer and waiting
    for a slower rank; the longest waits; the slowest rank per step. Nothing for one rank."""
    r = s.get("ranks")
    if not r:
        return
    per = r.get("per_rank") or []
    page.section("ranks", f"Ranks ({len(r.get('ranks') or per)})")
    page.add('<p class="note">Communication = transfer + waiting for a slower rank to arrive at the '
             "collective.</p>")  # fmt: skip
    rows = [[p["rank"], fmt_ns(p["kernel_ns"]), fmt_pct(p.get("idle_fraction")), fmt_ns(p["comm_ns"]),
             fmt_ns(p["comm_transfer_ns"]), fmt_ns(p["comm_wait_ns"]),
             fmt_pct(p["comm_wait_ns"] / p["comm_ns"] if p["comm_ns"] else None),
             f"{p.get('last_arrivals', 0):,}"] for p in per]  # fmt: skip
    page.add(table(["rank", "kernel time", "idle (own wall)", "communication", "transfer", "waiting", "wait%",
                    "arrived last"], rows, num=range(8)))  # fmt: skip
    method = {"order": "same sequence on every rank: n-th with n-th",
              "name": "by name and order: the sequences differ",
              "none": "none could be matched"}.get(str(r.get("matching")), str(r.get("matching")))  # fmt: skip
    page.add(f"<p>{r.get('matched_collectives', 0):,} collectives matched across ranks ({esc(method)}).</p>")
    events = r.get("skew_events") or []
    if events:
        rows = []
        for e in events[:10]:
            waits = ", ".join(
                f"r{x['rank']} {fmt_ns(x['wait_ns'])}/{fmt_ns(x['dur_ns'])}" for x in e["ranks"]
            )
            rows.append([f"#{e['index']}", e["phase"], e["step"], f"rank {e['last_rank']}", fmt_ns(e["skew_ns"]),
                         waits, name_cell(str(e["name"]).split("(")[0])])  # fmt: skip
        page.add("<h3>The longest waits for a slower rank (per collective)</h3>",
                 table(["collective", "phase", "step", "last in", "skew", "waiting/duration per rank", "kernel"],
                       rows, num=[2, 4], name=[6]))  # fmt: skip
    steps = r.get("steps") or []
    if steps:
        by_phase: dict[str, list[dict[str, Any]]] = {}
        for st in steps:
            by_phase.setdefault(st["phase"], []).append(st)
        rows = []
        for phase, ss in by_phase.items():
            counts: dict[Any, int] = {}
            for st in ss:
                counts[st["slowest_rank"]] = counts.get(st["slowest_rank"], 0) + 1
            who = ", ".join(
                f"rank {k} in {v}/{len(ss)}"
                for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            )
            rows.append([phase, len(ss), who, fmt_ns(sum(st["others_wait_ns"] for st in ss))])  # fmt: skip
        page.add("<h3>Slowest rank per step (the one the others waited for)</h3>",
                 table(["phase", "steps", "slowest", "others waited"], rows, num=[1, 3]))  # fmt: skip
    notes = r.get("notes") or []
    if notes:
        page.add('<ul class="warn">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")


def _roofline(page: Page, s: dict[str, Any]) -> None:
    page.section("roofline", "Roofline")
    drawn = 0
    big, small = charted_phases(s)
    _small_phases_note(page, s, small)
    for p in big:
        groups = [g for g in s.get("groups", []) if g["phase"] == p]
        fig = figures.roofline(s, p)
        if fig is not None:
            drawn += 1
            page.figure(fig)
        no_flops = [g for g in groups if not g.get("flops") or not g.get("bytes")]
        invalid = [g for g in groups if g.get("bound") == "invalid"]
        total = sum(g["time_ns"] for g in groups) or 1
        notes = []
        if no_flops and fig is not None:
            notes.append(f"{len(no_flops)} groups ({fmt_pct(sum(g['time_ns'] for g in no_flops) / total)} of {p} "
                         "time) have no FLOP/byte count and are not drawn")  # fmt: skip
        if invalid:
            notes.append(
                f"{len(invalid)} groups are left out because their numbers exceed a peak (a data error)"
            )
        if notes:
            page.add(f'<p class="note">{esc("; ".join(notes))}.</p>')
    if not drawn:
        page.add('<p class="note">No kernel group has FLOPs and bytes (no shapes recorded and no --model): '
                 "nothing to place on a roofline.</p>")  # fmt: skip


def _shares_text(parts: list[dict[str, Any]] | None, key: str, fallback: str) -> str:
    """``moe_sort`` or ``decode 97.0%, prefill 3.0%``: every value of a kernel with its time share."""
    if not parts:
        return fallback
    if len(parts) == 1:
        return str(parts[0][key])
    return ", ".join(f"{p[key]} {fmt_pct(p['share'])}" for p in parts)


def _achieved(r: dict[str, Any]) -> Any:
    """The achieved rate of a top-kernel row; a dash (reason on hover) when it exceeds a peak."""
    if r.get("bound") == "invalid" and r.get("achieved_tbps") is None and r.get("achieved_tflops") is None:
        return Markup(f'<span title="{esc(r.get("invalid_reason") or "exceeds a peak")}">—</span>')
    pct = r.get("pct_of_peak")
    if r.get("bound") == "compute" and r.get("achieved_tflops") is not None:
        # the compute roof is the peak of the dtype the kernels compute in (fp8, int8, bf16 ...)
        roof = f" {r['roof_dtype']}" if r.get("roof_dtype") else ""
        val = f"{r['achieved_tflops']:.1f} TFLOP/s{roof}"
    elif r.get("achieved_tbps") is not None:
        val = f"{r['achieved_tbps']:.2f} TB/s"
    else:
        return "-"
    val += f" ({fmt_pct(pct)})" if pct is not None else ""
    # measured on some of the row's phases only (e.g. decode launches without shapes): say which
    from_ = r.get("rate_phases") or []
    if from_ and not set(from_) >= set(r.get("phases") or []):
        val += f" in {'+'.join(from_)}"
    return val


def _rule_cell(r: dict[str, Any]) -> Any:
    """The kernel rule of a top-kernel row, and the rule that gave its stage where another did."""
    rid, sr = r.get("rule_id"), r.get("stage_rule")
    if not sr or sr == rid:
        return rid
    return Markup(
        f'<span title="name rule {esc(rid)}; stage given by {esc(sr)}">{esc(rid)} → {esc(sr)}</span>'
    )


def _top(page: Page, s: dict[str, Any]) -> None:
    page.section("top", "Top kernels")
    rows = []
    notes = []
    for n, r in enumerate(s.get("top_kernels", []), start=1):
        rows.append([n, fmt_pct(r["share"]), fmt_ns(r["time_ns"]), f"{r['count']:,}", fmt_ns(r.get("mean_ns")),
                     _shares_text(r.get("stages"), "stage", r["stage"]), r["provider"],
                     _shares_text(r.get("phase_shares"), "phase", "/".join(r.get("phases") or [])),
                     _achieved(r), r.get("bound") or "-", _rule_cell(r), r.get("tile"),
                     split_k_text(r.get("split_k")), name_cell(r["norm_name"])])  # fmt: skip
        if r.get("invalid_reason"):
            notes.append(f"<li>#{n}: {esc(r['invalid_reason'])}</li>")
    page.add(table(["#", "share", "time", "count", "mean", "stage", "provider", "phases", "achieved (of roof)",
                    "bound", "rule", "tile", "split_k", "kernel"], rows, num=[0, 1, 2, 3, 4, 8, 12],
                   name=[13]))  # fmt: skip
    if notes:
        page.add('<p class="note">— / invalid: the numbers exceed a peak of the GPU, so no rate is shown.</p>',
                 '<ul class="warn">' + "".join(notes) + "</ul>")  # fmt: skip


_SHARE_WORDS = ("share", "fraction", "replayed", "pct")


def _number(key: str, v: float) -> str:
    """A number for a reader: shares as percentages, thousands separated, 4 significant digits,
    never exponent notation."""
    if any(w in key for w in _SHARE_WORDS) and -1 <= v <= 1:
        return fmt_pct(v)
    if not math.isfinite(v):
        return str(v)
    if float(v).is_integer() or abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.4g}"
    return np.format_float_positional(v, precision=4, unique=False, fractional=False, trim="-")


def _value(key: str, v: Any) -> Any:
    """One evidence value for display: durations also in human units, numbers without exponents,
    shares as percentages, a dash for a missing value."""
    if isinstance(v, dict):
        if v and all(isinstance(x, dict) for x in v.values()):
            cols = list(dict.fromkeys(k for x in v.values() for k in x))
            return Markup(
                table([key, *cols], [[k, *(_value(c, x.get(c)) for c in cols)] for k, x in v.items()])
            )
        return "; ".join(f"{k}: {_value(str(k), x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return ", ".join(str(_value(key, x)) for x in v)
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float) and key.endswith("_ns"):
        return f"{fmt_ns(v)} ({v:,.0f} ns)"
    if isinstance(v, int | float):
        return _number(key, float(v))
    return v


def _kv(d: dict[str, Any]) -> str:
    rows = [[k, _value(str(k), v)] for k, v in d.items()]
    return table(["evidence", "value"], rows).replace("<table>", '<table class="kv">', 1)


def _findings(page: Page, s: dict[str, Any]) -> None:
    fs = s.get("findings") or []
    page.section("findings", f"Findings ({len(fs)})")
    if not fs:
        page.add('<p class="note">No findings.</p>')
    for f in fs:
        sev = str(f.get("severity") or "info")
        cls = sev if sev in ("critical", "warning", "info") else "info"
        parts = [f'<div class="card {cls}"><div><span class="sev">{esc(sev)}</span><b>{esc(f.get("id"))}</b> '
                 f"{esc(f.get('phase') or '')}: {esc(f.get('title'))}</div>"]  # fmt: skip
        if f.get("evidence"):
            parts.append(_kv(f["evidence"]))
        keys = f.get("group_keys") or []
        if keys:
            items = "".join(f"<li><code>{esc(k)}</code></li>" for k in keys)
            parts.append(f"<details><summary>{len(keys)} kernel groups</summary><ul>{items}</ul></details>")
        if f.get("suggestion"):
            parts.append(f"<p><b>Suggestion:</b> {esc(f['suggestion'])}</p>")
        page.add("".join(parts) + "</div>")


def _unclassified(page: Page, s: dict[str, Any]) -> None:
    rows = s.get("unclassified") or []
    share = sum(r["share"] for r in rows)
    page.section("unclassified", "Unclassified kernels")
    page.add(
        f"<p>{fmt_pct(share)} of kernel time in {len(rows)} kernel names matched no rule (stage other).</p>"
    )
    bp = s.get("barrier_packets") or {}
    if bp.get("count"):
        page.add(
            f"<p>Barrier packets: {fmt_pct(bp['share'])} of kernel time in {bp['count']:,} rocprof "
            "&lt;barrier packet&gt; dispatches (queue waits, not kernels; not counted as unclassified).</p>"
        )
    if rows:
        page.add(table(["share", "time", "count", "kernel"],
                       [[fmt_pct(r["share"]), fmt_ns(r["time_ns"]), f"{r['count']:,}", name_cell(r["norm_name"])]
                        for r in rows[:100]], num=[0, 1, 2], name=[3]))  # fmt: skip
        if len(rows) > 100:
            page.add(f'<p class="note">... {len(rows) - 100} more in the JSON summary.</p>')


def _warnings(page: Page, warnings: list[str]) -> None:
    page.section("warnings", f"Warnings ({len(warnings)})")
    if warnings:
        page.add('<ul class="warn">' + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul>")
    else:
        page.add('<p class="note">None.</p>')


# --------------------------------------------------------------------------- compare page


class _InputPage:
    """A view of a :class:`Page` for one compared input: its sections' anchors and titles carry the
    input's key, so the single-run sections can be reused on the compare page."""

    def __init__(self, page: Page, key: str, label: str) -> None:
        self.page, self.key, self.label = page, key, label

    def add(self, *parts: str) -> None:
        self.page.add(*parts)

    def figure(self, fig: go.Figure | None, missing: str = "") -> None:
        self.page.figure(fig, missing)

    def section(self, anchor: str, title: str) -> None:
        self.page.section(f"{anchor}-{self.key}", f"{self.key}: {title}")


def _input_details(page: Page, key: str, label: str, s: dict[str, Any]) -> None:
    """One compared input's top kernels, rooflines and findings, as its own page shows them."""
    view: Any = _InputPage(page, key, label)
    _top(view, s)
    _roofline(view, s)
    _findings(view, s)
