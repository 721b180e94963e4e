"""Where ``analyze`` spends its time, without a profiler's overhead: wall time per pipeline stage.

Usage::

    python benchmarks/stages.py benchmarks/data/dense-1GB.json [--json OUT]

Runs ``llm-kernel-map analyze FILE --json OUT`` in this process with a timer wrapped around each of
the functions listed in ``STAGES`` (module attributes, looked up at call time, so wrapping them is
enough); the findings checks are timed one by one through ``findings.CHECKS``. Rows form the call
tree as it happened (a function called from two places shows twice); times are inclusive. A function
the code no longer has is skipped, one never called is not listed. cProfile (``run.py --profile``) gives the function-level detail but
inflates Python-heavy code about 2x; these numbers are the real proportions.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

T_START = time.perf_counter()

# (module, attribute) of the functions timed; the tree shown is the one they were called in
STAGES: list[tuple[str, str]] = [
    ("analyzer.runtime.driver", "analyze"),
    ("analyzer.runtime.rank_workers", "analyze_parts"),
    ("analyzer.runtime.driver", "load_inputs"),
    ("analyzer.runtime.loading", "read_traces"),
    ("analyzer.runtime.cache", "load_trace"),
    ("analyzer.runtime.cache", "cache_key"),
    ("analyzer.runtime.cache", "read_entry"),
    ("analyzer.runtime.cache", "_try_write"),
    ("analyzer.readers", "read_trace"),
    ("analyzer.readers.kineto", "read"),
    ("analyzer.runtime.chunked_kineto", "read_events"),
    # kineto.py imports stream_events by name: it is wrapped where it is looked up
    ("analyzer.readers.kineto", "stream_events"),
    ("analyzer.readers.kineto_scan", "_decode_at_boundary"),
    ("analyzer.readers.kineto_scan", "decode_last"),
    ("analyzer.readers.kineto_events", "TableBuilder.add"),
    ("analyzer.readers.kineto_events", "_gpu_table"),
    ("analyzer.readers.kineto_events", "_op_table"),
    ("analyzer.readers.kineto_events", "_call_table"),
    ("analyzer.readers.kineto_events", "_ann_table"),
    ("analyzer.readers", "file_sha256"),
    ("analyzer.readers.kineto", "_post_process"),
    ("analyzer.readers.kineto", "_host_ops"),
    ("analyzer.readers.kineto", "_launch_info"),
    ("analyzer.model", "Trace.validate"),
    ("analyzer.pipeline", "analyze_trace"),
    ("analyzer.runtime.background", "wait"),
    ("analyzer.pipeline", "classify_step"),
    ("analyzer.analyses.classify", "classify_kernels"),
    ("analyzer.analyses.classify", "classify_by_name"),
    ("analyzer.analyses.classify", "launching_ops"),
    ("analyzer.analyses.walk.grammar", "walk_sequence"),
    ("analyzer.analyses.walk.eager_ops", "compose_attention"),
    ("analyzer.pipeline", "phases_step"),
    ("analyzer.analyses.phases", "label_phases"),
    ("analyzer.analyses.phases", "coverage_warnings"),
    # the package's modules look each other's functions up by name: each is wrapped where it is looked up
    ("analyzer.analyses.phases.split", "split_phases"),
    ("analyzer.analyses.phases.split", "_steps_from_annotations"),
    ("analyzer.analyses.phases.split", "_steps_from_structure"),
    ("analyzer.analyses.phases.structure", "label_steps"),
    ("analyzer.analyses.phases.annotated", "_step_row"),
    ("analyzer.analyses.phases.structure", "_step_row"),
    ("analyzer.pipeline", "roofline_step"),
    ("analyzer.analyses.roofline", "measure"),
    ("analyzer.analyses.roofline", "rate_warnings"),
    # looked up where they are called: measure calls kernel_work and rates by its own module's names
    ("analyzer.analyses.roofline.measurement", "kernel_work"),
    ("analyzer.analyses.roofline.formulas", "op_work"),
    ("analyzer.analyses.roofline.measurement", "rates"),
    ("analyzer.pipeline", "run_warnings_step"),
    ("analyzer.pipeline", "findings_step"),
    ("analyzer.analyses.findings", "find"),
    ("analyzer.analyses.findings", "check_all"),
    ("analyzer.analyses.findings", "CHECKS"),
    ("analyzer.results.summary", "build_summary"),
    ("analyzer.tables.frames", "to_frame"),
    ("analyzer.results.summary", "totals"),
    ("analyzer.results.summary", "phase_summary"),
    ("analyzer.results.summary", "stage_rows"),
    ("analyzer.results.summary", "provider_rows"),
    ("analyzer.results.summary", "group_rows"),
    ("analyzer.results.summary", "top_kernels"),
    ("analyzer.results.summary", "unclassified"),
    ("analyzer.results.summary", "step_rows"),
    ("analyzer.report.text", "render"),
    ("analyzer.cli.analyze", "write_json"),
]

# (path of labels from the outermost timed caller) -> [calls, seconds]; first-seen order kept
TIMES: dict[tuple[str, ...], list[float]] = {}
_STACK: list[str] = []


def _timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        if label in _STACK:  # recursion: the outermost call counts
            return fn(*a, **k)
        _STACK.append(label)
        key = tuple(_STACK)
        acc = TIMES.setdefault(key, [0, 0.0])
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[0] += 1
            acc[1] += time.perf_counter() - t0
            _STACK.pop()

    return wrapper


def install() -> None:
    """Wrap every listed function that exists."""
    done: set[str] = set()
    for modname, attr in STAGES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        short = modname.removeprefix("analyzer.")
        if attr == "CHECKS":
            checks = getattr(mod, "CHECKS", None)
            if isinstance(checks, dict):
                for name, fn in list(checks.items()):
                    checks[name] = _timed(f"{short}.CHECKS[{name}]", fn)
            continue
        owner: Any = mod
        parts = attr.split(".")
        for p in parts[:-1]:
            owner = getattr(owner, p, None)
        label = f"{short}.{attr}"
        if owner is None or not callable(getattr(owner, parts[-1], None)) or label in done:
            continue
        setattr(owner, parts[-1], _timed(label, getattr(owner, parts[-1])))
        done.add(label)


def tree(total: float) -> tuple[list[str], list[dict[str, Any]]]:
    """Rows in call-tree order (children after their parent, in first-call order)."""
    keys = list(TIMES)
    lines: list[str] = []
    data: list[dict[str, Any]] = []

    def emit(prefix: tuple[str, ...]) -> None:
        for k in keys:
            if len(k) == len(prefix) + 1 and k[: len(prefix)] == prefix:
                calls, secs = TIMES[k]
                depth = len(k) - 1
                lines.append(
                    f"{'  ' * depth + k[-1]:<60} {int(calls):>7} {secs:>8.2f} {100 * secs / total:>5.1f}%"
                )
                data.append({"depth": depth, "stage": k[-1], "calls": int(calls), "seconds": round(secs, 3)})
                emit(k)

    emit(())
    return lines, data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", type=Path)
    p.add_argument("--json", type=Path, help="also write the stage times here")
    p.add_argument(
        "--use-cache", action="store_true", help="use $LKM_CACHE_DIR as it is (default: a fresh empty cache)"
    )
    a = p.parse_args(argv)
    fresh = None
    if not a.use_cache:  # time a first analysis: parse, then write the parsed-trace cache
        fresh = tempfile.TemporaryDirectory(prefix="lkm-stages-cache-")
        os.environ["LKM_CACHE_DIR"] = fresh.name
    t_imp = time.perf_counter()
    from analyzer.cli import main as cli_main

    install()
    t_run = time.perf_counter()
    imports = t_run - t_imp
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["analyze", str(a.file), "--json", str(Path(tmp) / "out.json")])
    total = time.perf_counter() - T_START
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = [
        f"stages of `llm-kernel-map analyze {a.file.name}` (exit {rc}): {total:.2f} s in all "
        f"(of which importing the CLI {imports:.2f} s), peak RSS {rss / 1e6:,.0f} MB",
        "",
        f"{'stage (inclusive times)':<60} {'calls':>7} {'seconds':>8} {'share':>6}",
    ]
    if fresh is not None:
        fresh.cleanup()
    lines, data = tree(total)
    out += lines
    print("\n".join(out))
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "file": str(a.file),
                    "rc": rc,
                    "total_s": total,
                    "import_s": imports,
                    "peak_rss": rss,
                    "stages": data,
                },
                indent=1,
            )
            + "\n"
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
