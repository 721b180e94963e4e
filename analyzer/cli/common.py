"""Options shared by analyze, report, export, baseline and gate (README.md, "Commands"), and their wiring."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from analyzer.errors import UsageError
from analyzer.options import Options

if TYPE_CHECKING:
    from analyzer.pipeline import Analysis


def shared_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with --rules, --gpu, --model, --set, the scale options and the TRACE arguments."""
    f = click.option(
        "--set",
        "settings",
        multiple=True,
        metavar="KEY=VALUE",
        help="Finding threshold override CHECK.KEY=VALUE, e.g. --set decode_gpu_idle.max_idle=0.3 "
        "(each finding's keys: `llm-kernel-map rules explain F006`).",
    )(f)
    f = click.option(
        "--model",
        metavar="CONFIG_OR_NAME",
        help="HF config.json or built-in architecture name (rules/models.toml).",
    )(f)
    f = click.option(
        "--gpu", metavar="NAME", help="GPU to assume instead of detecting it (rules/hardware.toml)."
    )(f)
    f = click.option(
        "--rules",
        "rules",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False),
        help="Extra rule file (TOML); its rules take precedence.",
    )(f)
    f = click.argument("traces", nargs=-1, required=True, type=click.Path())(f)
    f = scale_options(f)
    return f


SCALE_KEY = "lkm.scale"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta.setdefault(SCALE_KEY, {})[param.name] = value
    return value


def scale_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with --jobs, --no-cache, --executor, --scheduler (docs/scale.md).

    They are kept in the click context (not passed to the command), and ``run_analysis`` reads them.
    """
    f = click.option(
        "--scheduler",
        metavar="ADDRESS",
        expose_value=False,
        callback=_remember,
        help="Dask scheduler to parse the traces on, e.g. tcp://host:8786 (implies --executor dask).",
    )(f)
    f = click.option(
        "--executor",
        type=click.Choice(["local", "dask"]),
        expose_value=False,
        callback=_remember,
        help="Where traces are parsed: local processes (default) or a Dask cluster.",
    )(f)
    f = click.option(
        "--no-cache",
        is_flag=True,
        expose_value=False,
        callback=_remember,
        help="Parse the traces again instead of using the parsed-trace cache ($LKM_CACHE_DIR).",
    )(f)
    f = click.option(
        "--jobs",
        "-j",
        type=click.IntRange(min=1),
        expose_value=False,
        callback=_remember,
        help="Processes parsing traces at once (default: one per trace, at most one per CPU).",
    )(f)
    return f


def scale_settings() -> dict[str, Any]:
    """The --jobs/--no-cache/--executor/--scheduler of the running command as load_inputs arguments."""
    ctx = click.get_current_context(silent=True)
    got = (ctx.meta.get(SCALE_KEY) if ctx is not None else None) or {}
    scheduler = got.get("scheduler")
    executor = got.get("executor") or ("dask" if scheduler else "local")
    if scheduler and executor != "dask":
        raise UsageError("--scheduler needs --executor dask")
    return {
        "jobs": got.get("jobs"),
        "cache": not got.get("no_cache"),
        "executor": executor,
        "scheduler": scheduler,
    }


def parse_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise UsageError(f"--set expects KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def make_options(
    rules: tuple[str, ...], gpu: str | None, model: str | None, settings: tuple[str, ...]
) -> Options:
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
    from analyzer.runtime.driver import RunPolicy, analyze  # pyarrow loads here, after memory.configure

    policy = RunPolicy(progress=_progress_printer(), byte_progress=_byte_progress(), **scale_settings())
    return analyze(list(traces), options, policy)


def compared_inputs(traces: tuple[str, ...]) -> list[str]:
    """``--compare``'s inputs: every trace named, a folder meaning each trace inside it."""
    from analyzer.readers import expand_inputs  # pyarrow: loads after memory.configure

    return [str(f) for t in traces for f in expand_inputs([t])]
