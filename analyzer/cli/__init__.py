"""The ``llm-kernel-map`` (alias ``lkm``) command line: a click group, one module per subcommand.

``main()`` returns the exit code: 0 ok, 1 only from ``gate`` (a regression), 2 for bad input or
usage, always as one line on stderr and never a traceback (set LKM_DEBUG=1 to see one).
"""

from __future__ import annotations

import os
import sys

import click

from analyzer.errors import AnalyzerError
from analyzer.runtime import background, memory
from analyzer.version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llm-kernel-map")
def cli() -> None:
    """Map the GPU kernels of an LLM inference trace to pipeline stages, libraries and phases."""


def _register() -> None:
    from analyzer.cli import analyze, export, rules_cmd

    cli.add_command(analyze.analyze)
    cli.add_command(export.export)
    cli.add_command(rules_cmd.rules)
    for optional in ("report_cmd", "gate_cmd", "baseline_cmd", "capture_cmd", "check_cmd", "cut_cmd"):
        try:
            mod = __import__(f"analyzer.cli.{optional}", fromlist=["command"])
        except ModuleNotFoundError as e:
            if e.name != f"analyzer.cli.{optional}":
                raise
            continue
        cli.add_command(mod.command)


_register()


PROG_NAMES = ("llm-kernel-map", "lkm")


def completion_var(prog: str) -> str:
    """The variable click's shell completion reads, e.g. ``_LKM_COMPLETE=bash_source lkm``."""
    return f"_{prog.replace('-', '_').upper()}_COMPLETE"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code instead of raising.

    The memory settings are applied first: mimalloc reads them when pyarrow loads it, which no
    module imported so far has done (a test checks it)."""
    memory.configure(sys.argv[1:] if argv is None else argv)
    prog = "llm-kernel-map"
    invoked = os.path.basename(sys.argv[0]) if argv is None else prog
    if invoked in PROG_NAMES and os.environ.get(completion_var(invoked)):
        # shell completion (click's own mechanism): the script is generated for the name typed
        cli.main(args=argv, prog_name=invoked, complete_var=completion_var(invoked))
    try:
        rv = cli.main(args=argv, prog_name=prog, standalone_mode=False)
    except AnalyzerError as e:
        for line in e.details:
            click.echo(f"error: {line}", err=True)
        click.echo(f"error: {e}", err=True)
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 2
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        return 2
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 2
    except Exception as e:  # a bug, not bad input: still one line unless debugging
        if os.environ.get("LKM_DEBUG"):
            raise
        click.echo(f"internal error: {type(e).__name__}: {e} (rerun with LKM_DEBUG=1 for details)", err=True)
        return 2
    return rv if isinstance(rv, int) else 0


def entry() -> None:
    """Console-script entry: run the CLI, then leave without tearing the interpreter down."""
    leave(main())


def leave(code: int) -> None:
    """Exit with ``code`` once the output is flushed and the exit handlers ran, skipping the
    interpreter's teardown: it frees the analysis's millions of objects one by one (docs/performance.md), where the operating system takes the whole process back at once."""
    import atexit

    background.wait()  # nothing is left running (runtime.driver.analyze joins its threads already)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``) or a closed stream
            pass
    atexit._run_exitfuncs()  # multiprocessing, tempfile and logging clean up as on a normal exit
    os._exit(code)
