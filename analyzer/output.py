"""Writing result files safely: parent folders made, a half-written file removed on error.

The one place that opens an output file: reporters (:mod:`analyzer.report`) get the open stream.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from analyzer.errors import UsageError
from analyzer.report import Reporter
from analyzer.report.json_report import JsonReporter


@contextlib.contextmanager
def output_file(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open ``path`` for writing; remove it again if the writer fails half-way."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        f = open(p, mode, encoding=None if "b" in mode else "utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {p}: {e.strerror}") from None
    try:
        with f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError):
            p.unlink()
        raise


def write_report(reporter: Reporter, data: Any, path: str | os.PathLike[str]) -> None:
    """Render ``data`` with ``reporter`` into ``path`` (binary or text as the reporter writes);
    a file the reporter fails half-way through is removed."""
    with output_file(path, "wb" if reporter.binary else "w") as f:
        reporter.render(data, f)


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """``obj`` (a summary, a comparison, capture metadata) as indented JSON in ``path``."""
    write_report(JsonReporter(), obj, path)
