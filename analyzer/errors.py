"""Errors that carry their exit code: the CLI turns them into one line on stderr (README.md, "Commands": exit codes).

An error about an option names it as the caller spelled it: ``--gpu 'H999'`` on the command line,
``gpu='H999'`` from :func:`analyzer.analyze` (:func:`option`, :func:`api_keywords`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

# whether the run was asked for through the Python API (keywords) rather than the command line (flags)
_API_KEYWORDS: ContextVar[bool] = ContextVar("lkm_api_keywords", default=False)
# command-line flag -> the Python API's keyword, where they differ
_KEYWORD_OF = {"set": "settings"}


def option(flag: str, value: object) -> str:
    """An option with its value as the caller gave it: ``--gpu 'H999'`` / ``--set a.b`` on the command
    line, ``gpu='H999'`` / ``settings['a.b']`` in the Python API (``set`` values are the setting's key)."""
    if not _API_KEYWORDS.get():
        return f"--{flag} {value}" if flag == "set" else f"--{flag} {value!r}"
    keyword = _KEYWORD_OF.get(flag, flag)
    return f"{keyword}[{value!r}]" if flag == "set" else f"{keyword}={value!r}"


def option_name(flag: str) -> str:
    """An option's name as the caller spells it: ``--jobs`` on the command line, ``jobs=`` in the API."""
    return f"{_KEYWORD_OF.get(flag, flag)}=" if _API_KEYWORDS.get() else f"--{flag}"


@contextlib.contextmanager
def api_keywords() -> Iterator[None]:
    """Within this block errors name options by their Python API keyword (``gpu=``)."""
    token = _API_KEYWORDS.set(True)
    try:
        yield
    finally:
        _API_KEYWORDS.reset(token)


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
