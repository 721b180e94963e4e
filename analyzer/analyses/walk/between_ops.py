"""What lies between two GEMM ops of the layer walk, read by its role rules: an add or nothing (a
block ends), a norm before the next GEMM (an MLP's inner norm, STR066), a gate activation and its
multiply (an attention output gate's projection, STR068), and the GEMMs' shapes against the MLP's
gate / up projection (the down projection reads its output, STR056; the up projection has its own
K and N, STR066).

Contract: pure predicates over one device's kernels in launch order (positions into ``rows``); they
change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from analyzer.analyses.walk.positions import _is_add
from analyzer.analyses.walk.registry import _V, ATTENTION, GENERIC
from analyzer.analyses.walk.sequence import KernelSequence

GemmShapes = Callable[[int], tuple[int, int] | None]


def _add_before_gemm(rows: list[int], q: int, gemm: np.ndarray, op_names: Sequence[str | None]) -> bool:
    """Whether, from position ``q`` up to the next GEMM, an add op runs or nothing does: a block ends
    there (a residual add, or a projection of the block's output). Between an MLP's gate / up and its
    down projection its activation runs."""
    if q < len(rows) and gemm[q]:
        return True
    while q < len(rows) and not gemm[q]:
        if _is_add(rows[q], op_names):
            return True
        q += 1
    return False


def _reads_gate_up(
    gemm_kn: GemmShapes | None,
    r: int,
    gate_up_row: int,
) -> bool:
    """Whether the GEMM op at kernel row ``r`` reads what the MLP's gate / up projection (at kernel
    row ``gate_up_row``) wrote: its K is that projection's N (half of it for a fused gate and up),
    and differs from that projection's K (a square MLP cannot tell)."""
    if gemm_kn is None or gate_up_row < 0:
        return False
    kn, gate_up = gemm_kn(r), gemm_kn(gate_up_row)
    if kn is None or gate_up is None:
        return False
    k, n = gate_up
    return kn is not None and kn[0] != k and kn[0] in (n, n // 2)


_GATE_PROJECTION_OPS = _V("gate_projection_activation_ops")
_MUL_OPS = _V("scale_ops")


def _gated_output(ks: KernelSequence, lo: int, hi: int) -> bool:
    """STR068: in positions [lo, hi) (between two GEMM ops) no add runs and only generic kernels or a
    gate activation's (``gate_projection_activation_ops``, whatever stage its name gave it), among
    them that activation and a multiply after it: a gate projected and multiplied into the
    attention's output before its O projection."""
    act = found = False
    for q in range(lo, hi):
        op = ks.op_names[ks.rows[q]]
        if _is_add(ks.rows[q], ks.op_names):
            return False
        if op in _GATE_PROJECTION_OPS:
            act = True
        elif ks.st[q] not in GENERIC:
            return False
        elif act and op in _MUL_OPS:
            found = True
    return found


def _norm_then_gemm(ks: KernelSequence, gemm: np.ndarray, q: int) -> bool:
    """Whether from position ``q`` a norm runs before the next GEMM op, and no attention kernel."""
    seen = False
    while q < ks.n and not gemm[q]:
        if ks.st[q] in ATTENTION:
            return False
        seen = seen or bool(ks.normish[q])
        q += 1
    return seen and q < ks.n


def _same_shape(gemm_kn: GemmShapes | None, r: int, gate_up_row: int) -> bool:
    """Whether the GEMM op at kernel row ``r`` has the (K, N) of the MLP's gate projection (at
    ``gate_up_row``), K != N: it reads the MLP's input as that projection does (STR066)."""
    if gemm_kn is None or gate_up_row < 0:
        return False
    kn, gate = gemm_kn(r), gemm_kn(gate_up_row)
    return kn is not None and kn == gate and kn[0] != kn[1]
