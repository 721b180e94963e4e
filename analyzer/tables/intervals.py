"""Interval arithmetic on the GPU timeline: busy time (union of activity) and idle gaps.

Pure numpy functions over start/end arrays in ns; no tables, no I/O.
"""

from __future__ import annotations

import numpy as np


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of ``[start, end)`` intervals as sorted, disjoint (start, end) arrays."""
    if len(start) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    s, e = np.asarray(start, np.int64), np.asarray(end, np.int64)
    if len(s) > 1 and not (s[1:] >= s[:-1]).all():  # a device's kernels come in time order: no copies then
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def busy_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Nanoseconds covered by at least one interval."""
    ms, me = merge_intervals(start, end)
    return int((me - ms).sum())


def span_ns(start: np.ndarray, end: np.ndarray) -> int:
    """From the first start to the last end (0 when empty)."""
    if len(start) == 0:
        return 0
    return int(np.max(end) - np.min(start))
