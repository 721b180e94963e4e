"""The analysed kernels table as a pandas frame, and narrow views of it (no domain knowledge)."""

from __future__ import annotations

from collections.abc import Iterator
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
