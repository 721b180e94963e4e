"""JSON reporter: a result dict (summary, comparison, baseline) as indented JSON, one document per file.

The result carries its own ``format_version`` (README.md, "Output columns"); this module only serialises it: two-space
indent, numpy scalars as numbers, a final newline. Keys keep the result's order.
"""

from __future__ import annotations

from typing import IO, Any, ClassVar

import orjson


class JsonReporter:
    """``render(obj, binary_stream)``. ``non_str_keys``: write non-string keys as strings (as the
    summary and comparison files always were) instead of failing (as the baseline file always did)."""

    name: ClassVar[str] = "json"
    extensions: ClassVar[tuple[str, ...]] = (".json",)
    binary: ClassVar[bool] = True

    def __init__(self, non_str_keys: bool = True) -> None:
        self.option = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
        if non_str_keys:
            self.option |= orjson.OPT_NON_STR_KEYS

    def dumps(self, obj: Any) -> bytes:
        """The whole document as bytes, final newline included."""
        return orjson.dumps(obj, option=self.option) + b"\n"

    def render(self, data: Any, stream: IO[bytes]) -> None:
        stream.write(self.dumps(data))
