"""The versioned result object (README.md 'Commands'): a JSON-ready dict built from an :class:`Analysis`.

Contract: pure function of the analysed tables; all times in integer ns, shares as fractions 0..1;
keys of the README.md 'Commands' skeleton are always present (empty when a capability has nothing to say).
Every number here is recomputable from the kernels table: tests do exactly that. Kernels measured
faster than a peak (bound ``invalid``) are counted and explained in every rate row, never rated; a
multi-rank run counts a step (one step index across the ranks) once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.analyses.classify import classification_shares
from analyzer.analyses.ranks import rank_summary
from analyzer.analyses.roofline import CAUSAL_CONVENTION, FLOPS_SOURCES
from analyzer.knowledge.kernel_rules import BARRIER_RULE_ID
from analyzer.knowledge.taxonomy import PHASES
from analyzer.pipeline import Analysis
from analyzer.results.summary_rates import RATE_COLUMNS, dominant_bound
from analyzer.results.summary_rows import (
    TOP_KERNELS,
    group_rows,
    provider_rows,
    stage_rows,
    tile_text,
    top_kernels,
)
from analyzer.tables import intervals
from analyzer.tables.frames import category_codes, groups, only_columns

FORMAT_VERSION = 2


def kernels_frame(analysis: Analysis) -> pd.DataFrame:
    """The analysed kernels as pandas: :attr:`Analysis.frame` (built once per kernels table)."""
    return analysis.frame


def build_summary(analysis: Analysis, top: int = TOP_KERNELS) -> dict[str, Any]:
    """The summary of ``analysis``; ``top_kernels`` holds the ``top`` largest kernel groups, never
    fewer than :data:`TOP_KERNELS` (what the JSON contract promises readers)."""
    df = kernels_frame(analysis)
    total = int(df["dur_ns"].sum())
    summary = {
        "format_version": FORMAT_VERSION,
        "inputs": [
            {
                "trace_id": m.trace_id,
                "path": m.path,
                "sha256": m.sha256,
                "format": m.format,
                "reader_version": m.reader_version,
                "rank": m.rank,
                "world_size": m.world_size,
                "gpu_name": m.gpu_name,
                "arch": m.arch,
            }
            for m in analysis.trace.inputs
        ],
        "rules_sha256": analysis.rules_sha256,
        "gpu": analysis.gpu or {"name": None, "arch": None, "peaks": {}},
        "model": getattr(analysis.model, "name", None),
        "annotations": analysis.annotations_found,
        "totals": totals(df),
        "phases": {
            p: phase_summary(only_columns(df, "phase", "category", "dur_ns", "bound"), analysis, p)
            for p in PHASES
            if (df["phase"] == p).any()
        },
        "stages": stage_rows(
            only_columns(df, "phase", "stage", "provider", "category", "count", *RATE_COLUMNS),
            total,
            analysis.gpu,
        ),
        "providers": provider_rows(only_columns(df, "provider", "count", *RATE_COLUMNS), total),
        "groups": group_rows(df, analysis.gpu),
        "top_kernels": top_kernels(
            only_columns(
                df,
                *("group_key", "norm_name", "stage", "provider", "rule_id", "stage_rule", "phase", "count"),
                *("tile_m", "tile_n", "tile_k", "split_k"),
                *RATE_COLUMNS,
            ),
            total,
            n=max(top, TOP_KERNELS),
            gpu=analysis.gpu,
        ),
        "unclassified": unclassified(df, total),
        "work": work_basis(analysis, total),
        "barrier_packets": barrier_packets(df, total),
        "classification": {
            **classification_shares(df["stage_source"], df["dur_ns"]),
            "by_rule": rule_times(df),
            "layer_rules": dict(sorted(analysis.layer_rules.items())),
            "rule_groups": dict(analysis.rule_groups),
        },
        "steps": step_rows(analysis),
        "findings": analysis.findings,
        "warnings": analysis.warnings,
        "ranks": rank_summary(df),
        "brief": analysis.brief,
    }
    _decoded_tiles(summary["top_kernels"], analysis.kernels)
    return summary


def _decoded_tiles(rows: list[dict[str, Any]], kernels: Any) -> None:
    """Give each top-kernel row its whole decoded tile. The pandas frame leaves ``tile_k`` out (a
    column per kernel that nothing else reads), which printed ``64x8x?`` where the name says
    ``64x8x64``; a group's kernels share one tile (it is part of the ``group_key``), so the first
    kernel of each top group is read from the kernels table."""
    if not rows or "tile_k" not in kernels.column_names or "group_key" not in kernels.column_names:
        return
    from analyzer.tables.dictionaries import dict_strings

    gk = dict_strings(kernels["group_key"])
    values = gk.dictionary.to_pylist()
    code_of = {v: i for i, v in enumerate(values)}
    codes = gk.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    tiles = kernels.select(["tile_m", "tile_n", "tile_k"])
    for r in rows:
        c = code_of.get(r["group_key"])
        if c is None:
            continue
        at = np.flatnonzero(codes == c)[:1]  # the group's first kernel: its kernels share one tile
        if len(at):
            r["tile"] = tile_text(pd.Series(tiles.take(pa.array(at)).to_pylist()[0]))


def _timed(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with a timeline (no copy when every row has one)."""
    if "aggregate" not in df or not df["aggregate"].any():
        return df
    return df[~df["aggregate"]]


def totals(df: pd.DataFrame) -> dict[str, Any]:
    """Wall (the longest span of one device's activity), busy (union of each device's activity,
    summed over devices) and idle = 1 - busy / (devices x wall): the share of the GPUs' time over
    the run's wall that no kernel used, so a late rank counts as idle.

    A device is one physical GPU: a rank's device, whichever of the rank's inputs (the per-stage
    files of one profile) recorded its work."""
    timed = _timed(df)
    wall = busy = 0
    devices = 0
    for _, g in groups(only_columns(timed, "rank", "device", "start_ns", "dur_ns"), ["rank", "device"]):
        devices += 1
        s = g["start_ns"].to_numpy(np.int64)
        e = s + g["dur_ns"].to_numpy(np.int64)
        wall = max(wall, intervals.span_ns(s, e))
        busy += intervals.busy_ns(s, e)
    return {
        "wall_ns": int(wall),
        "kernel_ns": int(df["dur_ns"].sum()),
        "busy_ns": int(busy),
        "idle_fraction": float(1 - busy / (devices * wall)) if devices and wall else 0.0,
        "kernels": int(df["count"].sum()),
        "devices": devices,
        "aggregate_rows": int(df["aggregate"].sum()) if "aggregate" in df else 0,
    }


def _pct(values: pd.Series | np.ndarray, q: float) -> int:
    return int(np.percentile(np.asarray(values, np.float64), q)) if len(values) else 0


def phase_summary(df: pd.DataFrame, analysis: Analysis, phase: str) -> dict[str, Any]:
    from analyzer.knowledge.kernel_rules import category_labels

    of_phase = (df["phase"] == phase).to_numpy()
    kernel_ns = int(df["dur_ns"].to_numpy().sum(where=of_phase))
    steps = analysis.steps
    st = steps[steps["phase"] == phase] if steps is not None and len(steps) else None
    run = run_steps(st) if st is not None else None
    step_ns = run["dur_ns"].to_numpy() if run is not None else np.empty(0)
    tokens = None
    if run is not None and len(run) and run["tokens"].notna().any():
        tokens = int(run["tokens"].fillna(0).sum())
    idle = None
    if st is not None and len(st):
        span = int(st["dur_ns"].sum())
        busy = int(st["busy_ns"].sum())
        idle = float(1 - busy / span) if span else 0.0
    labels = category_labels()
    prof = []
    for cat, g in _by_category(df, of_phase):
        t = int(g["dur_ns"].sum())
        prof.append(
            {
                "category": cat,
                "label": labels.get(cat, cat),
                "time_ns": t,
                "share": t / kernel_ns if kernel_ns else 0.0,
                "bound": dominant_bound(g),
            }
        )
    prof.sort(key=lambda r: (-r["time_ns"], r["category"]))
    return {
        "steps": int(len(step_ns)),
        "kernel_ns": kernel_ns,
        "step_ns": {
            "p50": _pct(step_ns, 50),
            "p90": _pct(step_ns, 90),
            "p99": _pct(step_ns, 99),
            "mean": int(step_ns.mean()) if len(step_ns) else 0,
            "total": int(step_ns.sum()) if len(step_ns) else 0,
        },
        "tokens": tokens,
        "idle_fraction": idle,
        "profile": prof,
    }


def _by_category(df: pd.DataFrame, rows: np.ndarray) -> Iterator[tuple[Any, pd.DataFrame]]:
    """``(category, its rows' time and bound)`` for the ``rows`` of ``df`` (a mask), one category's
    rows copied at a time: a filter of the phase's rows and a group-by over them copied them twice."""
    codes, cats = category_codes(df["category"])
    narrow = only_columns(df, "dur_ns", "bound")
    for c in pd.unique(codes[rows]).tolist():
        if c >= 0:
            yield cats[c], narrow.iloc[np.flatnonzero(rows & (codes == c))]


def run_steps(st: pd.DataFrame) -> pd.DataFrame:
    """The steps of the run: the rows of one step index on different ranks are one step, its time
    the wall span across those ranks and its tokens counted once (TP ranks share the batch: the
    largest count). Two rows of one rank with one index (two inputs of one rank) stay apart."""
    if not len(st) or "rank" not in st or st["rank"].nunique() < 2:
        return st[["dur_ns", "tokens"]]
    st = st.sort_values("start_ns", kind="stable")
    nth = st.groupby(["rank", "step"], sort=False).cumcount()
    g = st.assign(_nth=nth.to_numpy(), _end=(st["start_ns"] + st["dur_ns"]).to_numpy()).groupby(
        ["step", "_nth"], sort=True
    )
    run = g.agg(start=("start_ns", "min"), end=("_end", "max"), tokens=("tokens", "max"))
    return pd.DataFrame(
        {"dur_ns": (run["end"] - run["start"]).to_numpy(), "tokens": run["tokens"].to_numpy()}
    )


def _barrier_mask(df: pd.DataFrame) -> np.ndarray:
    """The rows that are rocprof ``<barrier packet>`` pseudo-dispatches (rule ``MEM600``)."""
    if "rule_id" not in df:
        return np.zeros(len(df), bool)
    return (df["rule_id"] == BARRIER_RULE_ID).to_numpy(bool, na_value=False)


def barrier_packets(df: pd.DataFrame, total: int) -> dict[str, Any]:
    """rocprof's ``<barrier packet>`` pseudo-dispatches: queue waits, not kernels, reported on their
    own (``time_ns``, ``share`` of the kernel time, ``count``); zeros when the trace has none."""
    sub = df[_barrier_mask(df)]
    t = int(sub["dur_ns"].sum())
    return {"time_ns": t, "share": t / total if total else 0.0, "count": int(sub["count"].sum())}


def unclassified(df: pd.DataFrame, total: int) -> list[dict[str, Any]]:
    """Kernel names of stage ``other``, largest first; barrier packets are no kernels and not listed."""
    sub = df[(df["stage"] == "other").to_numpy(bool, na_value=False) & ~_barrier_mask(df)]
    rows = []
    for name, g in sub.groupby("norm_name", sort=False, observed=True):
        t = int(g["dur_ns"].sum())
        rows.append(
            {
                "norm_name": name,
                "count": int(g["count"].sum()),
                "time_ns": t,
                "share": t / total if total else 0.0,
            }
        )
    rows.sort(key=lambda r: (-r["time_ns"], r["norm_name"]))
    return rows


def work_basis(analysis: Analysis, total: int) -> dict[str, Any]:
    """What the FLOPs and bytes rest on (docs/roofline-validation.md): kernel time by ``flops_source``, the kernels
    without numbers by the reason (``uncounted``) with their largest stages, the sizes that counted
    kernels without shapes (per input), the causal convention, and the kernels ``--model`` would
    count (``model_would_count``: GEMM-role and expert kernels without shapes in a run where no
    sizes were found; the ``analyze`` hint). Read from the kernels table (the frame leaves these
    columns out)."""
    k = analysis.kernels
    cols = [c for c in ("flops_source", "uncounted", "stage", "dur_ns", "count") if c in k.column_names]
    if "flops_source" not in cols or "dur_ns" not in cols:
        return {
            "causal": CAUSAL_CONVENTION,
            "basis": {},
            "uncounted": [],
            "sizes": {},
            "model_would_count": None,
        }
    t = k.select(cols)
    if "count" not in cols:
        t = t.append_column("count", pa.array(np.ones(t.num_rows, np.int64)))

    def grouped(keys: list[str]) -> list[dict[str, Any]]:
        g = t.group_by(keys).aggregate([("dur_ns", "sum"), ("count", "sum")]).to_pylist()
        return [r for r in g if all(r[x] is not None for x in keys)]

    def part(time_ns: int, kernels: int) -> dict[str, Any]:
        return {"kernels": int(kernels), "time_ns": int(time_ns), "share": time_ns / total if total else 0.0}

    basis = {
        r["flops_source"]: part(r["dur_ns_sum"], r["count_sum"])
        for r in sorted(grouped(["flops_source"]), key=lambda r: FLOPS_SOURCES.index(r["flops_source"]))
    }
    uncounted = []
    if "uncounted" in cols:
        by_stage = grouped(["uncounted", "stage"]) if "stage" in cols else []
        for r in grouped(["uncounted"]):
            stages = sorted(
                (x for x in by_stage if x["uncounted"] == r["uncounted"]), key=lambda x: -x["dur_ns_sum"]
            )
            uncounted.append(
                {
                    "reason": r["uncounted"],
                    **part(r["dur_ns_sum"], r["count_sum"]),
                    "stages": [x["stage"] for x in stages[:4]],
                }
            )
        uncounted.sort(key=lambda r: (-r["time_ns"], r["reason"]))
    would = next((r for r in uncounted if r["reason"] == "no_sizes"), None)
    return {
        "causal": CAUSAL_CONVENTION,
        "basis": basis,
        "uncounted": uncounted,
        "sizes": dict(sorted(analysis.work_sizes.items())),
        "model_would_count": {x: would[x] for x in ("kernels", "time_ns", "share")} if would else None,
    }


def rule_times(df: pd.DataFrame) -> dict[str, int]:
    """Kernel time (ns) per ``stage_rule`` id (the rule that gave each kernel its final stage),
    largest first (ties by id); ids with no time are left out, the values sum to the kernel time."""
    if "stage_rule" not in df or len(df) == 0:
        return {}
    t = df.groupby("stage_rule", observed=True, sort=False)["dur_ns"].sum()
    rows = sorted(((str(k), int(v)) for k, v in t.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))
    return dict(rows)


def _ids(v: Any) -> list[str]:
    """A list cell of rule ids (list, tuple or array) as a list; empty when missing."""
    return [str(x) for x in v] if isinstance(v, (list, tuple, np.ndarray)) else []


def _opt_int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def step_rows(analysis: Analysis) -> list[dict[str, Any]]:
    """One row per step: timing, phase, tokens (in all and of each kind: a mixed step has both),
    ``model`` (``target``, or ``draft`` for a speculative draft model's step) and ``verify_k`` (the
    tokens per sequence a speculative verify step scores; null elsewhere)."""
    st = analysis.steps
    if st is None or len(st) == 0:
        return []
    out = []
    for r in st.itertuples(index=False):
        out.append(
            {
                "step": int(r.step),
                "phase": r.phase,
                "start_ns": int(r.start_ns),
                "dur_ns": int(r.dur_ns),
                "busy_ns": int(r.busy_ns),
                "kernel_ns": int(r.kernel_ns),
                "kernels": int(r.kernels),
                "tokens": _opt_int(r.tokens),
                "prefill_tokens": _opt_int(getattr(r, "prefill_tokens", None)),
                "decode_tokens": _opt_int(getattr(r, "decode_tokens", None)),
                "model": getattr(r, "model", None) or "target",
                "verify_k": _opt_int(getattr(r, "verify_k", None)),
                "rank": int(r.rank),
                "trace_id": int(r.trace_id),
                "source": r.source,
                "phase_rule": r.phase_rule if isinstance(getattr(r, "phase_rule", None), str) else None,
                "phase_evidence": _ids(getattr(r, "phase_evidence", None)),
                "m_regime": r.m_regime if isinstance(getattr(r, "m_regime", None), str) else None,
            }
        )
    return out
