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

from analyzer.tables.frames import category_codes, floats, grouped_sums

ROOF_TARGET = 0.8  # --set brief.roof_target=


def headroom(frame: pd.DataFrame, gpu: Any, target: float = ROOF_TARGET) -> dict[str, Any]:
    """The ranked saving rows and the kernels without a rate (module contract)."""
    base = {"roof_target": float(target), "rows": [], "uncounted": []}
    if not len(frame) or "pct_of_peak" not in frame:
        return base
    if not gpu or not gpu.get("name"):
        base["unknown"] = (gpu or {}).get("reason") or "no known GPU: no roofs"
    pct = floats(frame["pct_of_peak"])
    dur = frame["dur_ns"].to_numpy()
    count = frame["count"].to_numpy() if "count" in frame else None
    phase, phases = category_codes(frame["phase"])
    stage, stages = category_codes(frame["stage"])
    keys = [(phase, len(phases)), (stage, len(stages))]

    def rated(sl: slice) -> np.ndarray:
        return np.isfinite(pct[sl])

    def saved(sl: slice) -> np.ndarray:
        p = pct[sl]
        share = np.clip(np.where(np.isfinite(p), p, 0.0) / target, 0.0, 1.0)
        return np.where(np.isfinite(p), dur[sl] * (1.0 - share), 0.0)

    # sums per phase x stage from the categoricals' codes, a slice of rows at a time: no per-kernel strings
    g = grouped_sums(
        len(dur),
        keys,
        {
            "time": lambda sl: dur[sl],
            "rated_time": lambda sl: np.where(rated(sl), dur[sl], 0),
            "saved": saved,
            "pct_t": lambda sl: np.where(rated(sl), pct[sl] * dur[sl], 0.0),
            "rated": rated,
        },
    )
    rows = []
    for i, j in zip(*np.nonzero((g["time"] > 0) & (g["rated"] > 0)), strict=True):
        time, rated_time = g["time"][i, j], g["rated_time"][i, j]
        rows.append(
            {
                "phase": str(phases[i]),
                "stage": str(stages[j]),
                "time_ns": int(time),
                "rated_time_ns": int(rated_time),
                "rated_kernels": int(g["rated"][i, j]),
                "pct_of_peak": float(g["pct_t"][i, j] / rated_time) if rated_time else None,
                "saved_ns": int(round(g["saved"][i, j])),
                "saved_share": float(g["saved"][i, j] / time) if time else 0.0,
            }
        )
    rows.sort(key=lambda x: (-x["saved_ns"], x["phase"], x["stage"]))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    base["rows"] = rows
    base["uncounted"] = _uncounted(frame, keys, phases, stages, pct, dur, count)
    return base


def _uncounted(
    frame: pd.DataFrame,
    keys: list[tuple[np.ndarray, int]],
    phases: list[Any],
    stages: list[Any],
    pct: np.ndarray,
    dur: np.ndarray,
    count: np.ndarray | None,
) -> list[dict[str, Any]]:
    """The kernels without a rate per phase x stage: their time, count and reasons (the roofline's
    ``uncounted``; else ``invalid`` for an invalid rate, ``no_gpu`` without roofs)."""
    if "uncounted" in frame:
        why, reasons = category_codes(frame["uncounted"])
    else:
        why, reasons = np.full(len(frame), -1, np.int8), []
    invalid, no_gpu = len(reasons), len(reasons) + 1
    bound_invalid = None
    if "bound" in frame:
        bound, bounds = category_codes(frame["bound"])
        bound_invalid = bounds.index("invalid") if "invalid" in bounds else None

    def reason(sl: slice) -> np.ndarray:
        w = why[sl].astype(np.int64)
        other = np.where(bound[sl] == bound_invalid, invalid, no_gpu) if bound_invalid is not None else no_gpu
        return np.where(w >= 0, w, other)

    names = [*map(str, reasons), "invalid", "no_gpu"]
    g = grouped_sums(
        len(dur),
        [*keys, (reason, len(names))],
        {
            "time": lambda sl: dur[sl],
            "kernels": (lambda sl: count[sl]) if count is not None else None,
            "rows": None,
        },
        mask=lambda sl: ~np.isfinite(pct[sl]),
    )
    out = []
    per = g["time"].sum(axis=2)
    for i, j in zip(*np.nonzero(g["rows"].sum(axis=2) > 0), strict=True):
        t, n = g["time"][i, j], g["rows"][i, j]
        order = sorted((k for k in range(len(names)) if n[k] > 0), key=lambda k: (-t[k], names[k]))
        out.append(
            {
                "phase": str(phases[i]),
                "stage": str(stages[j]),
                "time_ns": int(per[i, j]),
                "kernels": int(g["kernels"][i, j].sum()),
                "reasons": [names[k] for k in order[:4]],
            }
        )
    out.sort(key=lambda x: (-x["time_ns"], x["phase"], x["stage"]))
    return out
