"""Plain-text report: a one-screen summary of a summary dict, written to a stream."""

from __future__ import annotations

from typing import Any, TextIO

PHASE_ORDER = ("prefill", "decode", "mixed", "unknown")


def fmt_ns(ns: float | int | None) -> str:
    """Human duration: 812 ns, 12.3 us, 4.56 ms, 1.23 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _short(name: str, width: int = 80) -> str:
    name = " ".join(str(name).split())
    return name if len(name) <= width else name[: width - 3] + "..."


def _table(out: TextIO, headers: list[str], rows: list[list[str]], indent: str = "  ") -> None:
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    line = indent + "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers))
    out.write(line.rstrip() + "\n")
    for r in rows:
        cells = [c.rjust(widths[i]) if i and _numeric(c) else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.write((indent + "  ".join(cells)).rstrip() + "\n")


def _numeric(c: str) -> bool:
    return bool(c) and (c[0].isdigit() or c[0] == "-" and len(c) > 1)


def render(summary: dict[str, Any], out: TextIO, top: int = 10) -> None:
    """Write the one-screen summary of ``summary`` to ``out``."""
    ins = summary["inputs"]
    out.write("llm-kernel-map analysis\n")
    for i in ins:
        rank = f" rank {i['rank']}/{i['world_size']}" if i.get("world_size", 1) > 1 else ""
        out.write(f"  input {i['trace_id']}: {i['path']} ({i['format']}{rank})\n")
    gpu = summary.get("gpu") or {}
    if gpu.get("name"):
        peaks = gpu.get("peaks") or {}
        pk = ", ".join(
            f"{k} {v:g}" for k, v in peaks.items() if k in ("bf16_tflops", "fp8_tflops", "hbm_tbps")
        )
        out.write(
            f"  GPU: {gpu['name']}"
            + (f" ({gpu.get('arch')})" if gpu.get("arch") else "")
            + (f"; peaks {pk}" if pk else "")
            + "\n"
        )
    else:
        out.write(f"  GPU: unknown ({gpu.get('reason', 'not detected')}); times only, no roofline\n")
    if summary.get("model"):
        out.write(f"  model: {summary['model']}\n")
    if summary.get("annotations"):
        out.write(f"  step annotations: {', '.join(summary['annotations'])}\n")
    t = summary["totals"]
    ndev = t.get("devices", 1)
    across = f" (sum over {ndev} GPUs)" if ndev > 1 else ""
    out.write(
        f"  wall {fmt_ns(t['wall_ns'])}, GPU busy {fmt_ns(t['busy_ns'])}{across}, idle {fmt_pct(t['idle_fraction'])}, "
        f"kernel time {fmt_ns(t['kernel_ns'])} in {t['kernels']:,} GPU activities\n"
    )
    if t.get("aggregate_rows"):
        out.write(
            f"  note: {t['aggregate_rows']} rows are totals only (no timeline): phases and steps skip them\n"
        )
    _phases(summary, out)
    _stages(summary, out)
    _providers(summary, out)
    _top(summary, out, top)
    _unclassified(summary, out)
    if summary.get("ranks"):
        from analyzer.report.ranks_text import render_ranks

        render_ranks(summary, out)
    _findings(summary, out)
    for w in summary.get("warnings", []):
        out.write(f"warning: {w}\n")


def _phases(summary: dict[str, Any], out: TextIO) -> None:
    phases = summary.get("phases") or {}
    if not phases:
        return
    out.write("\nPhases\n")
    rows = []
    for p in PHASE_ORDER:
        ph = phases.get(p)
        if not ph:
            continue
        s = ph["step_ns"]
        rows.append(
            [
                p,
                str(ph["steps"]),
                fmt_ns(ph["kernel_ns"]),
                fmt_ns(s["p50"]),
                fmt_ns(s["p90"]),
                fmt_ns(s["p99"]),
                "-" if ph["tokens"] is None else f"{ph['tokens']:,}",
                fmt_pct(ph["idle_fraction"]),
            ]
        )
    _table(out, ["phase", "steps", "kernel time", "step p50", "p90", "p99", "tokens", "GPU idle"], rows)
    for p in PHASE_ORDER:
        ph = phases.get(p)
        if not ph or not ph["profile"]:
            continue
        out.write(f"\n  {p} profile\n")
        rows = [
            [r["label"], fmt_pct(r["share"]), fmt_ns(r["time_ns"]), r.get("bound") or "-"]
            for r in ph["profile"]
        ]
        _table(out, ["Category", "Time%", "time", "Bound-by"], rows, indent="    ")


def _stages(summary: dict[str, Any], out: TextIO) -> None:
    out.write("\nTime by stage\n")
    rows = [
        [r["phase"], r["stage"], r["provider"], fmt_ns(r["time_ns"]), fmt_pct(r["share"]), f"{r['count']:,}"]
        for r in summary["stages"][:25]
    ]
    _table(out, ["phase", "stage", "provider", "time", "share", "count"], rows)
    if len(summary["stages"]) > 25:
        out.write(f"  ... {len(summary['stages']) - 25} more (see --json)\n")


def _providers(summary: dict[str, Any], out: TextIO) -> None:
    out.write("\nTime by provider\n")
    rows = [
        [r["provider"], fmt_ns(r["time_ns"]), fmt_pct(r["share"]), f"{r['count']:,}"]
        for r in summary["providers"]
    ]
    _table(out, ["provider", "time", "share", "count"], rows)


def _rate(r: dict[str, Any]) -> str:
    """Achieved rate against the roof, as the kernel's bound says: TFLOP/s or TB/s and % of roof."""
    pct = r.get("pct_of_peak")
    if r.get("bound") == "compute" and r.get("achieved_tflops") is not None:
        val = f"{r['achieved_tflops']:.1f} TFLOP/s"
    elif r.get("achieved_tbps") is not None:
        val = f"{r['achieved_tbps']:.2f} TB/s"
    else:
        return "-"
    return val + (f" ({100 * pct:.0f}%)" if pct is not None else "")


def _top(summary: dict[str, Any], out: TextIO, top: int) -> None:
    out.write("\nTop kernels\n")
    rows = []
    for r in summary["top_kernels"][:top]:
        rows.append(
            [
                fmt_pct(r["share"]),
                fmt_ns(r["time_ns"]),
                f"{r['count']:,}",
                r["stage"],
                r["provider"],
                "/".join(r["phases"]),
                _rate(r),
                r.get("bound") or "-",
                _short(r["norm_name"], 60),
            ]
        )
    _table(
        out,
        ["share", "time", "count", "stage", "provider", "phase", "achieved (of roof)", "bound", "kernel"],
        rows,
    )


def _unclassified(summary: dict[str, Any], out: TextIO) -> None:
    rows = summary.get("unclassified") or []
    share = sum(r["share"] for r in rows)
    out.write(f"\nUnclassified: {fmt_pct(share)} of kernel time in {len(rows)} kernel names\n")
    for r in rows[:5]:
        out.write(f"  {fmt_pct(r['share']):>6}  {_short(r['norm_name'], 90)}\n")


def _findings(summary: dict[str, Any], out: TextIO) -> None:
    fs = summary.get("findings") or []
    if not fs:
        return
    out.write(f"\nFindings ({len(fs)})\n")
    for f in fs:
        out.write(f"  [{f['severity']}] {f['id']} {f.get('phase') or ''}: {f['title']}\n")
        if f.get("suggestion"):
            out.write(f"      -> {f['suggestion']}\n")


def render_compare(result: dict[str, Any], out: TextIO) -> None:
    """Write a ``compare_summaries`` result: inputs, phases, then category and stage time per phase,
    one column per input and ratios over the first input (A)."""
    ins = result["inputs"]
    keys = [i["key"] for i in ins]
    ref = keys[0]
    out.write(f"llm-kernel-map comparison ({len(ins)} inputs; ratios over {ref})\n")
    for i in ins:
        gpu = i["gpu"].get("name") or f"unknown GPU ({i['gpu'].get('reason') or 'not detected'})"
        out.write(f"  {i['key']}: {gpu}: {', '.join(i['paths'])}\n")
    rows = []
    for i in ins:
        t = i["totals"]
        rows.append(
            [
                i["key"],
                fmt_ns(t.get("wall_ns")),
                fmt_ns(t.get("busy_ns")),
                fmt_pct(t.get("idle_fraction")),
                fmt_ns(t.get("kernel_ns")),
                f"{t.get('kernels', 0):,}",
            ]
        )
    out.write("\n")
    _table(out, ["input", "wall", "GPU busy", "idle", "kernel time", "kernels"], rows)
    ratio_heads = [f"{k}/{ref}" for k in keys[1:]]

    def ratios(values: list[float | None]) -> list[str]:
        return ["-" if r is None else f"{r:.2f}x" for r in values[1:]]

    out.write("\nPhases\n")
    rows = []
    for p in result["phases"]:
        rows.append(
            [p["phase"], "kernel time", *[fmt_ns(v) for v in p["kernel_ns"]], *ratios(p["kernel_ratio"])]
        )
        if any(p["steps"]):
            rows.append(
                [
                    p["phase"],
                    "step p50",
                    *[fmt_ns(v) if n else "-" for v, n in zip(p["step_p50_ns"], p["steps"], strict=True)],
                    *ratios(p["step_p50_ratio"]),
                ]
            )
    _table(out, ["phase", "metric", *keys, *ratio_heads], rows)
    for p in result["phases"]:
        cats = [r for r in result["categories"] if r["phase"] == p["phase"]]
        if cats:
            out.write(f"\n  {p['phase']}: time by category\n")
            rows = [
                [
                    r["label"],
                    *[f"{fmt_ns(t)} {fmt_pct(s)}" for t, s in zip(r["time_ns"], r["share"], strict=True)],
                    *ratios(r["ratio"]),
                ]
                for r in cats
            ]
            _table(out, ["Category", *keys, *ratio_heads], rows, indent="    ")
        stages = [r for r in result["stages"] if r["phase"] == p["phase"]]
        if stages:
            out.write(f"\n  {p['phase']}: time by stage (providers)\n")
            rows = [
                [
                    r["stage"],
                    *[
                        fmt_ns(t) + (f" ({'+'.join(pr)})" if pr else "")
                        for t, pr in zip(r["time_ns"], r["providers"], strict=True)
                    ],
                    *ratios(r["ratio"]),
                ]
                for r in stages
            ]
            _table(out, ["stage", *keys, *ratio_heads], rows, indent="    ")
