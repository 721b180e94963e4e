"""A Kineto JSON document read whole, as plain values (for ``check``'s truth, which must not come
from the analyzer's own reader)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from analyzer.errors import InputError


def read_json(path: str | Path) -> dict[str, Any]:
    """The whole Kineto JSON document (gzip by magic bytes)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InputError(f"{p}: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        try:
            import orjson

            doc = orjson.loads(raw)
        except ImportError:
            doc = json.loads(raw)
    except ValueError as e:
        raise InputError(f"{p}: not a JSON trace ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(f"{p}: not a Kineto trace (no traceEvents)")
    return doc
