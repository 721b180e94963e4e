"""Structure-rule cases (``tests/cases/*.json.xz``): a cut of a real trace's canonical tables, as JSON
(xz-compressed where the file name ends in ``.xz``).

Contract: a case is one JSON object with ``format`` = :data:`CASE_FORMAT`, the three canonical
tables as columns (``kernels``, ``host_ops``, ``annotations``: ``{column: [values]}``, the
names and types of :mod:`analyzer.model`, absent columns null), the input's metadata (``input``: :class:`InputMeta` fields)
and whatever the writer adds beside them (``expect``, ``fires`` ...), which this module hands back
untouched. :func:`read_case` rebuilds a :class:`Trace` that ``validate()`` accepts; :func:`case_document`
is its inverse. Nothing else: the expectations are read by the tests and written by ``cut``.
"""

from __future__ import annotations

import lzma
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from analyzer.errors import InputError
from analyzer.model import (
    ANNOTATION_SCHEMA,
    HOST_OP_SCHEMA,
    KERNEL_SCHEMA,
    InputMeta,
    Trace,
    table_from_columns,
)

__all__ = ["CASE_FORMAT", "case_document", "read_case", "write_case"]

CASE_FORMAT = "lkm-case/1"
_TABLES = (("kernels", KERNEL_SCHEMA), ("host_ops", HOST_OP_SCHEMA), ("annotations", ANNOTATION_SCHEMA))
_META_KEYS = (
    "format",
    "reader_version",
    "rank",
    "world_size",
    "gpu_name",
    "arch",
    "sm_count",
    "total_memory",
)


def _columns(table: pa.Table, schema: pa.Schema) -> dict[str, Any]:
    """The columns of ``schema`` that hold a value in ``table``, as JSON-ready lists; a dictionary
    column as ``{"values": [distinct strings], "index": [per row]}`` (kernel names repeat)."""
    out: dict[str, Any] = {}
    for f in schema:
        col = table[f.name].combine_chunks()
        if col.null_count == len(col):
            continue
        if pa.types.is_dictionary(f.type):
            enc = col.cast(pa.string()).dictionary_encode()
            out[f.name] = {"values": enc.dictionary.to_pylist(), "index": enc.indices.to_pylist()}
        else:
            out[f.name] = col.to_pylist()
    return out


def _decoded(columns: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, v in columns.items():
        if isinstance(v, dict):
            values, index = v.get("values"), v.get("index")
            if not isinstance(values, list) or not isinstance(index, list):
                raise TypeError(f"column {name!r}: expected values and index lists")
            out[name] = pa.DictionaryArray.from_arrays(
                pa.array(index, pa.int32()), pa.array(values, pa.string())
            )
        else:
            out[name] = v
    return out


def write_case(doc: dict[str, Any], path: str | Path) -> None:
    """``doc`` as compact JSON, one line per top-level key (small diffs when a case is re-cut);
    xz-compressed where ``path`` ends in ``.xz`` (the repository's cases: a tenth of the size)."""
    lines = [f"{orjson.dumps(k).decode()}: {orjson.dumps(v).decode()}" for k, v in doc.items()]
    text = ("{\n" + ",\n".join(lines) + "\n}\n").encode("utf-8")
    Path(path).write_bytes(lzma.compress(text) if str(path).endswith(".xz") else text)


def case_document(trace: Trace, **fields: Any) -> dict[str, Any]:
    """The case of ``trace`` (one input): its tables and metadata, plus ``fields``."""
    m = trace.inputs[0]
    return {
        "format": CASE_FORMAT,
        **fields,
        "input": {k: getattr(m, k) for k in _META_KEYS},
        **{name: _columns(getattr(trace, name), schema) for name, schema in _TABLES},
    }


def read_case(path: str | Path) -> tuple[Trace, dict[str, Any]]:
    """The trace a case holds and the case's other fields; InputError for a file that is no case."""
    try:
        raw = Path(path).read_bytes()
        doc = orjson.loads(lzma.decompress(raw) if str(path).endswith(".xz") else raw)
    except (OSError, lzma.LZMAError, orjson.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read case: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != CASE_FORMAT:
        raise InputError(f"{path}: not a structure-rule case (format {CASE_FORMAT!r})")
    try:
        tables = {name: table_from_columns(_decoded(doc.get(name) or {}), schema) for name, schema in _TABLES}
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise InputError(f"{path}: bad case table: {e}") from None
    meta = InputMeta(
        trace_id=0, path=str(path), **{k: v for k, v in doc.get("input", {}).items() if k in _META_KEYS}
    )
    trace = Trace(inputs=[meta], **tables)
    trace.validate()
    rest = {k: v for k, v in doc.items() if k not in ("input", *(t for t, _ in _TABLES))}
    return trace, rest
