"""The rule table against real traces: at least 99 % of GPU time must land in a stage other than ``other``.

The traces are read here with the standard library only (gzip + json, sqlite3, csv), not with the project's
readers, so this test checks the rule table alone. They live in ``../shared/traces`` beside the checkout;
every test skips with a reason when that folder is absent.
"""

from __future__ import annotations

import csv
import gzip
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from analyzer.knowledge.kernel_rules import classify_names, default_rules

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MIN_COVERAGE = 0.99
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(), reason=f"sample traces not available ({TRACES} is absent on this machine)"
)


def _load_json(path: Path):
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return json.load(f)


def _kineto_traces() -> list[Path]:
    if not TRACES.is_dir():
        return []
    out = []
    for p in sorted(TRACES.rglob("*.json.gz")):
        with gzip.open(p, "rb") as f:
            head = f.read(1 << 16)
        if b'"traceEvents"' in head:
            out.append(p)
    return out


def _assert_covered(durations: Counter[str], label: str) -> None:
    total = sum(durations.values())
    assert total > 0, f"{label}: no GPU time found"
    rows = classify_names(list(durations), default_rules())
    uncovered = [(durations[r["name"]], r["name"]) for r in rows if r["stage"] == "other"]
    other = sum(d for d, _ in uncovered)
    coverage = 1 - other / total
    worst = "; ".join(f"{100 * d / total:.2f}% {n[:100]}" for d, n in sorted(uncovered, reverse=True)[:5])
    assert coverage >= MIN_COVERAGE, f"{label}: {100 * coverage:.2f}% classified; top unclassified: {worst}"


@needs_traces
@pytest.mark.parametrize("path", _kineto_traces(), ids=lambda p: str(p.relative_to(TRACES)))
def test_kineto_trace_coverage(path):
    doc = _load_json(path)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    durations: Counter[str] = Counter()
    for e in events:
        # gt_phase:: annotations are user_annotation / gpu_user_annotation events, not kernels
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            durations[e["name"]] += float(e.get("dur", 0.0))
    _assert_covered(durations, str(path.relative_to(TRACES)))


def test_kineto_traces_are_found():
    if not TRACES.is_dir():
        pytest.skip(f"sample traces not available ({TRACES} is absent on this machine)")
    assert len(_kineto_traces()) >= 10


@needs_traces
def test_rocprofv1_csv_coverage():
    durations: Counter[str] = Counter()
    with open(TRACES / "rocprofv1-llamacpp-r9700" / "results.csv", newline="") as f:
        for row in csv.DictReader(f):
            durations[row["KernelName"]] += int(row["DurationNs"])
    _assert_covered(durations, "rocprofv1 results.csv")


@needs_traces
def test_rocpd_coverage():
    db = TRACES / "rocpd-llamacpp-r9700" / "32432_results.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        durations: Counter[str] = Counter()
        for name, dur in con.execute("SELECT name, duration FROM kernels"):
            durations[name] += int(dur)
    finally:
        con.close()
    _assert_covered(durations, "rocpd kernels view")


@needs_traces
def test_nsys_sqlite_coverage():
    db = TRACES / "nsys-sqlite-nvfuser-h200" / "report1.sqlite"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        durations: Counter[str] = Counter()
        query = (
            "SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = k.demangledName"
        )
        for name, dur in con.execute(query):
            durations[name] += int(dur)
    finally:
        con.close()
    _assert_covered(durations, "nsys CUPTI_ACTIVITY_KIND_KERNEL")


@needs_traces
def test_rocprofv3_json_coverage():
    doc = _load_json(TRACES / "rocprofv3-json-mi350x-training" / "908_results.json.gz")
    tool = doc["rocprofiler-sdk-tool"][0]
    symbols = {s["kernel_id"]: s["kernel_name"] for s in tool["kernel_symbols"]}
    durations: Counter[str] = Counter()
    for d in tool["buffer_records"]["kernel_dispatch"]:
        name = symbols[d["dispatch_info"]["kernel_id"]]
        durations[name] += d["end_timestamp"] - d["start_timestamp"]
    _assert_covered(durations, "rocprofv3 kernel_dispatch")


@needs_traces
@pytest.mark.parametrize("stage", ["all-stage", "prefill", "decode"])
def test_nsys_stats_csv_coverage(stage):
    path = TRACES / "nsys-stats-csv-deepseek-ocr-rtx5090" / stage / "summary_cuda_gpu_kern_sum.csv"
    durations: Counter[str] = Counter()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            durations[row["Name"]] += float(row["Total Time (ns)"])
    _assert_covered(durations, f"nsys cuda_gpu_kern_sum {stage}")
