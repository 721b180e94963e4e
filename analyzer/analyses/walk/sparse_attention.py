"""Rules that assume a sparse attention: an indexer scores the cached keys, a top-k picks the ones each
query attends, and the attention kernel reads only those (DeepSeek-V3.2's DSA, GLM-5's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.analyses.walk.positions import _next_where
from analyzer.analyses.walk.registry import _ID, GENERIC, SAMPLING_LIKE

ATTENTION_INDEX_TOPK = _ID("attention-index-topk")


def _demote_attention_index_topk(
    rows: list[int],
    stage: Any,
    topk: np.ndarray,
    attention: np.ndarray,
    blocker: np.ndarray,
    why: Any,
) -> list[int]:
    """A top-k (``topk``, per position: a top-k candidate the names call sampling) whose next anchor
    is an attention kernel, with no GEMM, norm or embedding kernel between (``blocker``), picks the
    keys of a sparse attention: it, the generic work on the scores before it back to the indexer's
    last GEMM (the causal mask) and the generic work from it to the attention (the mask built from
    the picked indices: scatter, bitwise ops, masked fill) are the attention module's own
    ``elementwise`` work, not a sampler's and not the region's default (the LM head's top-k is
    followed by the next forward's lookup or projections, a router's by the expert GEMMs). Returns
    the positions it relabelled."""
    at = np.flatnonzero(topk)
    if not len(at) or not attention.any():
        return []
    after = at + 1
    nxt = _next_where(attention, after)
    to_attention = nxt < _next_where(blocker, after)
    done: list[int] = []
    last = -1
    for q, a in zip(at[to_attention].tolist(), nxt[to_attention].tolist(), strict=True):
        b = q  # back to the indexer's last GEMM: the scores' mask and scale before the top-k
        while b - 1 > last and not blocker[b - 1]:
            b -= 1
        for i in range(max(b, last + 1), a):
            if i == q or stage[rows[i]] in GENERIC or stage[rows[i]] in SAMPLING_LIKE:
                stage[rows[i]] = "elementwise"
                why[rows[i]] = ATTENTION_INDEX_TOPK
                done.append(i)
        last = a - 1
    return done
