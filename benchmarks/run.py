"""Speed and memory of ``llm-kernel-map analyze`` on scaled real traces, against docs/performance.md's targets.

Usage::

    python benchmarks/run.py                      # 250MB and 1GB from the dense Llama trace
    python benchmarks/run.py --sizes 100MB --no-hta --no-gzip    # a quick look
    python benchmarks/run.py --profile            # also cProfile analyze on the largest file

Every measurement runs in its own child process, one at a time, so each peak RSS (``ru_maxrss`` of
the child, from ``wait4``) belongs to that measurement alone. The file is read before each
measurement so all of them see it in the page cache (the orjson child's ~7 GB per GB of JSON can
push it out). Per plain file:

* ``orjson``   ``orjson.loads`` of the file's bytes with the GC off: the time of the call alone
  (reading the bytes is reported apart), and the child's peak RSS;
* ``read``     the reader alone (``analyzer.readers.read_trace``), wall time inside the child;
* ``analyze``  the full CLI, ``llm-kernel-map analyze FILE --json OUT``, wall time of the whole process
  (interpreter start and imports included) and its peak RSS;
* ``hta``      HolisticTraceAnalysis 0.5 (own venv under benchmarks/data/hta-venv): ``TraceAnalysis``
  load + ``get_gpu_kernel_breakdown()``, when it installs;

and for the gzip copy of the same bytes: ``gunzip`` (decompressing it to nowhere, 16 MB reads) and
``analyze`` on the ``.json.gz``, its runs alternating with those of the plain file's ``analyze``
(at least ``GZ_PAIRS`` of each: their difference is small next to the spread between runs). Results: a table on stdout, ``benchmarks/results/latest.json`` and
``benchmarks/results/latest.md``.

Targets (docs/performance.md, 1 GB plain file): analyze time / orjson.loads time <= 1.0; analyze peak RSS /
file size <= 1.0; analyze(.gz) - analyze(plain) <= gunzip time.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime as dt
import functools
import gzip
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

# runs of the plain and the .json.gz analyze, alternating, at least: their difference, ~1 s against
# a run-to-run spread of 1-2 s on a shared 2-core machine, needs more than the best of two
GZ_PAIRS = 3

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data"
RESULTS = HERE / "results"
HTA_VENV = DATA / "hta-venv"
DEFAULT_SOURCE = ROOT / "fixtures" / "h200-llama3-8b-dense" / "trace.json.gz"
SOURCES = {
    "dense": DEFAULT_SOURCE,
    "moe": ROOT / "fixtures" / "h200-qwen3-30b-a3b-moe" / "trace.json.gz",
    "tp2-graph": ROOT / "fixtures" / "h200-tp2-llama3-8b-graph" / "rank0.json.gz",
    # kernel-dense: one request per step, no recorded shapes (~4.5 million GPU activities per 10 GB)
    "noshape": ROOT / "fixtures" / "zoo" / "llama-assisted-noshape-bf16" / "trace.json.gz",
}

sys.path.insert(0, str(HERE))
from scale_trace import parse_size, size_label  # noqa: E402

# --------------------------------------------------------------------------- child programs

ORJSON_CHILD = """
import gc, json, sys, time
import orjson
gc.disable()
t0 = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    data = f.read()
t1 = time.perf_counter()
c1 = time.process_time()
obj = orjson.loads(data)
t2 = time.perf_counter()
c2 = time.process_time()
n = len(obj["traceEvents"]) if isinstance(obj, dict) else len(obj)
print(json.dumps({"read_s": t1 - t0, "op_s": t2 - t1, "op_cpu_s": c2 - c1, "events": n}))
"""

READER_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from analyzer.readers import read_trace
t1 = time.perf_counter()
c1 = time.process_time()
t = read_trace(sys.argv[1])
t2 = time.perf_counter()
c2 = time.process_time()
print(json.dumps({"import_s": t1 - t0, "op_s": t2 - t1, "op_cpu_s": c2 - c1, "kernels": t.kernels.num_rows,
                  "host_ops": t.host_ops.num_rows}))
"""

GUNZIP_CHILD = """
import gzip, json, sys, time
t0 = time.perf_counter()
c0 = time.process_time()
n = 0
with gzip.open(sys.argv[1], "rb") as f:
    while True:
        b = f.read(16 << 20)
        if not b:
            break
        n += len(b)
print(json.dumps({"op_s": time.perf_counter() - t0, "op_cpu_s": time.process_time() - c0, "bytes": n}))
"""

HTA_CHILD = """
import json, logging, sys, time
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
kinds, kernels = a.get_gpu_kernel_breakdown(visualize=False)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "breakdown_s": t3 - t2, "op_s": t3 - t1,
                  "kernel_rows": len(kernels)}))
"""


def run_child(
    cmd: list[str], timeout: float, mem_limit: int | None = None, env: dict | None = None, sample: bool = True
) -> dict:
    """Run ``cmd``; return wall time, peak RSS (bytes), return code, its last JSON line and stderr tail.

    ``sample=False``: no PSS sampling (see :func:`tree_rss`), so the times are undisturbed; the peak
    is then that of the largest single process only."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:

        def limit() -> None:
            if mem_limit:
                resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))

        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        p = subprocess.Popen(
            cmd, stdout=out, stderr=err, cwd=ROOT, preexec_fn=limit, env={**os.environ, **(env or {})}
        )
        deadline = t0 + timeout
        killed = False
        tree_peak = 0
        next_sample = t0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if sample and time.perf_counter() >= next_sample:
                # reading smaps costs the kernel a page-table walk: only while there are workers,
                # and at most every 100 ms, so the sampling does not slow what it measures
                tree_peak = max(tree_peak, tree_rss(p.pid))
                next_sample = time.perf_counter() + 0.1
            if time.perf_counter() > deadline:
                p.kill()
                killed = True
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    res: dict = {
        "wall_s": round(wall, 3),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),  # user + system time of the whole process
        # the process and its worker processes together: the sum of their proportional set sizes,
        # sampled every 100 ms while it has workers; never below the kernel's own peak RSS of the single largest process
        "peak_rss": max(ru.ru_maxrss * 1024, tree_peak),
        "peak_rss_largest_process": ru.ru_maxrss * 1024,
        "rc": p.returncode,
        "load1_before": round(load, 2),  # other work on the machine skews the times
        "sampled": sample,
    }
    if killed:
        res["error"] = f"timed out after {timeout:.0f} s"
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                res.update(json.loads(line))
                break
    if p.returncode != 0 and "error" not in res:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-3:]
        res["error"] = " | ".join(tail)[-400:] or f"exit code {p.returncode}"
    return res


def timed_runs(once: Callable[[bool], dict], repeat: int) -> dict:
    """The best wall time of ``repeat`` runs of ``once(sample=False)``, with the peak memory of one
    more run, sampled: reading every process's smaps (:func:`tree_rss`) takes its memory-map lock and
    walks its page tables ten times a second, work that competes with what is timed, so time and
    memory come from different runs of the same command."""
    return timed_alternating([once], repeat)[0]


def timed_alternating(onces: list[Callable[[bool], dict]], repeat: int) -> list[dict]:
    """:func:`timed_runs` of several commands whose times are compared, their runs alternating (a, b,
    b, a, a, b, ...) so that other work on the machine, which comes and goes over minutes, weighs on
    each of them alike: measured one after the other, a load that only one of them met showed as a
    difference of 2 s in 12 s here."""
    runs: list[list[dict]] = [[] for _ in onces]
    for i in range(repeat):
        order = range(len(onces)) if i % 2 == 0 else reversed(range(len(onces)))
        for j in order:
            runs[j].append(onces[j](False))
    out = []
    for rs in runs:
        good = [r for r in rs if r["rc"] == 0] or rs
        r = min(good, key=lambda x: x["wall_s"])
        if len(rs) > 1:
            r["runs"] = [x["wall_s"] for x in rs]
        out.append(r)
    # the first command's sampled run comes last: what it leaves (its cache entry) is there after
    for j in reversed(range(len(onces))):
        m = onces[j](True)
        out[j]["peak_rss"] = max(out[j]["peak_rss"], m["peak_rss"])
        out[j]["memory_run"] = {k: m[k] for k in ("wall_s", "cpu_s", "peak_rss", "rc")}
    return out


def tree_rss(pid: int) -> int:
    """Memory of ``pid`` and all its descendants now: the sum of their proportional set sizes (PSS),
    so pages a forked worker shares with its parent count once (0 when it is gone, or when it has no
    worker processes: then its own peak RSS from ``wait4`` is exact)."""
    if not _children(pid):
        return 0
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue
        todo += _children(p)
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        pass
    return out


# --------------------------------------------------------------------------- inputs


def _rel(p: Path) -> str:
    p = Path(p).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def ensure_plain(source: Path, size: int, name: str) -> Path:
    out = DATA / f"{name}-{size_label(size)}.json"
    if not out.exists():
        print(f"making {_rel(out)} ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, str(HERE / "scale_trace.py"), str(source), "--size", str(size), "-o", str(out)],
            check=True,
        )
    return out


def ensure_gzip(plain: Path) -> Path:
    out = plain.with_name(plain.name + ".gz")
    if not out.exists() or out.stat().st_mtime < plain.stat().st_mtime:
        print(f"compressing {_rel(out)} ...", file=sys.stderr)
        tmp = out.with_name(out.name + ".part")
        with open(plain, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
        tmp.replace(out)
    return out


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def hta_python() -> Path | None:
    """The HTA venv's python, creating it (pip from the registry) on first use; None if that fails."""
    py = HTA_VENV / "bin" / "python"
    ok = (
        py.exists()
        and subprocess.run([str(py), "-c", "import hta.trace_analysis"], capture_output=True).returncode == 0
    )
    if ok:
        return py
    print("installing HolisticTraceAnalysis into benchmarks/data/hta-venv ...", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "HolisticTraceAnalysis"], check=True, capture_output=True
        )
        subprocess.run([str(py), "-c", "import hta.trace_analysis"], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as e:
        print(f"HolisticTraceAnalysis not available ({e}); skipping it", file=sys.stderr)
        return None
    return py


def cli_cmd() -> list[str]:
    script = Path(sys.executable).parent / "llm-kernel-map"
    return [str(script)] if script.exists() else [sys.executable, "-m", "analyzer"]


# --------------------------------------------------------------------------- measurements


def measure_file(plain: Path, args: argparse.Namespace, hta_py: Path | None) -> dict:
    size = plain.stat().st_size
    row: dict = {"file": _rel(plain), "bytes": size}
    out_json = DATA / "bench-out.json"
    timeout = args.timeout
    py = sys.executable

    def best(cmd: list[str], **kw) -> dict:
        return best_of(lambda: run_child(cmd, timeout, **kw))

    def best_of(once) -> dict:  # noqa: ANN001
        runs = [once() for _ in range(args.repeat)]
        good = [r for r in runs if r["rc"] == 0] or runs
        key = "op_s" if "op_s" in good[0] else "wall_s"
        r = min(good, key=lambda r: r.get(key, r["wall_s"]))
        if len(runs) > 1:
            r["runs"] = [x.get(key, x["wall_s"]) for x in runs]
        return r

    warm(plain)
    cache = DATA / "bench-cache"  # the parsed-trace cache of the analyze runs; emptied before each cold one

    def cold(target: Path) -> list[str]:
        shutil.rmtree(cache, ignore_errors=True)
        return [*cli_cmd(), "analyze", str(target), "--json", str(out_json)]

    env = {"LKM_CACHE_DIR": str(cache)}

    def analyze_cold(target: Path, sample: bool) -> dict:
        return run_child(cold(target), timeout, env=env, sample=sample)

    gz = ensure_gzip(plain) if args.gzip else None
    for step in ("orjson", "read", "analyze", "analyze_cached"):
        print(f"  {plain.name}: {step} ...", file=sys.stderr, flush=True)
        # orjson's 7 GB of objects (1 GB file) may push the file out of the page cache: every
        # measurement starts with it cached, as it is for the orjson call
        warm(plain)
        if step == "orjson":
            row[step] = best([py, "-c", ORJSON_CHILD, str(plain)])
        elif step == "read":
            row[step] = best([py, "-c", READER_CHILD, str(plain)])
        elif step == "analyze":
            # the .json.gz's analyze runs alternate with these: their difference is a target
            targets = [plain, gz] if gz else [plain]
            for target in targets[1:]:
                warm(target)
            got = timed_alternating(
                [functools.partial(analyze_cold, t) for t in targets],
                max(args.repeat, GZ_PAIRS) if gz else args.repeat,
            )
            row[step] = got[0]
            if gz:
                row["gz_bytes"] = gz.stat().st_size
                row["analyze_gz"] = got[1]
        else:  # the cache now holds this file's tables: a second analyze reads them instead
            row[step] = run_child(
                [*cli_cmd(), "analyze", str(plain), "--json", str(out_json)], timeout, env=env
            )
        print(f"    {_brief(row[step])}", file=sys.stderr)
    if gz:
        warm(gz)
        print(f"  {gz.name}: gunzip ...", file=sys.stderr, flush=True)
        row["gunzip"] = best([py, "-c", GUNZIP_CHILD, str(gz)])
        print(f"    {_brief(row['gunzip'])}; analyze: {_brief(row['analyze_gz'])}", file=sys.stderr)
    shutil.rmtree(cache, ignore_errors=True)
    if hta_py is not None:
        tdir = DATA / "hta-dirs" / plain.stem
        tdir.mkdir(parents=True, exist_ok=True)
        for old in tdir.iterdir():
            old.unlink()
        (tdir / plain.name).symlink_to(plain.resolve())
        print(f"  {plain.name}: HolisticTraceAnalysis ...", file=sys.stderr, flush=True)
        limit = int(_ram_bytes() * 0.85) if _ram_bytes() else None
        row["hta"] = run_child([str(hta_py), "-c", HTA_CHILD, str(tdir)], args.hta_timeout, mem_limit=limit)
        print(f"    {_brief(row['hta'])}", file=sys.stderr)
    with contextlib.suppress(FileNotFoundError):
        out_json.unlink()
    _ratios(row)
    return row


def measure_ranks(plain: Path, n: int, args: argparse.Namespace) -> dict:
    """Analyze one rank trace, then ``n`` of them as one run (cold cache both times)."""
    folder = DATA / f"ranks-{plain.stem}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ranks = []
    for i in range(n):  # hard links: n rank files at no disk cost; the rank comes from the name
        r = folder / f"rank{i}.json"
        os.link(plain, r)
        ranks.append(r)
    warm(plain)
    cache = DATA / "bench-cache"
    out_json = DATA / "bench-out.json"
    env = {"LKM_CACHE_DIR": str(cache)}
    row: dict = {"file": _rel(plain), "bytes": plain.stat().st_size, "ranks": n}
    for key, files in (("one", ranks[:1]), ("all", ranks)):
        print(f"  {len(files)} x {plain.name} ...", file=sys.stderr, flush=True)

        def once(sample: bool, files: list[Path] = files) -> dict:
            shutil.rmtree(cache, ignore_errors=True)
            cmd = [*cli_cmd(), "analyze", *map(str, files), "--json", str(out_json)]
            return run_child(cmd, args.timeout, env=env, sample=sample)

        row[key] = timed_runs(once, args.repeat)
        print(f"    {_brief(row[key])}", file=sys.stderr)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    if _ok(row["one"]) and _ok(row["all"]):
        row["all_over_one"] = round(row["all"]["wall_s"] / row["one"]["wall_s"], 2)
    return row


BIG_RSS_LIMIT = (
    2 * 10**9
)  # issue 38: a 10 GB trace of any shape in 2 GB (docs/performance.md caps it at 3 GB)


def measure_big(plain: Path, args: argparse.Namespace) -> dict:
    """One cold ``analyze`` of a trace bigger than the others (10 GB): its time and peak memory."""
    cache = DATA / "bench-cache"
    out_json = DATA / "bench-out.json"
    shutil.rmtree(cache, ignore_errors=True)
    print(f"  {plain.name}: analyze ...", file=sys.stderr, flush=True)
    cmd = [*cli_cmd(), "analyze", str(plain), "--json", str(out_json)]
    r = run_child(cmd, args.timeout, env={"LKM_CACHE_DIR": str(cache)})
    print(f"    {_brief(r)}", file=sys.stderr)
    shutil.rmtree(cache, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        out_json.unlink()
    return {"file": _rel(plain), "bytes": plain.stat().st_size, "analyze": r}


def big_table(rows: list[dict]) -> str:
    lines = ["| file | MB | analyze s | peak RSS MB | under 2 GB |", "|---|---|---|---|---|"]
    for r in rows:
        a = r["analyze"]
        ok = "yes" if _ok(a) and a["peak_rss"] < BIG_RSS_LIMIT else "NO"
        lines.append(
            f"| {Path(r['file']).name} | {r['bytes'] / 1e6:,.0f} | {_fmt_t(a)} | {_fmt_m(a)} | {ok} |"
        )
    return "\n".join(lines)


def ranks_table(rows: list[dict]) -> str:
    lines = [
        "| rank file | MB | ranks | one rank: analyze s | RSS MB | all ranks: analyze s | RSS MB | all / one (<=5) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r.get("all_over_one")
        lines.append(
            f"| {Path(r['file']).name} | {r['bytes'] / 1e6:,.0f} | {r['ranks']} | {_fmt_t(r.get('one'))} "
            f"| {_fmt_m(r.get('one'))} | {_fmt_t(r.get('all'))} | {_fmt_m(r.get('all'))} "
            f"| {_fmt_r(ratio, 5.0)} |"
        )
    return "\n".join(lines)


def _brief(r: dict) -> str:
    s = f"wall {r['wall_s']:.2f} s, cpu {r['cpu_s']:.2f} s, peak RSS {r['peak_rss'] / 1e6:,.0f} MB"
    if "op_s" in r:
        s += f", op {r['op_s']:.2f} s"
    if r.get("error"):
        s += f", ERROR: {r['error']}"
    return s


def _ok(r: dict | None) -> bool:
    return r is not None and r.get("rc") == 0 and not r.get("error")


def _ratios(row: dict) -> None:
    size = row["bytes"]
    rat: dict = {}
    oj = row["orjson"]["op_s"] if _ok(row.get("orjson")) else None
    for key in ("analyze", "read"):
        r = row.get(key)
        if _ok(r) and oj:
            t = r["wall_s"] if key == "analyze" else r["op_s"]
            rat[f"{key}_time_over_orjson"] = round(t / oj, 3)
            rat[f"{key}_rss_over_file"] = round(r["peak_rss"] / size, 3)
    # CPU time: far less sensitive than wall time to other work on a shared machine
    if _ok(row.get("analyze")) and _ok(row.get("orjson")) and row["orjson"].get("op_cpu_s"):
        rat["analyze_cpu_over_orjson_cpu"] = round(row["analyze"]["cpu_s"] / row["orjson"]["op_cpu_s"], 3)
    if _ok(row.get("read")) and _ok(row.get("orjson")) and row["orjson"].get("op_cpu_s"):
        rat["read_cpu_over_orjson_cpu"] = round(row["read"]["op_cpu_s"] / row["orjson"]["op_cpu_s"], 3)
    if _ok(row.get("analyze_gz")) and _ok(row.get("analyze")) and _ok(row.get("gunzip")):
        extra = row["analyze_gz"]["wall_s"] - row["analyze"]["wall_s"]
        rat["gz_extra_s"] = round(extra, 3)
        rat["gz_extra_over_gunzip"] = round(extra / row["gunzip"]["op_s"], 3)
        extra_cpu = row["analyze_gz"]["cpu_s"] - row["analyze"]["cpu_s"]
        rat["gz_extra_cpu_over_gunzip_cpu"] = round(extra_cpu / row["gunzip"]["op_cpu_s"], 3)
    if _ok(row.get("hta")) and _ok(row.get("analyze")):
        rat["hta_time_over_analyze"] = round(row["hta"]["wall_s"] / row["analyze"]["wall_s"], 2)
    if _ok(row.get("hta")) and _ok(row.get("read")):
        rat["hta_time_over_read"] = round(row["hta"]["wall_s"] / row["read"]["op_s"], 2)
    row["ratios"] = rat


# --------------------------------------------------------------------------- profile


def profile(plain: Path, top: int) -> str:
    """cProfile the full CLI on ``plain``; write benchmarks/data/prof.out; return the summary text."""
    import io
    import pstats

    prof = DATA / "prof.out"
    out_json = DATA / "bench-out.json"
    print(f"profiling analyze on {plain.name} ...", file=sys.stderr, flush=True)
    cache = DATA / "bench-cache"
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(prof),
            "-m",
            "analyzer",
            "analyze",
            str(plain),
            "--json",
            str(out_json),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "LKM_CACHE_DIR": str(cache)},
    )
    wall = time.perf_counter() - t0
    shutil.rmtree(cache, ignore_errors=True)
    buf = io.StringIO()
    buf.write(
        f"cProfile of `llm-kernel-map analyze {_rel(plain)}` "
        f"(exit {p.returncode}, {wall:.1f} s under the profiler)\n"
    )
    if p.returncode != 0:
        buf.write(f"stderr: {p.stderr.strip()[-400:]}\n")
    if prof.exists():
        st = pstats.Stats(str(prof), stream=buf)
        total = st.total_tt  # type: ignore[attr-defined]
        buf.write(f"total {total:.2f} s of profiled time\n")
        buf.write("\n## the project's functions (analyzer/), by cumulative time\n")
        st.sort_stats("cumulative").print_stats(r"/analyzer/", top)
        buf.write("\n## everything, by own time\n")
        st.sort_stats("tottime").print_stats(top)
    site = str(Path(sys.prefix) / "lib")
    buf = io.StringIO(buf.getvalue().replace(str(ROOT) + "/", "").replace(site, "<venv>/lib"))
    with contextlib.suppress(FileNotFoundError):
        out_json.unlink()
    return buf.getvalue()


# --------------------------------------------------------------------------- report


def _ram_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def machine() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    vers = {}
    for pkg in ("orjson", "msgspec", "pyarrow", "numpy", "pandas"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            vers[pkg] = metadata.version(pkg)
    git = {}
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        git["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        git["dirty"] = bool(dirty)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": _ram_bytes(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": vers,
        "git": git,
    }


def _fmt_t(r: dict | None, key: str = "wall_s") -> str:
    if r is None:
        return "-"
    if not _ok(r):
        return "FAIL"
    return f"{r.get(key, r['wall_s']):.2f}"


def _fmt_m(r: dict | None) -> str:
    if r is None:
        return "-"
    if not _ok(r):
        return "FAIL"
    return f"{r['peak_rss'] / 1e6:,.0f}"


def _fmt_r(v: float | None, target: float | None = None) -> str:
    if v is None:
        return "-"
    s = f"{v:.2f}"
    if target is not None:
        s += " ok" if v <= target else " OVER"
    return s


def _load(row: dict) -> str:
    """The highest 1-minute load average any measurement of the row started under."""
    loads = [v["load1_before"] for v in row.values() if isinstance(v, dict) and "load1_before" in v]
    return f"{max(loads):.1f}" if loads else "-"


def table(rows: list[dict]) -> str:
    head = (
        "| file | MB | orjson.loads s | orjson RSS MB | read s | read RSS MB | analyze s | analyze RSS MB "
        "| analyze/orjson (<=1) | CPU analyze/orjson | RSS/file (<=1) | cached analyze s | gunzip s "
        "| analyze .gz s "
        "| .gz extra / gunzip (<=1) "
        "| HTA s | HTA RSS MB | HTA/analyze | load |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        rat = r["ratios"]
        lines.append(
            "| "
            + " | ".join(
                [
                    Path(r["file"]).name,
                    f"{r['bytes'] / 1e6:,.0f}",
                    _fmt_t(r.get("orjson"), "op_s"),
                    _fmt_m(r.get("orjson")),
                    _fmt_t(r.get("read"), "op_s"),
                    _fmt_m(r.get("read")),
                    _fmt_t(r.get("analyze")),
                    _fmt_m(r.get("analyze")),
                    _fmt_r(rat.get("analyze_time_over_orjson"), 1.0),
                    _fmt_r(rat.get("analyze_cpu_over_orjson_cpu")),
                    _fmt_r(rat.get("analyze_rss_over_file"), 1.0),
                    _fmt_t(r.get("analyze_cached")),
                    _fmt_t(r.get("gunzip"), "op_s"),
                    _fmt_t(r.get("analyze_gz")),
                    _fmt_r(rat.get("gz_extra_over_gunzip"), 1.0),
                    _fmt_t(r.get("hta")),
                    _fmt_m(r.get("hta")),
                    _fmt_r(rat.get("hta_time_over_analyze")),
                    _load(r),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def failures(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        for k in ("orjson", "read", "analyze", "analyze_cached", "gunzip", "analyze_gz", "hta"):
            if r.get(k) is not None and not _ok(r[k]):
                out.append(f"{Path(r['file']).name} {k}: {r[k].get('error')}")
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        "# Benchmark results (latest run)",
        "",
        f"Run {result['date']} on {m['cpu']}, {m['cores']} cores, {(m['ram_bytes'] or 0) / 2**30:.0f} GiB RAM, "
        f"Python {m['python']} ({', '.join(f'{k} {v}' for k, v in m['packages'].items())}); "
        f"commit {m['git'].get('commit', '?')}{' + local changes' if m['git'].get('dirty') else ''}.",
        f"Command: `{result['command']}`. Source trace: `{result['source']}`. "
        f"Times in seconds (best of {result['repeat']}; analyze of the plain and the .gz file: best of "
        f"{max(result['repeat'], GZ_PAIRS)}, their runs alternating), RSS = peak memory of the measured process "
        "and its worker processes together (the larger of: the sum of their proportional set sizes, "
        "sampled every 100 ms while it has workers; the peak RSS of the largest one). The analyze times "
        "(plain, .gz, ranks) come from runs without that sampling (it competes with what is timed); "
        "their memory from one more, sampled run.",
        "",
        "analyze s = wall time of the whole `llm-kernel-map analyze FILE --json OUT` process, first "
        "analysis (empty parsed-trace cache, so it parses and writes the cache); cached analyze s = "
        "the same command again, reading the cached tables; "
        "orjson.loads s = the call alone, GC off; read s = `read_trace` alone inside its process; "
        "CPU analyze/orjson = the same ratio in CPU time (user + system; the whole analyze process), "
        "which other work on the machine disturbs far less than wall time. "
        "load = highest 1-minute load average a measurement started under (2 cores: above ~1, other "
        "work was running and the times are inflated).",
        "",
        table(result["rows"]),
        "",
    ]
    sections = (
        (
            "rank_rows",
            ranks_table,
            "Ranks: the same command on one rank trace, then on all of them as one run (hard links of "
            "one scaled trace named `rank0.json` ..., so the rank comes from the name), cold cache.",
        ),
        (
            "big_rows",
            big_table,
            "Bigger than memory: one cold analyze of a trace grown to the size given by `--big` "
            "(target: peak memory under 2 GB on this 24 GB machine, for the benchmark trace and the "
            "kernel-dense one: `--big-sources dense,noshape`).",
        ),
    )
    for key, render, intro in sections:
        if result.get(key):
            lines += [intro, "", render(result[key]), ""]
    fails = failures(result["rows"])
    if fails:
        lines += ["Failures:", ""] + [f"- {f}" for f in fails] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--source",
        default="dense",
        help=f"trace to scale: one of {', '.join(SOURCES)} or a path (default dense)",
    )
    p.add_argument("--sizes", default="250MB,1GB", help="comma-separated target sizes (default 250MB,1GB)")
    p.add_argument("--files", nargs="*", type=Path, help="measure these plain .json files instead")
    p.add_argument("--repeat", type=int, default=1, help="runs per measurement, best kept (default 1)")
    p.add_argument("--no-gzip", dest="gzip", action="store_false", help="skip the .json.gz variant")
    p.add_argument("--no-hta", dest="hta", action="store_false", help="skip HolisticTraceAnalysis")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile analyze on the largest file (benchmarks/data/prof.out)",
    )
    p.add_argument("--profile-top", type=int, default=40, help="rows of the profile summary (default 40)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per measurement (default 1800)")
    p.add_argument("--hta-timeout", type=float, default=3600, help="seconds for HTA (default 3600)")
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update benchmarks/results")
    p.add_argument(
        "--ranks", type=int, default=8, help="rank traces analysed as one run (default 8; 0: skip)"
    )
    p.add_argument("--ranks-size", default="250MB", help="size of each rank trace (default 250MB)")
    p.add_argument(
        "--big", default="", help="also analyze one trace of this size (e.g. 10GB: peak memory under 2 GB)"
    )
    p.add_argument(
        "--big-sources",
        default="",
        help="comma-separated sources scaled to --big (default: --source; e.g. dense,noshape adds the "
        "kernel-dense trace)",
    )
    p.add_argument("--render", action="store_true", help="only rewrite results/latest.md from latest.json")
    a = p.parse_args(argv)
    if a.render:
        result = json.loads((RESULTS / "latest.json").read_text())
        (RESULTS / "latest.md").write_text(markdown(result))
        print(table(result["rows"]))
        return 0

    DATA.mkdir(parents=True, exist_ok=True)
    source = SOURCES.get(a.source, Path(a.source))
    name = a.source if a.source in SOURCES else source.name.split(".")[0]
    if a.files:
        files = [f.resolve() for f in a.files]
    else:
        files = [ensure_plain(source, parse_size(s), name) for s in a.sizes.split(",") if s.strip()]
    hta_py = hta_python() if a.hta else None
    # the package's bytecode, as an installed package has it: where PYTHONDONTWRITEBYTECODE is set,
    # a source checkout would otherwise compile its changed modules in every measured process
    compileall.compile_dir(ROOT / "analyzer", quiet=1)

    rows = []
    for f in files:
        print(f"{f.name} ({f.stat().st_size / 1e6:,.0f} MB)", file=sys.stderr)
        rows.append(measure_file(f, a, hta_py))
    rank_rows = []
    if a.ranks > 0:
        rank_file = ensure_plain(source, parse_size(a.ranks_size), name)
        print(f"{a.ranks} ranks of {rank_file.name}", file=sys.stderr)
        rank_rows.append(measure_ranks(rank_file, a.ranks, a))
    big_rows = []
    for big_source in (
        [x.strip() for x in (a.big_sources or a.source).split(",") if x.strip()] if a.big else []
    ):
        src = SOURCES.get(big_source, Path(big_source))
        big_name = big_source if big_source in SOURCES else src.name.split(".")[0]
        big_file = ensure_plain(src, parse_size(a.big), big_name)
        print(f"{big_file.name} ({big_file.stat().st_size / 1e6:,.0f} MB)", file=sys.stderr)
        big_rows.append(measure_big(big_file, a))
    result = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "source": _rel(source),
        "repeat": a.repeat,
        "machine": machine(),
        "targets": {
            "analyze_time_over_orjson": 1.0,
            "analyze_rss_over_file": 1.0,
            "gz_extra_over_gunzip": 1.0,
        },
        "hta": "measured" if hta_py else ("skipped (--no-hta)" if not a.hta else "not installable"),
        "rows": rows,
        "rank_rows": rank_rows,
        "big_rows": big_rows,
    }
    print()
    print(table(rows))
    if rank_rows:
        print()
        print(ranks_table(rank_rows))
    if big_rows:
        print()
        print(big_table(big_rows))
    for f in failures(rows):
        print(f"FAILED {f}")
    if a.profile:
        biggest = max(files, key=lambda f: f.stat().st_size)
        print(f"timing the stages of analyze on {biggest.name} ...", file=sys.stderr, flush=True)
        st = subprocess.run(
            [sys.executable, str(HERE / "stages.py"), str(biggest)], cwd=ROOT, capture_output=True, text=True
        )
        stages_text = st.stdout + (f"\nstderr: {st.stderr.strip()[-400:]}\n" if st.returncode else "")
        text = profile(biggest, a.profile_top)
        result["profile"] = _rel(RESULTS / "profile-latest.txt")
        result["stages"] = _rel(RESULTS / "stages-latest.txt")
        if a.write:
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / "profile-latest.txt").write_text(text)
            (RESULTS / "stages-latest.txt").write_text(stages_text)
        print(stages_text)
        print(text)
    if a.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "latest.md").write_text(markdown(result))
        print(f"wrote {_rel(RESULTS / 'latest.json')} and latest.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
