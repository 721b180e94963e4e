"""Gzip decompression for the readers: ISA-L's (``isal``, about three times zlib's speed on traces)
when it is installed, else the standard library's. Both read the same files and fail on the same
damage; :data:`ERRORS` lists what either raises for a corrupt or truncated stream."""

from __future__ import annotations

import io
import zlib
from typing import IO

try:
    from isal import igzip as _gzip
    from isal import isal_zlib

    ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, isal_zlib.error)
except ImportError:  # pragma: no cover - isal is a dependency; kept for platforms without its wheel
    import gzip as _gzip  # type: ignore[no-redef]

    ERRORS = (OSError, EOFError, zlib.error)

MAGIC = b"\x1f\x8b"


def reader(fileobj: IO[bytes]) -> io.BufferedIOBase:
    """The decompressed bytes of the gzip stream ``fileobj``, as a file."""
    return _gzip.GzipFile(fileobj=fileobj, mode="rb")  # type: ignore[return-value]


def decompress(data: bytes) -> bytes:
    return _gzip.decompress(data)
