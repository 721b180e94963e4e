"""Ground-truth phase labels of the H200 traces (``gt_phase::<phase>::q<N>`` ranges), for tests only.

The analyser never sees these: :func:`strip_labels` removes them before analysis, and
:func:`labelled_phases` turns them into a per-kernel expected phase and step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.model import Trace

PREFIX = "gt_phase::"


def strip_labels(trace: Trace) -> tuple[Trace, pa.Table]:
    """The trace without the label annotations, and the GPU-side label ranges that were removed."""
    a = trace.annotations
    is_gt = pc.starts_with(a["name"], PREFIX)
    labels = a.filter(pc.and_(is_gt, pc.equal(a["side"], "gpu")))
    stripped = dataclasses.replace(trace, annotations=a.filter(pc.invert(is_gt)))
    return stripped, labels


def labelled_phases(kernels: pa.Table, labels: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Expected phase (object array, None = not labelled) and step index (-1) per kernel.

    A kernel inside a label range gets that label; a kernel after a range and before the next one
    (sampling, bookkeeping) belongs to the step whose forward it follows.
    """
    n = kernels.num_rows
    phase = np.full(n, None, dtype=object)
    step = np.full(n, -1, np.int64)
    start = kernels["start_ns"].to_numpy(zero_copy_only=False)
    tid = kernels["trace_id"].to_numpy(zero_copy_only=False)
    lab = labels.to_pandas()
    for t in sorted(set(tid.tolist())):
        lt = lab[lab["trace_id"] == t].sort_values("start_ns").reset_index(drop=True)
        for i, r in lt.iterrows():
            lo = r["start_ns"]
            hi = lt.loc[i + 1, "start_ns"] if i + 1 < len(lt) else np.iinfo(np.int64).max
            sel = (tid == t) & (start >= lo) & (start < hi)
            phase[sel] = r["name"].split("::")[1]
            step[sel] = i
    return phase, step
