"""Roofline: FLOPs and bytes per kernel, achieved rates and what bounds each kernel (DESIGN §5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from analyzer.pipeline import Analysis, Options

COLUMNS = {
    "flops": pa.float64(),
    "bytes": pa.float64(),
    "flops_source": pa.string(),
    "achieved_tflops": pa.float64(),
    "achieved_tbps": pa.float64(),
    "pct_of_peak": pa.float64(),
    "intensity": pa.float64(),
    "bound": pa.string(),
}


def run(analysis: Analysis, options: Options) -> None:
    k = analysis.kernels
    n = k.num_rows
    for name, typ in COLUMNS.items():
        if name == "flops_source":
            arr = pa.array(["none"] * n, typ)
        elif name == "bound":
            arr = pa.array(["unknown"] * n, typ)
        else:
            arr = pa.nulls(n, typ)
        k = k.append_column(name, arr) if name not in k.column_names else k
    analysis.kernels = k
