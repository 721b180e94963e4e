"""Options shared by analyze, report, export, baseline and gate (DESIGN §6), and their wiring."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from analyzer.errors import UsageError
from analyzer.pipeline import Analysis, Options, analyze_trace, load_inputs


def shared_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with --rules, --gpu, --model, --set (and the TRACE arguments)."""
    f = click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="Finding threshold override, e.g. --set same_kernel.min_share=0.01.")(f)
    f = click.option("--model", metavar="CONFIG_OR_NAME",
                     help="HF config.json or built-in architecture name (rules/models.toml).")(f)
    f = click.option("--gpu", metavar="NAME", help="GPU to assume instead of detecting it (rules/hardware.toml).")(f)
    f = click.option("--rules", "rules", multiple=True, type=click.Path(exists=True, dir_okay=False),
                     help="Extra rule file (TOML); its rules take precedence.")(f)
    f = click.argument("traces", nargs=-1, required=True, type=click.Path())(f)
    return f


def parse_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise UsageError(f"--set expects KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def make_options(rules: tuple[str, ...], gpu: str | None, model: str | None, settings: tuple[str, ...]) -> Options:
    return Options(rules=list(rules), gpu=gpu, model=model, settings=parse_settings(settings))


def _progress_printer() -> Callable[[str, int, int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(path: str, i: int, n: int) -> None:
        click.echo(f"reading {path} ({i + 1}/{n})", err=True)

    return show


def _byte_progress() -> Callable[[int, int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        if total > (64 << 20):
            pct = min(100, 100 * done // max(total, 1))
            sys.stderr.write(f"\r  {done >> 20:,} / {total >> 20:,} MB ({pct}%)")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    return show


def run_analysis(traces: tuple[str, ...], options: Options) -> Analysis:
    """Load and analyse the inputs as one run, showing progress on a terminal."""
    trace = load_inputs(list(traces), progress=_progress_printer(), byte_progress=_byte_progress())
    return analyze_trace(trace, options)
