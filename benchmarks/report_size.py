"""Size and build time of the HTML report on the largest traces at hand.

Usage::

    python benchmarks/report_size.py                 # MI350X rocprofv3 trace + benchmarks/data/dense-250MB.json
    python benchmarks/report_size.py TRACE [TRACE]   # your own (each analysed as one run)

For each trace: the time of the analysis (read + classify + phases + roofline + findings), of
``build_summary``, and of what the report adds on top (figures + page assembly, then the file write),
the page size with plotly.js embedded and with ``--cdn``, and the number of timeline bars drawn.
The page must stay under 10 MB (exit status 1 otherwise). Times are wall seconds in this process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "traces"
DEFAULTS = [
    SHARED / "rocprofv3-json-mi350x-training" / "908_results.json.gz",  # 43,915 dispatches: most kernels
    HERE / "data" / "dense-250MB.json",  # made by benchmarks/run.py (scale_trace.py)
]
LIMIT_BYTES = 10_000_000

sys.path.insert(0, str(ROOT))


def measure(path: Path) -> dict[str, float | int | str]:
    from analyzer.output import write_report
    from analyzer.report import figures, html
    from analyzer.results.summary import build_summary
    from analyzer.runtime.driver import RunPolicy, analyze

    t0 = time.perf_counter()
    analysis = analyze([str(path)], policy=RunPolicy(keep_host_ops=True))
    t1 = time.perf_counter()
    summary = build_summary(analysis)
    t2 = time.perf_counter()
    page = html.render_report(analysis, summary)
    t3 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "report.html"
        write_report(html.HtmlReporter(analysis.kernels), summary, out)
        t4 = time.perf_counter()
        size = out.stat().st_size
    t5 = time.perf_counter()
    timeline = figures.timeline(analysis.kernels, summary["steps"])
    bars = sum(len(t.x) for t in timeline.data) if timeline is not None else 0
    t6 = time.perf_counter()
    cdn = len(html.render_report(analysis, summary, cdn=True).encode())
    return {
        "trace": str(path.relative_to(ROOT.parent)) if path.is_relative_to(ROOT.parent) else str(path),
        "trace_mb": path.stat().st_size / 1e6,
        "kernels": analysis.kernels.num_rows,
        "analyze_s": t1 - t0,
        "summary_s": t2 - t1,
        "render_s": t3 - t2,
        "write_s": t4 - t3,  # render again + write: what `--html` costs end to end
        "timeline_s": t6 - t5,
        "bars": bars,
        "page_mb": size / 1e6,
        "page_chars_mb": len(page.encode()) / 1e6,
        "cdn_mb": cdn / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path, help="traces to report (default: the largest known ones)")
    args = ap.parse_args(argv)
    paths = args.traces or [p for p in DEFAULTS if p.exists()]
    if not paths:
        print("no trace found: pass one, or make benchmarks/data/dense-250MB.json with benchmarks/run.py")
        return 2
    heads = ["trace", "trace MB", "kernels", "analyze s", "summary s", "report s", "render+write s", "timeline s",
             "bars", "page MB", "--cdn MB"]  # fmt: skip
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    ok = True
    for p in paths:
        r = measure(p)
        ok &= r["page_mb"] * 1e6 < LIMIT_BYTES
        print(f"| {r['trace']} | {r['trace_mb']:.1f} | {r['kernels']:,} | {r['analyze_s']:.1f} | {r['summary_s']:.1f} "
              f"| {r['render_s']:.2f} | {r['write_s']:.2f} | {r['timeline_s']:.2f} | {r['bars']:,} | {r['page_mb']:.2f} "
              f"| {r['cdn_mb']:.2f} |", flush=True)  # fmt: skip
    if not ok:
        print(f"FAIL: a page is {LIMIT_BYTES / 1e6:.0f} MB or more")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
