"""Continuous-batching interference: kernel time per token in mixed steps against pure steps, per stage.

Contract: pure over the kernels frame and the target model's steps (a draft model's steps are not
the engine's batches). A mixed step's kernels serve its prefill and its decode tokens at once, and
the trace cannot split one kernel between them, so the *whole* step is counted against each kind of
token in turn: per decode token, what each decode token's step costs when a prefill chunk rides
along; per prefill token, what each prefill token costs in a chunk that carries decode tokens. They
stand against the pure decode steps' kernel time per decode token and the pure prefill steps' per
prefill token. Each number is a sum of kernel time over the steps of a kind divided by the sum of
their tokens, in total and per stage, with the mixed / pure ratio and the step and token counts it
rests on. A step whose needed token count is unknown is left out and counted. ``unknown``, with the
reason, where the run has no mixed steps, no pure steps of the phase, or no token counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from analyzer.tables.frames import category_codes, grouped_sums

PURE_PREFILL, PURE_DECODE, MIXED = 0, 1, 2
# (kind of token, its pure phase, the steps table's column of its count)
_SIDES = (("decode", PURE_DECODE, "decode_tokens"), ("prefill", PURE_PREFILL, "prefill_tokens"))


def interference(
    frame: pd.DataFrame, target: pd.DataFrame, evidence: Callable[[pd.DataFrame], str]
) -> dict[str, Any]:
    """``decode`` and ``prefill``: each an item (module contract); ``evidence`` names what a set of
    steps' token counts rest on."""
    if not len(target) or "phase" not in target:
        both = {"value": None, "unknown": "no steps"}
        return {"decode": dict(both), "prefill": dict(both)}
    phase = target["phase"].astype(str).to_numpy()
    pre = pd.to_numeric(target.get("prefill_tokens"), errors="coerce").to_numpy(np.float64)
    dec = pd.to_numeric(target.get("decode_tokens"), errors="coerce").to_numpy(np.float64)
    kind = np.full(len(target), -1, np.int64)
    kind[phase == "prefill"] = PURE_PREFILL
    kind[phase == "decode"] = PURE_DECODE
    kind[phase == "mixed"] = MIXED
    tokens = {"prefill_tokens": pre, "decode_tokens": dec}
    time = _time_per_kind_and_stage(frame, target, kind)
    stages = time[1]
    out = {}
    for side, pure, column in _SIDES:
        out[side] = _side(side, pure, column, kind, tokens, time[0], stages, target, evidence)
    return out


def _side(
    side: str,
    pure: int,
    column: str,
    kind: np.ndarray,
    tokens: dict[str, np.ndarray],
    time: np.ndarray,
    stages: list[Any],
    target: pd.DataFrame,
    evidence: Callable[[pd.DataFrame], str],
) -> dict[str, Any]:
    count = tokens[column]
    mixed_steps, pure_steps = kind == MIXED, kind == pure
    if not mixed_steps.any():
        return _unknown(
            f"no mixed steps: no step batched prefill and decode tokens together "
            f"({int((kind == PURE_PREFILL).sum())} prefill, {int((kind == PURE_DECODE).sum())} decode steps)"
        )
    if not pure_steps.any():
        return _unknown(f"no pure {side} steps to set the {int(mixed_steps.sum())} mixed steps against")
    # a mixed step is counted only where both its counts are known (its kernels serve both kinds)
    mixed_ok = mixed_steps & np.isfinite(tokens["prefill_tokens"]) & np.isfinite(tokens["decode_tokens"])
    mixed_ok &= count > 0
    pure_ok = pure_steps & np.isfinite(count) & (count > 0)
    for ok, steps, what in ((mixed_ok, mixed_steps, "mixed"), (pure_ok, pure_steps, f"pure {side}")):
        if not ok.any():
            return _unknown(f"the {int(steps.sum())} {what} steps carry no {side} token counts")
    # per step row: the kernel time of each stage (time: [step row, stage])
    mixed_t, pure_t = time[mixed_ok].sum(axis=0), time[pure_ok].sum(axis=0)
    mixed_n, pure_n = float(count[mixed_ok].sum()), float(count[pure_ok].sum())

    def row(m: float, p: float) -> dict[str, Any]:
        a, b = m / mixed_n, p / pure_n
        return {"mixed_ns_per_token": a, "pure_ns_per_token": b, "ratio": a / b if b else None}

    order = sorted(
        (j for j in range(len(stages)) if mixed_t[j] or pure_t[j]),
        key=lambda j: (-mixed_t[j], -pure_t[j], str(stages[j])),
    )
    value = {
        "mixed_steps": int(mixed_ok.sum()),
        "pure_steps": int(pure_ok.sum()),
        "mixed_tokens": int(mixed_n),
        "pure_tokens": int(pure_n),
        "steps_without_tokens": int((mixed_steps & ~mixed_ok).sum() + (pure_steps & ~pure_ok).sum()),
        "total": row(float(mixed_t.sum()), float(pure_t.sum())),
        "stages": [{"stage": str(stages[j]), **row(float(mixed_t[j]), float(pure_t[j]))} for j in order],
    }
    why = (
        f"kernel time of the {value['mixed_steps']} mixed steps (each whole: its kernels serve its prefill "
        f"and decode tokens at once) over their {value['mixed_tokens']:,} {side} tokens, against the "
        f"{value['pure_steps']} pure {side} steps' over their {value['pure_tokens']:,}; token counts: "
        f"{evidence(target[mixed_ok | pure_ok])}"
    )
    return {"value": value, "evidence": why}


def _unknown(reason: str) -> dict[str, Any]:
    return {"value": None, "unknown": reason}


def _time_per_kind_and_stage(
    frame: pd.DataFrame, target: pd.DataFrame, kind: np.ndarray
) -> tuple[np.ndarray, list[Any]]:
    """Kernel time per step row of ``target`` (rows of kinds other than -1) and stage: the kernels'
    (trace, rank, step) looked up in a dense table of the step rows, a slice of kernels at a time."""
    stage, stages = category_codes(frame["stage"]) if len(frame) else (np.empty(0, np.int8), [])
    if not len(frame) or not (kind >= 0).any():
        return np.zeros((len(target), max(len(stages), 1))), stages
    trace, rank, step = (frame[c].to_numpy() for c in ("trace_id", "rank", "step"))
    t_id, r_id, s_id = (target[c].to_numpy(np.int64) for c in ("trace_id", "rank", "step"))
    n_t = int(max(trace.max(), t_id.max())) + 1
    n_r = int(max(rank.max(), r_id.max())) + 1
    n_s = int(max(step.max(), s_id.max())) + 1
    row_of = np.full(n_t * n_r * n_s, -1, np.int64)
    keep = (kind >= 0) & (t_id >= 0) & (r_id >= 0) & (s_id >= 0)
    row_of[((t_id * n_r + r_id) * n_s + s_id)[keep]] = np.flatnonzero(keep)
    dur = frame["dur_ns"].to_numpy()

    def step_row(sl: slice) -> np.ndarray:
        t, r, s = trace[sl].astype(np.int64), rank[sl].astype(np.int64), step[sl].astype(np.int64)
        inside = (t >= 0) & (r >= 0) & (s >= 0)
        return np.where(inside, row_of[np.where(inside, (t * n_r + r) * n_s + s, 0)], -1)

    got = grouped_sums(len(dur), [(step_row, len(target)), (stage, len(stages))], {"t": lambda sl: dur[sl]})
    return got["t"], stages
