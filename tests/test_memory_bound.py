"""Peak memory grows linearly with the GPU activities of a trace: peak ~ a x activities + b.

docs/performance.md ("The bound") states the bound measured on 10 GB traces; this test checks its
shape on small traces of growing density, with memory counted exactly instead of as RSS: the bytes
of the tables the reader built, plus the peaks of the Python/numpy heap (``tracemalloc``) and of
Arrow's memory pool during the analysis and the summary. Each size runs in a process of its own
(Arrow's pool peak cannot be reset). No time is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import FIXTURES, ROOT

# one request per step, no recorded shapes: the kernel-dense kind of trace (benchmarks/run.py
# --source noshape scales the same trace to 10 GB)
SOURCE = FIXTURES / "zoo" / "llama-assisted-noshape-bf16" / "trace.json.gz"
COPIES = (1, 2, 4)
# bytes per GPU activity the analysis may hold at its peak, tables included (measured 508 on
# this trace, 622 before issue 38; each per-kernel temporary of one Python object per row adds ~60)
A_MAX = 600
# how far the largest trace may lie above the line through the two smaller ones (a term that grows
# faster than the activities, e.g. a mask per step over all kernels, breaks it)
CURVE_MAX = 0.10

CHILD = """
import json, os, sys, tracemalloc
import pyarrow as pa
pool = pa.proxy_memory_pool(pa.default_memory_pool())
pa.set_memory_pool(pool)
from analyzer.pipeline import analyze_trace, resolve_context
from analyzer.readers import read_trace
from analyzer.results.summary import build_summary
context = resolve_context()
trace = read_trace(sys.argv[1])
n = trace.kernels.num_rows
tables = trace.kernels.nbytes + trace.host_ops.nbytes + trace.annotations.nbytes
read_pool = pool.bytes_allocated()
tracemalloc.start()
analysis = analyze_trace(trace, context, keep_host_ops=False)
del trace
build_summary(analysis)
heap = tracemalloc.get_traced_memory()[1]
print(json.dumps({"activities": n, "tables": tables, "heap": heap,
                  "arrow": pool.max_memory() - read_pool}), flush=True)
os._exit(0)  # a proxy pool set as the default must not be torn down with the interpreter
"""


def _peak(path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["peak"] = got["tables"] + got["heap"] + got["arrow"]
    return got


@pytest.mark.skipif(not SOURCE.exists(), reason="the zoo trace is missing")
def test_peak_memory_is_linear_in_the_gpu_activities(tmp_path) -> None:
    # GIVEN one real trace without shapes repeated 1, 2 and 4 times (benchmarks/scale_trace.py)
    runs = []
    for k in COPIES:
        path = tmp_path / f"x{k}.json"
        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "scale_trace.py"), str(SOURCE), "--copies", str(k)]
            + ["-o", str(path)],
            check=True,
            capture_output=True,
        )
        # WHEN each is read and analysed, and its summary built
        runs.append(_peak(path))
    n = np.array([r["activities"] for r in runs], float)
    peak = np.array([r["peak"] for r in runs], float)
    assert n[1] == 2 * n[0] and n[2] == 4 * n[0]
    # THEN the peak is a line in the activities: a bounded slope ...
    a, b = np.polyfit(n, peak, 1)
    assert 0 < a <= A_MAX, f"{a:.0f} bytes per GPU activity (bound {A_MAX}): {runs}"
    # ... and the largest trace lies on the line through the smaller two
    line = peak[1] + (peak[1] - peak[0]) / (n[1] - n[0]) * (n[2] - n[1])
    assert peak[2] <= line * (1 + CURVE_MAX), f"{peak[2]:.0f} above the line's {line:.0f}: {runs}"
