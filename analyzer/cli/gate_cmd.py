"""``gate``: fail a build when a stage got slower than in a saved baseline (exit 0 pass, 1 regression, 2 error)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import orjson

from analyzer.cli.common import make_options, run_analysis, shared_options
from analyzer.errors import InputError, UsageError
from analyzer.options import Options
from analyzer.output import write_report
from analyzer.report import GATE

CONFIG_TABLE = ("tool", "llm-kernel-map", "gate")
_BASELINE_MARK = b'"llm-kernel-map/baseline"'


def find_config(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above ``start``."""
    for d in (start, *start.parents):
        p = d / "pyproject.toml"
        if p.is_file():
            return p
    return None


def read_config(path: Path) -> dict[str, Any]:
    """The ``[tool.llm-kernel-map.gate]`` table of a pyproject.toml (empty when absent)."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML: {e}") from None
    table: Any = doc
    for key in CONFIG_TABLE:
        table = table.get(key, {}) if isinstance(table, dict) else {}
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.llm-kernel-map.gate] must be a table")
    return table


def _is_saved_json(path: Path) -> bool:
    """A baseline (or another of our result files), told from a trace by its first bytes."""
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    with open(path, "rb") as f:
        head = f.read(512)
    return _BASELINE_MARK in head or (
        head.lstrip().startswith(b'{"format_version"') and b"traceEvents" not in head
    )


def load_side(paths: tuple[str, ...], options: Options, top_share: float, label: str) -> dict[str, Any]:
    """A baseline object from a saved baseline JSON, or from analysing trace files."""
    from analyzer.results.baseline import build_baseline, check_baseline  # pyarrow

    saved = [p for p in paths if _is_saved_json(Path(p))]
    if saved:
        if len(paths) > 1:
            raise UsageError(f"{label}: give one saved baseline JSON or trace files, not both ({saved[0]})")
        try:
            obj = orjson.loads(Path(saved[0]).read_bytes())
        except orjson.JSONDecodeError as e:
            raise InputError(f"{saved[0]}: invalid JSON: {e}") from None
        return check_baseline(obj, saved[0])
    return build_baseline(run_analysis(paths, options), top_share=top_share)


@click.command("gate")
@shared_options
@click.option(
    "--baseline",
    "baseline_paths",
    multiple=True,
    required=True,
    type=click.Path(),
    help="Saved baseline JSON (from `llm-kernel-map baseline`) or trace file(s) to analyse.",
)
@click.option(
    "--threshold",
    type=str,
    default=None,
    metavar="REL",
    help="Relative slow-down that fails, e.g. 0.10 or 10%  [default: 0.10]",
)
@click.option(
    "--step-threshold",
    type=str,
    default=None,
    metavar="REL",
    help="Relative slow-down of a phase's step time (p50 or p90 of step durations) that fails  "
    "[default: 0.20]",
)
@click.option(
    "--min-delta-us",
    type=float,
    default=None,
    metavar="US",
    help="Absolute floor per step: smaller increases never fail  [default: 5]",
)
@click.option(
    "--stage-threshold",
    "stage_thresholds",
    multiple=True,
    metavar="KEY=REL",
    help="Override for a phase, stage or kernel: decode=0.05, decode.paged_attention=0.05, "
    "'decode.qkv_gemm/nvjet*=0.2' (repeatable; wildcards * ?).",
)
@click.option(
    "--min-steps",
    type=int,
    default=None,
    metavar="N",
    help="Steps a phase needs in both runs to be gated  [default: 3]",
)
@click.option(
    "--allow-few-steps",
    is_flag=True,
    default=None,
    help="Gate phases with fewer than --min-steps steps instead of refusing / skipping them.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(GATE.names)),
    default="text",
    show_default=True,
    help="Report format on stdout (and for -o files whose extension names none).",
)
@click.option(
    "-o",
    "--output",
    "outputs",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Also write the report here; format from the extension (.md, .xml, .json, .txt; "
    "none: --format's; another one is an error). Repeatable.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="pyproject.toml to read [tool.llm-kernel-map.gate] from  [default: the nearest one]",
)
def command(
    traces: tuple[str, ...],
    rules: tuple[str, ...],
    gpu: str | None,
    model: str | None,
    settings: tuple[str, ...],
    baseline_paths: tuple[str, ...],
    threshold: str | None,
    step_threshold: str | None,
    min_delta_us: float | None,
    stage_thresholds: tuple[str, ...],
    min_steps: int | None,
    allow_few_steps: bool | None,
    fmt: str,
    outputs: tuple[str, ...],
    config_path: str | None,
) -> int:
    """Compare CANDIDATE trace(s) with --baseline; exit 1 when a phase, stage or kernel got slower.

    Per phase with enough steps in both runs, the step time (p50 and p90 of the steps' wall
    durations, against --step-threshold) and the per-step median kernel time of the phase, of each
    stage and of each top kernel group are compared: a regression is a candidate time above
    baseline x (1 + threshold) that is also more than --min-delta-us higher. New stages above the
    floor fail too; new and vanished kernel groups are listed. Runs on another GPU, with another
    model shape (layers seen, GEMM roles), other tokens or batch per step (more than 10% apart) or
    too few steps are not comparable: exit 2 with the reason.

    Thresholds come from the command line, else from [tool.llm-kernel-map.gate] in the nearest
    pyproject.toml (threshold, step_threshold, min_delta_us, min_steps, allow_few_steps,
    stage_thresholds = {...}),
    else the defaults. --rules/--gpu/--model/--set apply to every trace analysed here.
    """
    from analyzer import regressions as gate  # pyarrow: loads after memory.configure
    from analyzer.report.gate_report import format_for_path

    formats = {path: format_for_path(path, default=fmt) for path in outputs}  # before any analysis
    cfg_file = Path(config_path) if config_path else find_config(Path.cwd())
    config = read_config(cfg_file) if cfg_file else {}
    thresholds = gate.make_thresholds(
        config,
        threshold=gate.parse_fraction(threshold, "--threshold") if threshold is not None else None,
        step_threshold=gate.parse_fraction(step_threshold, "--step-threshold")
        if step_threshold is not None
        else None,
        min_delta_us=min_delta_us,
        min_steps=min_steps,
        allow_few_steps=allow_few_steps,
        stage_thresholds=stage_thresholds,
        source=f"{cfg_file}: [tool.llm-kernel-map.gate]" if cfg_file else "[tool.llm-kernel-map.gate]",
    )
    options = make_options(rules, gpu, model, settings)
    reference = load_side(baseline_paths, options, 0.95, "--baseline")
    candidate = load_side(traces, options, 1.0, "CANDIDATE")
    result = gate.compare(reference, candidate, thresholds)
    for path in outputs:
        write_report(GATE.create(formats[path]), result, path)
        click.echo(f"wrote {path}", err=True)
    GATE.create("text" if outputs else fmt).render(result, sys.stdout)
    return 1 if result["status"] == "fail" else 0


for _param in command.params:
    if _param.name == "traces":
        _param.metavar = "CANDIDATE..."
