"""String columns without a Python string per row: Arrow dictionary arrays and shared-object arrays.

Analysis columns (stage, phase, provider ...) repeat a few values over millions of kernels. Contract:
every helper here takes a string column in any form (Arrow array, chunked or dictionary array, pandas
Categorical, Python sequence), works on its distinct values (a test or a lookup runs once per
value, never per row) and returns the per-row answer: a ``dictionary<int32, string>`` array
(:data:`DICT_STRING`), a boolean numpy array, or an object array whose equal values share one
``str``. Nulls stay null (or test False). No domain knowledge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DICT_STRING = pa.dictionary(pa.int32(), pa.string())


def dict_strings(values: Any) -> pa.DictionaryArray:
    """A string column as dictionary<int32, string>: analysis columns repeat a few values over
    millions of rows, so each row costs 4 bytes instead of its text."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.DictionaryArray):
        return values if values.type == DICT_STRING else values.cast(DICT_STRING)
    if hasattr(values, "categories") and hasattr(values, "codes"):  # a pandas Categorical
        return pa.array(values).cast(DICT_STRING)
    if not isinstance(values, pa.Array):
        values = pa.array(values, pa.string())
    return values.dictionary_encode().cast(DICT_STRING)


def dict_take(dictionary: pa.Array, indices: pa.Array) -> pa.DictionaryArray:
    """Rows ``dictionary[indices]`` as a dictionary array whose values are unique."""
    codes = dict_strings(dictionary)
    return pa.DictionaryArray.from_arrays(codes.indices.take(indices), codes.dictionary)


def objects(values: Any) -> np.ndarray:
    """A string column as a numpy object array whose equal values share one ``str`` (a plain
    ``to_pylist`` makes one object per row, for millions of kernels)."""
    codes = dict_strings(values)
    uniq = np.array(codes.dictionary.to_pylist() + [None], dtype=object)
    return uniq[codes.indices.fill_null(len(uniq) - 1).to_numpy(zero_copy_only=False)]


def filled(n: int, value: Any) -> np.ndarray:
    """An object array of ``n`` rows that all hold the one object ``value``: ``np.full`` of a ``str``
    converts it through a text array, one new ``str`` per row (~60 bytes each)."""
    out = np.empty(n, object)
    out.fill(value)
    return out


def dict_from_codes(codes: np.ndarray, labels: Sequence[str]) -> pa.DictionaryArray:
    """Per row ``labels[codes[row]]`` as dictionary<int32, string>, the same array
    :func:`dict_strings` makes of those strings (the labels in use, by first appearance; labels
    may repeat), without building them per row."""
    if len(codes) == 0:
        return dict_strings(pa.array([], pa.string()))
    used, first = np.unique(codes, return_index=True)
    lut = np.zeros(max(len(labels), 1), np.int32)
    out: dict[str, int] = {}
    for c in used[np.argsort(first, kind="stable")].tolist():
        lut[c] = out.setdefault(labels[c], len(out))
    return pa.DictionaryArray.from_arrays(pa.array(lut[codes], pa.int32()), pa.array(list(out), pa.string()))


def pylist(values: Any) -> list[Any]:
    """:func:`objects` as a list."""
    return objects(values).tolist()


def dict_where(values: Any, test: Callable[[str], bool]) -> np.ndarray:
    """Per row: ``test`` holds for the string (nulls: False), called once per distinct value."""
    codes = dict_strings(values)
    hit = np.array([bool(test(x)) for x in codes.dictionary.to_pylist()] + [False], bool)
    return hit[codes.indices.fill_null(len(codes.dictionary)).to_numpy(zero_copy_only=False)]


def dict_isin(values: Any, wanted: Sequence[str]) -> np.ndarray:
    """Per row: is the string one of ``wanted`` (nulls: False), tested once per distinct value."""
    codes = dict_strings(values)
    hit = pc.is_in(codes.dictionary, pa.array(list(wanted), pa.string())).take(codes.indices)
    return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)
