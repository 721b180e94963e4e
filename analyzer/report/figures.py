"""Plotly figures for the HTML report: pure functions of the summary (and, for the timeline and the
roofline scatter, of the analysed kernels table) that return ``plotly.graph_objects.Figure`` objects.

Contract: figures select and aggregate what they draw (sums, merged timeline bars) and compute no
analysis numbers. Every string that may come from a trace (kernel names, group keys, GPU and input
names) goes through :func:`ftext`, because plotly renders a subset of HTML tags (``<b>``, ``<br>``,
``<a>`` ...) inside titles, labels, legend entries and hover text.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.compute as pc
from plotly.subplots import make_subplots

from analyzer.knowledge.kernel_rules import load_taxonomy
from analyzer.report.formatting import fmt_ns, fmt_pct, shorten

TIMELINE_MAX_BARS = 5000
TIMELINE_FALLBACK_KERNELS = 2000
NAME_WIDTH = 110
# one colour per taxonomy stage, each clearly apart from every other (greedy max-min RGB distance
# over plotly's qualitative palettes, too-light colours left out: they vanish on white)
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#fe00fa", "#222a2a", "#511cfb", "#990099", "#00fe35", "#ff0092",
    "#1616a7", "#aa0dfe", "#e48f72", "#620042", "#3283fe", "#72b7b2", "#dd4477", "#eea6fb",
    "#66aa00", "#bab0ac", "#b68100", "#862a16", "#b3de69", "#22ffa7", "#9eb9f3",
)  # fmt: skip
LEGEND_ROW_PX = 22  # a vertical legend entry: figures grow so that none scrolls out of view
TIMELINE_COLUMNS = ["trace_id", "rank", "device", "stream", "step", "start_ns", "dur_ns", "stage", "provider",
                    "norm_name"]  # fmt: skip


def ftext(value: Any) -> str:
    """Text for a figure: ``&``, ``<`` and ``>`` as entities so plotly shows them literally."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def short(name: Any, width: int = NAME_WIDTH) -> str:
    """One-line name cut to ``width`` characters (cut before escaping, so no entity is split)."""
    return shorten(name, width)


@functools.lru_cache(maxsize=1)
def _vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    t = load_taxonomy()
    return t.stages, t.providers


def color_of(value: str, kind: str = "stage") -> str:
    """A fixed colour per stage (or provider), the same in every figure."""
    stages, providers = _vocabulary()
    order = stages if kind == "stage" else providers
    i = order.index(value) if value in order else len(order) + sum(map(ord, value))
    return PALETTE[i % len(PALETTE)]


def base_layout(title: str, height: int = 420, **extra: Any) -> dict[str, Any]:
    """Shared look; ``title`` must already be escaped."""
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "font": {"size": 15}},
        "template": "none",
        "height": height,
        "margin": {"l": 70, "r": 20, "t": 50, "b": 50},
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "hoverlabel": {"align": "left"},
        "legend": {"font": {"size": 11}},
    }
    layout.update(extra)
    return layout


# --------------------------------------------------------------------------- stage / provider bars


def stage_breakdown(summary: dict[str, Any], phase: str) -> go.Figure | None:
    """Horizontal stacked bars: one bar per stage of ``phase``, one segment per provider (time)."""
    rows = [r for r in summary.get("stages", []) if r["phase"] == phase and r["time_ns"] > 0]
    if not rows:
        return None
    phase_ns = (summary.get("phases", {}).get(phase) or {}).get("kernel_ns") or sum(
        r["time_ns"] for r in rows
    )
    by_stage: dict[str, int] = {}
    for r in rows:
        by_stage[r["stage"]] = by_stage.get(r["stage"], 0) + r["time_ns"]
    order = sorted(by_stage, key=lambda s: (by_stage[s], s))  # largest at the top
    fig = go.Figure()
    providers = sorted(
        {r["provider"] for r in rows}, key=lambda p: -sum(r["time_ns"] for r in rows if r["provider"] == p)
    )
    for p in providers:
        pr = sorted((r for r in rows if r["provider"] == p), key=lambda r: order.index(r["stage"]))
        fig.add_trace(
            go.Bar(
                name=ftext(p),
                orientation="h",
                y=[ftext(r["stage"]) for r in pr],
                x=[r["time_ns"] / 1e6 for r in pr],
                marker={"color": color_of(p, "provider")},
                hovertext=[
                    ftext(
                        f"{r['stage']} / {p}: {fmt_ns(r['time_ns'])}, {fmt_pct(r['time_ns'] / phase_ns)} of "
                        f"{phase}, {r['count']:,} kernels"
                    )
                    for r in pr
                ],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        base_layout(
            ftext(f"{phase}: time by stage and provider"),
            height=max(260, 60 + 24 * len(order)),
            barmode="stack",
            margin={"l": 130, "r": 20, "t": 50, "b": 45},
        ),
        xaxis={"title": {"text": "kernel time (ms)"}, "gridcolor": "#e5e5e5"},
        yaxis={"categoryorder": "array", "categoryarray": [ftext(s) for s in order]},
    )
    return fig


# --------------------------------------------------------------------------- timeline


def pick_steps(steps: Sequence[dict[str, Any]], prefill: int = 1, decode: int = 2) -> list[dict[str, Any]]:
    """The steps the timeline draws: the first prefill and the first two decode steps (else mixed).
    In a multi-rank run a step index is one step of every rank: it is picked once, from the first
    rank that ran it (:func:`rank_steps` adds the other ranks' rows)."""
    seen: set[tuple[str, int]] = set()
    once = []
    for s in sorted(steps, key=lambda s: (s.get("rank", 0), s["trace_id"], s["start_ns"])):
        key = (s["phase"], s["step"])
        if key not in seen:
            seen.add(key)
            once.append(s)
    chosen = [s for s in once if s["phase"] == "prefill"][:prefill]
    chosen += [s for s in once if s["phase"] == "decode"][:decode]
    if not chosen:
        chosen = [s for s in once if s["phase"] == "mixed"][: prefill + decode]
    if not chosen:
        chosen = once[: prefill + decode]
    return sorted(chosen, key=lambda s: (s["trace_id"], s["start_ns"]))


def rank_steps(steps: Sequence[dict[str, Any]], step: dict[str, Any]) -> list[dict[str, Any]]:
    """``step`` and the same step (index and phase) of every other rank, one row per rank: drawn
    together, a rank that starts late shows."""
    out = [step]
    ranks = {step.get("rank", 0)}
    for s in steps:
        r = s.get("rank", 0)
        if r not in ranks and s["step"] == step["step"] and s["phase"] == step["phase"]:
            ranks.add(r)
            out.append(s)
    return out


def _step_frame(kernels: pa.Table, step: Sequence[dict[str, Any]] | None) -> pd.DataFrame:
    cols = [c for c in TIMELINE_COLUMNS if c in kernels.column_names]
    t = kernels.select(cols)
    if "aggregate" in kernels.column_names:
        t = t.filter(pc.invert(kernels["aggregate"]))
    if step is not None:
        mask = None
        for st in step:
            one = pc.and_(pc.equal(t["trace_id"], st["trace_id"]), pc.equal(t["step"], st["step"]))
            mask = one if mask is None else pc.or_(mask, one)
        t = t.filter(mask)
    else:  # the first kernels of each rank (of its first input)
        parts = []
        for r in pc.unique(t["rank"]).to_pylist():
            tr = t.filter(pc.equal(t["rank"], r))
            tr = tr.filter(pc.equal(tr["trace_id"], pc.min(tr["trace_id"])))
            parts.append(
                tr.take(pc.sort_indices(tr, [("start_ns", "ascending")])[:TIMELINE_FALLBACK_KERNELS])
            )
        t = pa.concat_tables(parts) if parts else t
    df = t.to_pandas()
    for c in ("stage", "provider", "norm_name"):
        df[c] = df[c].astype(str)
    return df


def merge_bars(df: pd.DataFrame, cap: int) -> pd.DataFrame:
    """Bars to draw for one step: one per kernel when they fit under ``cap``; else consecutive
    same-stage kernels of a lane become one bar; if still too many, each lane is cut into time bins
    drawn as one bar in the stage that holds most of the bin's time."""
    df = df.sort_values(["lane", "start_ns"], kind="stable").reset_index(drop=True)
    df["end_ns"] = df["start_ns"] + df["dur_ns"]
    if len(df) <= cap:
        return df.assign(n=1)
    new_run = (df["lane"] != df["lane"].shift()) | (df["stage"] != df["stage"].shift())
    runs = _reduce(df, new_run.cumsum())
    if len(runs) <= cap:
        return runs
    lanes = max(1, df["lane"].nunique())
    nbins = max(1, cap // lanes)
    lo, hi = int(df["start_ns"].min()), int(df["end_ns"].max())
    width = max(1, math.ceil((hi - lo + 1) / nbins))
    df["bin"] = (df["start_ns"] - lo) // width
    main = df.groupby(["lane", "bin", "stage"], sort=False)["dur_ns"].sum().reset_index()
    main = main.sort_values("dur_ns", ascending=False, kind="stable").drop_duplicates(["lane", "bin"])
    df = df.drop(columns="stage").merge(main[["lane", "bin", "stage"]], on=["lane", "bin"])
    df = df.sort_values(["lane", "start_ns"], kind="stable")
    return _reduce(df, df.groupby(["lane", "bin"], sort=False).ngroup())


def _reduce(df: pd.DataFrame, key: pd.Series) -> pd.DataFrame:
    g = df.groupby(key, sort=False)
    out = g.agg(lane=("lane", "first"), stage=("stage", "first"), provider=("provider", "first"),
                norm_name=("norm_name", "first"), start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
                dur_ns=("dur_ns", "sum"), n=("dur_ns", "size"))  # fmt: skip
    return out.reset_index(drop=True)


def _lane(df: pd.DataFrame) -> pd.Series:
    stream = df["stream"].astype("Int64").astype(str).replace("<NA>", "?")
    lane = "gpu " + df["device"].astype(str) + " stream " + stream
    if "rank" in df and df["rank"].nunique() > 1:  # every rank's streams, each under its rank
        lane = "rank " + df["rank"].astype(str) + " " + lane
    return lane


def _hover(r: Any) -> str:
    dur = fmt_ns(r.end_ns - r.start_ns)
    if r.n == 1:
        return f"{ftext(short(r.norm_name))}<br>{ftext(r.stage)} / {ftext(r.provider)}, {dur}"
    return (f"{r.n} {ftext(r.stage)} kernels merged (busy {fmt_ns(r.dur_ns)} of {dur})"
            f"<br>first: {ftext(short(r.norm_name))}")  # fmt: skip


def timeline(
    kernels: pa.Table, steps: Sequence[dict[str, Any]], max_bars: int = TIMELINE_MAX_BARS
) -> go.Figure | None:
    """A few steps (first prefill, first two decode) drawn per stream, kernels coloured by stage.

    Each step is its own panel, time in microseconds from the step's first kernel. At most ``max_bars``
    bars in all (see :func:`merge_bars`)."""
    chosen: list[dict[str, Any] | None] = list(pick_steps(steps)) or [None]
    if kernels.num_rows == 0:
        return None
    frames = []
    for st in chosen:
        df = _step_frame(kernels, None if st is None else rank_steps(steps, st))
        if len(df):
            df["lane"] = _lane(df)
            frames.append((st, df))
    if not frames:
        return None
    cap = max(50, max_bars // len(frames))
    titles = []
    for st, df in frames:
        if st is None:
            titles.append(ftext(f"first {len(df):,} kernels (no steps found)"))
        else:
            span = int((df["start_ns"] + df["dur_ns"]).max() - df["start_ns"].min())
            ranks = sorted(int(r) for r in df["rank"].unique()) if "rank" in df else [st.get("rank", 0)]
            where = (f"trace {st['trace_id']}, rank {ranks[0]}" if len(ranks) == 1
                     else f"ranks {', '.join(map(str, ranks))}")  # fmt: skip
            titles.append(ftext(f"{st['phase']} step {st['step']} ({where}): "
                                f"{len(df):,} kernels over {fmt_ns(span)} (step {fmt_ns(st['dur_ns'])})"))  # fmt: skip
    heights = [max(1, df["lane"].nunique()) + 1 for _, df in frames]
    fig = make_subplots(rows=len(frames), cols=1, subplot_titles=titles, vertical_spacing=0.12 if len(frames) > 1 else 0,
                        row_heights=heights)  # fmt: skip
    seen: set[str] = set()
    for row, (_, df) in enumerate(frames, start=1):
        t0 = int(df["start_ns"].min())  # a step's annotation may open long before its first kernel
        bars = merge_bars(df, cap)
        for stage, b in bars.groupby("stage", sort=True):
            fig.add_trace(
                go.Bar(
                    name=ftext(stage),
                    legendgroup=ftext(stage),
                    showlegend=stage not in seen,
                    orientation="h",
                    y=[ftext(x) for x in b["lane"]],
                    base=((b["start_ns"] - t0) / 1e3).round(3).tolist(),
                    x=((b["end_ns"] - b["start_ns"]) / 1e3).clip(lower=0.001).round(3).tolist(),
                    marker={"color": color_of(str(stage)), "line": {"width": 0}},
                    hovertext=[_hover(r) for r in b.itertuples(index=False)],
                    hoverinfo="text",
                ),
                row=row,
                col=1,
            )
            seen.add(str(stage))
        last = row == len(frames)
        fig.update_xaxes(
            title_text="us from the step's first kernel" if last else None,
            gridcolor="#e5e5e5",
            row=row,
            col=1,
        )
        fig.update_yaxes(autorange="reversed", automargin=True, row=row, col=1)
    fig.update_layout(
        base_layout(
            ftext("timeline: a few steps per stream, coloured by stage"),
            height=max(
                min(1600, 160 + 90 * len(frames) + 26 * sum(heights)), 120 + LEGEND_ROW_PX * len(seen)
            ),
            barmode="overlay",
            bargap=0.25,
            margin={"l": 150, "r": 20, "t": 70, "b": 45},
        )
    )
    return fig


# --------------------------------------------------------------------------- roofline


def roofline(summary: dict[str, Any], phase: str) -> go.Figure | None:
    """Log-log achieved TFLOP/s vs arithmetic intensity of the kernel groups of ``phase`` (marker
    size ~ time), under the GPU's memory slope and compute roof (bf16, and fp8 dashed when known)."""
    pts = [g for g in summary.get("groups", []) if g["phase"] == phase and g.get("flops") and g.get("bytes")
           and g.get("achieved_tflops") and g["time_ns"] > 0 and g.get("bound") != "invalid"]  # fmt: skip
    if not pts:
        return None
    peaks = (summary.get("gpu") or {}).get("peaks") or {}
    tmax = max(g["time_ns"] for g in pts)
    fig = go.Figure()
    for stage in sorted({g["stage"] for g in pts}):
        sg = [g for g in pts if g["stage"] == stage]
        fig.add_trace(
            go.Scatter(
                name=ftext(stage),
                mode="markers",
                x=[g["flops"] / g["bytes"] for g in sg],
                y=[g["achieved_tflops"] for g in sg],
                marker={
                    "size": [6 + 34 * math.sqrt(g["time_ns"] / tmax) for g in sg],
                    "color": color_of(stage),
                    "opacity": 0.75,
                    "line": {"width": 0.5, "color": "#333"},
                },
                hovertext=[
                    f"{ftext(short(g['group_key']))}<br>{ftext(g['stage'])} / {ftext(g['provider'])}: "
                    f"{fmt_ns(g['time_ns'])} in {g['count']:,} kernels<br>{g['achieved_tflops']:.3g} TFLOP/s, "
                    f"{(g.get('achieved_tbps') or 0):.3g} TB/s, {g['flops'] / g['bytes']:.3g} FLOP/byte, "
                    f"bound {ftext(g.get('bound') or '-')}"
                    for g in sg
                ],
                hoverinfo="text",
            )
        )
    xs = [g["flops"] / g["bytes"] for g in pts]
    # the y range follows the memory- and compute-bound groups: latency-bound ones (launch overhead,
    # ~1e-6 TFLOP/s) would squash them into the top of the plot; those below are drawn at the floor
    matters = [g for g in pts if g.get("bound") in ("memory", "compute")] or pts
    ys = [g["achieved_tflops"] for g in matters]
    hbm, bf16, fp8 = peaks.get("hbm_tbps"), peaks.get("bf16_tflops"), peaks.get("fp8_tflops")
    lo, hi = min(xs) / 3, max(xs) * 3
    note = ""
    if hbm and bf16:
        lo, hi = min(lo, bf16 / hbm / 30), max(hi, bf16 / hbm * 30)
        for peak, label, dash in ((bf16, "bf16", "solid"), (fp8, "fp8", "dash")):
            if not peak:
                continue
            ridge = peak / hbm
            fig.add_trace(
                go.Scatter(
                    name=ftext(f"roof {label}: {peak:g} TFLOP/s, HBM {hbm:g} TB/s"),
                    mode="lines",
                    x=[lo, ridge, hi],
                    y=[hbm * lo, peak, peak],
                    line={"color": "#444" if label == "bf16" else "#999", "dash": dash, "width": 1.5},
                    hoverinfo="name",
                )
            )
    else:
        note = " (unknown GPU: no roof)"
    ymin = min(min(ys), hbm * min(xs) if hbm else min(ys)) / 3
    ymax = max(max(ys), bf16 or 0, fp8 or 0) * 2
    below = 0
    for trace in fig.data:
        if trace.mode == "markers" and any(y < ymin for y in trace.y):
            below += sum(y < ymin for y in trace.y)
            trace.y = [max(y, ymin * 1.15) for y in trace.y]
            trace.marker.symbol = ["triangle-down" if y <= ymin * 1.15 else "circle" for y in trace.y]
    if below:
        note += f" ({below} latency-bound groups below the axis drawn at its floor)"
    fig.update_layout(
        base_layout(ftext(f"{phase}: roofline of kernel groups{note}"), height=460),
        xaxis={"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}, "gridcolor": "#e5e5e5",
               "range": [math.log10(lo), math.log10(hi)], "exponentformat": "power"},
        yaxis={"type": "log", "title": {"text": "achieved TFLOP/s"}, "gridcolor": "#e5e5e5",
               "range": [math.log10(ymin), math.log10(ymax)], "exponentformat": "power"},
    )  # fmt: skip
    return fig


# --------------------------------------------------------------------------- compare


def compare_categories(result: dict[str, Any], phase: str) -> go.Figure | None:
    """Grouped bars: kernel time per category of ``phase``, one bar per compared input."""
    rows = [r for r in result.get("categories", []) if r["phase"] == phase]
    if not rows:
        return None
    fig = go.Figure()
    for i, inp in enumerate(result["inputs"]):
        fig.add_trace(
            go.Bar(
                name=ftext(f"{inp['key']}: {inp['label']}"),
                x=[ftext(r["label"]) for r in rows],
                y=[r["time_ns"][i] / 1e6 for r in rows],
                marker={"color": PALETTE[i % len(PALETTE)]},
                hovertext=[
                    ftext(
                        f"{inp['key']} {r['label']}: {fmt_ns(r['time_ns'][i])}, {fmt_pct(r['share'][i])} of "
                        f"{phase}" + ("" if r["ratio"][i] is None or i == 0 else f", {r['ratio'][i]:.2f}x A")
                    )
                    for r in rows
                ],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        base_layout(ftext(f"{phase}: kernel time by category"), height=420, barmode="group"),
        yaxis={"title": {"text": "kernel time (ms)"}, "gridcolor": "#e5e5e5"},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def figure_json(fig: go.Figure) -> str:
    """The figure as JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` left raw."""
    text = fig.to_json(validate=False, pretty=False, remove_uids=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
