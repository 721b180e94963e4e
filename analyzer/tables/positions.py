"""Row positions as Python sequences for the per-kernel loops, without an int object per kernel."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def row_sequence(seq: np.ndarray) -> Sequence[int]:
    """``seq`` (increasing row numbers) as a sequence of ints for Python loops: a ``range`` where the
    rows follow each other (one device's kernels in time order, the common case), else a list. A
    list holds one int object per row (~36 bytes): millions of kernels make it the largest
    temporary of a loop over them."""
    n = len(seq)
    if n and int(seq[-1]) - int(seq[0]) == n - 1 and bool((np.diff(seq) == 1).all()):
        return range(int(seq[0]), int(seq[0]) + n)
    return seq.tolist()


def row_array(rows: Sequence[int]) -> np.ndarray:
    """``rows`` (from :func:`row_sequence`) as an int64 array."""
    if isinstance(rows, range):
        return np.arange(rows.start, rows.stop, rows.step, dtype=np.int64)
    return np.asarray(rows, np.int64)
