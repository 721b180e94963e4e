"""``analyze``: print a one-screen summary; optionally write the JSON summary and the HTML report."""

from __future__ import annotations

import functools
import sys
from typing import Any

import click

from analyzer.cli.common import compared_inputs, make_options, run_analysis, shared_options
from analyzer.output import write_json, write_report
from analyzer.report.text import CompareTextReporter, TextReporter
from analyzer.results.compare import compare_summaries


@click.command()
@shared_options
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), help="Write the versioned JSON summary here."
)
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write the HTML report here.")
@click.option(
    "--top",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Kernel groups listed in the text summary and kept in --json (which keeps at least 15).",
)
@click.option("--compare", is_flag=True, help="Analyse each input on its own and set them side by side.")
@click.option(
    "--brief",
    "brief",
    is_flag=True,
    help="Print the prefill-vs-decode brief (each value with its evidence, or why it is unknown) "
    "instead of the summary.",
)
def analyze(
    traces: tuple[str, ...],
    rules: tuple[str, ...],
    gpu: str | None,
    model: str | None,
    settings: tuple[str, ...],
    json_path: str | None,
    html_path: str | None,
    top: int,
    compare: bool,
    brief: bool,
) -> int:
    """Analyse TRACE... as one run (ranks of one job, or prefill + decode traces of one workload).

    A directory means every trace inside it. Prints inputs, GPU, wall and busy time, phases, time by
    stage and provider, top kernels, unclassified kernels and findings; with --brief, the
    prefill-vs-decode brief instead.
    """
    from analyzer.results.summary import build_summary  # pyarrow: loads after memory.configure

    summary_of = functools.partial(build_summary, top=top)

    options = make_options(rules, gpu, model, settings)
    if compare:
        summaries = [summary_of(run_analysis((t,), options)) for t in compared_inputs(traces)]
        result: dict[str, Any] = compare_summaries(summaries)
        CompareTextReporter().render(result, sys.stdout)
        if json_path:
            write_json(result, json_path)
            click.echo(f"wrote {json_path}", err=True)
        if html_path:
            from analyzer.report.html_compare import CompareHtmlReporter  # plotly

            write_report(CompareHtmlReporter(summaries), result, html_path)
            click.echo(f"wrote {html_path}", err=True)
        return 0
    analysis = run_analysis(traces, options)
    summary = summary_of(analysis)
    if brief:
        from analyzer.report.brief_text import BriefTextReporter

        BriefTextReporter().render(summary, sys.stdout)
    else:
        TextReporter(top=top).render(summary, sys.stdout)
    if json_path:
        write_json(summary, json_path)
        click.echo(f"wrote {json_path}", err=True)
    if html_path:
        from analyzer.report.html import HtmlReporter  # plotly

        write_report(HtmlReporter(analysis.kernels), summary, html_path)
        click.echo(f"wrote {html_path}", err=True)
    return 0
