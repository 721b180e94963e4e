"""``report``: write the self-contained HTML report of one run (or, with --compare, of N inputs)."""

from __future__ import annotations

from pathlib import Path

import click

from analyzer.cli.common import make_options, run_analysis, shared_options


def default_output(traces: tuple[str, ...]) -> str:
    """reports/<first input's name without its trace extensions>.html"""
    name = Path(traces[0].rstrip("/")).name or "report"
    for ext in (".gz", ".json", ".csv", ".db", ".sqlite", ".trace"):
        name = name.removesuffix(ext)
    return str(Path("reports") / f"{name or 'report'}.html")


@click.command("report")
@shared_options
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="The HTML file to write [default: reports/<first input>.html].",
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
    from analyzer.report import html
    from analyzer.results.summary import build_summary

    options = make_options(rules, gpu, model, settings)
    path = output or default_output(traces)
    if compare:
        summaries = [build_summary(run_analysis((t,), options)) for t in traces]
        html.write_compare_report(summaries, path, cdn=cdn)
    else:
        analysis = run_analysis(traces, options)
        html.write_report(analysis, build_summary(analysis), path, cdn=cdn)
    click.echo(f"wrote {path} ({Path(path).stat().st_size / 1e6:.1f} MB)", err=True)
    return 0
