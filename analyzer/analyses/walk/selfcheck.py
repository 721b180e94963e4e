"""The walk's self-check (STR-self-check): a walk whose GEMM role sequence does not repeat over the
layers, or that found no attention, is dropped and the names' answers kept.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from analyzer.analyses.walk.registry import ATTENTION, DEFAULT_THRESHOLDS, GEMM_STAGES
from analyzer.knowledge.structure_rules import Thresholds


def structure_problem(
    seq: np.ndarray, stage: list[str], layer: np.ndarray, th: Thresholds = DEFAULT_THRESHOLDS
) -> str | None:
    """Why the walk's answer for one device's kernels cannot be trusted, or None.

    The structure is not found with confidence when the kernels hold GEMMs but no attention was
    located (every role would be a guess), or when the GEMM role sequence of the numbered layers
    does not repeat (the most common per-layer sequence covers under half of the layers; a
    dense-then-MoE mix has two sequences, both repeating).
    """
    st = [stage[r] for r in seq.tolist()]
    kinds = {x: i for i, x in enumerate(dict.fromkeys(st))}
    code = np.fromiter(map(kinds.__getitem__, st), np.int32, len(st))
    del st
    counts = np.bincount(code, minlength=len(kinds))
    names = list(kinds)
    gemms = int(sum(counts[i] for i, x in enumerate(names) if x in GEMM_STAGES or x == "moe_expert_gemm"))
    if gemms < th.min_gemms_for_layers:
        return None
    if not kinds.keys() & ATTENTION:
        return f"no attention located among {gemms} GEMM kernels"
    # one run per layer instance (kernels of one layer number, back to back): its GEMM roles in
    # order, repeats merged; only the GEMM positions are looked at
    role = np.array([x in GEMM_STAGES and x != "gemm" for x in names], bool)[code]
    lay = layer[seq]
    instance = np.concatenate([[0], np.cumsum(lay[1:] != lay[:-1])])
    at = np.flatnonzero(role & (lay >= 0))
    c, inst = code[at], instance[at]
    keep = np.ones(len(at), bool)
    keep[1:] = (inst[1:] != inst[:-1]) | (c[1:] != c[:-1])
    c, inst = c[keep], inst[keep]
    starts = np.flatnonzero(np.concatenate([[True], inst[1:] != inst[:-1]])) if len(inst) else inst
    if len(starts) >= 3:
        seqs = Counter(part.tobytes() for part in np.split(c, starts[1:]))
        if 2 * max(seqs.values()) < len(starts):
            return f"the GEMM role sequence does not repeat over {len(starts)} layers"
    return None
