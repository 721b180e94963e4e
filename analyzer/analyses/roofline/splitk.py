"""Split-K reduce kernels: which kernels they are, their split factor and the work they do.

Contract: a split-K reduce (cuBLASLt ``splitKreduce_kernel``, CK / hipBLASLt split-K reduce passes)
reads the GEMM's fp32 partial sums ``split`` times and writes C once; it has no FLOPs of its own
(its additions are part of the GEMM's 2·M·N·K). Names are matched once per unique name.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# split-K reduce kernels (cuBLASLt splitKreduce_kernel, CK/hipBLASLt split-K reduce passes): they read
# the fp32 partial sums of the GEMM and write C, not the GEMM's A and B
SPLITK_REDUCE = re.compile(r"split_?k_?reduce|reduce_?split_?k", re.IGNORECASE)
PARTIAL_BYTES = 4.0  # split-K partial sums are fp32
MIN_SPLIT = 2  # a reduce kernel reads at least two partials: the compulsory minimum when the split is unknown


def splitk_reduce_mask(kernels: pa.Table) -> np.ndarray:
    """The split-K reduce kernels (matched once per unique name)."""
    col = kernels["norm_name"].combine_chunks()
    if not isinstance(col, pa.DictionaryArray):
        col = col.dictionary_encode()
    hit = np.array([bool(SPLITK_REDUCE.search(str(v))) for v in col.dictionary.to_pylist()], bool)
    if not hit.any():
        return np.zeros(len(col), bool)
    idx = pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.where(idx >= 0, hit[np.maximum(idx, 0)], False)


def reduce_work(mn: float, split: float, out_bytes: float) -> tuple[float, float]:
    """(flops, bytes) of a split-K reduce of an M x N output: ``split`` fp32 partials read, C written.
    Its additions are part of the GEMM's 2·M·N·K already: no FLOPs of its own (a pure memory pass)."""
    return 0.0, float(split * mn * PARTIAL_BYTES + mn * out_bytes)


def split_of(kernels: pa.Table, rows: np.ndarray) -> np.ndarray:
    """The decoded split-K factor of ``rows`` (NaN where unknown)."""
    if "split_k" not in kernels.column_names or not len(rows):
        return np.full(len(rows), np.nan)
    sk = kernels["split_k"].take(pa.array(rows)).to_numpy(zero_copy_only=False)
    return np.asarray(sk, np.float64)


def largest_split(values: np.ndarray) -> float:
    """The largest decoded split-K factor among ``values``; :data:`MIN_SPLIT` when none is known."""
    ok = values[~np.isnan(values) & (values >= MIN_SPLIT)]
    return float(ok.max()) if len(ok) else float(MIN_SPLIT)
