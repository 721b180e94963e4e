"""Kernel time per phase x layer role: what ``--compare`` matches across runs of one model on two GPUs.

Contract: pure over the kernels frame, deterministic (no model or agent in the loop: the roles are
the classification's stages and the layer walk's layers). A kernel's *role* is the part of a
decoder layer it plays, named so that two GPUs' libraries meet in one row:

* a GEMM, its stage (the GEMM role: ``qkv_gemm``, ``o_gemm``, ``gate_up_gemm``, ``down_gemm``,
  ``lm_head_gemm``, the MoE GEMMs);
* ``attention``, every kernel of the attention itself or its split-KV combine (flash, paged, MLA,
  ``attention_reduce``): one backend splits what another runs in one kernel;
* a norm inside a layer, its position: ``norm before attention`` or ``norm after attention``, by
  the first attention kernel of its layer instance (trace, rank, step, layer); ``norm in a layer
  without attention`` where that instance ran none; ``norm outside layers`` (e.g. the final norm);
* anything else, its stage.

Per (phase, role): the kernel time, the kernels, the stages that played it, and the share of its
roof (time-weighted ``pct_of_peak`` over the kernels with a rate) with the time those rest on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES, ATTENTION_STAGES
from analyzer.tables.frames import category_codes, floats, grouped_sums

ATTENTION = "attention"
ROLE_STAGES = tuple(s for s in ATTENTION_STAGES if s != "linear_attention")  # a mixer of its own
NORM_ROLES = (
    "norm before attention",
    "norm after attention",
    "norm in a layer without attention",
    "norm outside layers",
)


def layer_roles(frame: pd.DataFrame) -> dict[str, Any]:
    """The rows (module contract) as an item: its value, or why the trace cannot tell."""
    if not len(frame) or "layer" not in frame:
        return {"value": None, "unknown": "no kernels, or no layer walk"}
    layer = floats(frame["layer"])
    if not (layer >= 0).any():
        return {"value": None, "unknown": "the layer walk numbered no layers (roles are a layer's parts)"}
    stage, stages = category_codes(frame["stage"])
    phase, phases = category_codes(frame["phase"])
    names = [str(s) for s in stages]
    roles = sorted({ATTENTION if s in ROLE_STAGES else s for s in names if s != "norm"} | set(NORM_ROLES))
    index = {r: i for i, r in enumerate(roles)}
    of_stage = np.array(
        [index[ATTENTION if s in ROLE_STAGES else s] if s != "norm" else -1 for s in names] + [-1]
    )
    norm_rows, norm_roles = _norm_positions(frame, stage, names, layer, index)
    pct = floats(frame["pct_of_peak"]) if "pct_of_peak" in frame else np.full(len(frame), np.nan)
    dur = frame["dur_ns"].to_numpy()
    count = frame["count"].to_numpy() if "count" in frame else None

    def role(sl: slice) -> np.ndarray:
        out = of_stage[stage[sl]]
        lo, hi = np.searchsorted(norm_rows, [sl.start, sl.stop])
        out[norm_rows[lo:hi] - sl.start] = norm_roles[lo:hi]
        return out

    def rated(sl: slice) -> np.ndarray:
        return np.isfinite(pct[sl])

    keys = [(phase, len(phases)), (role, len(roles))]
    g = grouped_sums(
        len(dur),
        keys,
        {
            "time": lambda sl: dur[sl],
            "kernels": (lambda sl: count[sl]) if count is not None else None,
            "rated_time": lambda sl: np.where(rated(sl), dur[sl], 0),
            "pct_t": lambda sl: np.where(rated(sl), pct[sl] * dur[sl], 0.0),
        },
    )
    played = grouped_sums(len(dur), [*keys, (stage, len(stages))], {"n": None})["n"]
    rows = []
    for i, j in zip(*np.nonzero(g["kernels"] > 0), strict=True):
        rt = g["rated_time"][i, j]
        rows.append(
            {
                "phase": str(phases[i]),
                "role": roles[j],
                "stages": [names[k] for k in np.flatnonzero(played[i, j] > 0)],
                "time_ns": int(g["time"][i, j]),
                "kernels": int(g["kernels"][i, j]),
                "rated_time_ns": int(rt),
                "pct_of_peak": float(g["pct_t"][i, j] / rt) if rt else None,
            }
        )
    rows.sort(key=lambda r: (r["phase"], -r["time_ns"], r["role"]))
    return {
        "value": {"rows": rows},
        "evidence": "the kernels' stages and the layer walk's layers; a norm's position by the first "
        "attention kernel of its layer instance; roof shares from the roofline's pct_of_peak",
    }


def _norm_positions(
    frame: pd.DataFrame, stage: np.ndarray, names: list[str], layer: np.ndarray, index: dict[str, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the norm kernels (sorted) and each one's role code: before or after the first
    attention kernel of its layer instance, in a layer without one, or outside layers."""
    norm = names.index("norm") if "norm" in names else None
    if norm is None:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    att_codes = [k for k, s in enumerate(names) if s in ATTENTION_KERNEL_STAGES]
    rows = np.flatnonzero(stage == norm)
    att = np.flatnonzero(np.isin(stage, att_codes) & (layer >= 0)) if att_codes else np.empty(0, np.int64)
    roles = np.full(len(rows), index["norm outside layers"], np.int64)
    inside = layer[rows] >= 0
    if not inside.any():
        return rows, roles
    start = frame["start_ns"].to_numpy()
    cols = [frame[c].to_numpy() for c in ("trace_id", "rank", "step")]
    n_rows = rows[inside]
    both = np.concatenate([n_rows, att])
    # one int64 per layer instance (trace, rank, step, layer) of these rows only: a 1-D unique
    key = np.zeros(len(both), np.int64)
    for col in (*cols, layer):
        part = col[both].astype(np.int64)
        part -= part.min(initial=0)
        key = key * (int(part.max(initial=0)) + 1) + part
    inv = np.unique(key, return_inverse=True)[1].ravel()
    n_keys = int(inv.max(initial=-1)) + 1
    first = np.full(n_keys, np.iinfo(np.int64).max)
    np.minimum.at(first, inv[len(n_rows) :], start[att])
    mine = first[inv[: len(n_rows)]]
    code = np.where(
        mine == np.iinfo(np.int64).max,
        index["norm in a layer without attention"],
        np.where(start[n_rows] < mine, index["norm before attention"], index["norm after attention"]),
    )
    roles[inside] = code
    return rows, roles
