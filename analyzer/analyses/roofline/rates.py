"""Achieved rates, the share of the roof reached and what bounds each kernel.

Contract: pure over each kernel's duration, FLOPs, bytes and roof dtype and the GPU spec. TFLOP/s =
flops / dur, TB/s = bytes / dur, intensity = flops / bytes; ``pct_of_peak`` is achieved FLOP/s over
the roof at that intensity (min(peak, intensity x BW)), or achieved TB/s over peak BW without FLOPs.
``bound`` is one of :data:`BOUNDS`: by the ridge point, ``latency`` for a short kernel far under its
roof, ``invalid`` when a rate exceeds a peak (warned by :func:`rate_warnings`), ``unknown`` without
numbers or a known GPU. A dtype the GPU has no peak for falls back to bf16.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.knowledge import hardware
from analyzer.tables.dictionaries import dict_isin, objects

BOUNDS = ("unknown", "compute", "memory", "latency", "invalid")
_BOUND_CODE = {b: np.int8(i) for i, b in enumerate(BOUNDS)}  # int8: np.where of Python ints makes int64
LATENCY_NS = 10_000  # a kernel shorter than this that reaches < LATENCY_PCT of its roof
LATENCY_PCT = 0.10


def rates(
    dur_ns: np.ndarray, flops: np.ndarray, nbytes: np.ndarray, dtype: list[str], spec: hardware.GpuSpec | None
) -> dict[str, Any]:
    dur = np.asarray(dur_ns, np.float64)
    flops = np.asarray(flops, np.float64)
    nbytes = np.asarray(nbytes, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tflops = np.where(dur > 0, flops / dur / 1e3, np.nan)  # flop/ns = GFLOP/s; /1e3 -> TFLOP/s
        tbps = np.where(dur > 0, nbytes / dur / 1e3, np.nan)  # byte/ns = GB/s; /1e3 -> TB/s
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
    n = len(dur)
    pct = np.full(n, np.nan) if spec is None else None  # else made below, once what it reads is known
    code = np.zeros(n, np.int8)  # positions in BOUNDS: no per-row strings for millions of kernels
    roof_names: list[str] = []  # the dtypes whose peaks the roofs use (roof_dtype), by code
    roof_code = np.full(n, -1, np.int32)
    if spec is not None:
        bw = spec.hbm_tbps
        default = hardware.peak_tflops(spec, "bf16") or np.nan
        dts = np.asarray(dtype, dtype=object)
        peak = np.full(n, default)
        for d in set(dtype):
            p = hardware.peak_tflops(spec, d)
            sel = dts == d
            peak[sel] = p if p else default
            used = (hardware.normalize_dtype(d) or d) if p else ("bf16" if default == default else None)
            if used is not None:
                if used not in roof_names:
                    roof_names.append(used)
                roof_code[sel] = roof_names.index(used)
        del dts
        has = ~(np.isnan(tbps) & np.isnan(tflops))
        roof_code[~has] = -1
        over = has & ((~np.isnan(tflops) & (tflops > peak)) | (~np.isnan(tbps) & (tbps > bw)))
        has_flops = has & ~over & (np.nan_to_num(flops) > 0) & ~np.isnan(peak)
        with np.errstate(divide="ignore", invalid="ignore"):
            # the share of the roof reached: FLOP/s over the roof with FLOPs, else TB/s over the
            # bandwidth (the two sets are apart); each per-kernel temporary goes once read
            pct = np.where(has & ~over & ~has_flops, tbps / bw, np.nan)
            roof = np.where(np.isnan(intensity), peak, np.minimum(peak, intensity * bw))
            compute_pct = np.full(n, np.nan)
            np.divide(tflops, roof, out=compute_pct, where=roof > 0)
            del roof
            np.copyto(pct, compute_pct, where=has_flops)
            del compute_pct
        kind = np.where(has_flops & (intensity >= peak / bw), _BOUND_CODE["compute"], _BOUND_CODE["memory"])
        latency = (dur < LATENCY_NS) & (pct < LATENCY_PCT)
        ok = has & ~over
        code = np.where(ok, np.where(latency, _BOUND_CODE["latency"], kind), code)
        code = np.where(over, _BOUND_CODE["invalid"], code)
        del kind, latency, ok, has_flops, has, peak
        tflops[over] = np.nan  # (both made above: written in place)
        tbps[over] = np.nan
    del dur
    return {
        "flops": flops,
        "bytes": nbytes,
        "achieved_tflops": tflops,
        "achieved_tbps": tbps,
        "pct_of_peak": pct,
        "intensity": intensity,
        "bound": _used_categories(code, BOUNDS),
        "roof_dtype": _used_categories(roof_code, roof_names),
    }


def _used_categories(codes: np.ndarray, categories: Sequence[str]) -> pd.Categorical:
    """``Categorical.from_codes(codes, categories).remove_unused_categories()`` (-1: missing), the
    categories in use found by a count, not by sorting every code."""
    used = np.bincount(codes[codes >= 0], minlength=len(categories)) > 0
    kept = [c for c, u in zip(categories, used.tolist(), strict=True) if u]
    small = np.int8 if len(kept) < 128 else np.int32
    if not kept:
        return pd.Categorical.from_codes(np.full(len(codes), -1, small), categories=kept)
    lut = np.cumsum(used) - 1
    return pd.Categorical.from_codes(
        np.where(codes >= 0, lut[np.maximum(codes, 0)], -1).astype(small), categories=kept
    )


def rate_warnings(kernels: pa.Table, gpu: dict[str, Any] | None) -> list[str]:
    """An unknown GPU, and kernels measured faster than the GPU's peaks, over the whole run."""
    gpu = gpu or {}
    if gpu.get("name") is None:
        return [
            f"GPU not known to rules/hardware.toml ({gpu.get('reason')}): times only, no bounds (use --gpu NAME)"
        ]
    invalid = dict_isin(kernels["bound"], ["invalid"])
    if not invalid.any():
        return []
    names = pd.Series(objects(kernels["norm_name"]))[invalid].value_counts()
    top = "; ".join(f"{n[:60]} (x{c})" for n, c in names.head(3).items())
    return [
        f"{int(invalid.sum())} kernels exceed a peak of {gpu['name']} "
        f"(bound=invalid, rates not trusted): {top}"
    ]
