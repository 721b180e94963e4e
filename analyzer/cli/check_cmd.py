"""``check``: how far the analysis agrees with a captured trace's own truth (docs/accuracy.md)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click

from analyzer.errors import InputError


def analyze_stripped(
    path: str, keep_steps: bool, rules: tuple[str, ...], gpu: str | None, model: str | None
) -> Any:
    """Analyse ``path`` with its truth ranges (and, unless ``keep_steps``, its step annotations)
    removed, CPU and GPU copies alike: the one analysis call of ``check``."""
    # pyarrow loads here, after the CLI applied the memory settings
    from analyzer.options import Options
    from analyzer.pipeline import analyze_trace
    from analyzer.results.accuracy import strip_annotations
    from analyzer.runtime.driver import load_inputs

    trace = load_inputs([path])
    trace = dataclasses.replace(trace, annotations=strip_annotations(trace.annotations, keep_steps))
    return analyze_trace(trace, Options(rules=list(rules), gpu=gpu, model=model))


def check_trace(
    path: str,
    *,
    keep_steps: bool = False,
    rules: tuple[str, ...] = (),
    gpu: str | None = None,
    model: str | None = None,
    worst: int = 10,
    truth_table: str | None = None,
) -> dict[str, Any]:
    """The agreement report of one trace (raises InputError when it holds no truth ranges)."""
    from analyzer.knowledge.annotations import load_annotation_patterns
    from analyzer.knowledge.truth import load_truth_table
    from analyzer.readers.raw_json import read_json
    from analyzer.results.accuracy import agreement, extract_truth, has_truth_ranges, step_agreement

    doc = read_json(path)
    if not has_truth_ranges(doc):
        raise InputError(f"{path}: no lkm::truth ranges (capture it with `llm-kernel-map capture --truth`)")
    table = load_truth_table(truth_table)
    truth = extract_truth(doc, table)
    del doc
    analysis = analyze_stripped(path, keep_steps, rules, gpu, model)
    report = agreement(analysis.kernels, truth, table, worst=worst, steps=analysis.steps)
    report["steps"] = step_agreement(analysis.kernels, truth, analysis.steps, load_annotation_patterns())
    # what the analysis said about itself: a wrong answer should come with one (issue 33)
    report["warnings"] = list(analysis.warnings)
    return {"trace": str(path), "keep_steps": keep_steps, **report}


@click.command("check")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option(
    "--keep-steps", is_flag=True, help="Keep the lkm::step annotations for the analysis (the annotated path)."
)
@click.option("--rules", "rules", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Extra rule file (TOML); its rules take precedence.")  # fmt: skip
@click.option("--gpu", metavar="NAME", help="GPU to assume instead of detecting it (rules/hardware.toml).")
@click.option("--model", metavar="CONFIG_OR_NAME", help="HF config.json or built-in architecture name.")
@click.option("--truth-table", type=click.Path(exists=True, dir_okay=False),
              help="Accepted stages per region (default: rules/truth.toml).")  # fmt: skip
@click.option("--worst", default=10, show_default=True, help="Disagreements listed.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON here.")
def command(
    trace: str,
    keep_steps: bool,
    rules: tuple[str, ...],
    gpu: str | None,
    model: str | None,
    truth_table: str | None,
    worst: int,
    json_path: str | None,
) -> int:
    """Measure the analysis of TRACE against the truth it carries (a `capture --truth` trace).

    The lkm::truth ranges and the lkm::step annotations are the truth: both are removed from the
    trace (CPU and GPU copies) before it is analysed, then each kernel's stage, category and phase
    are compared with it. Prints the time-weighted agreement over the kernels that have truth and
    the largest disagreements (kernel, the analyzer's answer, the accepted stages). Exit 0: it is a
    report. A trace without truth ranges is an error (exit 2). Not `rules check`, which validates rule files.
    """
    from analyzer.output import write_json
    from analyzer.report.accuracy_text import AccuracyTextReporter

    report = check_trace(
        trace, keep_steps=keep_steps, rules=rules, gpu=gpu, model=model, worst=worst, truth_table=truth_table
    )
    AccuracyTextReporter().render(report, sys.stdout)
    if json_path:
        write_json(report, json_path)
        click.echo(f"wrote {json_path}", err=True)
    return 0
