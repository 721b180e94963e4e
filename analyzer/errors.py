"""Errors that carry their exit code: the CLI turns them into one line on stderr (DESIGN §6)."""

from __future__ import annotations


class AnalyzerError(Exception):
    """Base class; ``exit_code`` is what the CLI returns."""

    exit_code = 2


class InputError(AnalyzerError):
    """The input cannot be read as a trace (wrong format, corrupt, empty, inconsistent)."""


class UsageError(AnalyzerError):
    """The command line asks for something impossible."""
