"""The rate fields of the summary's rows: what a set of kernels achieved against its roofs.

Contract: pure over the kernels frame. A row's FLOPs and bytes are summed over the kernels that have
them, its rates taken over those kernels' time, its ``pct_of_peak`` time-weighted; ``bound`` is the
bound holding for most of its time, ``roof_dtype`` the dtype whose peak most of its time with FLOPs
is measured against, ``basis`` what its numbers rest on (``flops_source``, in
:data:`~analyzer.analyses.roofline.FLOPS_SOURCES` order). Kernels measured faster than a peak (bound
``invalid``) are counted and explained (``invalid_kernels``, ``invalid_reason``), never rated.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analyzer.analyses.roofline import FLOPS_SOURCES
from analyzer.tables.frames import SLICE_ROWS, category_codes

# what roofline_fields and dominant_bound read
RATE_COLUMNS = (
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


def dominant_bound(g: pd.DataFrame) -> str | None:
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


def dominant_bounds(
    df: pd.DataFrame, keys: list[str], group: np.ndarray | None = None, index: pd.Index | None = None
) -> dict[tuple, str]:
    """:func:`dominant_bound` for every group of ``keys`` at once. ``group`` (optional): each row's
    group number among ``index``, the groups' keys (-1: a row of no group), where the caller has
    them: one integer key then stands for the ``keys`` (the same groups, in the same order)."""
    if "bound" not in df or len(df) == 0:
        return {}
    if group is not None and index is not None:
        return _dominant_by_group(df, group, index)
    t = df.groupby(keys + ["bound"], observed=True, sort=False)["dur_ns"].sum().reset_index()
    t = t[(t["bound"] != "unknown") & (t["dur_ns"] > 0)]
    # invalid only where nothing else holds: sorted after every real bound
    t = t.assign(_real=t["bound"] != "invalid").sort_values(["_real", "dur_ns"], ascending=False)
    t = t.drop(columns="_real").drop_duplicates(keys)
    return {tuple(r[:-2]) if len(keys) > 1 else r[0]: str(r[-2]) for r in t.itertuples(index=False)}


def _dominant_by_group(df: pd.DataFrame, group: np.ndarray, index: pd.Index) -> dict[tuple, str]:
    """:func:`dominant_bounds` by each row's group number: the time of each (group, bound) pair
    summed :data:`~analyzer.tables.frames.SLICE_ROWS` rows at a time (a group-by of two keys
    holds ~60 bytes a row), ties going to the pair seen first, as a group-by in order of
    appearance would."""
    codes, cats = category_codes(df["bound"])
    nb = max(len(cats), 1)
    dur = df["dur_ns"].to_numpy()
    pairs: dict[int, list[int]] = {}  # group * nb + bound -> [time, first row]
    for lo in range(0, len(df), SLICE_ROWS):
        hi = min(len(df), lo + SLICE_ROWS)
        b = codes[lo:hi]
        ok = (group[lo:hi] >= 0) & (b >= 0)
        pair = group[lo:hi][ok].astype(np.int64) * nb + b[ok]
        rows = np.flatnonzero(ok) + lo
        order = np.argsort(pair, kind="stable")
        pair = pair[order]
        starts = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
        times = np.add.reduceat(dur[rows[order]], starts) if len(starts) else starts
        for p, t, first in zip(
            pair[starts].tolist(), times.tolist(), rows[order][starts].tolist(), strict=True
        ):
            if p in pairs:
                pairs[p][0] += t
            else:
                pairs[p] = [t, first]
    names = [str(c) for c in cats]
    # invalid only where nothing else holds: sorted after every real bound
    ranked = sorted(
        (p for p, (t, _) in pairs.items() if t > 0 and names[p % nb] != "unknown"),
        key=lambda p: (names[p % nb] == "invalid", -pairs[p][0], pairs[p][1]),
    )
    out: dict[tuple, str] = {}
    for p in ranked:
        key = index[p // nb]
        if key not in out:
            out[key] = names[p % nb]
    return out


def invalid_rows(g: pd.DataFrame) -> np.ndarray:
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
    bad = invalid_rows(g)
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
            "bound": dominant_bound(g),
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
        "bound": dominant_bound(g),
        "basis": _basis(g["flops_source"][known]) if "flops_source" in g else None,
        "roof_dtype": _roof_dtype(g, known & (np.nan_to_num(fl) > 0)),
        **invalid,
    }


def _roof_codes(col: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Codes (-1: null) and categories of a ``roof_dtype`` column."""
    cat = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
    return cat.cat.codes.to_numpy(), cat.cat.categories


def roof_dtypes(df: pd.DataFrame, group: np.ndarray, index: pd.Index) -> dict[tuple, str]:
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
