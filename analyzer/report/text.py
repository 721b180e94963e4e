"""Plain-text reporters: the one-screen summary of a summary dict, and the side-by-side text of a
comparison, written to a text stream."""

from __future__ import annotations

from typing import Any, ClassVar, TextIO

from analyzer.report.formatting import (
    PHASE_ORDER,
    fmt_ns,
    fmt_pct,
    fmt_ratio,
    shorten,
    write_table,
)
from analyzer.report.ranks_text import render_ranks

NONE = "—"  # nothing to say: no timeline, a stage an input never ran, a rate that exceeds a peak
_BASIS_WORDS = {"shapes": "shapes", "found": "sizes found in the trace", "model": "--model", "none": "none"}
_BASIS_SHORT = {"found": "found sizes", "model": "--model"}


class TextReporter:
    """The one-screen summary of a summary dict (``top``: kernel groups listed)."""

    name: ClassVar[str] = "text"
    extensions: ClassVar[tuple[str, ...]] = (".txt",)
    binary: ClassVar[bool] = False

    def __init__(self, top: int = 10) -> None:
        self.top = top

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        render(data, stream, top=self.top)


class CompareTextReporter:
    """The side-by-side text of a ``compare_summaries`` result."""

    name: ClassVar[str] = "text"
    extensions: ClassVar[tuple[str, ...]] = (".txt",)
    binary: ClassVar[bool] = False

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        render_compare(data, stream)


def _classification(summary: dict[str, Any], out: TextIO) -> None:
    c = summary.get("classification")
    if not c:
        return
    why = next((w for w in summary.get("warnings", []) if w.startswith("layer structure not found")), None)
    reason = why.split(" (", 1)[1].split("):", 1)[0] if why else "no rule, host op or position names a role"
    out.write(
        f"  stages decided by name rules {fmt_pct(c['by_name_rule'])}, by shapes {fmt_pct(c['by_shapes'])}, "
        f"by layer structure {fmt_pct(c['by_structure'])}, role-free {fmt_pct(c['role_free'])}"
        + (f" ({reason})" if c["role_free"] else "")
        + "\n"
    )


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
    timed = bool(t.get("wall_ns")) or not t.get("aggregate_rows")  # totals-only inputs have no timeline
    wall, busy, idle = (
        (fmt_ns(t["wall_ns"]), fmt_ns(t["busy_ns"]), fmt_pct(t["idle_fraction"])) if timed else (NONE,) * 3
    )
    # with several GPUs the idle share is of their time over the wall (a reader's own sum), so say so
    how = f" (1 - busy / ({ndev} GPUs x wall))" if timed and ndev > 1 else ""
    out.write(
        f"  wall {wall}, GPU busy {busy}{across if timed else ''}, idle {idle}{how}, "
        f"kernel time {fmt_ns(t['kernel_ns'])} in {t['kernels']:,} GPU activities\n"
    )
    if t.get("aggregate_rows"):
        out.write(
            f"  note: {t['aggregate_rows']} rows are totals only (no timeline): phases and steps skip them\n"
        )
    _classification(summary, out)
    _work(summary, out)
    _phases(summary, out)
    _stages(summary, out)
    _providers(summary, out)
    _top(summary, out, top)
    _unclassified(summary, out)
    if summary.get("ranks"):
        render_ranks(summary, out)
    _findings(summary, out)
    for w in summary.get("warnings", []):
        out.write(f"warning: {w}\n")


def _work(summary: dict[str, Any], out: TextIO) -> None:
    """What the FLOPs and bytes rest on, by kernel time; one hint line when --model would count more."""
    work = summary.get("work") or {}
    basis = work.get("basis") or {}
    if not basis:
        return
    parts = ", ".join(f"{_BASIS_WORDS.get(k, k)} {fmt_pct(v['share'])}" for k, v in basis.items())
    out.write(f"  FLOPs/bytes from: {parts} of kernel time (causal prefill: half the score matrix)\n")
    would = work.get("model_would_count")
    none = basis.get("none")
    if would and none:
        out.write(
            f"hint: {none['kernels']:,} kernels ({fmt_pct(none['share'])} of kernel time) have no FLOP count; "
            f"--model CONFIG_OR_NAME would count the {would['kernels']:,} GEMM / expert kernels among them "
            f"({fmt_pct(would['share'])})\n"
        )


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
        pct = [fmt_ns(s[q]) if ph["steps"] else NONE for q in ("p50", "p90", "p99")]
        rows.append(
            [
                p,
                str(ph["steps"]),
                fmt_ns(ph["kernel_ns"]),
                *pct,
                "-" if ph["tokens"] is None else f"{ph['tokens']:,}",
                fmt_pct(ph["idle_fraction"]),
            ]
        )
    write_table(out, ["phase", "steps", "kernel time", "step p50", "p90", "p99", "tokens", "GPU idle"], rows)
    for p in PHASE_ORDER:
        ph = phases.get(p)
        if not ph or not ph["profile"]:
            continue
        out.write(f"\n  {p} profile\n")
        rows = [
            [r["label"], fmt_pct(r["share"]), fmt_ns(r["time_ns"]), r.get("bound") or "-"]
            for r in ph["profile"]
        ]
        write_table(out, ["Category", "Time%", "time", "Bound-by"], rows, indent="    ")


def _stages(summary: dict[str, Any], out: TextIO) -> None:
    out.write("\nTime by stage\n")
    rows = [
        [r["phase"], r["stage"], r["provider"], fmt_ns(r["time_ns"]), fmt_pct(r["share"]), f"{r['count']:,}"]
        for r in summary["stages"][:25]
    ]
    write_table(out, ["phase", "stage", "provider", "time", "share", "count"], rows)
    if len(summary["stages"]) > 25:
        out.write(f"  ... {len(summary['stages']) - 25} more (see --json)\n")


def _providers(summary: dict[str, Any], out: TextIO) -> None:
    out.write("\nTime by provider\n")
    rows = [
        [r["provider"], fmt_ns(r["time_ns"]), fmt_pct(r["share"]), f"{r['count']:,}"]
        for r in summary["providers"]
    ]
    write_table(out, ["provider", "time", "share", "count"], rows)


def _rate(r: dict[str, Any]) -> str:
    """Achieved rate against the roof, as the kernel's bound says: TFLOP/s or TB/s and % of roof;
    a dash for kernels whose numbers exceed a peak (the reason is printed under the table)."""
    pct = r.get("pct_of_peak")
    if r.get("bound") == "invalid" and r.get("achieved_tbps") is None and r.get("achieved_tflops") is None:
        return NONE
    if r.get("bound") == "compute" and r.get("achieved_tflops") is not None:
        # the compute roof is the peak of the dtype the kernels compute in (fp8, int8, bf16 ...)
        roof = f" {r['roof_dtype']}" if r.get("roof_dtype") else ""
        val = f"{r['achieved_tflops']:.1f} TFLOP/s{roof}"
    elif r.get("achieved_tbps") is not None:
        val = f"{r['achieved_tbps']:.2f} TB/s"
    else:
        return "-"
    # a rate not from the ops' own shapes names its basis: sizes found in the trace, or --model
    other = [_BASIS_SHORT[b] for b in r.get("basis") or [] if b in _BASIS_SHORT]
    return (
        val + (f" ({100 * pct:.0f}%)" if pct is not None else "") + (f" [{'+'.join(other)}]" if other else "")
    )


def _rate_from(r: dict[str, Any], rate: str) -> str:
    """The rate, naming its phase when only some of the row's phases have numbers (a decode row
    rated from its two prefill launches says so)."""
    from_ = r.get("rate_phases") or []
    if rate in ("-", NONE) or not from_ or set(from_) >= set(r.get("phases") or []):
        return rate
    return f"{rate} in {'+'.join(from_)}"


def _shared(parts: list[dict[str, Any]] | None, key: str, fallback: str, names: bool = True) -> str:
    """The value holding most of a kernel's time, with its share when others hold some too:
    ``moe_sort``, ``moe_sort 99.1% (+2)`` or ``decode 97.0% (+prefill)`` (every share is in --json)."""
    if not parts:
        return fallback
    head = parts[0]
    if len(parts) == 1:
        return str(head[key])
    rest = "+".join(str(p[key]) for p in parts[1:]) if names else str(len(parts) - 1)
    return f"{head[key]} {fmt_pct(head['share'])} (+{rest})"


def _top(summary: dict[str, Any], out: TextIO, top: int) -> None:
    out.write("\nTop kernels\n")
    rows = []
    notes = []
    for n, r in enumerate(summary["top_kernels"][:top], start=1):
        rows.append(
            [
                str(n),
                fmt_pct(r["share"]),
                fmt_ns(r["time_ns"]),
                f"{r['count']:,}",
                _shared(r.get("stages"), "stage", r["stage"], names=False),
                r["provider"],
                _shared(r.get("phase_shares"), "phase", "/".join(r.get("phases") or [])),
                _rate_from(r, _rate(r)),
                r.get("bound") or "-",
                shorten(r["norm_name"], 60),
            ]
        )
        if r.get("invalid_reason"):
            notes.append(f"  #{n}: {r['invalid_reason']}\n")
    write_table(
        out,
        [
            "#",
            "share",
            "time",
            "count",
            "stage",
            "provider",
            "phase",
            "achieved (of roof)",
            "bound",
            "kernel",
        ],
        rows,
    )
    if notes:
        out.write(f"  {NONE} / invalid: the numbers exceed a peak of the GPU, so no rate is shown\n")
        out.writelines(notes)


def _unclassified(summary: dict[str, Any], out: TextIO) -> None:
    rows = summary.get("unclassified") or []
    share = sum(r["share"] for r in rows)
    out.write(f"\nUnclassified: {fmt_pct(share)} of kernel time in {len(rows)} kernel names\n")
    for r in rows[:5]:
        out.write(f"  {fmt_pct(r['share']):>6}  {shorten(r['norm_name'], 90)}\n")
    bp = summary.get("barrier_packets") or {}
    if bp.get("count"):
        out.write(
            f"Barrier packets: {fmt_pct(bp['share'])} of kernel time in {bp['count']:,} rocprof "
            "<barrier packet> dispatches (queue waits, not kernels; not counted as unclassified)\n"
        )


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
    _compare_totals(ins, out)
    ratio_heads = [f"{k}/{ref}" for k in keys[1:]]
    _compare_phases(result, keys, ratio_heads, out)
    for p in result["phases"]:
        _compare_breakdown(result, p["phase"], keys, ratio_heads, out)
    for i in ins:
        _compare_input(i, out)


def _ratios(values: list[float | None]) -> list[str]:
    """The ratios over the first input, formatted (the first input's own is left out)."""
    return [fmt_ratio(r) for r in values[1:]]


def _compare_totals(ins: list[dict[str, Any]], out: TextIO) -> None:
    """One row per compared input: wall, GPU busy, idle, kernel time, kernels."""
    rows = []
    for i in ins:
        t = i["totals"]
        # a summary-only input has no timeline: its wall, busy and idle are unknown, as in analyze
        timed = bool(t.get("wall_ns")) or not t.get("aggregate_rows")
        rows.append(
            [
                i["key"],
                fmt_ns(t.get("wall_ns")) if timed else NONE,
                fmt_ns(t.get("busy_ns")) if timed else NONE,
                fmt_pct(t.get("idle_fraction")) if timed else NONE,
                fmt_ns(t.get("kernel_ns")),
                f"{t.get('kernels', 0):,}",
            ]
        )
    out.write("\n")
    write_table(out, ["input", "wall", "GPU busy", "idle", "kernel time", "kernels"], rows)


def _compare_phases(result: dict[str, Any], keys: list[str], ratio_heads: list[str], out: TextIO) -> None:
    """Kernel time (and step p50 where steps were recorded) per phase, per input."""
    out.write("\nPhases\n")
    rows = []
    for p in result["phases"]:
        rows.append(
            [p["phase"], "kernel time", *[fmt_ns(v) for v in p["kernel_ns"]], *_ratios(p["kernel_ratio"])]
        )
        if any(p["steps"]):
            rows.append(
                [
                    p["phase"],
                    "step p50",
                    *[fmt_ns(v) if n else "-" for v, n in zip(p["step_p50_ns"], p["steps"], strict=True)],
                    *_ratios(p["step_p50_ratio"]),
                ]
            )
    write_table(out, ["phase", "metric", *keys, *ratio_heads], rows)


def _compare_breakdown(
    result: dict[str, Any], phase: str, keys: list[str], ratio_heads: list[str], out: TextIO
) -> None:
    """One phase's time by category and by stage (with the providers), per input."""
    cats = [r for r in result["categories"] if r["phase"] == phase]
    if cats:
        out.write(f"\n  {phase}: time by category\n")
        rows = [
            [
                r["label"],
                *[f"{fmt_ns(t)} {fmt_pct(s)}" for t, s in zip(r["time_ns"], r["share"], strict=True)],
                *_ratios(r["ratio"]),
            ]
            for r in cats
        ]
        write_table(out, ["Category", *keys, *ratio_heads], rows, indent="    ")
    stages = [r for r in result["stages"] if r["phase"] == phase]
    if stages:
        out.write(f"\n  {phase}: time by stage (providers)\n")
        rows = [
            [
                r["stage"],
                *[
                    NONE if t is None else fmt_ns(t) + (f" ({'+'.join(pr)})" if pr else "")
                    for t, pr in zip(r["time_ns"], r["providers"], strict=True)
                ],
                *[
                    NONE if t is None or r["time_ns"][0] is None else x
                    for t, x in zip(r["time_ns"][1:], _ratios(r["ratio"]), strict=True)
                ],
            ]
            for r in stages
        ]
        write_table(out, ["stage", *keys, *ratio_heads], rows, indent="    ")
    _compare_roles(result, phase, keys, ratio_heads, out)


def role_cells(r: dict[str, Any]) -> list[str]:
    """Each input's time and share of its own roof in one role row (``—``: it never ran the role)."""
    return [
        NONE
        if t is None
        else f"{fmt_ns(t)} ({fmt_pct(p)} of roof)"
        if p is not None
        else f"{fmt_ns(t)} (no rate)"
        for t, p in zip(r["time_ns"], r["pct_of_peak"], strict=True)
    ]


def role_stages(r: dict[str, Any]) -> str:
    """The stages that played the role, per input, where they differ (one backend splits a kernel)."""
    names = ["+".join(st) if st else NONE for st in r["stages"]]
    return names[0] if len(set(names)) == 1 else " / ".join(names)


def _compare_roles(
    result: dict[str, Any], phase: str, keys: list[str], ratio_heads: list[str], out: TextIO
) -> None:
    """One phase's kernels matched by layer role: time, share of each GPU's roof, ratio, stages."""
    roles = [r for r in (result.get("roles") or {}).get("rows", []) if r["phase"] == phase]
    if not roles:
        return
    out.write(f"\n  {phase}: time by layer role (each input's share of its own roof)\n")
    rows = [
        [
            r["role"],
            *role_cells(r),
            *[
                NONE if t is None or r["time_ns"][0] is None else x
                for t, x in zip(r["time_ns"][1:], _ratios(r["ratio"]), strict=True)
            ],
            role_stages(r),
        ]
        for r in roles
    ]
    write_table(out, ["role", *keys, *ratio_heads, "stages"], rows, indent="    ")


def _compare_input(i: dict[str, Any], out: TextIO) -> None:
    """One compared input's top kernels and findings (the HTML comparison's per-input sections)."""
    top = i.get("top_kernels") or []
    if top:
        out.write(f"\n{i['key']}: top kernels\n")
        rows = [
            [str(n), fmt_pct(r["share"]), fmt_ns(r["time_ns"]), f"{r['count']:,}", r["stage"], r["provider"],
             r["phase"], shorten(r["norm_name"], 60)]
            for n, r in enumerate(top, start=1)
        ]  # fmt: skip
        write_table(
            out, ["#", "share", "time", "count", "stage", "provider", "phase", "kernel"], rows, indent="    "
        )
    fs = i.get("findings")
    if fs is None:
        return
    out.write(f"\n{i['key']}: findings ({len(fs)})\n")
    for f in fs:
        out.write(f"    [{f['severity']}] {f['id']} {f.get('phase') or ''}: {f['title']}\n")
