"""Steps and phases: every kernel gets ``step`` (-1 outside every step), ``phase`` and ``tokens``.

Contract (DESIGN §4), strongest source first:

1. **Engine annotations** (vLLM ``execute_new_N_cached_M`` and ``execute_N_context_..._generation_...``,
   SGLang ``step[EXTEND|DECODE|MIXED ...]``, ATOM ``prefill[...]`` / ``decode[...]``, our own
   ``lkm::step phase=..``, NVTX / rocpd ranges naming prefill/extend/context or decode/generation) on
   the GPU timeline (kernel start inside the range) or the CPU timeline (launch call inside the
   range). ``capture_<bs>_...`` ranges are graph capture, not execution. ``ProfilerStep#N`` is only an
   outer bound and is never a step.
2. **Forward segmentation** when no annotation applies: the timeline of each device is cut at the
   first kernel of every forward (the embedding lookup, or the first layer's input norm when there is
   no embedding kernel), so sampling and bookkeeping after a forward belong to that forward's step.
   Without any forward structure, idle gaps cut steps.
3. **Labels** for unannotated steps: the attention op's query length from host-op shapes when
   recorded (q > 1 -> prefill, q == 1 -> decode); else the kernels' own signature: a step whose
   typical GEMM / attention kernel runs many times longer than the run's shortest steps is a prefill.

Annotation names are matched by the patterns in ``rules/annotations.toml``; the analyser never
looks at any other annotation (in particular never at test labels).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.model import dict_isin, dict_strings, launch_calls, objects
from analyzer.tables import intervals, lookup

if TYPE_CHECKING:
    from analyzer.pipeline import Analysis, Options

from analyzer.paths import RULES_DIR  # noqa: E402

PHASES = ("prefill", "decode", "mixed", "unknown")
ATTENTION = ("flash_attention", "paged_attention", "mla_attention")
GEMMS = (
    "qkv_gemm",
    "o_gemm",
    "gate_up_gemm",
    "down_gemm",
    "lm_head_gemm",
    "moe_gate_gemm",
    "gemm",
    "moe_expert_gemm",
)
# how many times longer a step's typical heavy kernel must be than in the run's lightest steps
PREFILL_WORK_RATIO = 3.0
# an idle gap this many times the median inter-kernel gap (and >= 200 us) cuts a step when there
# is no forward structure at all
GAP_FACTOR = 50.0
MIN_GAP_NS = 200_000


@dataclasses.dataclass
class StepAnnotation:
    """A parsed engine annotation: one forward step."""

    start_ns: int
    end_ns: int
    side: str
    phase: str
    tokens: int | None
    name: str
    trace_id: int
    rank: int
    capture: bool = False


# --------------------------------------------------------------------------- annotation patterns


@lru_cache(maxsize=1)
def annotation_patterns() -> list[dict[str, Any]]:
    with open(RULES_DIR / "annotations.toml", "rb") as f:
        data = tomllib.load(f)
    pats = []
    for a in data["annotation"]:
        pats.append({**a, "regex": re.compile(a["pattern"])})
    return pats


def parse_annotation(name: str) -> tuple[str, str | None, int | None] | None:
    """(engine id, phase or None for capture, tokens) for a step annotation name, else None."""
    for a in annotation_patterns():
        m = a["regex"].search(name)
        if not m:
            continue
        g = m.groupdict()
        kind = a["kind"]
        if kind == "capture":
            return a["id"], None, None
        if kind == "outer":
            return None
        phase = _phase_of(a, g)
        tokens = _int(g.get("tokens"))
        if tokens is None and g.get("q") and g.get("bs"):
            tokens = int(g["q"]) * int(g["bs"])
        if tokens is None and phase == "decode":
            tokens = _int(g.get("bs"))  # one new token per sequence
        return a["id"], phase, tokens
    return None


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _phase_of(a: dict[str, Any], g: dict[str, str | None]) -> str:
    kind = a["kind"]
    if kind == "fixed":
        return a["phase"]
    if kind == "word":
        w = (g.get("word") or "").lower()
        for phase, words in a["words"].items():
            if w in words:
                return phase
        return "unknown"
    if kind == "counts":
        p = _int(g.get("prefill")) or 0
        d = _int(g.get("decode")) or 0
        if p and d:
            return "mixed"
        if p:
            return "prefill"
        if d:
            return "decode"
        return "unknown"
    return "unknown"


def step_annotations(annotations: pa.Table) -> tuple[list[StepAnnotation], list[str]]:
    """Parse every recognised step annotation; return them and the engine ids found."""
    out: list[StepAnnotation] = []
    engines: set[str] = set()
    if annotations.num_rows == 0:
        return out, []
    df = annotations.to_pandas()
    names = df["name"].astype(str)
    cache: dict[str, Any] = {}
    for i, name in enumerate(names):
        if name not in cache:
            cache[name] = parse_annotation(name)
        hit = cache[name]
        if hit is None:
            continue
        eng, phase, tokens = hit
        engines.add(eng)
        r = df.iloc[i]
        out.append(
            StepAnnotation(
                int(r.start_ns),
                int(r.end_ns),
                str(r.side),
                phase or "unknown",
                tokens,
                name,
                int(r["trace_id"]),
                int(r["rank"]),
                capture=phase is None,
            )
        )
    return out, sorted(engines)


# --------------------------------------------------------------------------- entry point


def run(analysis: Analysis, options: Options) -> None:
    label(analysis, options)
    analysis.warnings.extend(coverage_warnings(analysis.kernels))


def label(analysis: Analysis, options: Options) -> None:
    """Phase, step and tokens of every kernel, and the steps table: the per-trace part of :func:`run`
    (each input's steps depend on that input alone, so inputs may be labelled apart and joined)."""
    kernels = analysis.kernels
    anns, engines = step_annotations(analysis.trace.annotations)
    analysis.annotations_found = engines
    phase, step, tokens, steps, warnings = split_phases(kernels, analysis.trace.host_ops, anns)
    analysis.warnings.extend(warnings)
    analysis.steps = steps
    for name, arr in (
        ("phase", dict_strings(phase)),
        ("step", pa.array(step, pa.int32())),
        ("tokens", pa.array(tokens, pa.int64())),
    ):
        if name in kernels.column_names:
            kernels = kernels.set_column(kernels.schema.get_field_index(name), name, arr)
        else:
            kernels = kernels.append_column(name, arr)
    analysis.kernels = kernels


def coverage_warnings(kernels: pa.Table) -> list[str]:
    """What the labelled run leaves without a phase: totals-only rows, activity outside every step."""
    out = []
    agg = kernels["aggregate"].to_numpy(zero_copy_only=False)
    if agg.any():
        out.append(f"{int(agg.sum())} kernel rows are totals only (no timeline): no step or phase")
    outside = kernels["step"].to_numpy(zero_copy_only=False) < 0
    if outside.any() and (~outside).any():
        dur = kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.int64)
        share = dur[outside].sum() / max(dur.sum(), 1)
        if share > 0.001:
            out.append(
                f"{int(outside.sum())} GPU activities ({100 * share:.1f}% of kernel time) are outside "
                "every step (phase unknown)"
            )
    return out


STEP_COLUMNS = [
    "trace_id",
    "rank",
    "step",
    "phase",
    "start_ns",
    "dur_ns",
    "busy_ns",
    "kernel_ns",
    "kernels",
    "tokens",
    "source",
]


def split_phases(
    kernels: pa.Table, host_ops: pa.Table, anns: list[StepAnnotation]
) -> tuple[list[str], np.ndarray, list[int | None], pd.DataFrame, list[str]]:
    """Per-kernel phase, step and tokens, plus the steps table and the warnings of each input
    (:func:`coverage_warnings` adds those of the whole run)."""
    n = kernels.num_rows
    phase = ["unknown"] * n
    step = np.full(n, -1, np.int64)
    tokens: list[int | None] = [None] * n
    warnings: list[str] = []
    stage = objects(kernels["stage"])
    # plain numpy columns: per-step slicing by position must not go through pandas indexing
    df = {
        "trace_id": kernels["trace_id"].to_numpy(zero_copy_only=False),
        "rank": kernels["rank"].to_numpy(zero_copy_only=False),
        "start": kernels["start_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64),
        "dur": kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.int64),
        "agg": kernels["aggregate"].to_numpy(zero_copy_only=False),
        "stage": stage,
        "is_attn": dict_isin(kernels["stage"], ATTENTION),
        "is_heavy": dict_isin(kernels["stage"], GEMMS + ATTENTION),
        "fill": _is_fill(kernels),
        "corr": kernels["correlation"].to_numpy(zero_copy_only=False),
        "ext": kernels["launch_op_id"].to_numpy(zero_copy_only=False),
    }
    launch_ts = _launch_times(kernels, host_ops)
    step_rows: list[dict[str, Any]] = []
    timed = np.flatnonzero(~df["agg"])
    for tid in np.unique(df["trace_id"][timed]).tolist():
        sel = timed[df["trace_id"][timed] == tid]
        idx = sel[np.argsort(df["start"][sel], kind="stable")]
        t_anns = [a for a in anns if a.trace_id == tid]
        capture = [a for a in t_anns if a.capture]
        execs = [a for a in t_anns if not a.capture]
        if capture and not execs:
            warnings.append(
                f"trace {tid}: only graph-capture annotations ({capture[0].name} ...): "
                "kernels inside them are capture, not execution"
            )
        if execs:
            rows = _steps_from_annotations(idx, df, launch_ts, execs, step, phase, tokens, warnings, tid)
        else:
            rows = _steps_from_structure(idx, df, kernels, host_ops, step, phase, tokens, tid)
        step_rows.extend(rows)
    steps = pd.DataFrame(step_rows, columns=STEP_COLUMNS)
    return phase, step, tokens, steps, warnings


def _is_fill(kernels: pa.Table) -> np.ndarray:
    """Buffer fills: memsets and the framework's fill kernels."""
    names = dict_strings(kernels["norm_name"] if "norm_name" in kernels.column_names else kernels["name"])
    # matched once per distinct name: the names themselves are never expanded per row
    fill = pc.fill_null(pc.match_substring(names.dictionary, "FillFunctor"), False).take(names.indices)
    return pc.fill_null(fill, False).to_numpy(zero_copy_only=False) | dict_isin(kernels["kind"], ["memset"])


def _launch_times(kernels: pa.Table, host_ops: pa.Table) -> np.ndarray:
    """Start of the runtime/driver call that launched each kernel (kernel start when unknown)."""
    start = kernels["start_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if host_ops.num_rows == 0:
        return start.copy()
    calls = launch_calls(host_ops, ["trace_id", "correlation", "start_ns"])
    if calls.num_rows == 0:
        return start.copy()
    pos = lookup.index_in(  # the first call of each (trace, correlation)
        lookup.pair(kernels["trace_id"], kernels["correlation"]),
        lookup.pair(calls["trace_id"], calls["correlation"]),
    )
    call_start = pc.take(calls["start_ns"], pos)
    found = call_start.is_valid().to_numpy(zero_copy_only=False)
    return np.where(found, call_start.fill_null(0).to_numpy(zero_copy_only=False), start).astype(np.int64)


# --------------------------------------------------------------------------- annotated steps


def _steps_from_annotations(
    idx: np.ndarray,
    df: pd.DataFrame,
    launch_ts: np.ndarray,
    anns: list[StepAnnotation],
    step: np.ndarray,
    phase: list[str],
    tokens: list[int | None],
    warnings: list[str],
    tid: int,
) -> list[dict[str, Any]]:
    # prefer GPU-side ranges when the engine wrote both sides
    gpu = [a for a in anns if a.side == "gpu"]
    on_gpu = bool(gpu)
    use = merge_nested(sorted(gpu if on_gpu else anns, key=lambda a: a.start_ns))
    for a, b in zip(use, use[1:], strict=False):
        if b.start_ns < a.end_ns:
            warnings.append(f"trace {tid}: overlapping step annotations {a.name!r} and {b.name!r}")
            break
    start = df["start"][idx]
    key = start if on_gpu else launch_ts[idx]
    rows = []
    k_start = df["start"]
    k_dur = df["dur"]
    for s, a in enumerate(use):
        lo = np.searchsorted(key, a.start_ns, side="left") if on_gpu else None
        if on_gpu:
            hi = np.searchsorted(key, a.end_ns, side="left")
            members = idx[lo:hi]
        else:
            members = idx[(key >= a.start_ns) & (key < a.end_ns)]
        members = members[step[members] < 0]
        if len(members) == 0:
            warnings.append(f"trace {tid}: step annotation {a.name!r} holds no kernel")
            continue
        step[members] = s
        for m in members.tolist():
            phase[m] = a.phase
            tokens[m] = a.tokens
        ks, ke = k_start[members], k_start[members] + k_dur[members]
        lo_t = min(int(ks.min()), a.start_ns) if on_gpu else int(ks.min())
        hi_t = max(int(ke.max()), a.end_ns) if on_gpu else int(ke.max())
        rows.append(
            _step_row(tid, df, members, s, a.phase, lo_t, hi_t, a.tokens, "annotation:" + a.name[:60])
        )
    return rows


def merge_nested(anns: list[StepAnnotation]) -> list[StepAnnotation]:
    """Engines and patches often annotate one step twice (``execute_...`` around ``step[...]``):
    annotations that mostly overlap are one step, with the outer range and whichever tokens and
    phase are known."""
    out: list[StepAnnotation] = []
    for a in anns:
        if out:
            b = out[-1]
            inter = min(a.end_ns, b.end_ns) - max(a.start_ns, b.start_ns)
            shorter = max(min(a.end_ns - a.start_ns, b.end_ns - b.start_ns), 1)
            if inter >= 0.5 * shorter:
                phase = b.phase if b.phase != "unknown" else a.phase
                if "unknown" not in (a.phase, b.phase) and a.phase != b.phase:
                    phase = "mixed"
                out[-1] = dataclasses.replace(
                    b,
                    start_ns=min(a.start_ns, b.start_ns),
                    end_ns=max(a.end_ns, b.end_ns),
                    phase=phase,
                    tokens=b.tokens if b.tokens is not None else a.tokens,
                    name=b.name if len(b.name) <= len(a.name) else a.name,
                )
                continue
        out.append(a)
    return out


def _step_row(
    tid: int,
    df: pd.DataFrame,
    members: np.ndarray,
    s: int,
    ph: str,
    lo: int,
    hi: int,
    tok: int | None,
    source: str,
) -> dict[str, Any]:
    st = df["start"][members]
    en = st + df["dur"][members]
    return {
        "trace_id": int(tid),
        "rank": int(df["rank"][members[0]]),
        "step": int(s),
        "phase": ph,
        "start_ns": int(lo),
        "dur_ns": int(hi - lo),
        "busy_ns": intervals.busy_ns(st, en),
        "kernel_ns": int(df["dur"][members].sum()),
        "kernels": len(members),
        "tokens": tok,
        "source": source,
    }


# --------------------------------------------------------------------------- unannotated steps


def forward_starts(stages: np.ndarray) -> np.ndarray:
    """Positions (in time order) where a forward begins: embedding, else first layer input norm."""
    emb = np.flatnonzero(stages == "embedding")
    if len(emb):
        # consecutive embedding kernels (e.g. a gather + a scale) start one forward
        keep = np.concatenate([[True], np.diff(emb) > 1])
        return emb[keep]
    attn = np.isin(stages, ATTENTION)
    if not attn.any():
        return np.empty(0, np.int64)
    # a forward starts after an lm_head GEMM (or at the first kernel)
    lm = np.flatnonzero(stages == "lm_head_gemm")
    starts = [0]
    for p in lm.tolist():
        nxt = p + 1
        while nxt < len(stages) and stages[nxt] not in ("norm", "qkv_gemm") + ATTENTION:
            nxt += 1
        if nxt < len(stages):
            starts.append(nxt)
    return np.unique(np.asarray(starts, np.int64))


def _steps_from_structure(
    idx: np.ndarray,
    df: pd.DataFrame,
    kernels: pa.Table,
    host_ops: pa.Table,
    step: np.ndarray,
    phase: list[str],
    tokens: list[int | None],
    tid: int,
) -> list[dict[str, Any]]:
    stages = df["stage"][idx]
    starts = _graph_launch_start(
        forward_starts(stages),
        df["corr"][idx],
        kernels["graph_launch"].to_numpy(zero_copy_only=False)[idx],
        df["fill"][idx],
    )
    source = "forward"
    k_st = df["start"][idx]
    k_du = df["dur"][idx]
    if len(starts) == 0:
        starts = _gap_starts(k_st, k_du)
        source = "gaps"
    elif starts[0] > 0 and np.isin(stages[: starts[0]], GEMMS + ATTENTION).any():
        # a forward before the first recognised one (its embedding ran elsewhere, e.g. on the
        # host): the prefix is a step of its own rather than time outside every step
        first_heavy = int(np.flatnonzero(np.isin(stages[: starts[0]], GEMMS + ATTENTION))[0])
        lead = first_heavy
        while lead > 0 and stages[lead - 1] not in ("memset", "memcpy"):
            lead -= 1
        starts = np.unique(np.concatenate([[lead], starts]))
    bounds = list(starts.tolist()) + [len(idx)]
    segments = [idx[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    if not segments:
        return []
    q_lens = _query_lengths(kernels, host_ops)
    labels, toks = [], []
    for seg in segments:
        lab, tok = _label_from_shapes(seg, df, q_lens)
        labels.append(lab)
        toks.append(tok)
    if any(lab is None for lab in labels):
        sig = _label_from_signature(segments, df)
        labels = [lab if lab is not None else sig[i] for i, lab in enumerate(labels)]
    # graph-replayed decode steps record no shapes: with static batching each sequence of the
    # prefill batch adds one token per decode step
    batch = _prefill_batch(segments, df, q_lens)
    if batch:
        toks = [t if t is not None or lab != "decode" else batch for t, lab in zip(toks, labels, strict=True)]
    rows = []
    k_start = df["start"]
    for s, seg in enumerate(segments):
        step[seg] = s
        for m in seg.tolist():
            phase[m] = labels[s]
            tokens[m] = toks[s]
        lo = int(k_start[seg[0]])
        if s + 1 < len(segments):
            hi = int(k_start[segments[s + 1][0]])
        else:
            hi = int((k_start[seg] + df["dur"][seg]).max())
        rows.append(_step_row(tid, df, seg, s, labels[s], lo, hi, toks[s], source))
    return rows


MAX_STAGING_FILLS = 4


def _graph_launch_start(
    starts: np.ndarray, corr: np.ndarray, graph: np.ndarray, fill: np.ndarray
) -> np.ndarray:
    """A forward replayed from a CUDA/HIP graph begins with the graph's first kernel (position ids,
    buffer fills ... come before the embedding), so move each start back to it; the eager fills
    launched right before the replay reset its static input buffers, so they open the step too."""
    out = []
    for s in starts.tolist():
        if graph[s]:
            while s > 0 and graph[s - 1] and corr[s - 1] == corr[s]:
                s -= 1
            k = 0
            while s > 0 and k < MAX_STAGING_FILLS and not graph[s - 1] and fill[s - 1]:
                s -= 1
                k += 1
        out.append(s)
    return np.unique(np.asarray(out, np.int64))


def _gap_starts(start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    if len(start) == 0:
        return np.empty(0, np.int64)
    end = np.maximum.accumulate(start + dur)
    gaps = start[1:] - end[:-1]
    if len(gaps) == 0:
        return np.array([0])
    thresh = max(MIN_GAP_NS, GAP_FACTOR * float(np.median(np.maximum(gaps, 0))))
    cuts = np.flatnonzero(gaps > thresh) + 1
    return np.concatenate([[0], cuts]).astype(np.int64)


_ATTN_OPS = (
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
    "aten::scaled_dot_product_attention",
    "aten::_cudnn_attention_forward",
)


def _query_lengths(kernels: pa.Table, host_ops: pa.Table) -> dict[tuple[int, int], tuple[int, int]]:
    """(trace_id, external id) of attention ops -> (batch, query length) from their input shapes."""
    if host_ops.num_rows == 0:
        return {}
    attn = pa.array(dict_isin(host_ops["name"], _ATTN_OPS))
    sel = host_ops.select(["trace_id", "external_id", "input_dims"])
    sel = sel.filter(pc.and_(attn, pc.is_valid(sel["input_dims"])))
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for t, e, d in zip(
        sel["trace_id"].to_pylist(),
        sel["external_id"].to_pylist(),
        sel["input_dims"].to_pylist(),
        strict=True,
    ):
        if e is None or not d or len(d[0]) != 4:
            continue
        b, _, q, _ = d[0]
        out[(t, e)] = (b, q)
    return out


def _attention_hits(
    seg: np.ndarray, df: Any, q_lens: dict[tuple[int, int], tuple[int, int]]
) -> list[tuple[int, int]]:
    """(batch, query length) of the attention ops behind the attention kernels of one step."""
    if not q_lens:
        return []
    att = seg[df["is_attn"][seg]]
    out = []
    for t, e in zip(df["trace_id"][att].tolist(), df["ext"][att].tolist(), strict=True):
        if e is None or e != e:  # NaN: no host op
            continue
        hit = q_lens.get((int(t), int(e)))
        if hit:
            out.append(hit)
    return out


def _prefill_batch(
    segments: list[np.ndarray], df: Any, q_lens: dict[tuple[int, int], tuple[int, int]]
) -> int | None:
    """Batch size of the run's prefill (attention op shapes), when all shape-labelled steps agree."""
    batches = {b for seg in segments for b, q in _attention_hits(seg, df, q_lens)[:1] if q > 1}
    return batches.pop() if len(batches) == 1 else None


def _label_from_shapes(
    seg: np.ndarray, df: Any, q_lens: dict[tuple[int, int], tuple[int, int]]
) -> tuple[str | None, int | None]:
    hits = _attention_hits(seg, df, q_lens)
    if not hits:
        return None, None
    b, q = hits[0]
    return ("decode" if q == 1 else "prefill"), int(b * q)


def _label_from_signature(segments: list[np.ndarray], df: pd.DataFrame) -> list[str]:
    """Prefill steps do the same kernels' work over many tokens: their heavy kernels run longer."""
    work = []
    for seg in segments:
        dur = df["dur"][seg]
        heavy = dur[df["is_heavy"][seg]]
        work.append(float(np.median(heavy)) if len(heavy) else float(np.median(dur)))
    w = np.asarray(work)
    if len(w) == 1:
        return ["unknown"]
    base = float(np.percentile(w, 25))
    out = []
    for x in w:
        out.append("prefill" if base > 0 and x > PREFILL_WORK_RATIO * base else "decode")
    if all(lab == "prefill" for lab in out):
        return ["unknown"] * len(out)
    return out
