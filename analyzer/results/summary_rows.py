"""The summary's tables of kernel time: per stage, per provider, per kernel group, the top groups.

Contract: pure over the kernels frame; times in integer ns, shares of the total kernel time as
fractions 0..1; rows sorted by time, largest first (ties by their keys). Every row of stages, groups
and top kernels carries the rate fields of :mod:`analyzer.results.summary_rates`; a top kernel row
describes the stage holding most of its group's time and says in which phases its rate is measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analyzer.analyses.roofline import FLOPS_SOURCES
from analyzer.results.summary_rates import (
    dominant_bounds,
    invalid_reason,
    invalid_rows,
    roof_dtypes,
    roofline_fields,
)
from analyzer.tables.frames import SLICE_ROWS, category_codes, group_numbers, groups, only_columns

TOP_KERNELS = 15


def stage_rows(df: pd.DataFrame, total: int, gpu: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rows = []
    for (phase, stage, provider), g in groups(df, ["phase", "stage", "provider"]):  # sorted below
        t = int(g["dur_ns"].sum())
        rows.append(
            {
                "phase": phase,
                "stage": stage,
                "category": str(g["category"].iloc[0]),
                "provider": provider,
                "time_ns": t,
                "share": t / total if total else 0.0,
                "count": int(g["count"].sum()),
                **roofline_fields(g, gpu),
            }
        )
    rows.sort(key=lambda r: (-r["time_ns"], r["phase"], r["stage"], r["provider"]))
    return rows


def provider_rows(df: pd.DataFrame, total: int) -> list[dict[str, Any]]:
    rows = []
    # the two sums only: iterating a group-by would first copy every column into group order
    sums = df.groupby("provider", sort=True, observed=True)[["dur_ns", "count"]].sum()
    for provider, dur, count in zip(sums.index, sums["dur_ns"].tolist(), sums["count"].tolist(), strict=True):
        t = int(dur)
        rows.append(
            {
                "provider": provider,
                "time_ns": t,
                "share": t / total if total else 0.0,
                "count": int(count),
            }
        )
    rows.sort(key=lambda r: (-r["time_ns"], r["provider"]))
    return rows


def _none_if_nan(v: Any) -> Any:
    if v is None:
        return None
    try:
        if np.isnan(v):
            return None
    except TypeError:
        return v
    return float(v)


def group_rows(df: pd.DataFrame, gpu: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    keys = ["group_key", "phase", "stage", "provider"]
    if len(df) == 0:
        return []
    bad = invalid_rows(df)
    reasons = _invalid_reasons(df, keys, bad, gpu) if bad.any() else {}
    if "flops" in df:
        df, agg, basis, roofs, group = _rate_sums(df, keys, bad)
    else:
        group = None
        basis, roofs = {}, {}
        agg = df.groupby(keys, observed=True, sort=True).agg(
            count=("count", "sum"), time_ns=("dur_ns", "sum")
        )
    bounds = dominant_bounds(df, keys, group, agg.index)
    rows = []
    for key, r in zip(agg.index, agg.itertuples(index=False), strict=True):
        t = int(r.time_ns)
        flops = _none_if_nan(getattr(r, "flops", None))
        nbytes = _none_if_nan(getattr(r, "bytes", None))
        kt = float(getattr(r, "known_ns", 0) or 0)  # the time of the kernels that have numbers
        pct_ns = float(getattr(r, "pct_ns", 0) or 0)
        rows.append(
            {
                "group_key": str(key[0]),
                "phase": str(key[1]),
                "stage": str(key[2]),
                "provider": str(key[3]),
                "count": int(r.count),
                "time_ns": t,
                "flops": flops,
                "bytes": nbytes,
                "achieved_tflops": flops / kt / 1e3 if kt and flops is not None else None,
                "achieved_tbps": nbytes / kt / 1e3 if kt and nbytes is not None else None,
                "intensity": flops / nbytes if flops is not None and nbytes else None,
                "pct_of_peak": float(r.pct_w) / pct_ns if pct_ns else None,
                "bound": bounds.get(tuple(key), "unknown")
                if "bound" in df and df["bound"].notna().any()
                else None,
                "basis": [b for b in FLOPS_SOURCES if b in basis.get(tuple(key), ())] or None,
                "roof_dtype": roofs.get(tuple(key)),
                "invalid_kernels": reasons.get(tuple(key), (0, None))[0],
                "invalid_reason": reasons.get(tuple(key), (0, None))[1],
            }
        )
    rows.sort(key=lambda r: (-r["time_ns"], r["group_key"], r["phase"]))
    return rows


def _invalid_reasons(
    df: pd.DataFrame, keys: list[str], bad: np.ndarray, gpu: dict[str, Any] | None
) -> dict[tuple, tuple[int, str | None]]:
    """Per group with kernels measured faster than a peak (``bad``): how many, and why not rated."""
    reasons: dict[tuple, tuple[int, str | None]] = {}
    sizes = df.groupby(keys, observed=True, sort=False)["count"].sum()
    inv = only_columns(df, *keys, "count", "dur_ns", "flops", "bytes")[bad]
    for key, g in inv.groupby(keys, observed=True, sort=False):
        reasons[key] = (int(g["count"].sum()), invalid_reason(g, int(sizes[key]), gpu))
    return reasons


def _rate_sums(
    df: pd.DataFrame, keys: list[str], bad: np.ndarray
) -> tuple[pd.DataFrame, pd.DataFrame, dict[tuple, list[str]], dict[tuple, str], np.ndarray]:
    """The frame narrowed to what the rates read (invalid kernels' numbers left out of the sums),
    and per group: the sums (count, time, FLOPs and bytes, the time of the kernels with numbers and
    the time-weighted share of peak), the basis of its numbers and its roof dtype; and each row's
    group number (the position of its group in the sums)."""
    # only the columns used here: a copy of the whole frame costs far more per kernel
    df = df[
        [
            *keys,
            "count",
            "dur_ns",
            "flops",
            "bytes",
            "pct_of_peak",
            *(["bound"] if "bound" in df else []),
            *(["flops_source"] if "flops_source" in df else []),
            *(["roof_dtype"] if "roof_dtype" in df else []),
        ]
    ]
    if bad.any():  # invalid kernels' numbers are not rates: out of the sums
        ok = pd.Series(~bad, index=df.index)
        df = df.assign(flops=df["flops"].where(ok), bytes=df["bytes"].where(ok))
    known = df["flops"].notna() | df["bytes"].notna()
    has_pct = df["pct_of_peak"].notna()
    df = df.assign(
        _known_ns=df["dur_ns"].where(known, 0),
        _pct_w=(df["pct_of_peak"] * df["dur_ns"]).where(has_pct, 0.0),
        _pct_ns=df["dur_ns"].where(has_pct, 0),
    )
    # by one group number per row: a group-by of the four keys holds ~60 bytes a row
    group, index = group_numbers(df, keys)
    agg = df.groupby(group, sort=True).agg(
        count=("count", "sum"),
        time_ns=("dur_ns", "sum"),
        flops=("flops", "sum"),
        bytes=("bytes", "sum"),
        flops_n=("flops", "count"),
        bytes_n=("bytes", "count"),
        known_ns=("_known_ns", "sum"),
        pct_w=("_pct_w", "sum"),
        pct_ns=("_pct_ns", "sum"),
    )
    agg = agg[agg.index >= 0]  # (rows with a key missing)
    agg.index = index
    # a group without a single number has no sum (NaN), not 0
    agg["flops"] = agg["flops"].where(agg["flops_n"] > 0)
    agg["bytes"] = agg["bytes"].where(agg["bytes_n"] > 0)
    basis = _bases(df["flops_source"], known.to_numpy(), group, index) if "flops_source" in df else {}
    roofs = roof_dtypes(df, group, agg.index)
    return df, agg, basis, roofs, group


def _bases(
    source: pd.Series, known: np.ndarray, group: np.ndarray, index: pd.MultiIndex
) -> dict[tuple, list[str]]:
    """Per group (``group``: each row's group number among ``index``): the ``flops_source`` values
    of its kernels with numbers (``known``), a few rows at a time."""
    codes, cats = category_codes(source)
    n = max(len(cats), 1)
    pairs: set[int] = set()
    for lo in range(0, len(codes), SLICE_ROWS):
        sl = slice(lo, lo + SLICE_ROWS)
        ok = known[sl] & (group[sl] >= 0) & (codes[sl] >= 0)
        pairs.update(pd.unique(group[sl][ok] * n + codes[sl][ok]).tolist())
    basis: dict[tuple, list[str]] = {}
    for p in sorted(pairs):
        basis.setdefault(tuple(index[p // n]), []).append(str(cats[p % n]))
    return basis


def _shares(g: pd.DataFrame, col: str) -> list[dict[str, Any]]:
    """Time share of each value of ``col`` among ``g``'s kernels, largest first (ties by name)."""
    t = g.groupby(col, observed=True, sort=False)["dur_ns"].sum()
    tot = float(t.sum())
    rows = [{col: str(k), "share": float(v) / tot if tot else 0.0} for k, v in t.items()]
    return sorted(rows, key=lambda r: (-r["share"], r[col]))


def top_kernels(
    df: pd.DataFrame, total: int, n: int = TOP_KERNELS, gpu: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    rows = []
    if len(df) == 0:
        return rows
    # the columns a row reads: each top group's rows are taken out of this narrower frame
    df = only_columns(df, "group_key", "dur_ns", "stage", "phase", "norm_name", "provider", "rule_id",
                      "stage_rule", "count", "tile_m", "tile_n", "tile_k", "split_k", "flops", "bytes", "pct_of_peak",
                      "bound", "category", "flops_source", "roof_dtype")  # fmt: skip
    groups = df.groupby("group_key", observed=True)
    tot = groups["dur_ns"].sum()
    tot = tot.reset_index().sort_values(["dur_ns", "group_key"], ascending=[False, True])
    rows_of = groups.indices  # positions of each group's rows, in frame order
    for gk in tot["group_key"].head(n):
        g = df.iloc[rows_of[gk]]
        t = int(g["dur_ns"].sum())
        stages = _shares(g, "stage")
        phases = _shares(g, "phase")
        # the row describes the stage holding most of the time, not whichever kernel came first
        main = g[(g["stage"] == stages[0]["stage"]).to_numpy()]
        first = main.iloc[0]
        rows.append(
            {
                "group_key": str(gk),
                "norm_name": str(first["norm_name"]),
                "stage": stages[0]["stage"],
                "stages": stages,
                "provider": str(first["provider"]),
                "rule_id": str(first["rule_id"]),
                # the rule that gave most of that stage's time (a structure rule may relabel a kernel)
                "stage_rule": _shares(main, "stage_rule")[0]["stage_rule"] if "stage_rule" in main else None,
                "phase": phases[0]["phase"],
                "phase_shares": phases,
                "phases": sorted(p["phase"] for p in phases),
                "count": int(g["count"].sum()),
                "time_ns": t,
                "share": t / total if total else 0.0,
                "mean_ns": int(t / max(int(g["count"].sum()), 1)),
                "tile": tile_text(first),
                "split_k": _split_k(first.get("split_k")),
                **roofline_fields(g, gpu),
                **_rates_by_phase(g, gpu),
            }
        )
    rows.sort(key=lambda r: (-r["time_ns"], r["group_key"]))
    return rows[:n]


def _rates_by_phase(g: pd.DataFrame, gpu: dict[str, Any] | None) -> dict[str, Any]:
    """Which phases a kernel group's rate is measured on, and its rate in each phase.

    A configuration that serves both phases may have numbers in one only (graph-replayed decode
    launches record no shapes): its row's rate is then the other phase's, which the row must say.
    ``rate_phases``: the phases of the kernels that have numbers; ``phase_rates``: one row per phase
    with numbers (``achieved_tflops``, ``achieved_tbps``, ``pct_of_peak``, ``bound``)."""
    if "flops" not in g or "phase" not in g:
        return {"rate_phases": [], "phase_rates": []}
    known = (g["flops"].notna() | g["bytes"].notna()).to_numpy(bool) & ~invalid_rows(g)
    phases = sorted({str(p) for p in g["phase"].to_numpy()[known]})
    rates = []
    for ph in phases:
        f = roofline_fields(g[(g["phase"] == ph).to_numpy(bool)], gpu)
        rates.append(
            {"phase": ph, **{k: f[k] for k in ("achieved_tflops", "achieved_tbps", "pct_of_peak", "bound")}}
        )
    return {"rate_phases": phases, "phase_rates": rates}


def _split_k(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def tile_text(row: pd.Series) -> str | None:
    vals = [row.get(f"tile_{a}") for a in "mnk"]
    if all(v is None or pd.isna(v) for v in vals):
        return None
    return "x".join("?" if v is None or pd.isna(v) else str(int(v)) for v in vals)
