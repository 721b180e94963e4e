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
    ratio = np.clip(np.where(rated, pct, 0.0) / target, 0.0, 1.0)
    saved = np.where(rated, dur * (1.0 - ratio), 0.0)
    keys = pd.DataFrame(
        {
            "phase": frame["phase"].astype(str).to_numpy(),
            "stage": frame["stage"].astype(str).to_numpy(),
            "dur": dur,
            "rated_dur": np.where(rated, dur, 0.0),
            "saved": saved,
            "rated": rated.astype(np.int64),
            "count": frame["count"].to_numpy(np.int64) if "count" in frame else np.ones(len(frame), np.int64),
            "pct_t": np.where(rated, pct * dur, 0.0),
        }
    )
    g = keys.groupby(["phase", "stage"], sort=True).agg(
        time=("dur", "sum"),
        rated_time=("rated_dur", "sum"),
        saved=("saved", "sum"),
        rated=("rated", "sum"),
        kernels=("count", "sum"),
        pct_t=("pct_t", "sum"),
    )
    rows = []
    for (phase, stage), r in g.iterrows():
        if r["rated"] == 0:
            continue
        rows.append(
            {
                "phase": phase,
                "stage": stage,
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
    not_rated = keys[~rated]
    if len(not_rated):
        unc = frame["uncounted"] if "uncounted" in frame else pd.Series(None, index=frame.index, dtype=object)
        bound = frame["bound"] if "bound" in frame else pd.Series(None, index=frame.index, dtype=object)
        fallback = np.where(bound.astype(object).to_numpy()[~rated] == "invalid", "invalid", "no_gpu")
        why = pd.Series(unc.astype(object).to_numpy()[~rated]).fillna(pd.Series(fallback))
        nr = not_rated.assign(why=why.to_numpy())
        out = []
        for (phase, stage), sub in nr.groupby(["phase", "stage"], sort=True):
            reasons = sub.groupby("why")["dur"].sum().sort_values(ascending=False)
            out.append(
                {
                    "phase": phase,
                    "stage": stage,
                    "time_ns": int(sub["dur"].sum()),
                    "kernels": int(sub["count"].sum()),
                    "reasons": [str(x) for x in reasons.index[:4]],
                }
            )
        out.sort(key=lambda x: (-x["time_ns"], x["phase"], x["stage"]))
        base["uncounted"] = out
    return base
