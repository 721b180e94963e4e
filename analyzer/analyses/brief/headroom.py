"""Headroom per phase x stage: the kernel time saved if every kernel reached a target share of its roof.

Contract: pure over the kernels frame. A kernel with a rate (``pct_of_peak``: achieved over the roof
at its intensity, rated kernels only: ``invalid`` ones have none) below the target ``r`` would take
``t x pct / r`` at the target, saving ``t x (1 - pct / r)``; one at or above it saves nothing. Rows
are phase x stage, ranked by the time saved (ties by phase, then stage); the kernels without a rate
(no FLOPs or bytes counted, an ``invalid`` rate, or no known GPU) are listed apart per phase x
stage with their time and the reasons (``uncounted``), never folded into a saving.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

ROOF_TARGET = 0.8  # --set brief.roof_target=


def headroom(frame: pd.DataFrame, gpu: Any, target: float = ROOF_TARGET) -> dict[str, Any]:
    """The ranked saving rows and the kernels without a rate (module contract)."""
    base = {"roof_target": float(target), "rows": [], "uncounted": []}
    if not len(frame) or "pct_of_peak" not in frame:
        return base
    if not gpu or not gpu.get("name"):
        base["unknown"] = (gpu or {}).get("reason") or "no known GPU: no roofs"
    pct = frame["pct_of_peak"].to_numpy(np.float64, na_value=np.nan)
    dur = frame["dur_ns"].to_numpy(np.float64)
    rated = np.isfinite(pct)
    # one group code per kernel (phase x stage from the categoricals' codes): sums by bincount,
    # one array per kernel at a time, no per-kernel strings
    phase_c = pd.Categorical(frame["phase"])
    stage_c = pd.Categorical(frame["stage"])
    ns = max(len(stage_c.categories), 1)
    code = phase_c.codes.astype(np.int64) * ns + stage_c.codes.astype(np.int64)
    code = np.where((phase_c.codes < 0) | (stage_c.codes < 0), -1, code)
    n = len(phase_c.categories) * ns
    ok = code >= 0

    def total(w: np.ndarray) -> np.ndarray:
        return np.bincount(code[ok], weights=w[ok], minlength=n)

    time = total(dur)
    rated_time = total(np.where(rated, dur, 0.0))
    saved = total(np.where(rated, dur * (1.0 - np.clip(np.where(rated, pct, 0.0) / target, 0.0, 1.0)), 0.0))
    pct_t = total(np.where(rated, pct * dur, 0.0))
    rated_n = total(rated.astype(np.float64))
    counts = frame["count"].to_numpy(np.float64) if "count" in frame else np.ones(len(frame))
    kernels = total(counts)
    g = pd.DataFrame(
        {
            "time": time,
            "rated_time": rated_time,
            "saved": saved,
            "rated": rated_n,
            "kernels": kernels,
            "pct_t": pct_t,
        },
        index=pd.MultiIndex.from_product([list(phase_c.categories), list(stage_c.categories)]),
    )
    g = g[g["time"] > 0]
    rows = []
    for (phase, stage), r in g.iterrows():
        if r["rated"] == 0:
            continue
        rows.append(
            {
                "phase": str(phase),
                "stage": str(stage),
                "time_ns": int(r["time"]),
                "rated_time_ns": int(r["rated_time"]),
                "rated_kernels": int(r["rated"]),
                "pct_of_peak": float(r["pct_t"] / r["rated_time"]) if r["rated_time"] else None,
                "saved_ns": int(round(r["saved"])),
                "saved_share": float(r["saved"] / r["time"]) if r["time"] else 0.0,
            }
        )
    rows.sort(key=lambda x: (-x["saved_ns"], x["phase"], x["stage"]))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    base["rows"] = rows
    if (~rated).any():
        idx = np.flatnonzero(~rated & ok)
        unc = frame["uncounted"].to_numpy(object)[idx] if "uncounted" in frame else np.full(len(idx), None)
        bound = frame["bound"].to_numpy(object)[idx] if "bound" in frame else np.full(len(idx), None)
        why = np.where(pd.isna(unc), np.where(bound == "invalid", "invalid", "no_gpu"), unc)
        nr = pd.DataFrame({"code": code[idx], "dur": dur[idx], "count": counts[idx], "why": why})
        out = []
        phases, stages = list(phase_c.categories), list(stage_c.categories)
        for c, sub in nr.groupby("code", sort=True):
            reasons = sub.groupby("why")["dur"].sum().sort_values(ascending=False)
            out.append(
                {
                    "phase": str(phases[int(c) // ns]),
                    "stage": str(stages[int(c) % ns]),
                    "time_ns": int(sub["dur"].sum()),
                    "kernels": int(sub["count"].sum()),
                    "reasons": [str(x) for x in reasons.index[:4]],
                }
            )
        out.sort(key=lambda x: (-x["time_ns"], x["phase"], x["stage"]))
        base["uncounted"] = out
    return base
