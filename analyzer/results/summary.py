"""The versioned result object (DESIGN §6): a JSON-ready dict built from an :class:`Analysis`.

Contract: pure function of the analysed tables; all times in integer ns, shares as fractions 0..1;
keys of the DESIGN §6 skeleton are always present (empty when a capability has nothing to say).
Every number here is recomputable from the kernels table: tests do exactly that. Kernels measured
faster than a peak (bound ``invalid``) are counted and explained in every rate row, never rated; a
multi-rank run counts a step (one step index across the ranks) once.
"""

from __future__ import annotations

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
from analyzer.tables import intervals
from analyzer.tables.frames import groups, only_columns

FORMAT_VERSION = 2
TOP_KERNELS = 15


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
            only_columns(df, "phase", "stage", "provider", "category", "count", *_RATE_COLUMNS),
            total,
            analysis.gpu,
        ),
        "providers": provider_rows(only_columns(df, "provider", "count", *_RATE_COLUMNS), total),
        "groups": group_rows(df, analysis.gpu),
        "top_kernels": top_kernels(
            only_columns(
                df,
                *("group_key", "norm_name", "stage", "provider", "rule_id", "stage_rule", "phase", "count"),
                *("tile_m", "tile_n", "tile_k", "split_k"),
                *_RATE_COLUMNS,
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
        },
        "steps": step_rows(analysis),
        "findings": analysis.findings,
        "warnings": analysis.warnings,
        "ranks": rank_summary(df),
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
            r["tile"] = _tile(pd.Series(tiles.take(pa.array(at)).to_pylist()[0]))


# what roofline_fields and _dominant_bound read
_RATE_COLUMNS = (
    "dur_ns",
    "flops_source",
    "flops",
    "bytes",
    "achieved_tflops",
    "achieved_tbps",
    "pct_of_peak",
    "intensity",
    "bound",
    "roof_dtype",
)


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

    sub = df[df["phase"] == phase]
    kernel_ns = int(sub["dur_ns"].sum())
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
    for cat, g in sub.groupby("category", sort=False, observed=True):
        t = int(g["dur_ns"].sum())
        prof.append(
            {
                "category": cat,
                "label": labels.get(cat, cat),
                "time_ns": t,
                "share": t / kernel_ns if kernel_ns else 0.0,
                "bound": _dominant_bound(g),
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


def _dominant_bound(g: pd.DataFrame) -> str | None:
    """The bound that holds for most of this group's time (None before the roofline ran)."""
    if "bound" not in g:
        return None
    b = g["bound"]
    if not isinstance(b.dtype, pd.CategoricalDtype):
        b = b.astype("category")
    codes = b.cat.codes.to_numpy()
    has = codes >= 0
    if not has.any():
        return None
    # time per bound, in category order (the order a groupby would give; ties go to the first)
    cats = b.cat.categories
    t = np.bincount(codes[has], weights=g["dur_ns"].to_numpy()[has], minlength=len(cats))
    keep = (t > 0) & ~np.asarray(cats.isin(["unknown", "invalid"]))
    if not keep.any():
        return "invalid" if "invalid" in cats and t[cats.get_loc("invalid")] > 0 else "unknown"
    return str(cats[np.flatnonzero(keep)[np.argmax(t[keep])]])


def dominant_bounds(df: pd.DataFrame, keys: list[str]) -> dict[tuple, str]:
    """``_dominant_bound`` for every group of ``keys`` at once."""
    if "bound" not in df or len(df) == 0:
        return {}
    t = df.groupby(keys + ["bound"], observed=True, sort=False)["dur_ns"].sum().reset_index()
    t = t[(t["bound"] != "unknown") & (t["dur_ns"] > 0)]
    # invalid only where nothing else holds: sorted after every real bound
    t = t.assign(_real=t["bound"] != "invalid").sort_values(["_real", "dur_ns"], ascending=False)
    t = t.drop(columns="_real").drop_duplicates(keys)
    return {tuple(r[:-2]) if len(keys) > 1 else r[0]: str(r[-2]) for r in t.itertuples(index=False)}


def _invalid(g: pd.DataFrame) -> np.ndarray:
    """The kernels measured faster than a peak (bound ``invalid``): their numbers are not rates."""
    if "bound" not in g:
        return np.zeros(len(g), bool)
    return (g["bound"] == "invalid").to_numpy(bool, na_value=False)


def invalid_reason(inv: pd.DataFrame, of: int, gpu: dict[str, Any] | None) -> str | None:
    """Why the rates of ``inv`` (invalid kernels, ``of`` kernels in all) are not shown: the
    highest rate measured against the peak it exceeds; None when there are none."""
    n = int(inv["count"].sum()) if "count" in inv else len(inv)
    if n == 0:
        return None
    peaks = (gpu or {}).get("peaks") or {}
    dur = inv["dur_ns"].to_numpy(np.float64)

    def highest(col: str) -> float:
        if col not in inv:
            return float("nan")
        with np.errstate(divide="ignore", invalid="ignore"):
            r = inv[col].to_numpy(np.float64, na_value=np.nan) / dur / 1e3
        r = r[np.isfinite(r)]
        return float(r.max()) if len(r) else float("nan")

    tbps, tflops = highest("bytes"), highest("flops")
    hbm = peaks.get("hbm_tbps")
    if hbm and tbps > hbm:
        what = f"{tbps:.2f} TB/s, above the HBM peak {hbm:g} TB/s"
    elif tflops == tflops:
        what = f"{tflops:.1f} TFLOP/s, above the compute peak of its dtype"
    else:
        what = "above a peak"
    if n < of:
        return f"{n:,} of {of:,} kernels measured at up to {what}: left out of the rates"
    return f"measured at up to {what} (cache-resident data or a byte model that overcounts)"


def roofline_fields(g: pd.DataFrame, gpu: dict[str, Any] | None = None) -> dict[str, Any]:
    """Achieved rates of a set of kernels: summed FLOPs and bytes over the time of the kernels that
    have them, their intensity, the time-weighted share of the roof reached, and the dominant bound.
    Kernels measured faster than a peak (``invalid``) are counted and explained, never rated."""
    bad = _invalid(g)
    of = int(g["count"].sum()) if "count" in g else len(g)
    invalid = {
        "invalid_kernels": int(g["count"][bad].sum()) if "count" in g else int(bad.sum()),
        "invalid_reason": invalid_reason(g[bad], of, gpu) if bad.any() else None,
    }
    if "flops" not in g or (g["flops"].isna().all() and g["bytes"].isna().all()):
        return {
            "flops": None,
            "bytes": None,
            "achieved_tflops": None,
            "achieved_tbps": None,
            "intensity": None,
            "pct_of_peak": None,
            "bound": _dominant_bound(g),
            "basis": None,
            "roof_dtype": None,
            **invalid,
        }
    fl = g["flops"].to_numpy(np.float64, na_value=np.nan)
    by = g["bytes"].to_numpy(np.float64, na_value=np.nan)
    dur = g["dur_ns"].to_numpy()
    known = (~np.isnan(fl) | ~np.isnan(by)) & ~bad
    t = float(dur[known].sum())
    flops = _nan_sum(fl[known])
    nbytes = _nan_sum(by[known])
    pct = g["pct_of_peak"].to_numpy(np.float64, na_value=np.nan)[known]
    has_pct = ~np.isnan(pct)
    w = dur[known][has_pct]
    return {
        "flops": flops,
        "bytes": nbytes,
        "achieved_tflops": flops / t / 1e3 if t and flops is not None else None,
        "achieved_tbps": nbytes / t / 1e3 if t and nbytes is not None else None,
        "intensity": flops / nbytes if flops is not None and nbytes else None,
        "pct_of_peak": float(np.average(pct[has_pct], weights=w)) if len(w) and w.sum() > 0 else None,
        "bound": _dominant_bound(g),
        "basis": _basis(g["flops_source"][known]) if "flops_source" in g else None,
        "roof_dtype": _roof_dtype(g, known & (np.nan_to_num(fl) > 0)),
        **invalid,
    }


def _roof_codes(col: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Codes (-1: null) and categories of a ``roof_dtype`` column."""
    cat = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
    return cat.cat.codes.to_numpy(), cat.cat.categories


def _roof_dtypes(df: pd.DataFrame, group: np.ndarray, index: pd.Index) -> dict[tuple, str]:
    """Per group (``group``: each row's group number, ``index``: the groups' keys): the ``roof_dtype``
    holding most of the time of its kernels with FLOPs (one weighted count, no loop over groups)."""
    if "roof_dtype" not in df or not len(index):
        return {}
    codes, cats = _roof_codes(df["roof_dtype"])
    sel = (df["flops"].to_numpy(np.float64, na_value=0.0) > 0) & (codes >= 0) & (group >= 0)
    if not sel.any() or not len(cats):
        return {}
    ncat = len(cats)
    t = np.bincount(
        group[sel] * ncat + codes[sel],
        weights=df["dur_ns"].to_numpy(np.float64)[sel],
        minlength=len(index) * ncat,
    ).reshape(len(index), ncat)
    best = t.argmax(axis=1)
    has = t.max(axis=1) > 0
    return {tuple(index[i]): str(cats[best[i]]) for i in np.flatnonzero(has)}


def _roof_dtype(g: pd.DataFrame, rated: np.ndarray) -> str | None:
    """The dtype whose compute peak the row's kernels with FLOPs (``rated``) are measured against
    (``roof_dtype``), the one holding most of their time; None without FLOPs."""
    if "roof_dtype" not in g or not rated.any():
        return None
    codes, cats = _roof_codes(g["roof_dtype"])
    sel = rated & (codes >= 0)
    if not sel.any():
        return None
    t = np.bincount(codes[sel], weights=g["dur_ns"].to_numpy(np.float64)[sel], minlength=len(cats))
    return str(cats[int(t.argmax())])


def _basis(sources: pd.Series) -> list[str] | None:
    """What the rated kernels' numbers rest on (``flops_source`` values, in FLOPS_SOURCES order)."""
    seen = set(sources.astype(str))
    got = [s for s in FLOPS_SOURCES if s in seen]
    return got or None


def _nan_sum(values: np.ndarray) -> float | None:
    """Sum of the numbers, NaN skipped; None when there are none (pandas' ``sum(min_count=1)``)."""
    ok = ~np.isnan(values)
    return float(np.where(ok, values, 0.0).sum()) if ok.any() else None


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
    for provider, g in df.groupby("provider", sort=True, observed=True):
        t = int(g["dur_ns"].sum())
        rows.append(
            {
                "provider": provider,
                "time_ns": t,
                "share": t / total if total else 0.0,
                "count": int(g["count"].sum()),
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
    bad = _invalid(df)
    reasons: dict[tuple, tuple[int, str | None]] = {}
    if bad.any():
        sizes = df.groupby(keys, observed=True, sort=False)["count"].sum()
        inv = only_columns(df, *keys, "count", "dur_ns", "flops", "bytes")[bad]
        for key, g in inv.groupby(keys, observed=True, sort=False):
            reasons[key] = (int(g["count"].sum()), invalid_reason(g, int(sizes[key]), gpu))
    if "flops" in df:
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
        grouped = df.groupby(keys, observed=True, sort=True)
        agg = grouped.agg(
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
        # a group without a single number has no sum (NaN), not 0
        agg["flops"] = agg["flops"].where(agg["flops_n"] > 0)
        agg["bytes"] = agg["bytes"].where(agg["bytes_n"] > 0)
        basis: dict[tuple, list[str]] = {}
        if "flops_source" in df:
            for key, n in (
                df[known].groupby([*keys, "flops_source"], observed=True, sort=False).size().items()
            ):
                if n:
                    basis.setdefault(tuple(key[:-1]), []).append(str(key[-1]))
        roofs = _roof_dtypes(df, grouped.ngroup().to_numpy(), agg.index)
    else:
        basis, roofs = {}, {}
        agg = df.groupby(keys, observed=True, sort=True).agg(
            count=("count", "sum"), time_ns=("dur_ns", "sum")
        )
    bounds = dominant_bounds(df, keys)
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
                "tile": _tile(first),
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
    known = (g["flops"].notna() | g["bytes"].notna()).to_numpy(bool) & ~_invalid(g)
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


def _tile(row: pd.Series) -> str | None:
    vals = [row.get(f"tile_{a}") for a in "mnk"]
    if all(v is None or pd.isna(v) for v in vals):
        return None
    return "x".join("?" if v is None or pd.isna(v) else str(int(v)) for v in vals)


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
    """What the FLOPs and bytes rest on (DESIGN §5): kernel time by ``flops_source``, the kernels
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
