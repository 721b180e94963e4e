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

import tomllib
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.knowledge import kernel_rules as rules_mod
from analyzer.model import dict_isin, dict_strings, dict_take, pylist
from analyzer.tables import lookup

if TYPE_CHECKING:
    from analyzer.pipeline import Analysis, Options

from analyzer.paths import RULES_DIR  # noqa: E402

GEMM_ROLES = ("qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm", "lm_head_gemm", "moe_gate_gemm")
GEMM_STAGES = frozenset(GEMM_ROLES + ("gemm",))
ATTENTION = frozenset({"flash_attention", "paged_attention", "mla_attention"})
ATTN_AUX = frozenset({"attention_reduce"})
# Kernels whose stage the structure may refine: generic framework kernels only.
GENERIC = frozenset({"elementwise", "residual_add"})  # a bare ATen add is only a guess
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
    op_names, op_dims = launching_ops(kernels, host_ops)
    stage = cols["stage"]
    apply_op_hints(stage, op_names, op_dims)
    order = np.lexsort(
        (
            kernels["start_ns"].to_numpy(zero_copy_only=False),
            kernels["device"].to_numpy(zero_copy_only=False),
            kernels["trace_id"].to_numpy(zero_copy_only=False),
        )
    )
    layer = np.full(kernels.num_rows, -1, np.int64)
    timed = ~kernels["aggregate"].to_numpy(zero_copy_only=False)
    tid = kernels["trace_id"].to_numpy(zero_copy_only=False)
    dev = kernels["device"].to_numpy(zero_copy_only=False)
    norm = pylist(cols["norm_name"])
    launch = kernels["launch_op_id"].to_numpy(zero_copy_only=False)
    start = 0
    ordered = order[timed[order]]
    segment = tid[ordered].astype(np.int64) * 65536 + dev[ordered].astype(np.int64)
    bounds = np.flatnonzero(np.diff(segment)) + 1
    for seg in np.split(ordered, bounds):
        if len(seg):
            walk_sequence(seg, stage, norm, op_names, launch, layer)
        start += len(seg)
    categories = ruleset.taxonomy.stage_category
    category = [categories.get(s, "other") for s in stage]
    out = kernels
    idx = out.schema.get_field_index("norm_name")
    out = out.set_column(idx, "norm_name", cols["norm_name"])
    extra = {
        "stage": dict_strings(stage),
        "category": dict_strings(category),
        "provider": cols["provider"],
        "rule_id": cols["rule_id"],
        "tile_m": cols["tile_m"],
        "tile_n": cols["tile_n"],
        "tile_k": cols["tile_k"],
        "split_k": cols["split_k"],
        "group_key": cols["group_key"],
        "layer": pa.array(np.where(layer >= 0, layer, 0).astype(np.int32), mask=layer < 0),
    }
    for name, arr in extra.items():
        if name in out.column_names:
            out = out.set_column(out.schema.get_field_index(name), name, arr)
        else:
            out = out.append_column(name, arr)
    return out


# --------------------------------------------------------------------------- 1. names


_INT_FIELDS = ("tile_m", "tile_n", "tile_k", "split_k")


def classify_by_name(kernels: pa.Table, ruleset: Any) -> dict[str, Any]:
    """Rule-table result per row, computed once per distinct name (STYLE habit 9).

    ``stage`` is a Python list (later passes refine it); the other fields are Arrow arrays.
    """
    names = kernels["name"].combine_chunks()
    if not isinstance(names, pa.DictionaryArray):
        names = names.dictionary_encode()
    uniq = names.dictionary.to_pylist()
    by_name = {r["name"]: r for r in rules_mod.classify_names(uniq, ruleset)}
    indices = names.indices
    cols: dict[str, Any] = {}
    for f in ("norm_name", "stage", "provider", "rule_id", "group_key", *_INT_FIELDS):
        per_name = pa.array([by_name[u][f] for u in uniq], pa.int32() if f in _INT_FIELDS else pa.string())
        cols[f] = per_name.take(indices) if f in _INT_FIELDS else dict_take(per_name, indices)
    # memcpy/memset rows are classified by kind, whatever their name says
    kind = kernels["kind"].combine_chunks()
    is_mem = pc.and_(
        pc.is_in(kind, pa.array(["memcpy", "memset"])),
        pc.invert(pc.is_in(cols["stage"], pa.array(["memcpy", "memset"]))),
    )
    if pc.any(is_mem).as_py():
        for f, value in (
            ("stage", kind),
            ("provider", pa.scalar("runtime")),
            ("rule_id", pa.scalar("MEM_KIND")),
        ):
            cols[f] = dict_strings(pc.if_else(is_mem, value, cols[f].cast(pa.string())))
    cols["stage"] = pylist(cols["stage"])
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


_LAUNCH_MEMO: list[tuple[Any, Any, Any]] = []


def launching_op_rows(kernels: pa.Table, host_ops: pa.Table) -> tuple[pa.Table, pa.Array] | None:
    """The cpu_ops that launched kernels (innermost per external id) and, per kernel, the row
    of its op in that table (null when none). Memoised for the last (host_ops, launch ids) pair:
    classification and the roofline ask for the same join."""
    if host_ops.num_rows == 0 or kernels["launch_op_id"].null_count == kernels.num_rows:
        return None
    launch = kernels["launch_op_id"]
    for h, lid, result in _LAUNCH_MEMO:
        if h is host_ops and lid.equals(launch):
            return result
    result = _launching_op_rows(kernels, host_ops)
    _LAUNCH_MEMO[:] = [(host_ops, launch, result)]
    return result


def forget_launching_ops() -> None:
    """Drop the memo of :func:`launching_op_rows` (it holds the host ops table it was asked about)."""
    _LAUNCH_MEMO.clear()


def _launching_op_rows(kernels: pa.Table, host_ops: pa.Table) -> tuple[pa.Table, pa.Array] | None:
    wanted = lookup.unique(kernels["launch_op_id"])
    mask = dict_isin(host_ops["category"], ["cpu_op"]) & lookup.isin(host_ops["external_id"], wanted)
    rows = pa.array(np.flatnonzero(mask))
    if len(rows) == 0:
        return None
    # several ops share an external id when nested: the innermost is the latest to start. Order and
    # deduplicate on the key columns alone, then take the surviving rows of the full table once.
    start = host_ops["start_ns"].take(rows)
    order = pc.array_sort_indices(start.combine_chunks(), order="descending")
    rows = rows.take(order)
    op_keys = lookup.pair(host_ops["trace_id"].take(rows), host_ops["external_id"].take(rows))
    first = lookup.index_in(op_keys, op_keys)  # first occurrence = latest start
    keep = pc.equal(first, pa.array(np.arange(len(rows)), pa.int32()))
    rows = rows.filter(keep)
    # the key columns only (the shape lists stay in host_ops: ``row`` points there), so that the
    # memo holds a few bytes per launching op
    ops = host_ops.select(["trace_id", "name", "shape_id"]).take(rows).append_column("row", rows)
    kkeys = lookup.pair(kernels["trace_id"], kernels["launch_op_id"])
    return ops, lookup.index_in(kkeys, op_keys.filter(keep))


def launching_ops(kernels: pa.Table, host_ops: pa.Table) -> tuple[list[str | None], dict[int, Any]]:
    """Name of the innermost cpu_op that launched each kernel (External id), and the input shapes
    of those ops that may be embedding lookups (by kernel row)."""
    n = kernels.num_rows
    found = launching_op_rows(kernels, host_ops)
    if found is None:
        return [None] * n, {}
    ops, pos = found
    names = dict_strings(ops["name"]).take(pos)
    is_gather = pc.fill_null(
        pc.is_in(names.dictionary, pa.array(list(_GATHER_OPS))).take(names.indices), False
    )
    rows = np.flatnonzero(is_gather.to_numpy(zero_copy_only=False))
    dims = {}
    if len(rows):
        got = host_ops["input_dims"].take(ops["row"].take(pos.take(pa.array(rows)))).to_pylist()
        dims = dict(zip(rows.tolist(), got, strict=True))
    return pylist(names), dims


_GATHER_OPS = ("aten::gather", "aten::take_along_dim", "aten::index_select", "aten::embedding")


def _is_embedding_lookup(op: str, dims: Any) -> bool:
    """A gather from a [vocab, hidden] table: many more rows than columns, and a vocabulary's rows."""
    if op not in _GATHER_OPS or dims is None or len(dims) == 0:
        return False
    table = dims[0]
    return table is not None and len(table) == 2 and table[0] >= 8192 and table[0] >= 4 * table[1]


def apply_op_hints(
    stage: list[str], op_names: Sequence[str | None], op_dims: dict[int, Any] | None = None
) -> None:
    table = op_hint_table()
    op_dims = op_dims or {}
    for i, op in enumerate(op_names):
        if op is not None and stage[i] in GENERIC:
            d = op_dims.get(i)
            if _is_embedding_lookup(op, d):
                stage[i] = "embedding"
                continue
            s = table.get(op)
            if s is not None and (s != "embedding" or d is None or _is_embedding_lookup(op, d)):
                stage[i] = s


# --------------------------------------------------------------------------- 3. structure


def _gemm_ops(
    seq: np.ndarray, gemm: np.ndarray, norm: list[str], launch: np.ndarray
) -> list[tuple[int, int]]:
    """(first, last) positions in ``seq`` of each logical GEMM: adjacent GEMM kernels of one launching
    op, or a split-K reduction right after its GEMM (``gemm``: a GEMM stage at each position)."""
    pos = np.flatnonzero(gemm)
    if not len(pos):
        return []
    rows = seq[pos]
    names = [norm[r] for r in rows.tolist()]
    reduce = {n: _is_reduce(n) for n in set(names)}
    lv = launch[rows]
    joins = np.zeros(len(pos), bool)
    joins[1:] = (pos[1:] == pos[:-1] + 1) & (
        (lv[1:] == lv[:-1]) | np.fromiter(map(reduce.__getitem__, names[1:]), bool, len(pos) - 1)
    )  # NaN (no op) never equals
    first = np.flatnonzero(~joins)
    last = np.append(first[1:] - 1, len(pos) - 1)
    return list(zip(pos[first].tolist(), pos[last].tolist(), strict=True))


def _next_where(mask: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per position in ``at``: the first position >= it where ``mask`` holds (``len(mask)``: none)."""
    where = np.append(np.flatnonzero(mask), len(mask))
    return where[np.searchsorted(where[:-1], at)]


def _is_reduce(name: str) -> bool:
    n = name.lower()
    return "splitkreduce" in n or "reduce_kernel" in n and "gemm" in n


_NORM_WORDS = ("rsqrt", "MeanOps", "layer_norm", "rms_norm", "rmsnorm", "RMSNorm", "Rmsnorm")
_MOE_ROUTING = frozenset({"moe_topk", "moe_sort"})


def _norm_like(stage: str, name: str) -> bool:
    return stage == "norm" or any(w in name for w in _NORM_WORDS)


def walk_sequence(
    seq: np.ndarray,
    stage: list[str],
    norm: list[str],
    op_names: Sequence[str | None],
    launch: np.ndarray,
    layer: np.ndarray,
) -> None:
    """Assign GEMM roles, layers and region stages along one device's time-ordered kernels.

    Regions of a decoder layer: ``attn_in`` (after the input norm: QKV GEMMs, RoPE, KV store),
    ``attn`` (attention), ``attn_out`` (after the O GEMM: residual add, post-attention norm),
    ``mlp_in`` (between gate/up GEMMs and the down GEMM: activation), ``mlp_out`` (after the down
    GEMM: residual add, next input norm), ``moe`` / ``moe_experts`` (routing, expert GEMMs), ``tail``
    (after the LM head: sampling). A GEMM's role follows from its region and what comes next.
    """
    rows = seq.tolist()
    n = len(rows)
    st = list(map(stage.__getitem__, rows))
    pairs = list(zip(st, map(norm.__getitem__, rows), strict=True))
    memo = {k: _norm_like(*k) for k in set(pairs)}
    normish = np.fromiter(map(memo.__getitem__, pairs), bool, n)
    kinds = {s: i for i, s in enumerate(dict.fromkeys(st))}
    code = np.fromiter(map(kinds.__getitem__, st), np.int32, n)

    def stages(*sets: Any) -> np.ndarray:
        return np.array([any(s in x for x in sets) for s in kinds], bool)[code]

    anchor = stages(ATTENTION, SAMPLING_LIKE, ("embedding", "moe_sort", "moe_expert_gemm"))
    gemm = stages(GEMM_STAGES)
    ops = _gemm_ops(seq, gemm, norm, launch)
    # what follows each GEMM op, seen from the position after it: the next anchor kernel; the next
    # anchor or GEMM ("gemm" for a GEMM); whether a GEMM comes before the next norm / attention /
    # routing / embedding kernel
    after = np.array([b + 1 for _, b in ops], np.int64)
    at = _next_where(anchor, after).tolist()
    follow = [st[q] if q < n else "" for q in at]
    at = _next_where(anchor | gemm, after).tolist()
    lead = [("gemm" if not anchor[q] else st[q]) if q < n else "" for q in at]
    blocker = normish | stages(ATTENTION, _MOE_ROUTING, ("embedding",))
    at = _next_where(gemm | blocker, after).tolist()
    gemm_ahead = [q < n and bool(gemm[q]) for q in at]
    op_at = {a: k for k, (a, _) in enumerate(ops)}
    # only these positions change the walk's state; the runs between them take the region as it is
    events = np.zeros(n, bool)
    events[[a for a, _ in ops]] = True
    events |= normish | stages(ATTENTION, _MOE_ROUTING, ("embedding", "sampling", "moe_expert_gemm"))
    region = "pre"
    layer_no = -1
    norm_seen = False
    region_of = [""] * n
    layer_of = [-1] * n  # lists: numpy item assignment per kernel costs ~100 ns each
    p = 0
    for e in [*np.flatnonzero(events).tolist(), n]:
        if e < p:
            continue  # inside a GEMM op already walked
        if e > p:
            region_of[p:e] = [region] * (e - p)
            layer_of[p:e] = [-1 if region in ("pre", "tail") else layer_no] * (e - p)
        p = e
        if p == n:
            break
        s = st[p]
        k = op_at.get(p)
        if k is not None:
            b = ops[k][1]
            routing_next = lead[k] in ("moe_topk", "moe_sort", "sampling", "moe_expert_gemm")
            role, region, layer_no = _role(
                region, follow[k], gemm_ahead[k], norm_seen, layer_no, routing_next
            )
            norm_seen = False
            for q in range(p, b + 1):
                if stage[rows[q]] in GEMM_STAGES:
                    stage[rows[q]] = role
                region_of[q] = region
                layer_of[q] = -1 if region in ("pre", "tail") else layer_no
            p = b + 1
            continue
        if s == "embedding":
            region, layer_no, norm_seen = "pre", -1, False
        elif s in ATTENTION:
            region, norm_seen = "attn", False
        elif s in _MOE_ROUTING and region in ("attn_out", "mlp_in", "moe"):
            region = "moe"
        elif s == "sampling" and region == "moe":
            stage[rows[p]] = "moe_topk"
        elif s == "moe_expert_gemm":
            region = "moe_experts"
        elif normish[p]:
            norm_seen = True
        region_of[p] = region
        layer_of[p] = -1 if region in ("pre", "tail") else layer_no
        p += 1
    _label_generic(seq, stage, op_names, region_of)
    layer[seq] = layer_of
    _shift_prologue_to_next_layer(seq, stage, layer)


def _role(
    region: str, follow: str, gemm_ahead: bool, norm_seen: bool, layer_no: int, routing_next: bool = False
) -> tuple[str, str, int]:
    """(role, new region, layer number) of a GEMM from where we are and what comes next."""
    if region == "attn":
        return "o_gemm", "attn_out", layer_no
    if region == "attn_in":
        return "qkv_gemm", "attn_in", layer_no
    if region in ("attn_out", "mlp_in"):
        if region == "attn_out" and routing_next:
            return "moe_gate_gemm", "moe", layer_no
        if gemm_ahead:
            return "gate_up_gemm", "mlp_in", layer_no
        return "down_gemm", "mlp_out", layer_no
    if region == "moe":
        return "moe_expert_gemm", "moe_experts", layer_no
    if region == "moe_experts" and not norm_seen:
        return "moe_expert_gemm", "moe_experts", layer_no
    # pre, mlp_out, moe_experts (after a norm), tail
    if norm_seen and follow in ATTENTION:
        return "qkv_gemm", "attn_in", layer_no + 1
    if norm_seen and follow in ("sampling", "embedding", ""):
        return "lm_head_gemm", "tail", layer_no
    return "gemm", region, layer_no


# Region -> stage for generic kernels found there.
_REGION_STAGE = {
    "attn_in": "rope",
    "attn_out": "norm",
    "mlp_in": "activation",
    "mlp_out": "norm",
    "moe": "moe_sort",
    "moe_experts": "moe_accumulate",
    "tail": "sampling",
}
_KV_OPS = ("aten::cat", "aten::copy_", "aten::index_copy_", "aten::index_put_", "aten::slice_scatter")
_NORM_OPS = {"aten::rsqrt", "aten::mean", "aten::pow", "aten::var_mean", "aten::native_layer_norm"}


def _label_generic(
    seq: np.ndarray, stage: list[str], op_names: Sequence[str | None], region_of: list[str]
) -> None:
    rows = seq.tolist()
    n = len(rows)
    p = 0
    while p < n:
        reg = region_of[p]
        q = p
        while q < n and region_of[q] == reg:
            q += 1
        run = [i for i in range(p, q) if stage[rows[i]] in GENERIC]
        if run and reg == "pre":
            _label_first_norm(rows, run, p, q, stage)
        if run and reg in _REGION_STAGE:
            target = _REGION_STAGE[reg]
            if reg == "moe_experts":
                _label_moe_block(rows, run, p, q, stage, op_names)
                p = q
                continue
            if reg in ("attn_out", "mlp_out"):
                # the residual add opens the block, the input norm of the next block follows
                add = next((i for i in run if _is_add(rows[i], op_names)), None)
                if add is not None:
                    stage[rows[add]] = "residual_add"
                    run = [i for i in run if i > add]
                if reg == "mlp_out":
                    target = "norm" if _has_norm_signal(rows, run, op_names, stage, p, q) else "elementwise"
            if reg == "attn_in":
                tail = []
                for i in reversed(run):  # trailing cat/copy before attention = KV-cache update
                    if _is_kv_update(rows[i], op_names):
                        tail.append(i)
                    else:
                        break
                for i in tail:
                    stage[rows[i]] = "kv_cache_store"
                run = [i for i in run if i not in set(tail)]
            for i in run:
                stage[rows[i]] = target
        p = q


def _label_first_norm(rows: list[int], run: list[int], lo: int, hi: int, stage: list[str]) -> None:
    """Before the first layer: the generic kernels of the trailing norm (input norm of layer 0)."""
    norms = [i for i in range(lo, hi) if stage[rows[i]] == "norm"]
    if not norms:
        return
    start = norms[0]
    while start - 1 >= lo and stage[rows[start - 1]] in GENERIC:
        start -= 1
        if start <= norms[0] - 2:
            break
    for i in run:
        if i >= start:
            stage[rows[i]] = "norm"


def _label_moe_block(
    rows: list[int], run: list[int], lo: int, hi: int, stage: list[str], op_names: Sequence[str | None]
) -> None:
    """Expert block: dispatch before the last expert GEMM, combine after it, then residual + norm."""
    gemms = [i for i in range(lo, hi) if stage[rows[i]] == "moe_expert_gemm"]
    last = gemms[-1] if gemms else lo - 1
    after = [i for i in run if i > last]
    add = next((i for i in after if _is_add(rows[i], op_names) and _has_norm_after(rows, i, hi, stage)), None)
    for i in run:
        if i < last:
            stage[rows[i]] = "moe_sort"
        elif add is None or i < add:
            stage[rows[i]] = "moe_accumulate"
        elif i == add:
            stage[rows[i]] = "residual_add"
        else:
            stage[rows[i]] = "norm"


def _is_add(r: int, op_names: Sequence[str | None]) -> bool:
    return op_names[r] in ("aten::add", "aten::add_")


def _has_norm_after(rows: list[int], add: int, end: int, stage: list[str]) -> bool:
    return any(stage[rows[i]] == "norm" for i in range(add + 1, end))


def _has_norm_signal(
    rows: list[int], run: list[int], op_names: Sequence[str | None], stage: list[str], lo: int, hi: int
) -> bool:
    if any(stage[rows[i]] == "norm" for i in range(lo, hi)):
        return True
    ops = {op_names[rows[i]] for i in run}
    return bool(ops & _NORM_OPS)


def _is_kv_update(r: int, op_names: Sequence[str | None]) -> bool:
    op = op_names[r]
    return op in _KV_OPS if op else False


def _shift_prologue_to_next_layer(seq: np.ndarray, stage: list[str], layer: np.ndarray) -> None:
    """Norm kernels that precede a layer's QKV GEMM belong to that layer, not the previous one."""
    rows = seq.tolist()
    for q in range(len(rows)):
        r = rows[q]
        if stage[r] == "qkv_gemm" and (q == 0 or stage[rows[q - 1]] != "qkv_gemm"):
            k = q - 1
            while k >= 0 and stage[rows[k]] in ("norm", "elementwise", "quantize"):
                layer[rows[k]] = layer[r]
                k -= 1


# --------------------------------------------------------------------------- 4. roles from shapes


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


def gemm_roles_from_shapes(kernels: pa.Table, host_ops: pa.Table, arch: Any, tp: int = 1) -> list[str | None]:
    """Role per kernel from its op's (K, N) checked against the layer dimensions; None if undecidable.

    ``arch`` is an :class:`analyzer.knowledge.architectures.ModelArch`; with tensor parallelism each rank holds
    1/tp of the column-parallel outputs (QKV, gate/up, LM head) and of the row-parallel inputs (O,
    down). When two roles share a shape (Llama's q_proj and o_proj are both hidden x hidden) the
    kernel gets None: shapes alone cannot tell them apart.
    """
    h = arch.hidden_size
    q, kv = arch.q_dim // tp, arch.kv_dim // tp
    inter = arch.intermediate_size // tp
    shapes: dict[tuple[int, int], set[str]] = {}

    def add(k_in: int, n_out: int, role: str) -> None:
        shapes.setdefault((k_in, n_out), set()).add(role)

    for n_out in {q, kv, q + 2 * kv}:
        add(h, n_out, "qkv_gemm")
    add(q, h, "o_gemm")
    if arch.is_moe:
        add(h, arch.num_experts, "moe_gate_gemm")
        e = arch.expert_intermediate_size
        for n_out in (e, 2 * e):
            add(h, n_out, "moe_expert_gemm")
        add(e, h, "moe_expert_gemm")
    if not arch.is_moe or arch.dense_layers:
        for n_out in (inter, 2 * inter):
            add(h, n_out, "gate_up_gemm")
        add(inter, h, "down_gemm")
    for v in {arch.vocab_size, arch.vocab_size // tp}:
        add(h, v, "lm_head_gemm")
    found = launching_op_rows(kernels, host_ops)
    if found is None:
        return [None] * kernels.num_rows
    ops, pos = found
    names = ops["name"].combine_chunks().cast(pa.string()).take(pos).to_pylist()
    dims = host_ops["input_dims"].take(ops["row"].take(pos)).to_pylist()
    out: list[str | None] = []
    for name, d in zip(names, dims, strict=True):
        shape = gemm_shape(name, [list(x) for x in d] if d is not None else None)
        roles = shapes.get(shape) if shape else None
        if shape and roles is None and name in ("aten::bmm", "aten::baddbmm") and d is not None:
            roles = _bmm_expert_roles(d, arch)
        out.append(next(iter(roles)) if roles and len(roles) == 1 else None)
    return out


def _bmm_expert_roles(d: Any, arch: Any) -> set[str] | None:
    """HF eager MoE multiplies gathered expert weights [E, out, in] by tokens [E, in, n]."""
    if not arch.is_moe or len(d) < 2 or len(d[0]) != 3:
        return None
    e = arch.expert_intermediate_size
    out_f, in_f = d[0][1], d[0][2]
    if (in_f, out_f) in {(arch.hidden_size, e), (arch.hidden_size, 2 * e), (e, arch.hidden_size)}:
        return {"moe_expert_gemm"}
    return None
