"""Small pure helpers over one device's kernel positions: the next position where a mask holds, the
GEMM ops (a split-K GEMM's kernels as one op), norm-like names, casts and adds, norm clusters.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.registry import (
    _ADD_OPS,
    _COPY_OPS,
    _FUSED_NORM_WORDS,
    DEFAULT_THRESHOLDS,
    KNOWLEDGE,
    WORK_OPS,
)

_COPY_WORDS = KNOWLEDGE.words("copy_words")


def _gemm_ops(
    seq: np.ndarray, gemm: np.ndarray, norm: list[str], launch: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last positions in ``seq`` of each logical GEMM (two arrays): adjacent GEMM
    kernels of one launching op, or a split-K reduction right after its GEMM (``gemm``: a GEMM
    stage at each position)."""
    pos = np.flatnonzero(gemm)
    if not len(pos):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    rows = seq[pos]
    names = [norm[r] for r in rows.tolist()]
    reduce = {n: _is_reduce(n) for n in set(names)}
    lv = launch[rows]
    joins = np.zeros(len(pos), bool)
    joins[1:] = (pos[1:] == pos[:-1] + 1) & (
        (lv[1:] == lv[:-1]) | np.fromiter(map(reduce.__getitem__, names[1:]), bool, len(pos) - 1)
    )  # NaN (no op) never equals
    first = np.flatnonzero(~joins)
    last = np.append(first[1:] - 1, len(pos) - 1)
    return pos[first], pos[last]


def _next_where(mask: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per position in ``at``: the first position >= it where ``mask`` holds (``len(mask)``: none)."""
    where = np.append(np.flatnonzero(mask), len(mask))
    return where[np.searchsorted(where[:-1], at)]


_SPLITK_REDUCE_WORDS = KNOWLEDGE.words("splitk_reduce_words")


def _is_reduce(name: str) -> bool:
    n = name.lower()
    return any(all(w in n for w in words) for words in _SPLITK_REDUCE_WORDS)


# norm-like names: the kernels of a composed norm, or a fused norm kernel
_NORM_WORDS = (*KNOWLEDGE.words("composed_norm_words"), *KNOWLEDGE.words("fused_norm_words"))


def _norm_like(stage: str, name: str) -> bool:
    return stage == "norm" or any(w in name for w in _NORM_WORDS)


def _is_cast(r: int, norm: Sequence[str], op_names: Sequence[str | None]) -> bool:
    op = op_names[r]
    return op in _COPY_OPS if op is not None else any(w in norm[r] for w in _COPY_WORDS)


def _fused_norm(name: str) -> bool:
    """A fused norm kernel (one kernel is the whole norm), by its name's words."""
    return any(w in name for w in _FUSED_NORM_WORDS)


def _norm_windows(
    clusters: tuple[list[int], list[int]],
    lo: int,
    hi: int,
    shape: dict[str, tuple[int, int]],
    rows: list[int],
    norm: Sequence[str],
    op_names: Sequence[str | None] | None = None,
) -> set[int]:
    """Positions in [lo, hi) covered by a norm of its learned shape around each norm-like cluster
    (``clusters``: the first and last positions of every cluster, from :func:`_cluster_bounds`).
    With ``op_names``: where the shape opens with a cast (to fp32) but this norm has none before it
    (its input is fp32 already: a residual kept in fp32), it has no cast back either; a cast at its
    window's end is the next op's (the LM head input's cast, Mamba's)."""
    first, last = clusters
    out: set[int] = set()
    for k in range(bisect.bisect_left(last, lo), bisect.bisect_left(first, hi)):
        c0, c1 = first[k], last[k]
        got = shape.get(norm[rows[c0]])
        if got is not None:
            end = min(c1 + got[1], hi - 1)
            if (
                op_names is not None
                and got[0]
                and end > c1
                and not (c0 and _is_cast(rows[c0 - 1], norm, op_names))
            ):
                end -= _is_cast(rows[end], norm, op_names)
            out.update(range(max(c0 - got[0], lo), end + 1))
    return out


def _cluster_bounds(
    pos: np.ndarray, gap: int = int(DEFAULT_THRESHOLDS.norm_cluster_gap)
) -> tuple[list[int], list[int]]:
    """The first and the last positions of each run of norm kernels at most ``gap`` apart (pow,
    mean, add, rsqrt), as two lists
    (searched with ``bisect``: one search per region, where numpy's per-call cost would dominate)."""
    if not len(pos):
        return [], []
    cut = np.flatnonzero(np.diff(pos) > gap) + 1
    return pos[np.concatenate([[0], cut])].tolist(), pos[np.concatenate([cut - 1, [len(pos) - 1]])].tolist()


def widens_activation(widen: Any, inputs: Callable[[int], list[list[int]] | None] | None, r: int) -> bool:
    """Kernel row ``r`` copies an activation (more than one dimension; unknown shapes: any) into a
    wider float (``widen``, per kernel row; None: unknown): a residual kept in fp32, not a norm's
    weight cast to fp32 (Gemma's ``1 + weight.float()``)."""
    if widen is None or not widen[r]:
        return False
    got = inputs(r) if inputs is not None else None
    return not got or not got[0] or len(got[0]) > 1


def _is_add(r: int, op_names: Sequence[str | None]) -> bool:
    return op_names[r] in _ADD_OPS


def gemm_shape(op_name: str | None, dims: list[list[int]] | None) -> tuple[int, int] | None:
    """(K, N) of a recorded dense GEMM op from its input shapes (``rules/work_ops.toml``, grouped
    products left out: their weights are experts); None when not a GEMM the table reads."""
    return WORK_OPS.dense_shape(op_name, dims)


def gemm_elements(op_name: str | None, dims: list[list[int]] | None) -> tuple[int, int] | None:
    """Elements of a recorded dense GEMM op's activation input and of its output (rows x K, rows x
    N, by the op's layout in ``rules/work_ops.toml``: addmm's bias is no input); None where the
    shapes do not say."""
    kn = WORK_OPS.dense_shape(op_name, dims)
    m = WORK_OPS.rows(op_name, dims)
    if kn is None or m <= 0:
        return None
    return m * kn[0], m * kn[1]


def numel(dims: Sequence[int]) -> int:
    """The element count of a tensor of ``dims`` (0 for no dims recorded)."""
    n = 1
    for d in dims:
        n *= int(d)
    return n if len(dims) else 0
