"""Writing result files safely: parent folders made, a half-written file removed on error."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from analyzer.errors import UsageError


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


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    data = orjson.dumps(
        obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    )
    with output_file(path, "wb") as f:
        f.write(data)
        f.write(b"\n")
