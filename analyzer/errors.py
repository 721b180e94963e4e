"""Errors that carry their exit code: the CLI turns them into one line on stderr (DESIGN §6)."""

from __future__ import annotations


class AnalyzerError(Exception):
    """Base class; ``exit_code`` is what the CLI returns. ``details``: lines the CLI prints before the
    error's own line when one input has several problems (each a complete one-line error)."""

    exit_code = 2

    def __init__(self, *args: object, details: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(*args)
        self.details = tuple(details)


class InputError(AnalyzerError):
    """The input cannot be read as a trace (wrong format, corrupt, empty, inconsistent)."""


class UsageError(AnalyzerError):
    """The command line asks for something impossible."""
