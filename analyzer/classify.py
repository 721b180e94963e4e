"""Kernels -> stage, category, provider, rule id, decoded tile fields, GEMM role and layer.

Contract (pure over the kernels and host_ops tables):

1. **Names.** Every distinct kernel name is normalised and matched once against the rule table
   (``rules/kernels.toml``, first match wins) and the result is mapped back to every launch.
2. **Host ops.** A generic framework kernel (stage ``elementwise``) launched by a host op whose name
   says what it does (``rules/ops.toml``: ``aten::silu`` -> activation, ``aten::topk`` -> sampling ...)
   takes that stage.
3. **Structure.** On each device the kernels form a repeating per-layer sequence
   (norm -> QKV GEMM -> RoPE / KV store -> attention -> O GEMM -> norm -> MLP or MoE). One pass over
   that sequence gives every GEMM its role (``qkv_gemm`` ... ``lm_head_gemm``, ``moe_gate_gemm``,
   expert GEMMs), numbers the decoder layers (``layer``) and gives the generic kernels between the
   anchors the stage of the region they sit in (an eager RMSNorm's pow/mean/rsqrt/mul -> norm, an
   eager RoPE's mul/neg/cat/add -> rope, the trailing KV-cache cat/copy -> kv_cache_store ...).
   This works without host ops (CUDA-graph replay, rocprof, nsys), so shapes are never required.
4. **Shapes.** Where host-op input shapes are recorded, ``gemm_roles_from_shapes`` derives the
   roles independently from the layer dimensions; tests check both agree.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer import rules as rules_mod

if TYPE_CHECKING:
    from analyzer.pipeline import Analysis, Options

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"

GEMM_ROLES = ("qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm", "lm_head_gemm", "moe_gate_gemm")
GEMM_STAGES = frozenset(GEMM_ROLES + ("gemm",))
ATTENTION = frozenset({"flash_attention", "paged_attention", "mla_attention"})
ATTN_AUX = frozenset({"attention_reduce"})
# Kernels whose stage the structure may refine: generic framework kernels only.
GENERIC = frozenset({"elementwise"})
SAMPLING_LIKE = frozenset({"sampling", "moe_topk"})
NEUTRAL = frozenset({"communication", "memcpy", "memset", "other", "quantize"})


# --------------------------------------------------------------------------- entry point


def run(analysis: Analysis, options: Options) -> None:
    ruleset = rules_mod.load_rules(list(options.rules))
    analysis.rules_sha256 = ruleset.sha256
    analysis.kernels = classify_kernels(analysis.kernels, analysis.trace.host_ops, ruleset)


def classify_kernels(kernels: pa.Table, host_ops: pa.Table, ruleset: Any) -> pa.Table:
    """Add the classification columns (DESIGN §2) to ``kernels``."""
    cols = classify_by_name(kernels, ruleset)
    op_names = launching_op_names(kernels, host_ops)
    stage = cols["stage"]
    apply_op_hints(stage, op_names)
    order = np.lexsort((kernels["start_ns"].to_numpy(zero_copy_only=False),
                        kernels["device"].to_numpy(zero_copy_only=False),
                        kernels["trace_id"].to_numpy(zero_copy_only=False)))
    layer = np.full(kernels.num_rows, -1, np.int64)
    timed = ~kernels["aggregate"].to_numpy(zero_copy_only=False)
    tid = kernels["trace_id"].to_numpy(zero_copy_only=False)
    dev = kernels["device"].to_numpy(zero_copy_only=False)
    norm = cols["norm_name"]
    launch = kernels["launch_op_id"].to_numpy(zero_copy_only=False)
    start = 0
    ordered = order[timed[order]]
    keys = tid[ordered].astype(np.int64) * 65536 + dev[ordered].astype(np.int64)
    bounds = np.flatnonzero(np.diff(keys)) + 1
    for seg in np.split(ordered, bounds):
        if len(seg):
            walk_sequence(seg, stage, norm, op_names, launch, layer)
        start += len(seg)
    categories = ruleset.taxonomy.stage_category
    category = [categories.get(s, "other") for s in stage]
    out = kernels
    for name in ("norm_name",):
        idx = out.schema.get_field_index(name)
        out = out.set_column(idx, name, pa.array(cols[name], pa.string()).dictionary_encode()
                             .cast(pa.dictionary(pa.int32(), pa.string())))
    extra = {
        "stage": pa.array(stage, pa.string()),
        "category": pa.array(category, pa.string()),
        "provider": pa.array(cols["provider"], pa.string()),
        "rule_id": pa.array(cols["rule_id"], pa.string()),
        "tile_m": pa.array(cols["tile_m"], pa.int32()),
        "tile_n": pa.array(cols["tile_n"], pa.int32()),
        "tile_k": pa.array(cols["tile_k"], pa.int32()),
        "split_k": pa.array(cols["split_k"], pa.int32()),
        "group_key": pa.array(cols["group_key"], pa.string()),
        "layer": pa.array(np.where(layer >= 0, layer, 0).astype(np.int32), mask=layer < 0),
    }
    for name, arr in extra.items():
        if name in out.column_names:
            out = out.set_column(out.schema.get_field_index(name), name, arr)
        else:
            out = out.append_column(name, arr)
    return out


# --------------------------------------------------------------------------- 1. names


def classify_by_name(kernels: pa.Table, ruleset: Any) -> dict[str, list[Any]]:
    """Rule-table result per row, computed once per distinct name (STYLE habit 9)."""
    names = kernels["name"].combine_chunks()
    if not isinstance(names, pa.DictionaryArray):
        names = names.dictionary_encode()
    uniq = names.dictionary.to_pylist()
    by_name = {r["name"]: r for r in rules_mod.classify_names(uniq, ruleset)}
    indices = names.indices.to_numpy(zero_copy_only=False)
    kinds = kernels["kind"].to_pylist()
    fields = ("norm_name", "stage", "provider", "rule_id", "tile_m", "tile_n", "tile_k", "split_k",
              "group_key")
    per_name = {f: [by_name[u][f] for u in uniq] for f in fields}
    cols = {f: [per_name[f][i] for i in indices] for f in fields}
    # memcpy/memset rows are classified by kind, whatever their name says
    for i, kind in enumerate(kinds):
        if kind in ("memcpy", "memset") and cols["stage"][i] not in ("memcpy", "memset"):
            cols["stage"][i] = kind
            cols["provider"][i] = "runtime"
            cols["rule_id"][i] = "MEM_KIND"
    return cols


# --------------------------------------------------------------------------- 2. host-op hints


@lru_cache(maxsize=1)
def op_hint_table() -> dict[str, str]:
    """Host-op name -> stage for generic kernels (``rules/ops.toml``)."""
    with open(RULES_DIR / "ops.toml", "rb") as f:
        data = tomllib.load(f)
    out: dict[str, str] = {}
    valid = set(rules_mod.load_taxonomy().stage_category)
    for stage, names in data.get("stages", {}).items():
        if stage not in valid:
            raise ValueError(f"rules/ops.toml: unknown stage {stage!r}")
        for n in names:
            out[n] = stage
    return out


def launching_op_names(kernels: pa.Table, host_ops: pa.Table) -> list[str | None]:
    """Name of the innermost cpu_op that launched each kernel (via External id), else None."""
    n = kernels.num_rows
    if host_ops.num_rows == 0:
        return [None] * n
    ops = host_ops.filter(pc.equal(host_ops["category"].cast(pa.string()), "cpu_op"))
    ops = ops.filter(pc.is_valid(ops["external_id"]))
    if ops.num_rows == 0:
        return [None] * n
    # several rows (trace_id, external id): keep the innermost = latest start for each id
    df = ops.select(["trace_id", "external_id", "name", "start_ns"]).to_pandas()
    df["name"] = df["name"].astype(str)
    df = df.sort_values("start_ns").drop_duplicates(["trace_id", "external_id"], keep="last")
    lookup = dict(zip(zip(df["trace_id"].tolist(), df["external_id"].tolist(), strict=True),
                      df["name"].tolist(), strict=True))
    tid = kernels["trace_id"].to_pylist()
    ext = kernels["launch_op_id"].to_pylist()
    return [lookup.get((t, e)) if e is not None else None for t, e in zip(tid, ext, strict=True)]


def apply_op_hints(stage: list[str], op_names: Sequence[str | None]) -> None:
    table = op_hint_table()
    for i, op in enumerate(op_names):
        if op is not None and stage[i] in GENERIC:
            s = table.get(op)
            if s is not None:
                stage[i] = s


# --------------------------------------------------------------------------- 3. structure


def _gemm_ops(seq: np.ndarray, stage: list[str], norm: list[str], launch: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) positions in ``seq`` of each logical GEMM."""
    ops: list[tuple[int, int]] = []
    prev_pos = -2
    for pos, r in enumerate(seq.tolist()):
        if stage[r] not in GEMM_STAGES:
            continue
        if ops and prev_pos == pos - 1:
            last_r = seq[ops[-1][1]]
            same_op = bool(launch[r] == launch[last_r])  # NaN (no op) never equals
            if same_op or _is_reduce(norm[r]):
                ops[-1] = (ops[-1][0], pos)
                prev_pos = pos
                continue
        ops.append((pos, pos))
        prev_pos = pos
    return ops


def _is_reduce(name: str) -> bool:
    n = name.lower()
    return "splitkreduce" in n or "reduce_kernel" in n and "gemm" in n


def walk_sequence(
    seq: np.ndarray,
    stage: list[str],
    norm: list[str],
    op_names: Sequence[str | None],
    launch: np.ndarray,
    layer: np.ndarray,
) -> None:
    """Assign GEMM roles, layers and region stages along one device's time-ordered kernels."""
    st = [stage[r] for r in seq.tolist()]
    n = len(st)
    is_attn = np.array([s in ATTENTION for s in st], bool)
    # next anchor after each position: what follows decides a GEMM's role
    nxt = [""] * (n + 1)
    for p in range(n - 1, -1, -1):
        s = st[p]
        if s in ATTENTION or s in SAMPLING_LIKE or s in ("embedding", "activation", "moe_topk", "moe_sort",
                                                        "moe_expert_gemm"):
            nxt[p] = s
        elif s in GEMM_STAGES:
            nxt[p] = "gemm:" + nxt[p + 1]
        else:
            nxt[p] = nxt[p + 1]
    ops = _gemm_ops(seq, stage, norm, launch)
    op_at = {}
    for i, (a, b) in enumerate(ops):
        for p in range(a, b + 1):
            op_at[p] = i
    # state machine over positions
    region = "pre"  # pre | attn_in | attn_out | mlp_in | mlp_out | moe | tail
    layer_no = -1
    since_attn = 0  # GEMM ops since the last attention
    moe = False
    region_of = [""] * n
    layer_of = np.full(n, -1, np.int64)
    p = 0
    while p < n:
        s = st[p]
        if s == "embedding":
            region, layer_no, moe = "pre", -1, False
        if s in GEMM_STAGES and p in op_at:
            a, b = ops[op_at[p]]
            follow = _strip_gemm(nxt[b + 1] if b + 1 <= n else "")
            role = _role(region, follow, since_attn, moe)
            if role == "qkv_gemm" and region not in ("attn_in",):
                layer_no += 1
                region = "attn_in"
            elif role == "o_gemm":
                region = "attn_out"
            elif role == "gate_up_gemm":
                region = "mlp_in"
            elif role == "down_gemm":
                region = "mlp_out"
            elif role == "moe_gate_gemm":
                region, moe = "moe", True
            elif role == "lm_head_gemm":
                region = "tail"
            since_attn += 1
            for q in range(a, b + 1):
                r = seq[q]
                if stage[r] in GEMM_STAGES:
                    stage[r] = role
                region_of[q] = region
                layer_of[q] = layer_no if role != "lm_head_gemm" else -1
            p = b + 1
            continue
        if s in ATTENTION:
            region, since_attn = "attn", 0
        elif s == "activation" and region in ("mlp_in", "attn_out"):
            region = "mlp_act"
        elif s in ("moe_expert_gemm",):
            region, moe = "moe_experts", True
        elif s in ("moe_topk", "moe_sort") and region in ("moe", "attn_out", "mlp_in"):
            region, moe = "moe", True
        elif s == "sampling" and region in ("moe",):
            stage[seq[p]] = "moe_topk"
        elif s == "sampling":
            region = "tail"
        region_of[p] = region
        layer_of[p] = layer_no if region not in ("pre", "tail") else -1
        p += 1
    _label_generic(seq, stage, op_names, region_of, layer_of)
    # layers: generic kernels between the end of one layer and the next layer's QKV GEMM belong
    # to the next layer (its input norm)
    for q in range(n):
        layer[seq[q]] = layer_of[q]
    _shift_prologue_to_next_layer(seq, stage, region_of, layer)


def _strip_gemm(s: str) -> str:
    while s.startswith("gemm:"):
        s = s[5:]
    return s


def _role(region: str, follow: str, since_attn: int, moe: bool) -> str:
    """Role of a GEMM from where we are and which anchor comes next."""
    if region == "attn":
        return "o_gemm"
    if region in ("pre", "mlp_out", "moe_experts", "moe_done", "tail", "attn_in") and follow in ATTENTION:
        return "qkv_gemm"
    if region in ("mlp_out", "moe_experts", "moe_done", "pre") and follow in ("sampling", ""):
        return "lm_head_gemm"
    if region in ("attn_out",):
        if follow in ("moe_topk", "sampling", "moe_sort"):
            return "moe_gate_gemm"
        if follow in ("moe_expert_gemm",):
            return "moe_gate_gemm"
        return "gate_up_gemm"
    if region == "mlp_in":
        return "gate_up_gemm"
    if region == "mlp_act":
        return "down_gemm"
    if region in ("moe", "moe_experts"):
        return "moe_expert_gemm"
    if follow in ATTENTION:
        return "qkv_gemm"
    return "gemm"


# Region -> stage for generic kernels found there.
_REGION_STAGE = {
    "attn_in": "rope",
    "attn_out": "norm",
    "mlp_act": "activation",
    "mlp_out": "norm",
    "moe": "moe_sort",
    "moe_experts": "moe_accumulate",
    "tail": "sampling",
}
_ADDS = ("add", "CUDAFunctor_add", "AddFunctor")
_KV_OPS = ("aten::cat", "aten::copy_", "aten::index_copy_", "aten::index_put_", "aten::slice_scatter")


def _label_generic(
    seq: np.ndarray, stage: list[str], op_names: Sequence[str | None], region_of: list[str], layer_of: np.ndarray
) -> None:
    n = len(seq)
    p = 0
    while p < n:
        reg = region_of[p]
        q = p
        while q < n and region_of[q] == reg:
            q += 1
        run = [i for i in range(p, q) if stage[seq[i]] in GENERIC]
        if run and reg in _REGION_STAGE:
            target = _REGION_STAGE[reg]
            if reg in ("attn_out", "mlp_out"):
                # residual add first, then the norm of the next block
                first = seq[run[0]]
                if _is_add(first, op_names):
                    stage[first] = "residual_add"
                    run = run[1:]
                if reg == "mlp_out":
                    # a norm region only exists when a norm-like kernel is present
                    target = "norm" if _has_norm_signal(seq, run, op_names) else "elementwise"
            if reg == "attn_in":
                # trailing cat/copy before attention = KV-cache update (HF DynamicCache)
                tail = []
                for i in reversed(run):
                    if _is_kv_update(seq[i], op_names):
                        tail.append(i)
                    else:
                        break
                for i in tail:
                    stage[seq[i]] = "kv_cache_store"
                run = [i for i in run if i not in set(tail)]
            for i in run:
                stage[seq[i]] = target
        p = q


def _is_add(r: int, op_names: Sequence[str | None]) -> bool:
    op = op_names[r]
    return op in ("aten::add", "aten::add_") if op else False


def _has_norm_signal(seq: np.ndarray, run: list[int], op_names: Sequence[str | None]) -> bool:
    ops = {op_names[seq[i]] for i in run}
    if ops & {"aten::rsqrt", "aten::mean", "aten::pow", "aten::var_mean", "aten::native_layer_norm"}:
        return True
    return bool(run) and all(op is None for op in ops)


def _is_kv_update(r: int, op_names: Sequence[str | None]) -> bool:
    op = op_names[r]
    return op in _KV_OPS if op else False


def _shift_prologue_to_next_layer(seq: np.ndarray, stage: list[str], region_of: list[str], layer: np.ndarray) -> None:
    """Norm kernels that precede a layer's QKV GEMM belong to that layer, not the previous one."""
    n = len(seq)
    for q in range(n):
        r = seq[q]
        if stage[r] == "qkv_gemm" and (q == 0 or stage[seq[q - 1]] != "qkv_gemm"):
            L = layer[r]
            k = q - 1
            while k >= 0 and stage[seq[k]] in ("norm", "residual_add", "elementwise", "quantize"):
                if layer[seq[k]] != L:
                    layer[seq[k]] = L
                k -= 1


# --------------------------------------------------------------------------- 4. roles from shapes


@dataclasses.dataclass(frozen=True)
class LayerDims:
    hidden: int
    vocab: int | None = None
    experts: int | None = None


def gemm_shape(op_name: str | None, dims: list[list[int]] | None) -> tuple[int, int] | None:
    """(K, N) of a recorded GEMM op from its input shapes; None when not a GEMM we can read."""
    if not op_name or not dims:
        return None
    d = [x for x in dims if x]
    try:
        if op_name in ("aten::mm", "aten::matmul") and len(d) >= 2 and len(d[1]) == 2:
            return d[0][-1], d[1][-1]
        if op_name == "aten::addmm" and len(dims) >= 3 and len(dims[2]) == 2:
            return dims[1][-1], dims[2][-1]
        if op_name == "aten::linear" and len(d) >= 2 and len(d[1]) == 2:
            return d[1][1], d[1][0]
        if op_name in ("aten::bmm", "aten::baddbmm") and len(d) >= 2 and len(d[-1]) == 3:
            a, b = (d[0], d[1]) if op_name == "aten::bmm" else (d[1], d[2])
            return a[-1], b[-1]
    except (IndexError, TypeError):
        return None
    return None


def gemm_roles_from_shapes(
    kernels: pa.Table, host_ops: pa.Table, dims: LayerDims
) -> list[str | None]:
    """Role per kernel from its op's (K, N) against the layer dimensions; None if not decidable.

    Rules: N == vocab -> lm_head; K == hidden and N == experts -> moe_gate; N == hidden and
    K != hidden -> down (K = intermediate) unless K is the attention width (o); K == hidden and
    N < hidden -> qkv (k/v or fused GQA); K == hidden and N > hidden: fused QKV when N is below
    2*hidden, else gate/up. The q-vs-o tie (both hidden x hidden in Llama) is broken by whether the
    op's input is the attention output, which shapes alone cannot tell: such kernels get None.
    """
    ops = host_ops.filter(pc.equal(host_ops["category"].cast(pa.string()), "cpu_op"))
    ops = ops.filter(pc.is_valid(ops["external_id"]))
    df = ops.select(["trace_id", "external_id", "name", "input_dims", "start_ns"]).to_pandas()
    df["name"] = df["name"].astype(str)
    df = df.sort_values("start_ns").drop_duplicates(["trace_id", "external_id"], keep="last")
    lookup = {
        (t, e): (n, d) for t, e, n, d in zip(df["trace_id"], df["external_id"], df["name"], df["input_dims"], strict=True)
    }
    out: list[str | None] = []
    H = dims.hidden
    for t, e in zip(kernels["trace_id"].to_pylist(), kernels["launch_op_id"].to_pylist(), strict=True):
        hit = lookup.get((t, e)) if e is not None else None
        shape = gemm_shape(hit[0], [list(x) for x in hit[1]] if hit and hit[1] is not None else None) if hit else None
        if shape is None:
            out.append(None)
            continue
        K, N = shape
        if dims.vocab and N == dims.vocab or dims.vocab and N * 2 == dims.vocab and K == H:
            out.append("lm_head_gemm")
        elif dims.experts and K == H and N == dims.experts:
            out.append("moe_gate_gemm")
        elif K == H and N == H:
            out.append(None)  # q_proj or o_proj
        elif N == H:
            out.append("down_gemm" if K > H else "o_gemm")
        elif K == H and N < H:
            out.append("qkv_gemm")
        elif K == H and N < 2 * H:
            out.append("qkv_gemm")
        elif K == H:
            out.append("gate_up_gemm")
        else:
            out.append(None)
    return out
