"""Findings: checks over the analysed tables that turn numbers into advice, with evidence.

Contract: each check is a pure function ``(run frame, settings) -> list[finding]`` over the
analysed kernels (pandas) and the steps table; thresholds come from ``rules/findings.toml``,
overridable per run with ``--set <check>.<key>=<value>``. A finding is a dict with ``id``,
``check``, ``severity`` (info | warning | critical), ``phase``, ``title``, ``group_keys``,
``evidence`` (the numbers that triggered it) and ``suggestion`` (drawn from the seeds). Findings
are returned most severe first, then by the time they concern.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from analyzer.knowledge.kernel_rules import BARRIER_RULE_ID
from analyzer.knowledge.taxonomy import ALL_GEMM_STAGES, ATTENTION_STAGES, LABELLED_PHASES
from analyzer.tables import intervals
from analyzer.tables.frames import only_columns

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
# roofs of a GEMM already in a low-precision dtype: F004 does not advise a lower dtype for them
_LOW_PRECISION = frozenset({"fp8", "fp4", "int8"})
# a phase whose kernels are replayed from CUDA/HIP graphs at least this much is "in graphs": advice
# to capture graphs would contradict the evidence
GRAPH_REPLAYED_SHARE = 0.9


@dataclasses.dataclass
class RunFrame:
    """What every check reads: the analysed kernels as pandas, the steps, the run's kernel time."""

    df: pd.DataFrame
    steps: pd.DataFrame | None
    total_ns: int

    def only(self, *columns: str) -> pd.DataFrame:
        """The kernels frame narrowed to ``columns``: row selections then copy these alone."""
        return only_columns(self.df, *columns)


def find(
    df: pd.DataFrame, steps: pd.DataFrame | None, settings: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Every finding of the run: ``df`` the analysed kernels (:func:`analyzer.tables.frames.to_frame`),
    ``steps`` the steps table, ``settings`` the thresholds (``rules/findings.toml`` + ``--set``).

    rocprof's ``<barrier packet>`` pseudo-dispatches are queue waits, not kernels: no check sees
    them (shares stay shares of the run's whole kernel time)."""
    total = int(df["dur_ns"].sum())
    if "rule_id" in df:
        barrier = (df["rule_id"] == BARRIER_RULE_ID).to_numpy(bool, na_value=False)
        if barrier.any():
            df = df[~barrier]
    return check_all(RunFrame(df=df, steps=steps, total_ns=total), settings)


def check_all(ctx: RunFrame, cfg: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, fn in CHECKS.items():
        if name in cfg:
            out.extend(fn(ctx, cfg[name]))
    out.sort(key=lambda f: (SEVERITY_ORDER[f["severity"]], -f.get("_cost", 0), f["id"], f["title"]))
    for f in out:
        f.pop("_cost", None)
    return out


def _finding(
    c: dict[str, Any],
    check: str,
    severity: str | None,
    phase: str | None,
    title: str,
    group_keys: list[str],
    evidence: dict[str, Any],
    suggestion: str,
    cost: float,
) -> dict[str, Any]:
    return {
        "id": c["id"],
        "check": check,
        "severity": severity or c["severity"],
        "phase": phase,
        "title": title,
        "group_keys": group_keys,
        "evidence": evidence,
        "suggestion": suggestion,
        "_cost": cost,
    }


def _phase_total(ctx: RunFrame, phase: str) -> int:
    return int(ctx.df.loc[ctx.df["phase"] == phase, "dur_ns"].sum())


def _tokens_per_step(ctx: RunFrame, phase: str) -> float | None:
    st = ctx.steps
    if st is None or len(st) == 0:
        return None
    t = st.loc[(st["phase"] == phase) & st["tokens"].notna(), "tokens"]
    return float(t.median()) if len(t) else None


# --------------------------------------------------------------------------- F001


def same_kernel_both_phases(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """One kernel configuration (group_key + block size) serving both prefill and decode.

    A kernel tuned for one phase wastes the other: prefill runs thousands of tokens per step, decode
    one per sequence. The finding is a warning (critical above ``critical_share`` of the run) when
    a GEMM or attention kernel does at least ``stretch_ratio`` times the tokens or work per launch in
    prefill, and ``info`` (benign: an lm_head over the last token, a sampler) below
    ``same_size_ratio``. A norm / activation / RoPE / KV-store kernel sizes its grid to the problem,
    so serving both phases is normal for it: ``info`` with fusion advice, never a warning. The
    advice follows the kernel's kind: per-phase tiles for GEMMs, decode kernels for attention,
    fusion and graphs for the small norm / activation / RoPE / elementwise kernels. Groups below
    ``min_share`` of the run and the ``exclude_stages`` / ``exclude_providers`` are skipped.
    """
    df = ctx.df
    sub = df[
        df["phase"].isin(["prefill", "decode"])
        & ~df["stage"].isin(c["exclude_stages"])
        & ~df["provider"].isin(c["exclude_providers"])
    ]
    out = []
    for (gk, _stage), g in sub.groupby(["group_key", "stage"], sort=False):
        phases = set(g["phase"])
        if phases != {"prefill", "decode"}:
            continue
        p, d = g[g["phase"] == "prefill"], g[g["phase"] == "decode"]
        bp = set(p["block_x"].dropna().astype(int)) if "block_x" in p else set()
        bd = set(d["block_x"].dropna().astype(int)) if "block_x" in d else set()
        if bp and bd and not (bp & bd):
            continue  # same symbol, different launch configuration (e.g. NCCL protocols)
        cost = int(g["dur_ns"].sum())
        if ctx.total_ns and cost / ctx.total_ns < c["min_share"]:
            continue
        ev = {ph: _phase_work(x) for ph, x in (("prefill", p), ("decode", d))}
        tp, td = ev["prefill"]["tokens"], ev["decode"]["tokens"]
        tok_ratio = tp / td if tp and td else None
        work_ratio, work_basis = _work_ratio(ev["prefill"], ev["decode"])
        # the kernel itself must do more work per launch in prefill (an lm_head over the last token
        # only, or a sampler, runs the same problem in both phases: benign)
        stretched = (work_ratio or 0) >= c["same_size_ratio"] and (
            (tok_ratio or 0) >= c["stretch_ratio"] or (work_ratio or 0) >= c["stretch_ratio"]
        )
        ev["token_ratio"] = tok_ratio
        ev["stretched"] = bool(stretched)  # far more work per launch in prefill than in decode
        ev["work_ratio"] = work_ratio
        ev["work_basis"] = work_basis
        dur_ratio = work_ratio
        ev["share_of_run"] = cost / ctx.total_ns if ctx.total_ns else 0.0
        stage = str(g["stage"].iloc[0])
        ev["stage"] = stage
        name = str(g["norm_name"].iloc[0])
        ev["token_regime"] = regime = _token_regime(tp, td, stage)
        if stretched:
            ratio = f"{tok_ratio:,.0f}x the tokens" if tok_ratio else f"{dur_ratio:,.0f}x the time per launch"
            ratio = f"{ratio} in prefill; {regime}"
            sugg = _same_kernel_advice(stage, float(d["graph_launch"].mean()) if len(d) else 0.0)
            if _sizes_its_grid(stage):
                # the advice itself says one kernel for both phases is normal: a warning would
                # contradict it, so it is information (with the fusion advice it carries)
                sev = "info"
                title = (
                    f"one {stage} kernel serves prefill and decode ({ratio}; normal for a "
                    f"kernel that sizes its grid to the problem): {_short(name)}"
                )
            else:
                sev = "critical" if ev["share_of_run"] >= c["critical_share"] else "warning"
                title = f"one {stage} configuration serves prefill and decode ({ratio}): {_short(name)}"
        else:
            sev = "info"
            title = (
                f"one {stage} configuration serves both phases on a similar problem size (benign; {regime}): "
                f"{_short(name)}"
            )
            sugg = f"No action: the {stage} kernel does the same work in both phases."
        out.append(_finding(c, "same_kernel_both_phases", sev, "both", title, [gk], ev, sugg, cost))
    return out


def _token_regime(prefill: float | None, decode: float | None, stage: str) -> str:
    """The tokens per step each phase hands the kernel (the median over its steps), and what
    serving both with one configuration means: ``2,048 tokens in prefill, 4 in decode: one tile
    serves both``; a phase whose steps carry no token count says so."""

    def n(v: float | None) -> str:
        return f"{v:,.0f} tokens" if v is not None else "tokens unknown"

    one = "one tile serves both" if stage in ALL_GEMM_STAGES else "one configuration serves both"
    return f"{n(prefill)} in prefill, {n(decode).removesuffix(' tokens')} in decode: {one}"


def _sizes_its_grid(stage: str) -> bool:
    """Kernels that are not GEMMs or attention (norm, activation, RoPE, KV store ...) scale their
    grid with the tokens: one kernel for both phases is how they work, not a tuning mistake."""
    return stage not in ALL_GEMM_STAGES and stage not in ATTENTION_STAGES


def _article(word: str) -> str:
    """``A`` or ``An`` before ``word`` (by its first letter: stage ids are spelt, not spoken)."""
    return "An" if word[:1].lower() in "aeiou" else "A"


def _same_kernel_advice(stage: str, decode_graph_share: float) -> str:
    """F001's advice for a kernel of ``stage``: tiling for GEMMs, decode kernels for attention,
    launch cost and fusion for the small memory-bound kernels (they scale their grid by design)."""
    if stage in ALL_GEMM_STAGES:
        return (
            "Tune prefill and decode separately: a large-tile/prefill-shaped GEMM configuration wastes "
            "decode's skinny problem (and vice versa); pick per-phase tuned configs (skinny tiles / "
            "split-K for decode GEMMs, large tiles for prefill)."
        )
    if stage in ATTENTION_STAGES:
        return (
            "Use a decode attention kernel in decode (paged / split-KV decode kernels read the KV "
            "cache with enough parallelism for one query token per sequence) and a prefill "
            "(flash / varlen) kernel in prefill."
        )
    graphs = (
        "the launches are already graph-replayed, so fuse rather than re-capture"
        if decode_graph_share >= GRAPH_REPLAYED_SHARE
        else "capture decode in CUDA/HIP graphs to hide the launches"
    )
    return (
        f"{_article(stage)} {stage} kernel sizes its grid to the problem, so one kernel for both phases is normal; "
        "in decode it handles a few tokens and its cost is launch latency, not tuning. Fuse it with "
        f"its neighbours (add+RMSNorm+quant, RoPE+KV-store, act+mul) and {graphs}."
    )


def _work_ratio(p: dict[str, Any], d: dict[str, Any]) -> tuple[float | None, str]:
    """Prefill / decode work per launch: FLOPs (shapes), else grid blocks, else mean duration."""
    for key in ("flops_per_launch", "grid_blocks", "mean_ns"):
        a, b = p.get(key), d.get(key)
        if a and b:
            return float(a) / float(b), key
    return None, "none"


def _phase_work(x: pd.DataFrame) -> dict[str, Any]:
    t = int(x["dur_ns"].sum())
    n = int(x["count"].sum())
    toks = x.groupby("step")["tokens"].first().dropna() if "tokens" in x else pd.Series(dtype=float)
    grid = (x["grid_x"] * x["grid_y"].fillna(1) * x["grid_z"].fillna(1)).dropna()
    rate = None
    if "achieved_tflops" in x and x["flops"].notna().any():
        f = x["flops"].sum()
        rate = float(f / x.loc[x["flops"].notna(), "dur_ns"].sum() / 1e3)
    fl = x["flops"].dropna() if "flops" in x else pd.Series(dtype=float)
    return {
        "time_ns": t,
        "count": n,
        "mean_ns": t / n if n else 0.0,
        "flops_per_launch": float(fl.median()) if len(fl) else None,
        "tokens": float(toks.median()) if len(toks) else None,
        "grid_blocks": float(grid.median()) if len(grid) else None,
        "achieved_tflops": rate,
    }


def _short(name: str, n: int = 90) -> str:
    name = " ".join(name.split())
    return name if len(name) <= n else name[: n - 3] + "..."


# --------------------------------------------------------------------------- F002


def large_tile_decode_gemm(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """A decode GEMM whose tile's skinny side (at least ``min_tile``) is more than ``tile_over_tokens``
    times the decode step's tokens: most of each tile computes padding. Needs the tile decoded from
    the kernel name and the steps' token counts; groups below ``min_share`` of decode are skipped.
    """
    df = ctx.df
    tok = _tokens_per_step(ctx, "decode")
    if tok is None:
        return []
    dec = df[
        (df["phase"] == "decode")
        & df["stage"].isin(ALL_GEMM_STAGES)
        & df["tile_m"].notna()
        & df["tile_n"].notna()
    ]
    total = _phase_total(ctx, "decode")
    out = []
    for gk, g in dec.groupby("group_key", sort=False):
        skinny = int(min(g["tile_m"].iloc[0], g["tile_n"].iloc[0]))
        cost = int(g["dur_ns"].sum())
        if (
            skinny < c["min_tile"]
            or skinny <= c["tile_over_tokens"] * tok
            or not total
            or cost / total < c["min_share"]
        ):
            continue
        ev = {
            "tile": f"{int(g['tile_m'].iloc[0])}x{int(g['tile_n'].iloc[0])}",
            "skinny_side": skinny,
            "tokens_per_step": tok,
            "time_ns": cost,
            "share_of_decode": cost / total,
        }
        out.append(
            _finding(
                c,
                "large_tile_decode_gemm",
                None,
                "decode",
                f"decode GEMM uses a {ev['tile']} tile for {tok:.0f} tokens per step: {_short(str(g['norm_name'].iloc[0]))}",
                [gk],
                ev,
                "Use skinny tiles (M=16/32) or split-K for decode GEMMs; most of a large "
                "tile computes padding when M is the batch of new tokens.",
                cost,
            )
        )
    return out


# --------------------------------------------------------------------------- F003 / F004


def _below_roof(ctx: RunFrame, c: dict[str, Any], phase: str, bound: str, check: str) -> list[dict[str, Any]]:
    df = ctx.df
    if "pct_of_peak" not in df:
        return []
    sub = df[
        (df["phase"] == phase)
        & df["stage"].isin(c["stages"])
        & (df["bound"] == bound)
        & df["pct_of_peak"].notna()
    ]
    total = _phase_total(ctx, phase)
    out = []
    for gk, g in sub.groupby("group_key", sort=False):
        cost = int(g["dur_ns"].sum())
        w = g["dur_ns"].to_numpy(np.float64)
        pct = float(np.average(g["pct_of_peak"].to_numpy(np.float64), weights=w)) if w.sum() else 0.0
        if not total or cost / total < c["min_share"] or pct >= c["max_pct"]:
            continue
        roof_dtype = _roof_dtype(g)
        ev = {
            "pct_of_roof": pct,
            "time_ns": cost,
            f"share_of_{phase}": cost / total,
            "achieved_tflops": float(np.nanmedian(g["achieved_tflops"]))
            if g["achieved_tflops"].notna().any()
            else None,
            "achieved_tbps": float(np.nanmedian(g["achieved_tbps"]))
            if g["achieved_tbps"].notna().any()
            else None,
            "stage": str(g["stage"].iloc[0]),
            "roof_dtype": roof_dtype,
        }
        roof = "memory bandwidth" if bound == "memory" else f"{roof_dtype or ''} compute".lstrip()
        sugg = (
            "Decode is memory-bound: a decode GEMM should stream its weights near HBM bandwidth; check "
            "tile/split-K choice, weight layout (pre-shuffled), and that attention reads the KV cache "
            "once (paged decode kernel with enough splits)."
            if bound == "memory"
            else "Prefill GEMMs should run near the compute roof of their dtype: check tile shape vs M/N/K "
            "and that the tuned config for this shape is being picked"
            + (
                "."
                if roof_dtype in _LOW_PRECISION
                else ", and whether the dtype can be lower (fp8 where the accuracy allows)."
            )
        )
        out.append(
            _finding(
                c,
                check,
                None,
                phase,
                f"{phase} {ev['stage']} at {100 * pct:.0f}% of the {roof} roof: {_short(str(g['norm_name'].iloc[0]))}",
                [gk],
                ev,
                sugg,
                cost,
            )
        )
    return out


def _roof_dtype(g: pd.DataFrame) -> str | None:
    """The dtype whose peak the group's roofs use (``roof_dtype``), the one holding most of its time."""
    if "roof_dtype" not in g:
        return None
    known = g[g["roof_dtype"].notna()]
    if not len(known):
        return None
    return str(known.groupby("roof_dtype", observed=True)["dur_ns"].sum().idxmax())


def decode_below_memory_roof(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """A memory-bound decode GEMM or attention kernel (one of ``stages``) reaching less than
    ``max_pct`` of the HBM bandwidth roof (time-weighted). Needs FLOPs and bytes (shapes or
    ``--model``); latency-bound and invalid kernels make no claim; groups below ``min_share`` of
    decode are skipped."""
    return _below_roof(ctx, c, "decode", "memory", "decode_below_memory_roof")


def prefill_below_compute_roof(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """A compute-bound prefill GEMM (one of ``stages``) reaching less than ``max_pct`` of the
    compute roof of its dtype (time-weighted); groups below ``min_share`` of prefill are skipped."""
    return _below_roof(ctx, c, "prefill", "compute", "prefill_below_compute_roof")


# --------------------------------------------------------------------------- F005


def launch_overhead_chain(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """Many short (< ``max_kernel_ns``) small-stage kernels (``stages``: norm, RoPE, activation,
    elementwise ...) per step, at least ``min_per_step`` of them taking ``min_share`` of the phase:
    launch cost the GPU spends idle or underused. The advice asks for graphs only when the kernels
    are not already replayed from CUDA/HIP graphs (``graph_replayed`` in the evidence)."""
    df = ctx.only("phase", "stage", "dur_ns", "step", "graph_launch", "group_key", "count")
    out = []
    dur = df["dur_ns"].to_numpy()
    for phase in LABELLED_PHASES:
        # masks, and the rows of the columns read: a phase's rows of every column would be a copy
        # of most of the frame
        in_phase = (df["phase"] == phase).to_numpy(bool, na_value=False)
        total = int(df["dur_ns"][in_phase].sum())
        if not total:
            continue
        keep = in_phase & df["stage"].isin(c["stages"]).to_numpy(bool) & (dur < c["max_kernel_ns"])
        short = df.loc[keep, ["stage", "dur_ns", "graph_launch", "group_key"]]
        steps = max(df["step"][in_phase].nunique(), 1)
        share = short["dur_ns"].sum() / total
        per_step = len(short) / steps
        if share < c["min_share"] or per_step < c["min_per_step"]:
            continue
        by_stage = short.groupby("stage")["dur_ns"].agg(["count", "sum"]).sort_values("sum", ascending=False)
        ev = {
            "short_kernels_per_step": per_step,
            "share_of_phase": float(share),
            "time_ns": int(short["dur_ns"].sum()),
            "graph_replayed": float(short["graph_launch"].mean()) if len(short) else 0.0,
            "by_stage": {
                s: {"count": int(r["count"]), "time_ns": int(r["sum"])}
                for s, r in by_stage.head(6).iterrows()
            },
        }
        if ev["graph_replayed"] >= GRAPH_REPLAYED_SHARE:
            sugg = (
                "Fuse the small kernels (add+RMSNorm+quant, RoPE+KV-store, act+mul): they are already "
                "replayed from CUDA/HIP graphs, so what is left is each kernel's fixed cost and the "
                "gaps between them, which only fewer kernels remove."
            )
        else:
            sugg = (
                "Fuse the small kernels (add+RMSNorm+quant, RoPE+KV-store, act+mul) and capture the step "
                "in a CUDA/HIP graph; each launch costs microseconds that the GPU spends idle or underused."
            )
        # the title names the stages the classification gave these kernels, largest first
        named = "/".join(str(s) for s in by_stage.index[by_stage["count"] > 0][:3])
        out.append(
            _finding(
                c,
                "launch_overhead_chain",
                None,
                phase,
                f"{phase}: {per_step:.0f} short (<{c['max_kernel_ns'] / 1000:.0f} us) {named} "
                f"kernels per step take {100 * share:.0f}% of the time",
                list(short["group_key"].value_counts().index[:5]),
                ev,
                sugg,
                int(short["dur_ns"].sum()),
            )
        )
    return out


# --------------------------------------------------------------------------- F006


def decode_gpu_idle(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPU idle for more than ``max_idle`` of the decode steps' wall time (step span minus busy
    time, over all decode steps): the host does not keep the GPU fed. When the decode kernels are
    already replayed from CUDA/HIP graphs (``graph_replayed`` in the evidence) the gap is between
    replays, and the advice turns to the host work around them instead of asking for graphs."""
    st = ctx.steps
    if st is None or len(st) == 0:
        return []
    d = st[st["phase"] == "decode"]
    if len(d) == 0:
        return []
    span, busy = int(d["dur_ns"].sum()), int(d["busy_ns"].sum())
    idle = 1 - busy / span if span else 0.0
    if idle <= c["max_idle"]:
        return []
    ev = {
        "idle_fraction": idle,
        "decode_steps": len(d),
        "step_p50_ns": int(d["dur_ns"].median()),
        "busy_p50_ns": int(d["busy_ns"].median()),
        "graph_replayed": _graph_share(ctx, "decode"),
    }
    if ev["graph_replayed"] >= GRAPH_REPLAYED_SHARE:
        sugg = (
            "Decode is already replayed from CUDA/HIP graphs, so the idle time lies between replays: "
            "overlap scheduling and input preparation with the previous step (async scheduling), "
            "remove host syncs (.item(), DtoH copies) and per-step Python work around the graph."
        )
    else:
        sugg = (
            "Fix the host path first: capture decode in CUDA/HIP graphs, overlap scheduling with "
            "the previous step, remove host syncs (.item(), DtoH copies) from the step loop."
        )
    return [
        _finding(
            c,
            "decode_gpu_idle",
            None,
            "decode",
            f"GPU idle {100 * idle:.0f}% of decode step time: the host cannot keep the GPU fed",
            [],
            ev,
            sugg,
            span - busy,
        )
    ]


def _graph_share(ctx: RunFrame, phase: str) -> float:
    """The share of a phase's launches replayed from CUDA/HIP graphs (0 when none ran)."""
    df = ctx.only("phase", "graph_launch", "count")
    g = df.loc[df["phase"] == phase]
    n = float(g["count"].sum())
    return float((g["graph_launch"].astype(bool) * g["count"]).sum() / n) if n else 0.0


# --------------------------------------------------------------------------- F007


def moe_gate_sort_share(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """MoE routing (the ``moe_gate_sort`` category: top-k, sort, accumulate) taking more than
    ``max_share`` of a phase's kernel time: routing should be a few fused microsecond kernels.
    A gather of the experts' weights is expert work (``moe_expert_gemm``, rules/taxonomy.toml), not
    routing: it is not counted here, and a fused top-k and sort would not remove it."""
    df = ctx.only("phase", "category", "stage", "dur_ns", "group_key")
    out = []
    for phase in LABELLED_PHASES:
        ph = df[df["phase"] == phase]
        total = int(ph["dur_ns"].sum())
        gs = ph[ph["category"] == "moe_gate_sort"]
        if not total or len(gs) == 0:
            continue
        share = gs["dur_ns"].sum() / total
        if share <= c["max_share"]:
            continue
        by = gs.groupby("stage")["dur_ns"].sum().to_dict()
        ev = {
            "share_of_phase": float(share),
            "time_ns": int(gs["dur_ns"].sum()),
            "by_stage": {k: int(v) for k, v in by.items()},
        }
        out.append(
            _finding(
                c,
                "moe_gate_sort_share",
                None,
                phase,
                f"{phase}: MoE gate + sort takes {100 * share:.0f}% of kernel time",
                list(gs.groupby("group_key")["dur_ns"].sum().sort_values(ascending=False).index[:5]),
                ev,
                "Use a fused top-k softmax and a single-pass token sort (e.g. aiter/vLLM "
                "topk_softmax + moe_align/sorting kernels) instead of framework topk/one-hot/index "
                "chains; in decode the routing should be a couple of microsecond kernels.",
                int(gs["dur_ns"].sum()),
            )
        )
    return out


# --------------------------------------------------------------------------- F008


def communication_not_overlapped(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """Collective kernels running with no compute beside them on their GPU for more than
    ``min_share`` of the phase's busy time (exposed communication, per device)."""
    df = ctx.only("aggregate", "phase", "stage", "trace_id", "device", "start_ns", "dur_ns", "group_key")
    df = df[~df["aggregate"]] if df["aggregate"].any() else df
    out = []
    for phase in LABELLED_PHASES:
        ph = df[df["phase"] == phase]
        comm = ph[ph["stage"] == "communication"]
        if len(comm) == 0:
            continue
        exposed = 0
        busy = 0
        for _, g in ph.groupby(["trace_id", "device"]):
            s = g["start_ns"].to_numpy(np.int64)
            e = s + g["dur_ns"].to_numpy(np.int64)
            busy += intervals.busy_ns(s, e)
            is_c = (g["stage"] == "communication").to_numpy()
            cs, ce = s[is_c], e[is_c]
            os_, oe = s[~is_c], e[~is_c]
            comm_busy = intervals.busy_ns(cs, ce)
            both = intervals.busy_ns(np.concatenate([cs, os_]), np.concatenate([ce, oe]))
            other = intervals.busy_ns(os_, oe)
            exposed += both - other  # communication time with no compute running beside it
            _ = comm_busy
        share = exposed / busy if busy else 0.0
        if share < c["min_share"]:
            continue
        ev = {
            "exposed_ns": int(exposed),
            "share_of_busy": float(share),
            "comm_kernels": int(len(comm)),
            "comm_time_ns": int(comm["dur_ns"].sum()),
        }
        out.append(
            _finding(
                c,
                "communication_not_overlapped",
                None,
                phase,
                f"{phase}: {100 * share:.0f}% of GPU busy time is communication with no compute beside it",
                list(comm["group_key"].value_counts().index[:3]),
                ev,
                "Overlap collectives with compute (separate stream, fused all-reduce + RMSNorm, "
                "custom one-shot all-reduce for small decode messages); check rank skew before blaming "
                "the interconnect.",
                int(exposed),
            )
        )
    return out


# --------------------------------------------------------------------------- F009


def unclassified_time(ctx: RunFrame, c: dict[str, Any]) -> list[dict[str, Any]]:
    """More than ``max_share`` of the run's kernel time in kernels no rule recognises (stage
    ``other``): every breakdown above undercounts them; the evidence names the largest."""
    df = ctx.df
    un = df[df["stage"] == "other"]
    share = un["dur_ns"].sum() / ctx.total_ns if ctx.total_ns else 0.0
    if share <= c["max_share"]:
        return []
    top = un.groupby("norm_name")["dur_ns"].sum().sort_values(ascending=False)
    ev = {
        "share_of_run": float(share),
        "time_ns": int(un["dur_ns"].sum()),
        "names": int(len(top)),
        "top": {_short(str(k), 120): int(v) for k, v in top.head(5).items()},
    }
    return [
        _finding(
            c,
            "unclassified_time",
            None,
            None,
            f"{100 * share:.1f}% of kernel time is in kernels no rule recognises",
            list(un["group_key"].value_counts().index[:5]),
            ev,
            "Add rules for them (`llm-kernel-map rules classify NAME`, then a rule in an --rules file) "
            "and send them upstream.",
            int(un["dur_ns"].sum()),
        )
    ]


CHECKS: dict[str, Callable[[RunFrame, Mapping[str, Any]], list[dict[str, Any]]]] = {
    "same_kernel_both_phases": same_kernel_both_phases,
    "large_tile_decode_gemm": large_tile_decode_gemm,
    "decode_below_memory_roof": decode_below_memory_roof,
    "prefill_below_compute_roof": prefill_below_compute_roof,
    "launch_overhead_chain": launch_overhead_chain,
    "decode_gpu_idle": decode_gpu_idle,
    "moe_gate_sort_share": moe_gate_sort_share,
    "communication_not_overlapped": communication_not_overlapped,
    "unclassified_time": unclassified_time,
}
