"""The analysed kernels table as a pandas frame, and narrow views of it (no domain knowledge)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

# kernel columns no summary, finding, baseline or report reads from the frame: left out of it, they
# would cost 8 bytes per kernel each (a 10 GB trace has millions of kernels)
FRAME_SKIP = frozenset(
    {
        "correlation",
        "registers",
        "shared_mem",
        "launch_op_id",
        "bytes_recorded",
        "launch_api",
        "block_y",
        "block_z",
        "tile_k",
    }
)


def to_frame(kernels: pa.Table) -> pd.DataFrame:
    """The kernels as pandas (string columns categorical), without the :data:`FRAME_SKIP` columns.

    One block per column (no 2-D block per dtype to copy into): numeric columns stay views of the
    Arrow buffers, which keeps the peak of the findings on big traces down. So do float64 columns
    with nulls whose null slots already hold NaN (the roofline's: built from arrays with NaN), where
    pyarrow would copy each to write the NaNs."""
    names = [c for c in kernels.column_names if c not in FRAME_SKIP]
    views = {c: v for c in names if (v := _nan_view(kernels[c])) is not None}
    df = kernels.select([c for c in names if c not in views]).to_pandas(
        strings_to_categorical=True, split_blocks=True
    )
    for c, v in views.items():
        df.insert(names.index(c), c, pd.Series(v, index=df.index, name=c, copy=False))
    return df


def _nan_view(column: pa.ChunkedArray) -> np.ndarray | None:
    """A float64 column with nulls as a read-only view of its values, where every null slot holds
    NaN (what pandas makes of a null), else None."""
    if column.type != pa.float64() or column.num_chunks != 1 or not column.null_count:
        return None
    a = column.chunk(0)
    values = np.frombuffer(a.buffers()[1], np.float64, count=len(a), offset=a.offset * 8)
    if not (np.isnan(values) | a.is_valid().to_numpy(zero_copy_only=False)).all():
        return None
    return values


def only_columns(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """The frame narrowed to ``columns`` (those it has): group-by loops then slice only these,
    not every column of millions of kernels (no copy is made here: pandas copies on write)."""
    return df[[c for c in dict.fromkeys(columns) if c in df]]


def groups(df: pd.DataFrame, keys: list[str]) -> Iterator[tuple[Any, pd.DataFrame]]:
    """``(key, rows)`` per group of ``keys`` (observed values only, missing keys left out), one
    group's rows copied at a time. Iterating a pandas group-by first copies the whole frame into
    group order; this takes each group's rows by position instead. Groups come in no set order."""
    for key, at in df.groupby(keys, sort=False, observed=True).indices.items():
        yield key, df.iloc[at]


# rows summed at a time by :func:`grouped_sums`: its temporaries stay this size whatever the length
SLICE_ROWS = 1 << 18


def category_codes(column: pd.Series) -> tuple[np.ndarray, list[Any]]:
    """A column's category codes (-1: missing) and its categories; a categorical column's own codes,
    not a copy."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(), list(column.cat.categories)
    cat = pd.Categorical(column)
    return cat.codes, list(cat.categories)


def floats(column: pd.Series) -> np.ndarray:
    """A numeric column as float64 with NaN for missing values (a float64 column's own buffer)."""
    if column.dtype == np.float64:
        return column.to_numpy()
    return column.to_numpy(np.float64, na_value=np.nan)


def grouped_sums(
    rows: int,
    keys: Sequence[tuple[np.ndarray | Callable[[slice], np.ndarray], int]],
    weights: Mapping[str, Callable[[slice], np.ndarray] | None],
    mask: Callable[[slice], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Per group of ``keys`` over ``rows`` rows (each key a per-row array of codes, -1 for none, or
    a function giving a slice of rows' codes; and how many codes it has) the sum of each weight (a
    function of a slice of rows; None counts rows), rows outside ``mask`` (a function of a slice)
    left out. Arrays shaped by the keys' sizes.

    Summed :data:`SLICE_ROWS` rows at a time, so the temporaries (one group code and one weight per
    row of a slice) stay bounded on millions of rows, and no per-row Python object is made."""
    sizes = [max(int(size), 1) for _, size in keys]
    total = int(np.prod(sizes)) if sizes else 1
    out = {name: np.zeros(total) for name in weights}
    for lo in range(0, rows, SLICE_ROWS):
        sl = slice(lo, min(rows, lo + SLICE_ROWS))
        ok = np.ones(sl.stop - sl.start, bool) if mask is None else np.array(mask(sl), bool)
        code = np.zeros(len(ok), np.int64)
        for (codes, _), size in zip(keys, sizes, strict=True):
            part = codes(sl) if callable(codes) else codes[sl]
            ok &= part >= 0
            code *= size
            code += part
        code = code[ok]
        for name, weight in weights.items():
            w = None if weight is None else np.asarray(weight(sl), np.float64)[ok]
            out[name] += np.bincount(code, weights=w, minlength=total)
    return {name: v.reshape(sizes) for name, v in out.items()}


def group_numbers(df: pd.DataFrame, keys: Sequence[str]) -> tuple[np.ndarray, pd.MultiIndex]:
    """Each row's group of ``keys`` as a number (-1: a key missing) and the groups' keys, numbered
    in the order ``df.groupby(keys, observed=True, sort=True)`` gives them (by category, the first
    key first). One int64 per row, built :data:`SLICE_ROWS` rows at a time: a group-by of several
    keys holds ~60 bytes a row (every key's codes, their product and its factorization)."""
    coded = [category_codes(df[k]) for k in keys]
    sizes = [max(len(cats), 1) for _, cats in coded]
    out = np.empty(len(df), np.int64)
    seen: list[np.ndarray] = []
    for lo in range(0, len(df), SLICE_ROWS):
        sl = slice(lo, min(len(df), lo + SLICE_ROWS))
        code = np.zeros(sl.stop - sl.start, np.int64)
        missing = np.zeros(len(code), bool)
        for (codes, _), size in zip(coded, sizes, strict=True):
            part = codes[sl]
            missing |= part < 0
            code *= size
            code += part
        code[missing] = -1
        out[sl] = code
        seen.append(pd.unique(code[~missing]))
    used = np.unique(np.concatenate(seen)) if seen else np.zeros(0, np.int64)
    for lo in range(0, len(df), SLICE_ROWS):
        sl = slice(lo, min(len(df), lo + SLICE_ROWS))
        code = out[sl]
        out[sl] = np.where(code >= 0, np.searchsorted(used, code), -1)
    levels = []
    rest = used
    for (_, cats), size in zip(reversed(coded), reversed(sizes), strict=True):
        levels.append(np.asarray(cats, dtype=object)[rest % size] if len(cats) else np.full(len(rest), None))
        rest = rest // size
    return out, pd.MultiIndex.from_arrays(levels[::-1], names=list(keys))
