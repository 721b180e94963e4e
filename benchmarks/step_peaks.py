"""Peak RSS of the analysing process per pipeline step of one ``analyze FILE --json OUT --no-cache``.

Usage: ``PYTHONPATH=. python benchmarks/step_peaks.py FILE``. A thread samples this process's RSS
every 20 ms and files each sample under the step running then (the read, taking the launch calls
out of the host ops, each input and run step, the summary; "after X" between steps). The worker
processes of the read are not counted. docs/performance.md ("Where the memory goes, per step").
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SAMPLE_S = 0.02


def main(path: str) -> int:
    argv = ["analyze", path, "--json", os.devnull, "--no-cache"]
    from analyzer.runtime import memory

    memory.configure(argv)  # before pyarrow loads, as the CLI does
    current = ["imports"]
    peaks: dict[str, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")

    def sample() -> None:
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            peaks[current[0]] = max(peaks.get(current[0], 0), rss)
            time.sleep(SAMPLE_S)

    def step(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            current[0] = name
            try:
                return fn(*args, **kwargs)
            finally:
                current[0] = f"after {name}"

        return run

    import analyzer.pipeline as pipeline
    import analyzer.results.summary as summary
    import analyzer.runtime.driver as driver
    from analyzer.tables import launches

    for name in ("classify_step", "phases_step", "roofline_step", "run_warnings_step", "findings_step"):
        setattr(pipeline, name, step(name.removesuffix("_step"), getattr(pipeline, name)))
    pipeline.INPUT_STEPS = (pipeline.classify_step, pipeline.phases_step, pipeline.roofline_step)
    pipeline.RUN_STEPS = (pipeline.run_warnings_step, pipeline.findings_step)
    driver.load_inputs = step("read", driver.load_inputs)
    launches.take_launch_calls = step("split", launches.take_launch_calls)
    summary.build_summary = step("summary", summary.build_summary)
    threading.Thread(target=sample, daemon=True).start()
    from analyzer.cli import main as cli

    start = time.perf_counter()
    rc = cli(argv)
    time.sleep(3 * SAMPLE_S)
    for name, rss in peaks.items():
        print(f"{name:20s} {rss / 1e6:8,.0f} MB", file=sys.stderr)
    print(
        f"rc {rc}, {time.perf_counter() - start:.1f} s, peak {max(peaks.values()) / 1e6:,.0f} MB",
        file=sys.stderr,
    )
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
