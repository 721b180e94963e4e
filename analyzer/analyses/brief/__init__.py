"""The prefill-vs-decode brief: what an engineer gathers before tuning a kernel for either phase, read from the trace.

Contract: :func:`build_brief` is a pure function of the analysed kernels (pandas frame), the steps
table, the per-input facts the host ops gave (:mod:`.facts`, an input step), the GPU, the
``--model`` architecture and the brief's settings. It returns plain JSON values. Every value is an
*item*: ``{"value": ..., "evidence": "..."}`` naming what it rests on (host-op shapes, kernel names
or grids, engine annotations, the rule that decided, ``--model``), or ``{"value": null, "unknown":
"..."}`` saying why the trace cannot tell. Nothing is guessed: a value two sources disagree on is
``unknown`` with both named, except where one source is known to show a derived view (an attention
op handed KV heads that were repeated to the query heads: the projections and the cache keep the
real count).

Sections: ``phases`` (time shares), ``tokens`` (per step: prefill, decode, verify width, the
aggregated M of mixed steps), ``model`` (dimensions per rank and, with several ranks, for the
whole model; ``--model`` disagreements), ``dtypes`` (per GEMM family, attention, KV writes;
quantized GEMMs), ``kv_cache`` (layout, GQA group, bytes per token), ``hardware``, ``speculative``,
``latency`` (prefill step times, decode step p50 / p99 per batch), ``interference``
(:mod:`.interference`), ``roles`` (kernel time per phase x layer role, what ``--compare`` matches:
:mod:`.roles`) and ``headroom`` (:mod:`.headroom`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analyses.brief.facts import KV_STORE, input_facts
from analyzer.analyses.brief.kv_cache import kv_cache
from analyzer.analyses.brief.values import known, unknown
from analyzer.knowledge import hardware
from analyzer.knowledge.taxonomy import ALL_GEMM_STAGES, ATTENTION_KERNEL_STAGES, PHASES
from analyzer.tables.frames import SLICE_ROWS, category_codes, floats, grouped_sums

__all__ = ["build_brief", "input_facts", "known", "unknown"]

_QUANT_WEIGHTS = {"int8", "fp8", "fp4", "int", "unsigned char", "c10::quint4x2"}
_MOE_STAGES = ("moe_expert_gemm", "moe_gate_gemm", "moe_topk", "moe_sort", "moe_accumulate")


def _dist(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    v = np.asarray(values, np.float64)
    return {
        "steps": int(len(v)),
        "p50": float(np.percentile(v, 50)),
        "p90": float(np.percentile(v, 90)),
        "max": float(v.max()),
    }


def build_brief(
    frame: pd.DataFrame,
    steps: pd.DataFrame | None,
    facts: Mapping[str, Any],
    gpu: Mapping[str, Any] | None,
    arch: Any = None,
    world_size: int = 1,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The brief of one analysed run (module contract)."""
    from analyzer.analyses.brief import headroom, interference, roles

    settings = settings or {}
    st = steps if steps is not None else pd.DataFrame()
    target, draft = _split_models(st)
    one = _first_facts(facts)
    layers = _walk_layers(frame, target)
    dims = _dims(one, layers, arch, draft_steps=len(draft))
    value_head = dims.pop("value_head_dim", None)
    kinds = _StageFacts.of(frame)
    if not kinds.present & set(_MOE_STAGES):
        dense = known(None, "a dense model: no expert GEMM, router or top-k kernel ran")
        dims.update(experts=dense, top_k=dense, expert_ffn=dense)
    dtypes = _dtypes(one, kinds)
    return {
        "phases": _phases(kinds, st),
        "tokens": _tokens(target),
        "model": {
            "per_rank": dims,
            "whole": _whole(dims, world_size),
            "world_size": world_size,
            "inputs_with_shapes": sum(1 for f in facts.values() if f.get("sizes")),
            "check": _model_check(one, arch, world_size),
        },
        "dtypes": dtypes,
        "kv_cache": kv_cache(
            one, kinds.present, kinds.cache_names, {**dims, "value_head_dim": value_head}, dtypes
        ),
        "hardware": _hardware(gpu),
        "speculative": _speculative(st, target, draft),
        "latency": _latency(target),
        "interference": interference.interference(frame, target, _token_evidence),
        "roles": roles.layer_roles(frame),
        "headroom": headroom.headroom(frame, gpu, settings.get("roof_target", headroom.ROOF_TARGET)),
        "settings": dict(settings),
    }


@dataclasses.dataclass(frozen=True)
class _StageFacts:
    """What the brief reads of the kernels' stages, summed once over the frame's category codes:
    the stages that ran, the kernel time in all and per phase, per stage its most common roof dtype (ties: the
    first by name), and the kernel names of the KV-cache and attention stages."""

    present: set[str]
    total_ns: int
    phase_time: dict[str, int]
    roof_dtype: dict[str, str]
    cache_names: list[str]

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _StageFacts:
        if not len(frame):
            return cls(set(), 0, {}, {}, [])
        n = len(frame)
        stage, stages = category_codes(frame["stage"])
        phase, phases = category_codes(frame["phase"])
        dur = frame["dur_ns"].to_numpy()
        ran = grouped_sums(n, [(stage, len(stages))], {"n": None})["n"]
        present = {str(stages[j]) for j in np.flatnonzero(ran > 0)}
        per_phase = grouped_sums(n, [(phase, len(phases))], {"t": lambda sl: dur[sl]})["t"]
        phase_time = {str(p): int(t) for p, t in zip(phases, per_phase, strict=True) if t}
        roof: dict[str, str] = {}
        if "roof_dtype" in frame:
            rd, rds = category_codes(frame["roof_dtype"])
            c = grouped_sums(n, [(stage, len(stages)), (rd, len(rds))], {"n": None})["n"]
            for j in np.flatnonzero(c.sum(axis=1) > 0):
                best = max(range(len(rds)), key=lambda k: (c[j, k], -k))
                roof[str(stages[j])] = str(rds[best])
        names: list[str] = []
        want = np.array([s in (KV_STORE, *ATTENTION_KERNEL_STAGES) for s in stages] + [False])
        if "norm_name" in frame and want.any():
            nm, nms = category_codes(frame["norm_name"])
            c = grouped_sums(n, [(nm, len(nms))], {"n": None}, mask=lambda sl: want[stage[sl]])["n"]
            names = [str(nms[k]) for k in np.flatnonzero(c > 0)]
        return cls(present, int(dur.sum()), phase_time, roof, names)


# --------------------------------------------------------------------------- steps


def _split_models(st: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    if not len(st):
        return st, st
    model = st["model"].fillna("target") if "model" in st else pd.Series("target", index=st.index)
    return st[model != "draft"], st[model == "draft"]


def _step_evidence(st: pd.DataFrame) -> str:
    """Which rules decided these steps' phases, and how many steps each."""
    if "phase_rule" not in st or not len(st):
        return "no steps"
    c = Counter(str(x) for x in st["phase_rule"].dropna())
    parts = [f"{rule} ({n} steps)" for rule, n in c.most_common()]
    return "phase rule " + ", ".join(parts) if parts else "steps without a phase rule"


def _phases(kinds: _StageFacts, st: pd.DataFrame) -> dict[str, Any]:
    total = kinds.total_ns
    out: dict[str, Any] = {}
    for p in PHASES:
        t = int(kinds.phase_time.get(p, 0))
        if not t:
            continue
        sub = st[st["phase"] == p] if len(st) else st
        out[p] = {
            "time_ns": t,
            "share": t / total if total else 0.0,
            "steps": int(len(sub)),
            "evidence": _step_evidence(sub) if p != "unknown" else "kernels no phase rule decided",
        }
    return out


def _column(st: pd.DataFrame, name: str) -> pd.Series:
    return st[name] if name in st else pd.Series(np.nan, index=st.index)


def _tokens(st: pd.DataFrame) -> dict[str, Any]:
    def dist(sub: pd.DataFrame, col: str, what: str) -> dict[str, Any]:
        if not len(sub):
            return unknown(f"no {what} steps")
        v = pd.to_numeric(_column(sub, col), errors="coerce")
        have = v.dropna()
        if not len(have):
            return unknown(
                f"the {len(sub)} {what} steps carry no token counts (no shapes, annotations or grids say)"
            )
        item = known(_dist(have.to_numpy()), _token_evidence(sub[v.notna()]))
        if len(have) < len(sub):
            item["missing_steps"] = int(len(sub) - len(have))
        return item

    phase = st["phase"] if len(st) else pd.Series(dtype=object)
    pre, dec, mix = st[phase == "prefill"], st[phase == "decode"], st[phase == "mixed"]
    verify = pd.to_numeric(_column(dec, "verify_k"), errors="coerce").dropna() if len(dec) else pd.Series()
    if len(verify):
        vk = known(_dist(verify.to_numpy()), f"verify steps of a speculating target: {_token_evidence(dec)}")
    elif not len(dec):
        vk = unknown("no decode steps")
    else:
        vk = known(None, "no decode step scores several tokens per sequence beside a draft model's steps")
    return {
        "prefill_per_step": dist(pre, "prefill_tokens", "prefill"),
        "decode_per_step": dist(dec, "decode_tokens", "decode"),
        "verify_width": vk,
        "mixed_per_step": dist(mix, "tokens", "mixed"),
        "mixed_prefill_per_step": dist(mix, "prefill_tokens", "mixed"),
        "mixed_decode_per_step": dist(mix, "decode_tokens", "mixed"),
    }


def _token_evidence(st: pd.DataFrame) -> str:
    src = _column(st, "source").fillna("").astype(str)
    ann = src.str.startswith("annotation:")
    parts = []
    if ann.any():
        first = src[ann].iloc[0].removeprefix("annotation:")
        parts.append(f"engine annotations ({int(ann.sum())} steps, e.g. '{first}')")
    if (~ann).any():
        parts.append(f"{_step_evidence(st[~ann])}: attention-op shapes or kernel grids")
    return "; ".join(parts)


# --------------------------------------------------------------------------- model dimensions


def _first_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of the first input that found sizes (ranks of one model show the same shards)."""
    for key in sorted(facts, key=lambda k: int(k) if str(k).isdigit() else 0):
        if facts[key].get("sizes"):
            return dict(facts[key])
    return dict(next(iter(facts.values()))) if facts else {"sizes": None, "qkv": [], "ops": {}}


def _walk_layers(frame: pd.DataFrame, target: pd.DataFrame) -> tuple[int | None, str]:
    """Decoder layers per step as the layer walk numbered them: the value most steps show (ties:
    the larger). The distinct (rank, step, layer) of a slice of kernels at a time, as one integer
    each: no copy of the frame's columns, no per-kernel object."""
    if "layer" not in frame or not len(frame):
        return None, "the layer walk numbered no layers"
    layer, step, rank = floats(frame["layer"]), frame["step"].to_numpy(), frame["rank"].to_numpy()
    top_layer, top_step = np.nanmax(layer, initial=-1), int(step.max(initial=-1))
    if top_layer < 0 or top_step < 0:
        return None, "the layer walk numbered no layers inside a step"
    wanted = np.ones(top_step + 1, bool)
    if len(target) and "step" in target:
        wanted[:] = False
        ids = target["step"].to_numpy(np.int64)
        wanted[ids[(ids >= 0) & (ids <= top_step)]] = True
    low = int(rank.min())
    n_layer, n_step = int(top_layer) + 1, top_step + 1
    seen = []
    for lo in range(0, len(frame), SLICE_ROWS):
        sl = slice(lo, lo + SLICE_ROWS)
        s, la = step[sl], layer[sl]
        ok = (la >= 0) & (s >= 0)
        ok[ok] = wanted[s[ok]]
        key = (rank[sl][ok].astype(np.int64) - low) * n_step + s[ok]
        seen.append(np.unique(key * n_layer + la[ok].astype(np.int64)))
    cells = np.unique(np.concatenate(seen)) if seen else np.empty(0, np.int64)
    if not len(cells):
        return None, "the layer walk numbered no layers inside a step"
    per = np.unique(cells // n_layer, return_counts=True)[1]  # layers per (rank, step)
    values, steps = np.unique(per, return_counts=True)
    best = int(np.flatnonzero(steps == steps.max())[-1])
    n, k = int(values[best]), int(steps[best])
    return n, f"the layer walk numbered {n} decoder layers in {k} of {len(per)} steps"


def _dims(
    facts: Mapping[str, Any], layers: tuple[int | None, str], arch: Any, draft_steps: int
) -> dict[str, Any]:
    sizes = facts.get("sizes")
    out: dict[str, Any] = {}
    walk_n, walk_why = layers
    if draft_steps and sizes:
        why = (
            f"a draft model's {draft_steps} steps ran too (speculative decoding): the shapes found "
            "in the trace mix its sizes with the target's"
        )
        sizes = None
    elif not sizes:
        why = "no embedding lookup with recorded shapes (shapes not recorded, or graph-replayed forwards)"
    else:
        why = ""
    shapes = "recorded host-op shapes"

    def take(key: str, evidence: str, missing: str) -> dict[str, Any]:
        if sizes is None:
            return unknown(why)
        v = sizes.get(key)
        return known(int(v), f"{shapes}: {evidence}") if v is not None else unknown(missing)

    out["hidden"] = take("hidden_size", "the token embedding table's width [V, H]", why)
    out["vocab"] = take(
        "vocab_size",
        "the embedding table's rows, with one H -> V LM-head GEMM per forward",
        "the LM head's GEMM shape is not told apart (its op count fits no single role)",
    )
    out["heads"] = take(
        "num_attention_heads",
        "the fused attention ops' query shape (rules/attention_ops.toml layouts)",
        "no fused attention op with readable shapes (attention composed of matmuls names no heads)",
    )
    out["head_dim"] = take(
        "head_dim",
        "the fused attention ops' query shape",
        "no fused attention op with readable shapes",
    )
    out["kv_heads"] = _kv_heads(sizes, facts, out, why)
    out["ffn"] = take(
        "intermediate_size",
        "the width one GEMM per layer projects back to H (down), H -> I twice as often or H -> 2I (gate, up)",
        "no dense MLP whose GEMM op counts fit gate/up and down (a mixture of experts, or counts that fit no role)",
    )
    if walk_n is not None:
        n_attn = sizes.get("num_hidden_layers") if sizes else None
        ev = walk_why + (
            f"; the attention ops per forward agree ({n_attn})"
            if n_attn == walk_n
            else (
                f"; attention ops per forward show {n_attn} (some forwards without shapes)" if n_attn else ""
            )
        )
        out["layers"] = known(walk_n, ev)
    else:
        out["layers"] = take("num_hidden_layers", "attention ops per forward", walk_why)
    out["value_head_dim"] = (sizes or {}).get("value_head_dim")
    out["experts"] = take(
        "num_experts",
        "the grouped expert GEMMs' or expert-weight gathers' weights, else the router's width",
        "no grouped expert GEMM, expert-weight gather or router with shapes (a dense model, or shapes not recorded)",
    )
    out["top_k"] = take(
        "num_experts_per_tok",
        "routed rows of a step's expert GEMMs over its tokens",
        "no expert GEMM whose routed rows are a whole multiple of its step's tokens",
    )
    out["expert_ffn"] = take(
        "moe_intermediate_size",
        "one expert's width in the grouped expert GEMMs",
        "no grouped expert GEMM with shapes",
    )
    return out


def _kv_heads(
    sizes: Mapping[str, Any] | None, facts: Mapping[str, Any], out: dict[str, Any], why: str
) -> dict[str, Any]:
    """KV heads from three views: the attention op's key shape, the K / V projections' width next
    to the Q projection's, and the KV-cache write's destination. An attention op whose key heads
    equal its query heads may have been handed repeated KV heads (``repeat_kv``): the projections
    and the cache then keep the model's count."""
    if sizes is None:
        return unknown(why)
    heads, hd, hidden = sizes.get("num_attention_heads"), sizes.get("head_dim"), sizes.get("hidden_size")
    attn = sizes.get("num_key_value_heads")
    views: dict[str, int] = {}
    if attn:
        views["the attention ops' key shape"] = int(attn)
    if heads and hd:
        q = heads * hd
        qkv = {(k, n): c for k, n, c in facts.get("qkv", []) if k == hidden}
        if (hidden, q) in qkv:
            narrower = [(n, c) for (_, n), c in qkv.items() if n < q and n % hd == 0]
            if narrower and all(c == 2 * qkv[(hidden, q)] for _, c in narrower) and len(narrower) == 1:
                views[f"the K and V projections' width {narrower[0][0]} beside Q's {q}"] = (
                    narrower[0][0] // hd
                )
            elif not narrower and all(n == q for (_, n) in qkv) and next(iter(qkv.values())) % 3 == 0:
                views[f"Q, K and V projections of one width {q}"] = int(heads)
        fused = [n for (_, n) in qkv if n > q and (n // hd - heads) % 2 == 0 and n % hd == 0]
        if len(qkv) == 1 and fused:
            views[f"the fused QKV projection's width {fused[0]}"] = (fused[0] // hd - heads) // 2
    if hd:
        dests = [w.get("dest") for w in facts.get("ops", {}).get(KV_STORE, []) if w.get("dest")]
        cache = Counter()
        for d in dests:
            dims = [int(x) for x in d.split("x")]
            if len(dims) == 3 and dims[-1] == hd:  # a flat slot cache [slots, KV heads, head size]
                cache[dims[1]] += 1
        if len(cache) == 1:
            ((n, _),) = cache.items()
            views[f"the KV cache written as [{dests[0].replace('x', ', ')}]"] = int(n)
    if not views:
        return unknown("no attention op, K / V projection or cache write shows the KV heads")
    values = set(views.values())
    ev = "; ".join(f"{k} ({v})" for k, v in views.items())
    if len(values) == 1:
        return known(values.pop(), f"recorded host-op shapes: {ev}")
    others = {k: v for k, v in views.items() if not k.startswith("the attention ops'")}
    if attn and attn == heads and len(set(others.values())) == 1:
        v = next(iter(others.values()))
        return known(
            v,
            f"recorded host-op shapes: {ev}; the attention op is handed the KV heads repeated to the query heads",
        )
    return unknown(f"the views disagree: {ev}")


def _whole(dims: Mapping[str, Any], world: int) -> dict[str, Any] | None:
    """With several ranks: per-rank shards times the world size, stated as the assumption it is."""
    if world <= 1:
        return None
    out = {}
    why = f"per rank x world size {world}, assuming tensor parallelism shards it over every rank"
    for key in ("heads", "kv_heads", "ffn", "vocab", "experts", "expert_ffn"):
        v = dims.get(key, {}).get("value")
        out[key] = (
            known(v * world, why)
            if v is not None
            else unknown(f"per rank: {dims.get(key, {}).get('unknown')}")
        )
    for key in ("hidden", "head_dim", "layers", "top_k"):
        out[key] = dict(dims.get(key, unknown("not found")))
        if out[key].get("value") is not None:
            out[key]["evidence"] += "; not sharded by tensor parallelism"
    return out


def _model_check(facts: Mapping[str, Any], arch: Any, world: int) -> dict[str, Any] | None:
    if arch is None:
        return None
    from analyzer.analyses.shape_roles import ModelDims, size_disagreements

    sizes = facts.get("sizes")
    if not sizes:
        return {"model": arch.name, "disagreements": [], "checked": False}
    found = ModelDims(
        hidden=sizes["hidden_size"],
        vocab=sizes.get("vocab_size"),
        intermediate=sizes.get("intermediate_size"),
        heads=sizes.get("num_attention_heads"),
        kv_heads=sizes.get("num_key_value_heads"),
        head_dim=sizes.get("head_dim"),
        layers=sizes.get("num_hidden_layers"),
        experts=sizes.get("num_experts"),
        experts_per_tok=sizes.get("num_experts_per_tok"),
        expert_intermediate=sizes.get("moe_intermediate_size"),
    )
    return {"model": arch.name, "disagreements": size_disagreements(found, arch, world), "checked": True}


# --------------------------------------------------------------------------- dtypes and the KV cache


def _norm(raw: str | None) -> str | None:
    return hardware.normalize_dtype(raw) or raw if raw else None


def _dtypes(facts: Mapping[str, Any], kinds: _StageFacts) -> dict[str, Any]:
    """Per GEMM family, attention stage and the KV-cache store: the dtypes its launching ops
    recorded (activation, weight / key), the op names, and whether the GEMM is quantized; else the
    dtype its kernels' roofs were measured in (a kernel name that spells it, or the model's)."""
    ops = facts.get("ops", {})
    stages = [s for s in (*ALL_GEMM_STAGES, *ATTENTION_KERNEL_STAGES, KV_STORE) if s in kinds.present]
    out: dict[str, Any] = {}
    for s in stages:
        rows = ops.get(s, [])
        if s in ATTENTION_KERNEL_STAGES:  # its front end's q, k, v; not the copies around it
            rows = [r for r in rows if r.get("attention_op")]
        elif s == KV_STORE:
            rows = [r for r in rows if r.get("dtype")]
        if rows:
            best = max(rows, key=lambda r: r["kernels"])
            act, weight = _norm(best["dtype"]), _norm(best["weight_dtype"])
            names = sorted({r["op"] for r in rows})
            quant = s in ALL_GEMM_STAGES and (
                (weight is not None and (weight in _QUANT_WEIGHTS or weight != act))
                or any("scaled" in n or "int4" in n or "int8" in n or "_int_mm" in n for n in names)
            )
            share = best["kernels"] / sum(r["kernels"] for r in rows)
            value = {
                "activation": act,
                "weight" if s in ALL_GEMM_STAGES else "key": weight,
                "quantized": bool(quant),
            }
            if s == KV_STORE:
                value = {"written": act}
                names = sorted({r["op"] for r in rows})
            out[s] = known(
                value,
                f"recorded input types of {', '.join(names[:4])} ({share:.0%} of its {sum(r['kernels'] for r in rows)} kernels with ops)",
            )
            continue
        v = kinds.roof_dtype.get(s)
        if v is not None:
            out[s] = known(
                {"compute": v},
                "the dtype its kernels' roofs use (a kernel name that spells it, or the model's)",
            )
        else:
            out[s] = unknown("no launching op with recorded input types and no dtype in its kernel names")
    out["accumulator"] = unknown("no trace records a GEMM's accumulator type (only its inputs and outputs)")
    return out


# --------------------------------------------------------------------------- hardware, speculation, latency


def _hardware(gpu: Mapping[str, Any] | None) -> dict[str, Any]:
    if not gpu or not gpu.get("name"):
        return unknown((gpu or {}).get("reason") or "no GPU name, arch or SM count in the trace")
    peaks = dict(gpu.get("peaks") or {})
    return known(
        {
            "name": gpu["name"],
            "arch": gpu.get("arch"),
            "hbm_tbps": peaks.get("hbm_tbps"),
            "bf16_tflops": peaks.get("bf16_tflops"),
            "fp8_tflops": peaks.get("fp8_tflops"),
            "fp8": bool(peaks.get("fp8_tflops")),
            "measured": dict(gpu.get("measured") or {}),
        },
        f"{gpu.get('reason')}; peaks from rules/hardware.toml ({gpu.get('source', '')[:80]})",
    )


def _speculative(st: pd.DataFrame, target: pd.DataFrame, draft: pd.DataFrame) -> dict[str, Any]:
    if not len(st):
        return unknown("no steps")
    verify = pd.to_numeric(_column(target, "verify_k"), errors="coerce").dropna()
    if len(draft) or len(verify):
        return known(
            {
                "draft_steps": int(len(draft)),
                "target_steps": int(len(target)),
                "verify_steps": int(len(verify)),
                "verify_width": _dist(verify.to_numpy()) if len(verify) else None,
            },
            f"{len(draft)} steps of a second, smaller model interleaved with the target's "
            f"({_step_evidence(draft) if len(draft) else 'no draft steps'}); {len(verify)} target steps score several tokens per sequence",
        )
    return known(None, f"none seen: no draft model's steps and no verify steps among {len(st)} steps")


def _latency(st: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {}
    phase = st["phase"] if len(st) else pd.Series(dtype=object)
    pre = st[phase == "prefill"]
    if len(pre):
        d = pre["dur_ns"].to_numpy(np.float64)
        out["prefill_step_ns"] = known(
            {**_dist(d), "first": float(d[0]), "kernel_p50": float(np.percentile(pre["kernel_ns"], 50))},
            "wall time of each prefill step (first kernel start to last kernel end): a floor under time to first token",
        )
    else:
        out["prefill_step_ns"] = unknown("no prefill steps")
    dec = st[phase == "decode"]
    if len(dec):
        d = dec["dur_ns"].to_numpy(np.float64)
        item = known(
            {
                "steps": int(len(d)),
                "p50": float(np.percentile(d, 50)),
                "p99": float(np.percentile(d, 99)),
                "kernel_p50": float(np.percentile(dec["kernel_ns"], 50)),
            },
            "wall time of each decode step: a floor under the inter-token latency",
        )
        tok = pd.to_numeric(_column(dec, "decode_tokens"), errors="coerce")
        if tok.nunique() > 1:
            item["value"]["per_batch"] = [
                {
                    "tokens": int(t),
                    "steps": int(len(g)),
                    "p50": float(np.percentile(g, 50)),
                    "p99": float(np.percentile(g, 99)),
                }
                for t, g in dec.assign(_t=tok).groupby("_t")["dur_ns"]
            ]
        out["decode_step_ns"] = item
    else:
        out["decode_step_ns"] = unknown("no decode steps")
    return out
