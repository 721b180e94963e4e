"""The gate's baseline object: per-step times of one analysed run, versioned and JSON-ready.

Contract: :func:`build_baseline` is a pure function of an :class:`Analysis` (no I/O). Every time is
normalised PER STEP: for each phase, each of the run's steps (one sample per rank and step) gets
the summed kernel time of a phase, stage or kernel group in it (zero where it did not run), and
the baseline keeps the median (``p50_ns``) and mean (``mean_ns``) over those samples, how many
samples it ran in (``present``), its launches per step and, where the steps' token counts are
known, the median time per token. The median makes one slow step (a clock hiccup, a late launch)
irrelevant; the mean covers work that runs in fewer than half of the steps.

Kernel groups (``group_key``, rules/README.md) are kept for the top ones that cover ``top_share`` of
each phase's kernel time; the rest are kept as short hashes with their mean, so the gate can tell
"new" from "grew out of the tail". Kernels outside every step (phase ``unknown``) and summary-only
rows have no per-step time: they are recorded as totals, never gated.

``comparability`` holds what must match before two runs can be compared: the GPU, the model
shape seen in the trace (layers = highest layer index + 1, the set of GEMM roles; hidden sizes
are unknown unless ``--model`` named them), the ranks, and per phase the steps, tokens per step
and batch (decode: one new token per sequence, so batch = tokens per step; other phases unknown).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pandas as pd

from analyzer.errors import InputError
from analyzer.knowledge.taxonomy import PHASES, ROLE_GEMM_STAGES
from analyzer.pipeline import Analysis
from analyzer.version import __version__

FORMAT_VERSION = 1
KIND = "llm-kernel-map/baseline"
TOP_SHARE = 0.95
# GEMM stages that name a role of the model (the generic ``gemm`` names none, so it says nothing
# about the model's shape and may come and go with framework code): the gate compares these
GEMM_ROLES = ROLE_GEMM_STAGES
_SAMPLE = ["trace_id", "rank", "step"]


def group_hash(stage: str, group_key: str) -> str:
    """A short stable id for a (stage, kernel group) kept only in a baseline's tail."""
    return hashlib.sha256(f"{stage}\t{group_key}".encode()).hexdigest()[:12]


def check_baseline(obj: Any, source: str) -> dict[str, Any]:
    """``obj`` if it is a baseline this version reads; InputError (one line) otherwise."""
    if not isinstance(obj, dict) or obj.get("kind") != KIND:
        hint = ""
        if isinstance(obj, dict) and "totals" in obj and "phases" in obj:
            hint = " (it is an `analyze --json` summary)"
        raise InputError(
            f"{source}: not a llm-kernel-map baseline{hint}; write one with `llm-kernel-map baseline`"
        )
    version = obj.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise InputError(
            f"{source}: baseline format_version {version!r} is newer than this tool reads "
            f"({FORMAT_VERSION}); upgrade llm-kernel-map or regenerate the baseline"
        )
    for key in ("comparability", "phases", "stages", "groups"):
        if key not in obj:
            raise InputError(
                f"{source}: baseline lacks {key!r}; regenerate it with `llm-kernel-map baseline`"
            )
    return obj


def build_baseline(analysis: Analysis, top_share: float = TOP_SHARE) -> dict[str, Any]:
    """The baseline object of an analysed run (see the module docstring for its contract)."""
    from analyzer.results.summary import kernels_frame

    if not 0 < top_share <= 1:
        raise ValueError(f"top_share must be in (0, 1], got {top_share}")
    df = kernels_frame(analysis)
    steps = analysis.steps if analysis.steps is not None else pd.DataFrame(columns=[*_SAMPLE, "phase"])
    timed = df[~df["aggregate"].astype(bool)] if "aggregate" in df else df
    in_steps = timed[timed["step"] >= 0]
    phases: dict[str, Any] = {}
    stages: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    tails: dict[str, Any] = {}
    for phase in PHASES:
        st = steps[steps["phase"] == phase]
        if not len(st):
            continue
        sub = in_steps[in_steps["phase"] == phase]
        samples = pd.MultiIndex.from_frame(st[_SAMPLE].astype(np.int64)).unique()
        tokens = _tokens_per_step(st)
        phases[phase] = _phase_entry(st, sub, samples, tokens)
        stages.extend(_rows(sub, samples, tokens, ["stage"], phase))
        g_rows = _rows(sub, samples, tokens, ["group_key", "stage", "provider"], phase)
        top, tail = _split_top(g_rows, top_share)
        groups.extend(top)
        if tail:
            tails[phase] = {
                "groups": len(tail),
                "mean_ns": int(sum(r["mean_ns"] for r in tail)),
                "keys": {group_hash(r["stage"], r["group_key"]): r["mean_ns"] for r in tail},
            }
    unstepped = timed[timed["step"] < 0]
    return {
        "format_version": FORMAT_VERSION,
        "kind": KIND,
        "tool_version": __version__,
        "inputs": [
            {
                "path": m.path,
                "sha256": m.sha256,
                "format": m.format,
                "gpu_name": m.gpu_name,
                "arch": m.arch,
                "rank": m.rank,
                "world_size": m.world_size,
            }
            for m in analysis.trace.inputs
        ],
        "rules_sha256": analysis.rules_sha256,
        "settings": {"top_share": top_share},
        "comparability": comparability(analysis, df, phases),
        "phases": phases,
        "stages": stages,
        "groups": groups,
        "tail_groups": tails,
        "not_in_steps": {
            "kernel_ns": int(unstepped["dur_ns"].sum()),
            "kernels": int(unstepped["count"].sum()),
            "aggregate_ns": int(df.loc[df["aggregate"].astype(bool), "dur_ns"].sum())
            if "aggregate" in df
            else 0,
        },
    }


def comparability(analysis: Analysis, df: pd.DataFrame, phases: dict[str, Any]) -> dict[str, Any]:
    """What two runs must share before their per-step times can be compared."""
    gpu = analysis.gpu or {}
    first = analysis.trace.inputs[0]
    layer = df["layer"].dropna() if "layer" in df else pd.Series(dtype=float)
    model = analysis.model
    roles = sorted(set(df["stage"].astype(str)) & set(GEMM_ROLES))
    return {
        "gpu": {
            "name": gpu.get("name"),
            "key": gpu.get("key"),
            "arch": gpu.get("arch") or first.arch,
            "device_name": first.gpu_name,
        },
        "model": {
            "name": getattr(model, "name", None),
            "layers_seen": int(layer.max()) + 1 if len(layer) else None,
            "hidden_size": getattr(model, "hidden_size", None),
            "gemm_roles": roles,
        },
        "ranks": sorted({int(m.rank) for m in analysis.trace.inputs}),
        "world_size": max(int(m.world_size) for m in analysis.trace.inputs),
        "phases": {
            p: {"steps": e["steps"], "tokens_per_step": e["tokens_per_step"], "batch": e["batch"]}
            for p, e in phases.items()
        },
    }


def _tokens_per_step(st: pd.DataFrame) -> float | None:
    tok = st["tokens"].dropna() if "tokens" in st else pd.Series(dtype=float)
    return float(np.median(tok.to_numpy(np.float64))) if len(tok) else None


def _pct(a: np.ndarray, q: float) -> int:
    return int(round(float(np.percentile(a, q)))) if len(a) else 0


def _per_token(ns: float, tokens: float | None) -> float | None:
    return round(ns / tokens, 1) if tokens else None


def _phase_entry(
    st: pd.DataFrame, sub: pd.DataFrame, samples: pd.MultiIndex, tokens: float | None
) -> dict[str, Any]:
    wall = st["dur_ns"].to_numpy(np.float64)
    per = _per_sample(sub, samples)
    per_rank = st.groupby(["trace_id", "rank"]).size()
    return {
        "steps": int(per_rank.min()),
        "samples": len(samples),
        "tokens_per_step": None if tokens is None else int(round(tokens)),
        "batch": None if tokens is None or st["phase"].iloc[0] != "decode" else int(round(tokens)),
        "step_ns": {
            "p50": _pct(wall, 50),
            "p90": _pct(wall, 90),
            "p99": _pct(wall, 99),
            "mean": int(round(wall.mean())),
        },
        "kernel_ns": {
            "p50": _pct(per, 50),
            "p90": _pct(per, 90),
            "p99": _pct(per, 99),
            "mean": int(round(per.mean())) if len(per) else 0,
        },
        "per_token_ns": _per_token(float(np.median(per)), tokens) if len(per) else None,
        "kernels_per_step": round(float(sub["count"].sum()) / max(len(samples), 1), 2),
    }


def _per_sample(sub: pd.DataFrame, samples: pd.MultiIndex) -> np.ndarray:
    """Summed duration per step sample (zero where nothing ran), in sample order."""
    s = sub.groupby(_SAMPLE, sort=False)["dur_ns"].sum()
    return s.reindex(samples, fill_value=0).to_numpy(np.float64)


def _rows(
    sub: pd.DataFrame, samples: pd.MultiIndex, tokens: float | None, keys: list[str], phase: str
) -> list[dict[str, Any]]:
    """One row per value of ``keys`` in this phase: per-step p50/mean, presence and launches."""
    if sub.empty:
        return []
    n = len(samples)
    per = sub.groupby([*keys, *_SAMPLE], sort=False, observed=True)["dur_ns"].sum()
    counts = sub.groupby(keys, sort=False, observed=True)["count"].sum()
    category = sub.groupby(keys, sort=False, observed=True)["category"].first() if "category" in sub else None
    rows = []
    for key, s in per.groupby(level=list(range(len(keys))), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        vals = s.droplevel(list(range(len(keys)))).reindex(samples, fill_value=0).to_numpy(np.float64)
        p50 = float(np.median(vals))
        row: dict[str, Any] = {"phase": phase, **dict(zip(keys, key, strict=True))}
        if keys == ["stage"] and category is not None:
            row["category"] = str(category.loc[key if len(key) > 1 else key[0]])
        row.update(
            {
                "p50_ns": int(round(p50)),
                "mean_ns": int(round(vals.sum() / n)),
                "present": int((vals > 0).sum()),
                "count_per_step": round(float(counts.loc[key if len(key) > 1 else key[0]]) / n, 2),
                "per_token_ns": _per_token(p50, tokens),
            }
        )
        rows.append(row)
    rows.sort(key=lambda r: (-r["mean_ns"], *(str(r[k]) for k in keys)))
    return rows


def _split_top(
    rows: list[dict[str, Any]], top_share: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows (sorted by mean, largest first) covering ``top_share`` of the total, and the rest."""
    total = sum(r["mean_ns"] for r in rows)
    acc = 0
    for i, r in enumerate(rows):
        if total and acc >= top_share * total:
            return rows[:i], rows[i:]
        acc += r["mean_ns"]
    return rows, []
