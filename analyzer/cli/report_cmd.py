"""``report``: write the self-contained HTML report of one run (or, with --compare, of N inputs)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import click

from analyzer.cli.common import compared_inputs, make_options, run_analysis, shared_options
from analyzer.output import write_report
from analyzer.results.compare import compare_summaries

STEMS_IN_NAME = 3


def _stem(trace: str) -> str:
    name = Path(trace.rstrip("/")).name or "report"
    for ext in (".gz", ".json", ".csv", ".db", ".sqlite", ".sqlite3", ".nsys-rep", ".trace"):
        name = name.removesuffix(ext)
    return name or "report"


def default_output(traces: tuple[str, ...], compare: bool = False) -> str:
    """reports/<inputs' names joined by +>[-compare]-<8 hex>.html: the hash covers every input's
    absolute path (in order) and --compare, so no two sets of inputs share a default report."""
    stems = [_stem(t) for t in traces]
    shown = "+".join(stems[:STEMS_IN_NAME]) + (
        f"+{len(stems) - STEMS_IN_NAME}more" if len(stems) > STEMS_IN_NAME else ""
    )
    key = "\n".join(os.path.abspath(t.rstrip("/") or t) for t in traces) + ("\ncompare" if compare else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return str(Path("reports") / f"{shown[:60]}{'-compare' if compare else ''}-{digest}.html")


@click.command("report")
@shared_options
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="The HTML file to write [default: reports/<inputs' names>-<hash of their paths>.html].",
)
@click.option(
    "--cdn",
    is_flag=True,
    help="Link plotly.js from its CDN instead of embedding it (smaller, needs network).",
)
@click.option("--compare", is_flag=True, help="Analyse each input on its own and set them side by side.")
def command(
    traces: tuple[str, ...],
    rules: tuple[str, ...],
    gpu: str | None,
    model: str | None,
    settings: tuple[str, ...],
    output: str | None,
    cdn: bool,
    compare: bool,
) -> int:
    """Write one self-contained HTML page for TRACE... analysed as one run.

    The page holds the inputs, GPU and engine annotations, phases with step-time percentiles, the
    profile template per phase, stage and provider bars, a timeline of a few steps, rooflines, the
    top kernels, findings with evidence, unclassified kernels and warnings. plotly.js is embedded,
    so the page works offline (use --cdn for a small page that loads it from the network).
    """
    from analyzer.report.html import HtmlReporter  # plotly, pyarrow
    from analyzer.report.html_compare import CompareHtmlReporter
    from analyzer.results.summary import build_summary  # pyarrow: loads after memory.configure

    options = make_options(rules, gpu, model, settings)
    path = output or default_output(traces, compare)
    if compare:
        summaries = [build_summary(run_analysis((t,), options)) for t in compared_inputs(traces)]
        write_report(CompareHtmlReporter(summaries, cdn=cdn), compare_summaries(summaries), path)
    else:
        analysis = run_analysis(traces, options)
        write_report(HtmlReporter(analysis.kernels, cdn=cdn), build_summary(analysis), path)
    click.echo(f"wrote {path} ({Path(path).stat().st_size / 1e6:.1f} MB)", err=True)
    return 0
