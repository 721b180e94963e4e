"""The steps table: its columns, what a step row says besides its timing, and the row itself.

Contract: :data:`STEP_COLUMNS` are the columns of the steps table every labelling gives (one row per
step, annotated or found by structure); :func:`_step_row` makes one row from a step's kernels
and its :class:`StepLabel`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from analyzer.analyses.phases.evidence import _step_regime
from analyzer.tables import intervals

STEP_COLUMNS = [
    "trace_id",
    "rank",
    "step",
    "phase",
    "start_ns",
    "dur_ns",
    "busy_ns",
    "kernel_ns",
    "kernels",
    "tokens",
    "prefill_tokens",
    "decode_tokens",
    "model",
    "verify_k",
    "source",
    "phase_rule",
    "phase_evidence",
    "m_regime",
]


@dataclasses.dataclass(frozen=True)
class StepLabel:
    """What a step row says besides its timing: phase, token counts, model, verify width."""

    phase: str
    tokens: int | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    model: str = "target"
    verify_k: int | None = None
    rule: str = ""  # the id of the rule (or annotation pattern) that decided the phase
    evidence: tuple[str, ...] = ()  # the ids of the rules whose evidence the decision used


def _step_row(
    tid: int,
    df: Any,
    members: np.ndarray,
    s: int,
    label: StepLabel,
    lo: int,
    hi: int,
    source: str,
) -> dict[str, Any]:
    st = df["start"][members]
    en = st + df["dur"][members]
    return {
        "trace_id": int(tid),
        "rank": int(df["rank"][members[0]]),
        "step": int(s),
        "phase": label.phase,
        "start_ns": int(lo),
        "dur_ns": int(hi - lo),
        "busy_ns": intervals.busy_ns(st, en),
        "kernel_ns": int(df["dur"][members].sum()),
        "kernels": len(members),
        "tokens": label.tokens,
        "prefill_tokens": label.prefill_tokens,
        "decode_tokens": label.decode_tokens,
        "model": label.model,
        "verify_k": label.verify_k,
        "source": source,
        "phase_rule": label.rule,
        "phase_evidence": list(dict.fromkeys(label.evidence)),
        "m_regime": _step_regime(members, df),
    }
