"""The HTML report (analyzer/report/html.py, figures.py, cli/report_cmd.py): page structure and
escaping without a browser, then real rendering in Debian's Chromium driven by playwright.

Browser tests are marked ``browser``; they skip when /usr/bin/chromium or playwright is missing.
Screenshots land in tests/actual/ (git-ignored) as artifacts.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.output import write_report
from analyzer.pipeline import Options
from analyzer.report import figures, html, html_compare
from analyzer.results.compare import compare_summaries
from analyzer.results.summary import build_summary
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2, ROOT, SHARED
from tests.runs import analyze_paths

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip
ACTUAL = ROOT / "tests" / "actual"
SGLANG = SHARED / "mi300x-sglang-qwen3-8b"
SGLANG_PAIR = [SGLANG / "sglang_Qwen3-8B_decode.json.gz", SGLANG / "sglang_Qwen3-8B_prefilldecode.json.gz"]
EVIL = [
    "<script>alert(1)</script>",
    "\"quotes'",
    "<b>bold</b>",
    "a<br>b",
    "</script><script>alert(2)</script>",
]
EVIL_GEMM_SUFFIX = "<b>bold</b><img src=x onerror=alert(3)>"
EVIL_GPU = "NVIDIA H200 <b>bold</b>"
EVIL_FILE = "evil<b>x<i>&amp;.json.gz"


# --------------------------------------------------------------------------- helpers


_CACHE: dict[tuple[str, ...], tuple[Any, dict[str, Any]]] = {}


def analysed(paths: list[Path], gpu: str | None = None) -> tuple[Any, dict[str, Any]]:
    key = (*map(str, paths), str(gpu))
    if key not in _CACHE:
        a = analyze_paths([str(p) for p in paths], Options(gpu=gpu))
        _CACHE[key] = (a, build_summary(a))
    return _CACHE[key]


def figure_data(page_text: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="lkm-figures">(.*?)</script>', page_text, re.S)
    assert m, "figure JSON block missing"
    return json.loads(m.group(1))


def make_evil_trace(folder: Path) -> Path:
    """A copy of the MoE fixture whose top kernels, GPU name and file name carry HTML/JS."""
    with gzip.open(H200_MOE, "rt") as f:
        doc = json.load(f)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    names = [n for n, _ in Counter(e["name"] for e in kernels).most_common()]
    gemm = next(n for n in names if n.startswith("nvjet"))
    rename = dict(zip(names, EVIL, strict=False))
    rename[gemm] = gemm + EVIL_GEMM_SUFFIX  # still a GEMM by rule: reaches the roofline too
    for e in kernels:
        e["name"] = rename.get(e["name"], e["name"])
    doc["deviceProperties"][0]["name"] = EVIL_GPU
    path = folder / EVIL_FILE
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


@pytest.fixture(scope="module")
def evil_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_evil_trace(tmp_path_factory.mktemp("evil"))


# --------------------------------------------------------------------------- page structure (no browser)


def test_page_embeds_plotly_once_and_holds_every_section() -> None:
    # GIVEN the dense H200 fixture analysed
    analysis, summary = analysed([H200_DENSE])
    # WHEN the page is rendered
    text = html.render_report(analysis, summary)
    # THEN plotly.js is embedded exactly once, nothing is fetched, and every section is there
    from plotly.offline import get_plotlyjs

    assert text.count(get_plotlyjs()[:300]) == 1
    page_only = text.replace(html.plotly_tag(False), "")
    assert "cdn.plot.ly" not in page_only and "src=" not in page_only
    for anchor in (
        "inputs",
        "phases",
        "stages",
        "timeline",
        "roofline",
        "top",
        "findings",
        "unclassified",
        "warnings",
    ):
        assert f'id="{anchor}"' in text
    figs = figure_data(text)
    assert len(figs) == text.count('class="fig"') >= 5
    assert "Engine annotations found" in text and "NVIDIA H200" in text
    for f in summary["findings"]:
        assert html.esc(f["title"]) in text


def test_cdn_page_links_plotly_and_is_small() -> None:
    analysis, summary = analysed([H200_DENSE])
    text = html.render_report(analysis, summary, cdn=True)
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js"', text)
    assert len(text.encode()) < 1_000_000


def test_unknown_gpu_says_why(tmp_path: Path) -> None:
    # GIVEN a summary whose GPU was not detected
    analysis, summary = analysed([H200_DENSE])
    s = dict(summary, gpu={"name": None, "arch": None, "peaks": {}, "reason": "no <b>match</b>"})
    text = html.render_report(analysis, s)
    # THEN the page says so, escaped
    assert "unknown GPU (no &lt;b&gt;match&lt;/b&gt;)" in text


def test_figure_json_cannot_close_the_script() -> None:
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=[1], y=["</script><script>alert(1)</script>&"]))
    text = figures.figure_json(fig)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text)["data"][0]["y"] == ["</script><script>alert(1)</script>&"]


def test_ftext_escapes_plotly_markup() -> None:
    assert figures.ftext("a<b>&c</b>") == "a&lt;b&gt;&amp;c&lt;/b&gt;"


def test_trace_strings_are_escaped_in_tables_and_figures(evil_trace: Path) -> None:
    # GIVEN a trace whose kernel names, GPU name and file name hold HTML and script
    analysis, summary = analysed([evil_trace], gpu="h200")
    # WHEN its page is rendered
    text = html.render_report(analysis, summary)
    figs = figure_data(text)
    page_only = text.replace(html.plotly_tag(False), "")
    # THEN no trace string reaches the markup raw: four scripts (config, plotly, figures, boot), no img
    assert text.count("<script") == 4 and page_only.count("<script") == 2
    assert "<img" not in page_only and "alert(1)</script>" not in page_only and "<b>bold" not in page_only
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page_only  # visible as text in the tables
    assert html.esc(EVIL_FILE) in page_only and html.esc(EVIL_GPU) in page_only
    # and the figure text carries the names as entities, which plotly shows literally
    hover = json.dumps([t.get("hovertext") for f in figs.values() for t in f["data"]])
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hover
    assert "&lt;img src=x onerror=alert(3)&gt;" in hover
    assert "<script>" not in hover and "<b>bold" not in hover


def test_timeline_caps_the_bars_by_merging() -> None:
    # GIVEN the dense fixture with a tiny bar budget
    analysis, summary = analysed([H200_DENSE])
    fig = figures.timeline(analysis.kernels, summary["steps"], max_bars=300)
    # THEN at most the budget is drawn (per panel: budget / panels), and no kernel time is lost
    bars = sum(len(t.x) for t in fig.data)
    assert bars <= 300
    full = figures.timeline(analysis.kernels, summary["steps"])
    assert sum(len(t.x) for t in full.data) > bars


def test_timeline_gives_every_rank_its_rows() -> None:
    # GIVEN the TP2 run, whose rank 1 starts its prefill 137 ms after rank 0
    analysis, summary = analysed(H200_TP2)
    fig = figures.timeline(analysis.kernels, summary["steps"])
    lanes = {y for t in fig.data for y in t.y}
    # THEN both ranks have lanes, and each panel is one step of both ranks
    assert any(y.startswith("rank 0 ") for y in lanes) and any(y.startswith("rank 1 ") for y in lanes)
    titles = [a.text for a in fig.layout.annotations]
    assert titles and all("ranks 0, 1" in t for t in titles)
    # ... drawn from one origin: rank 1's late prefill starts far from 0 us
    prefill = [t for t in fig.data if t.xaxis in ("x", "x1")]
    first: dict[str, float] = {}
    for t in prefill:
        for y, b in zip(t.y, t.base, strict=True):
            rank = y.split(" gpu")[0]
            first[rank] = min(first.get(rank, b), b)
    assert first["rank 0"] < 1_000 and first["rank 1"] > 100_000  # us from the step's first kernel


def test_pick_steps_takes_a_step_of_several_ranks_once() -> None:
    steps = [
        {"trace_id": r, "rank": r, "step": i, "phase": p, "start_ns": i}
        for r in (0, 1)
        for i, p in enumerate(["prefill", "decode", "decode", "decode"])
    ]
    chosen = figures.pick_steps(steps)
    assert [(s["rank"], s["step"]) for s in chosen] == [(0, 0), (0, 1), (0, 2)]
    assert [s["rank"] for s in figures.rank_steps(steps, chosen[1])] == [0, 1]


def test_merge_bars_keeps_busy_time_and_counts() -> None:
    import pandas as pd

    df = pd.DataFrame({"lane": ["a"] * 6 + ["b"] * 2, "stage": ["x", "x", "y", "y", "y", "x", "x", "x"],
                       "provider": ["p"] * 8, "norm_name": [f"k{i}" for i in range(8)],
                       "start_ns": [0, 10, 20, 30, 40, 50, 0, 10], "dur_ns": [5] * 8})  # fmt: skip
    runs = figures.merge_bars(df, cap=5)
    assert len(runs) == 4 and runs["n"].sum() == 8 and runs["dur_ns"].sum() == 40
    binned = figures.merge_bars(df, cap=2)
    assert len(binned) <= 2 and binned["n"].sum() == 8


def test_pick_steps_takes_first_prefill_and_two_decode() -> None:
    steps = [
        {"trace_id": 0, "step": i, "phase": p, "start_ns": i}
        for i, p in enumerate(["decode", "prefill", "decode", "decode", "prefill"])
    ]
    assert [s["step"] for s in figures.pick_steps(steps)] == [0, 1, 2]
    assert figures.pick_steps([]) == []


def test_roofline_draws_the_gpu_ceilings() -> None:
    analysis, summary = analysed([H200_DENSE])
    fig = figures.roofline(summary, "decode")
    peaks = summary["gpu"]["peaks"]
    roofs = [t for t in fig.data if t.mode == "lines"]
    bf16 = next(t for t in roofs if "bf16" in t.name)
    assert bf16.y[-1] == peaks["bf16_tflops"]
    assert bf16.y[0] == pytest.approx(peaks["hbm_tbps"] * bf16.x[0])
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


# --------------------------------------------------------------------------- CLI


def test_report_command_writes_one_page(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "dense.html"
    res = CliRunner().invoke(cli, ["report", str(H200_DENSE), "-o", str(out)], standalone_mode=False)
    assert res.exit_code == 0, res.output
    assert out.stat().st_size < 10_000_000 and out.read_text().startswith("<!DOCTYPE html>")


def test_analyze_html_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "a.html"
    res = CliRunner().invoke(cli, ["analyze", str(H200_DENSE), "--html", str(out)], standalone_mode=False)
    assert res.exit_code == 0, res.output
    assert 'id="roofline"' in out.read_text()


def test_default_output_name_is_distinct_per_set_of_inputs() -> None:
    from analyzer.cli.report_cmd import default_output

    # GIVEN inputs that share a file name, or one input and a set holding it
    one = default_output(("x/rank0.json.gz",))
    names = {
        one,
        default_output(("y/rank0.json.gz",)),
        default_output(("x/rank0.json.gz", "x/rank1.json.gz")),
        default_output(("x/rank0.json.gz", "x/rank1.json.gz"), compare=True),
        default_output(("x/rank1.json.gz", "x/rank0.json.gz")),
    }
    # THEN no two reports get the same default name; it stays readable and deterministic
    assert len(names) == 5
    assert Path(one).parent == Path("reports") and Path(one).name.startswith("rank0-")
    assert Path(one).suffix == ".html" and one == default_output(("x/rank0.json.gz",))
    assert "rank0+rank1" in default_output(("x/rank0.json.gz", "x/rank1.json.gz"))
    assert len(Path(default_output(tuple(f"d/trace{i}.json" for i in range(50)))).name) < 100


# ----------------------------------------------------------- the page matches the text summary


def test_ranks_section_shows_transfer_and_waiting_like_the_text() -> None:
    import io

    from analyzer.report.formatting import fmt_ns
    from analyzer.report.ranks_text import render_ranks

    # GIVEN the two-rank fixture (the text summary has a Ranks section)
    analysis, summary = analysed(H200_TP2)
    buf = io.StringIO()
    render_ranks(summary, buf)
    assert buf.getvalue().strip().startswith("Ranks (2)")
    # WHEN its page is rendered, THEN it has a Ranks section with each rank's transfer and waiting
    text = html.render_report(analysis, summary)
    assert 'id="ranks"' in text and 'href="#ranks"' in text
    section = text.split('id="ranks"', 1)[1].split("<h2", 1)[0]
    for r in summary["ranks"]["per_rank"]:
        for key in ("comm_ns", "comm_transfer_ns", "comm_wait_ns"):
            assert f">{html.esc(fmt_ns(r[key]))}<" in section, key
    assert "transfer" in section and "waiting" in section
    assert "longest waits" in section
    # and a single-rank run has none
    a1, s1 = analysed([H200_DENSE])
    assert 'id="ranks"' not in html.render_report(a1, s1)


def test_compare_page_carries_each_inputs_findings_top_kernels_and_rooflines() -> None:
    # GIVEN two inputs compared
    summaries = [analysed([H200_DENSE])[1], analysed([H200_MOE])[1]]
    text = html_compare.compare_page(compare_summaries(summaries), summaries)
    # THEN each input's findings, top kernels and rooflines are on the page
    for key, s in zip("AB", summaries, strict=True):
        for anchor in (f"findings-{key}", f"top-{key}", f"roofline-{key}"):
            assert f'id="{anchor}"' in text, anchor
        for f in s["findings"]:
            assert html.esc(f["title"]) in text
        for k in s["top_kernels"][:3]:
            assert (
                html.esc(figures.short(k["norm_name"], html.NAME_CELL)) in text
                or html.esc(k["norm_name"]) in text
            )
    names = [f["layout"]["title"]["text"] for f in figure_data(text).values()]
    assert sum("roofline" in n for n in names) >= 2


def test_evidence_values_are_formatted() -> None:
    # GIVEN evidence with missing values, large floats, nested tables and lists
    ev = {
        "token_ratio": None,
        "tokens": 15360.0,
        "share_of_run": 0.01234,
        "work_ratio": 1.536e4,
        "prefill": {"tokens": None, "mean_ns": 1.5e6, "grid_blocks": 123456.0},
        "by_stage": {"norm": {"count": 12000, "time_ns": 15360000}},
        "top": [None, 2.0e7],
    }
    out = html._kv(ev)
    # THEN no Python None and no exponent notation reach the page
    assert "None" not in out and not re.search(r"\de[+-]\d", out)
    assert "15,360" in out and "1.2%" in out and "12,000" in out
    # and real pages agree
    for paths in ([H200_DENSE], SGLANG_PAIR):
        if not all(Path(p).exists() for p in paths):
            continue
        analysis, summary = analysed(paths)
        text = html.render_report(analysis, summary)
        findings = text.split('id="findings"', 1)[1].split('id="unclassified"', 1)[0]
        assert ">None<" not in findings and not re.search(r">[^<]*\de[+-]\d[^<]*<", findings)


def test_timeline_legend_shows_every_stage_once_and_colours_differ() -> None:
    analysis, summary = analysed([H200_DENSE])
    fig = figures.timeline(analysis.kernels, summary["steps"])
    shown = [t.name for t in fig.data if t.showlegend]
    drawn = {t.name for t in fig.data}
    # every stage drawn has exactly one legend entry, and the legend fits without scrolling
    assert sorted(shown) == sorted(drawn)
    assert fig.layout.height >= 80 + 22 * len(shown)
    assert fig.layout.legend.orientation == "h" or fig.layout.legend.orientation is None
    # every stage of the taxonomy gets its own colour, clearly apart from the others
    stages, _ = figures._vocabulary()
    rgb = {s: tuple(int(figures.color_of(s)[i : i + 2], 16) for i in (1, 3, 5)) for s in stages}
    worst = min(
        sum((x - y) ** 2 for x, y in zip(rgb[a], rgb[b], strict=True)) ** 0.5
        for i, a in enumerate(stages)
        for b in stages[i + 1 :]
    )
    assert worst >= 40, worst


def test_roofline_axes_follow_the_points_that_matter() -> None:
    # GIVEN the dense decode phase, whose latency-bound sampling kernels reach ~1e-6 TFLOP/s
    analysis, summary = analysed([H200_DENSE])
    fig = figures.roofline(summary, "decode")
    pts = [y for t in fig.data if t.mode == "markers" for y in t.y]
    assert min(pts) > 0
    lo = fig.layout.yaxis.range[0]
    # THEN the y axis does not reach down to them: it starts within a few decades of the
    # memory- and compute-bound groups, and points below it are drawn at its floor
    matters = [
        g["achieved_tflops"]
        for g in summary["groups"]
        if g["phase"] == "decode" and g.get("achieved_tflops") and g.get("bound") in ("memory", "compute")
    ]
    assert lo >= __import__("math").log10(min(matters)) - 1.5
    assert min(pts) >= 10**lo


# --------------------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def browser() -> Any:
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing (apt-get install -y chromium; `make test` does it)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


class Loaded:
    """A page loaded from file:// with its console errors, page errors and dialogs recorded."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page = browser.new_page(viewport={"width": 1300, "height": 900})
        self.page.on(
            "console",
            lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("dialog", self._dialog)
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_load_state("load")

    def _dialog(self, d: Any) -> None:
        self.dialogs.append(d.message)
        d.dismiss()

    def assert_clean_and_drawn(self, screenshot: str) -> int:
        figs = self.page.evaluate("document.querySelectorAll('div.fig').length")
        blank = self.page.evaluate(
            "Array.from(document.querySelectorAll('div.fig')).filter(d => !d.querySelector('svg.main-svg')"
            " || d.querySelector('svg.main-svg').childElementCount === 0).map(d => d.id)"
        )
        ACTUAL.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ACTUAL / screenshot), full_page=True)
        assert not self.errors, self.errors
        assert not self.dialogs, self.dialogs
        assert figs > 0 and not blank, f"figures not drawn: {blank}"
        return figs


def _write(tmp_path: Path, name: str, paths: list[Path], gpu: str | None = None) -> Path:
    analysis, summary = analysed(paths, gpu)
    out = tmp_path / name
    write_report(html.HtmlReporter(analysis.kernels), summary, out)
    return out


@pytest.mark.browser
def test_dense_report_renders_in_chromium(browser: Any, tmp_path: Path) -> None:
    page = Loaded(browser, _write(tmp_path, "dense.html", [H200_DENSE]))
    assert page.assert_clean_and_drawn("report-h200-dense.png") >= 5
    assert page.page.locator("#findings").is_visible()


@pytest.mark.browser
def test_sglang_prefill_decode_report_renders_in_chromium(browser: Any, tmp_path: Path) -> None:
    if not all(p.exists() for p in SGLANG_PAIR):
        pytest.skip("public traces mi300x-sglang-qwen3-8b not available (../shared/traces is absent)")
    page = Loaded(browser, _write(tmp_path, "sglang.html", SGLANG_PAIR))
    page.assert_clean_and_drawn("report-mi300x-sglang.png")
    assert "AMD Instinct MI300X" in page.page.inner_text("body")


@pytest.mark.browser
def test_compare_report_renders_in_chromium(browser: Any, tmp_path: Path) -> None:
    pair = SHARED / "sglang-deepseek-llama8b-decode-mi300x-vs-b300"
    paths = sorted(pair.glob("MI300/*.json.gz")) + sorted(pair.glob("B300/*.json.gz"))
    if len(paths) != 2:
        pytest.skip("public traces sglang-deepseek-llama8b-decode-mi300x-vs-b300 not available")
    out = tmp_path / "compare.html"
    summaries = [analysed([p])[1] for p in paths]
    write_report(html_compare.CompareHtmlReporter(summaries), compare_summaries(summaries), out)
    page = Loaded(browser, out)
    page.assert_clean_and_drawn("compare-mi300x-vs-b300.png")
    body = page.page.inner_text("body")
    assert "AMD Instinct MI300X" in body and "B300" in body and "B/A" in body


# plotly shows hover text only on hover: find a point whose hover text holds a needle, hover it
# through plotly's own API, and read what the hover layer shows.
FIND_POINT = """(needle) => {
  const figs = JSON.parse(document.getElementById('lkm-figures').textContent);
  for (const id of Object.keys(figs)) {
    const data = figs[id].data;
    for (let c = 0; c < data.length; c++) {
      const h = data[c].hovertext || [];
      for (let p = 0; p < h.length; p++) {
        if (String(h[p]).includes(needle)) {
          return [id, c, p, (data[c].xaxis || 'x') + (data[c].yaxis || 'y')];
        }
      }
    }
  }
  return null;
}"""
HOVER = "([id, c, p, sub]) => Plotly.Fx.hover(document.getElementById(id), [{curveNumber: c, pointNumber: p}], sub)"
READ_HOVER = """([id]) => {
  const hl = document.getElementById(id).querySelector('.hoverlayer');
  return {text: hl.textContent,
          bold: Array.from(hl.querySelectorAll('tspan')).filter(t => /bold/.test(t.getAttribute('style') || '')).length,
          links: hl.querySelectorAll('a').length};
}"""


@pytest.mark.browser
def test_injected_names_stay_text_in_chromium(browser: Any, tmp_path: Path, evil_trace: Path) -> None:
    # GIVEN the report of a trace whose kernel, GPU and file names hold HTML and script
    page = Loaded(browser, _write(tmp_path, "evil.html", [evil_trace], gpu="h200"))
    # THEN it renders cleanly and nothing ran: no dialog, no injected element
    page.assert_clean_and_drawn("report-injection.png")
    pg = page.page
    assert pg.evaluate("document.scripts.length") == 4
    assert pg.evaluate("document.querySelectorAll('img').length") == 0
    assert (
        pg.evaluate(
            "Array.from(document.querySelectorAll('b, i')).filter(e => /bold|^x$/.test(e.textContent)).length"
        )
        == 0
    )
    # AND the names are visible as literal text in the tables
    body = pg.inner_text("body")
    for name in ("<script>alert(1)</script>", "\"quotes'", "<b>bold</b>", "</script><script>alert(2)</script>",
                 EVIL_GPU, EVIL_FILE):  # fmt: skip
        assert name in body, name
    # AND in figure hover text, shown literally by plotly (not bold, no link, no line break from the name)
    for needle, shown in (("alert(1)", "<script>alert(1)</script>"), ("&lt;b&gt;bold&lt;/b&gt;", "<b>bold</b>"),
                          ("a&lt;br&gt;b", "a<br>b"), ("onerror", "<img src=x onerror=alert(3)>")):  # fmt: skip
        where = pg.evaluate(FIND_POINT, needle)
        assert where, needle
        pg.evaluate(HOVER, where)
        pg.wait_for_timeout(150)
        seen = pg.evaluate(READ_HOVER, where)
        assert shown in seen["text"], (needle, seen)
        assert seen["bold"] == 0 and seen["links"] == 0, seen
    assert not page.dialogs and not page.errors


def test_tp2_report_details_read_right() -> None:
    # GIVEN the TP2 run: split-K GEMMs with no factor in their name, a 1.5 us unknown phase
    analysis, summary = analysed(H200_TP2)
    text = html.report_page(summary, analysis.kernels, cdn=True)
    # THEN the tile is the whole decoded tile (as `rules classify` gives it), never 'x?'
    tiles = {r["norm_name"]: r["tile"] for r in summary["top_kernels"]}
    assert tiles["nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"] == "64x8x64"
    assert not any(t and "?" in t for t in tiles.values())
    # ... unknown split-K reads as such, not -1
    assert "yes (factor unknown)" in text and '<td class="num">-1</td>' not in text
    # ... and the unknown phase gets a line, not a bar chart and a roofline
    names = [f["layout"]["title"]["text"] for f in figure_data(text).values()]
    assert not any(n.startswith("unknown") for n in names)
    assert "Not charted, too little kernel time to draw: unknown" in text


def test_long_names_are_shortened_with_the_whole_name_escaped_on_hover() -> None:
    name = "void k<" + "x" * 300 + '>("<script>alert(1)</script>")'
    cell = html.name_cell(name)
    assert len(cell) < 1000 and "<details" not in cell
    assert cell.startswith('<span title="void k&lt;') and "&lt;script&gt;" in cell
    assert "<script>" not in cell and '"<' not in cell.split('title="', 1)[1].split('">', 1)[0]
    assert html.name_cell("short_kernel") == "short_kernel"


def test_top_kernels_name_the_rule_that_gave_the_stage() -> None:
    # GIVEN a zoo case whose layer walk relabels generic kernels (a structure rule gives their stage)
    analysis, summary = analysed([ROOT / "fixtures" / "zoo" / "qwen3-moe-grouped-bf16" / "trace.json.gz"])
    tops = summary["top_kernels"]
    relabelled = [r for r in tops if r["stage_rule"] != r["rule_id"]]
    assert relabelled and all(r["stage_rule"] for r in tops)
    # WHEN the page is rendered
    text = html.render_report(analysis, summary)
    # THEN the top-kernel table shows the name rule and the rule that gave the stage
    r = relabelled[0]
    assert f"{html.esc(r['rule_id'])} → {html.esc(r['stage_rule'])}" in text
