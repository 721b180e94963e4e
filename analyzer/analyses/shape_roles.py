"""GEMM roles from recorded shapes: a projection's weight dimensions against the model's sizes.

Contract (pure over the kernels and host_ops tables):

* :func:`model_dims` finds the sizes from the trace alone: the hidden size ``H`` and the vocabulary
  ``V`` from the embedding table (the ``[V, H]`` input of ``aten::embedding``), kept only where the
  ``H -> V`` GEMM runs once per forward (embedding lookup); the MLP's intermediate size ``I``: a width
  ``c`` that one GEMM per layer projects back to ``H`` (down) while ``H -> c`` runs twice as often
  (gate and up) or ``H -> 2c`` as often (fused gate_up). Shapes whose op counts fit no role stay
  undecided (a tiny model whose vocabulary equals its MLP width). With ``--model`` the architecture
  gives the sizes, the attention's query width too.
* :func:`found_sizes` is the one place the model's sizes are found in a trace's recorded shapes for
  the roofline (``flops_source = found``): the above, plus heads, KV heads and head size (the
  attention ops' shapes read by their layouts, ``rules/attention_ops.toml``), layers (attention ops
  per forward), experts and one expert's width (the grouped expert GEMMs, the expert-weight
  gathers, the router), top-k (routed rows per token) and the LM head's width as the GEMM runs it
  (a tensor-parallel rank's shard). :func:`size_disagreements` compares them with ``--model``.
* :func:`roles_from_shapes` gives each dense GEMM kernel the role its op's ``(K, N)`` names uniquely
  (``H -> V`` the LM head, ``I -> H`` down, ``H -> I`` / ``H -> 2I`` gate/up, ``q -> H`` o, ...), None
  where the shapes name no role or several (Llama's q and o are both ``H x H``).

The classification takes a role from shapes where the layer walk gave none or the same one
(``stage_source`` ``by_shapes``), and reports where the two disagree instead of guessing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.analyses.walk.positions import gemm_shape
from analyzer.analyses.walk.registry import GEMM_STAGES
from analyzer.knowledge.attention_ops import AttentionOps
from analyzer.knowledge.work_ops import WorkOps
from analyzer.tables import lookup
from analyzer.tables.dictionaries import dict_isin, dict_strings
from analyzer.tables.launches import OpJoin, distinct_op_shapes, joined, op_values

__all__ = [
    "GemmShapes",
    "ModelDims",
    "found_sizes",
    "gemm_shapes",
    "model_dims",
    "roles_from_shapes",
    "size_disagreements",
]


@dataclasses.dataclass(frozen=True)
class ModelDims:
    hidden: int
    vocab: int | None  # None: the LM head's shape is not told apart in this trace
    intermediate: int | None = None
    query: int | None = None  # the attention's query width (heads x head size); only from --model
    fused_mlp: bool | None = None  # gate and up in one GEMM (H -> 2I); None: either
    # found by :func:`found_sizes` (None: the trace does not say)
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    value_head_dim: int | None = None
    layers: int | None = None
    experts: int | None = None
    experts_per_tok: int | None = None
    expert_intermediate: int | None = None
    lm_head_out: int | None = None  # the LM head GEMM's N as run (a rank's vocabulary shard)

    def as_dict(self) -> dict[str, int | bool | None]:
        """The sizes under HF config key names (the summary's ``work.sizes``)."""
        return {
            "hidden_size": self.hidden,
            "vocab_size": self.vocab,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": self.layers,
            "num_experts": self.experts,
            "num_experts_per_tok": self.experts_per_tok,
            "moe_intermediate_size": self.expert_intermediate,
        }


def _embedding_table(host_ops: pa.Table, trace: int | None = None) -> tuple[int, int, int] | None:
    """(V, H, lookups) of the token embedding table: its ``[V, H]`` shape and how many forwards
    looked it up."""
    mask = dict_isin(host_ops["name"], ["aten::embedding"])
    if trace is not None:
        mask &= host_ops["trace_id"].to_numpy(zero_copy_only=False) == trace
    rows = np.flatnonzero(mask)
    if not len(rows) or "input_dims" not in host_ops.column_names:
        return None
    tables: Counter = Counter()
    for dims in host_ops["input_dims"].take(pa.array(rows)).to_pylist():
        if dims and dims[0] and len(dims[0]) == 2:
            tables[tuple(dims[0])] += 1
    if not tables:
        return None
    (v, h), k = max(tables.items(), key=lambda kv: kv[0][0])  # the token table: the most rows
    return (int(v), int(h), int(k)) if v > h > 0 else None


@dataclasses.dataclass(frozen=True)
class GemmShapes:
    """Dense GEMM kernels with a launching op: their ``rows``, the distinct (K, N) ``shapes``
    (None: not readable), each kernel's index into them (``inverse``) and its op's row (``op_rows``)."""

    rows: np.ndarray
    shapes: list[Any]
    inverse: np.ndarray
    op_rows: np.ndarray


def gemm_shapes(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    trace: int | None = None,
    join: OpJoin | None = None,
) -> GemmShapes:
    """The :class:`GemmShapes` of ``trace`` (None: every input), each distinct shape read once."""
    empty = np.empty(0, np.int64)
    none = GemmShapes(empty, [], empty, empty)
    found = joined(kernels, host_ops, join)
    if found is None or "input_dims" not in host_ops.column_names:
        return none
    ops, pos = found
    is_gemm = {x: x in GEMM_STAGES for x in set(stage)}
    mask = np.fromiter(map(is_gemm.__getitem__, stage), bool, len(stage))
    if trace is not None:
        mask &= kernels["trace_id"].to_numpy(zero_copy_only=False) == trace
    rows = np.flatnonzero(mask)
    if not len(rows):
        return none
    at = pos.take(pa.array(rows))
    valid = at.is_valid().to_numpy(zero_copy_only=False)
    rows = rows[valid]
    if not len(rows):
        return none
    op_rows = ops["row"].take(at.filter(pa.array(valid))).to_numpy(zero_copy_only=False).astype(np.int64)
    group_names, first, inverse = distinct_op_shapes(host_ops, op_rows)
    dims = host_ops["input_dims"].take(pa.array(op_rows[first])).to_pylist()
    shapes = [
        gemm_shape(nm, [list(x) for x in d] if d else None) for nm, d in zip(group_names, dims, strict=True)
    ]
    return GemmShapes(rows, shapes, inverse, op_rows)


def model_dims(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    arch: Any = None,
    trace: int | None = None,
    shapes: GemmShapes | None = None,
    join: OpJoin | None = None,
) -> ModelDims | None:
    """The model's sizes, from ``arch`` (``--model``) or from the trace (``trace``: one input's
    id, when the tables hold several; ``shapes``: its :func:`gemm_shapes`, read here when not
    given); None when neither tells."""
    if arch is not None:
        return ModelDims(arch.hidden_size, arch.vocab_size, arch.intermediate_size, arch.q_dim)
    table = _embedding_table(host_ops, trace)
    if table is None:
        return None
    vocab, hidden, forwards = table
    got = shapes if shapes is not None else gemm_shapes(kernels, host_ops, stage, trace, join)
    shapes_of, inverse, op_rows = got.shapes, got.inverse, got.op_rows
    # count GEMM ops (not kernels: a split-K op launches two) per weight shape
    per_shape: Counter = Counter()
    if len(op_rows):
        _, one = np.unique(op_rows, return_index=True)
        for k, c in zip(*np.unique(inverse[one], return_counts=True), strict=True):
            if shapes_of[int(k)] is not None:
                per_shape[shapes_of[int(k)]] += int(c)
    # the trace fixes a role's shape only where the op counts fit it: the LM head runs once per
    # forward; an MLP's down once per layer, its gate and up twice as often (or fused, as often)
    lm = vocab if per_shape.get((hidden, vocab), 0) == forwards else None
    inter = fused = None
    for c in sorted({k for k, n in per_shape if n == hidden and k not in (hidden, vocab)}):
        down = per_shape[(c, hidden)]
        if down % forwards:
            continue
        up, both = per_shape.get((hidden, c), 0), per_shape.get((hidden, 2 * c), 0)
        if both == down and up != 2 * down:
            inter, fused = c, True
        elif up == 2 * down and both != down:
            inter, fused = c, False
        else:
            continue
        break
    return ModelDims(hidden, lm, inter, None, fused)


def roles_from_shapes(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    dims: ModelDims,
    trace: int | None = None,
    shapes: GemmShapes | None = None,
    join: OpJoin | None = None,
) -> dict[int, str]:
    """Kernel row -> the role its dense GEMM's recorded (K, N) names uniquely (rows shapes cannot
    decide are absent); ``trace``: only that input's kernels (``shapes`` as for :func:`model_dims`)."""
    h = dims.hidden
    table: dict[tuple[int, int], set[str]] = {}

    def add(k_in: int, n_out: int, role: str) -> None:
        table.setdefault((k_in, n_out), set()).add(role)

    if dims.vocab:
        add(h, dims.vocab, "lm_head_gemm")
    if dims.intermediate:
        i = dims.intermediate
        if dims.fused_mlp is not True:
            add(h, i, "gate_up_gemm")
        if dims.fused_mlp is not False:
            add(h, 2 * i, "gate_up_gemm")
        add(i, h, "down_gemm")
    if dims.query:
        add(h, dims.query, "qkv_gemm")
        add(dims.query, h, "o_gemm")
    got = shapes if shapes is not None else gemm_shapes(kernels, host_ops, stage, trace, join)
    rows, inverse = got.rows, got.inverse
    if not len(rows):
        return {}
    named = []
    for sh in got.shapes:
        roles = table.get(sh) if sh is not None else None
        named.append(next(iter(roles)) if roles and len(roles) == 1 else None)
    decided = np.array([x is not None for x in named], bool)[inverse]
    return {int(r): named[int(k)] for r, k in zip(rows[decided], inverse[decided], strict=True)}


# --------------------------------------------------------------------------- sizes for the roofline


def found_sizes(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    attention: AttentionOps,
    work: WorkOps,
    trace: int | None = None,
    join: OpJoin | None = None,
) -> ModelDims | None:
    """The model's sizes as ``trace``'s recorded shapes show them (None: no embedding lookup was
    recorded, so not even the hidden size is known). Per rank: a tensor-parallel rank's heads and
    widths are its shards."""
    shapes = gemm_shapes(kernels, host_ops, stage, trace, join)
    base = model_dims(kernels, host_ops, stage, None, trace, shapes)
    if base is None:
        return None
    table = _embedding_table(host_ops, trace)
    forwards = table[2] if table else 0
    heads, kv_heads, head, value_head, n_attn = _attention_sizes(kernels, host_ops, attention, trace, join)
    layers = n_attn // forwards if forwards and n_attn and n_attn % forwards == 0 else None
    experts, expert_inter, top_k = _expert_sizes(
        kernels, host_ops, stage, work, base.hidden, trace, join, shapes
    )
    lm_out = _lm_head_out(kernels, host_ops, stage, base.hidden, trace, shapes)
    return dataclasses.replace(
        base,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head,
        value_head_dim=value_head,
        layers=layers,
        experts=experts,
        experts_per_tok=top_k,
        expert_intermediate=expert_inter,
        lm_head_out=lm_out or base.vocab,
    )


def _rows_of(host_ops: pa.Table, names: set[str], trace: int | None) -> np.ndarray:
    mask = dict_isin(host_ops["name"], sorted(names)) & dict_isin(host_ops["category"], ["cpu_op"])
    if trace is not None:
        mask &= host_ops["trace_id"].to_numpy(zero_copy_only=False) == trace
    return np.flatnonzero(mask)


def _mode(values: list[Any]) -> Any:
    return Counter(values).most_common(1)[0][0] if values else None


def _attention_sizes(
    kernels: pa.Table,
    host_ops: pa.Table,
    attention: AttentionOps,
    trace: int | None,
    join: OpJoin | None = None,
) -> tuple[int | None, int | None, int | None, int | None, int]:
    """(heads, KV heads, head size, value head size, attention ops) of the fused attention ops with
    recorded shapes that launched kernels (the SDPA front end above its backend is not counted
    again; composed attention has no head size in its scores: not read)."""
    if "input_dims" not in host_ops.column_names or host_ops.num_rows == 0:
        return None, None, None, None, 0
    found = joined(kernels, host_ops, join)
    if found is None:
        return None, None, None, None, 0
    names = [n for n in set(dict_strings(host_ops["name"]).dictionary.to_pylist()) if n]
    known = {n for n in names if (lay := attention.layout(n)) is not None and not lay.composed}
    rows = _rows_of(host_ops, known, trace) if known else np.empty(0, np.int64)
    # the ops that launched kernels: a sorted search (np.isin sorts both sets together, ~3 copies)
    rows = rows[lookup.isin(rows, lookup.unique(found[0]["row"]))]
    if not len(rows):
        return None, None, None, None, 0
    group_names, first, inverse = distinct_op_shapes(host_ops, rows)
    seen: list[tuple[int, int, int, int]] = []
    count = 0
    shapes = op_values(host_ops, ("input_dims",), rows[first])  # a step's KV length: millions of shapes
    for g, (nm, (d,)) in enumerate(zip(group_names, shapes, strict=True)):
        lay = attention.layout(nm, d) if nm else None
        got = lay.read(d) if lay is not None else None
        if got is None or got.heads <= 0 or got.head <= 0:
            continue
        n = int((inverse == g).sum())
        count += n
        seen.extend([(got.heads, got.kv_heads, got.head, got.value_head)] * n)
    if not seen:
        return None, None, None, None, 0
    h, kv, hd, vd = _mode(seen)
    return h, (kv if kv > 0 else None), hd, (vd if vd > 0 else None), count


def _lm_head_out(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    hidden: int,
    trace: int | None,
    shapes: GemmShapes,
) -> int | None:
    """N of the LM-head GEMM as the trace runs it (H -> N), from its kernels' recorded shapes."""
    rows = shapes.rows
    if not len(rows):
        return None
    outs = [
        sh[1]
        for r, k in zip(rows.tolist(), shapes.inverse.tolist(), strict=True)
        if stage[r] == "lm_head_gemm" and (sh := shapes.shapes[int(k)]) is not None and sh[0] == hidden
    ]
    return _mode(outs)


def _expert_sizes(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    work: WorkOps,
    hidden: int,
    trace: int | None,
    join: OpJoin | None = None,
    shapes: GemmShapes | None = None,
) -> tuple[int | None, int | None, int | None]:
    """(experts, one expert's width, top-k): the grouped expert GEMMs' weights (experts x K x N),
    the expert-weight gathers' tables (experts x N x K), else the router's width; top-k = the routed
    rows of a step's expert GEMMs over its tokens. ``shapes``: the run's :func:`gemm_shapes`, read
    here when not given."""
    if "input_dims" not in host_ops.column_names or host_ops.num_rows == 0:
        return None, None, None
    grouped = {n for g in work.gemms if g.grouped for n in g.names}
    gathers = {n for g in work.gathers if g.select == "consumer" for n in g.names}
    rows = _rows_of(host_ops, grouped | gathers, trace)
    experts: list[int] = []
    widths: list[int] = []
    if len(rows):
        group_names, first, inverse = distinct_op_shapes(host_ops, rows)
        dims = host_ops["input_dims"].take(pa.array(rows[first])).to_pylist()
        for g, (nm, d) in enumerate(zip(group_names, dims, strict=True)):
            n = int((inverse == g).sum())
            if nm in grouped:
                got = work.gemm(nm, d)
                if got is None or got[1].groups is None:
                    continue
                e, k_, n_ = got[1].groups, got[1].k, got[1].n
            else:
                t = d[0] if d else None
                if not t or len(t) != 3:
                    continue
                e, k_, n_ = t
            if hidden not in (k_, n_):
                continue
            experts.extend([int(e)] * n)
            widths.append(int(n_ if k_ == hidden else k_))
    width = min(widths) if widths else None  # the down projection's I (the gate_up's is 2I when fused)
    e_count = _mode(experts)
    if e_count is None:
        e_count = _router_width(kernels, host_ops, stage, hidden, trace, join, shapes)
    return e_count, width, _top_k(kernels, host_ops, stage, work, trace, e_count, join)


def _router_width(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    hidden: int,
    trace: int | None,
    join: OpJoin | None = None,
    shapes: GemmShapes | None = None,
) -> int | None:
    shapes = shapes if shapes is not None else gemm_shapes(kernels, host_ops, stage, trace, join)
    outs = [
        sh[1]
        for r, k in zip(shapes.rows.tolist(), shapes.inverse.tolist(), strict=True)
        if stage[r] == "moe_gate_gemm" and (sh := shapes.shapes[int(k)]) is not None and sh[0] == hidden
    ]
    return _mode(outs)


def _top_k(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    work: WorkOps,
    trace: int | None,
    experts: int | None,
    join: OpJoin | None = None,
) -> int | None:
    """Experts per token: the routed rows of a grouped expert GEMM (its M) or of a per-token batched
    one (its batch) over the tokens of the kernel's step; the most common whole ratio."""
    if experts is None or "tokens" not in kernels.column_names:
        return None
    found = joined(kernels, host_ops, join)
    if found is None:
        return None
    ops, pos = found
    mask = np.fromiter((s == "moe_expert_gemm" for s in stage), bool, len(stage))
    if trace is not None:
        mask &= kernels["trace_id"].to_numpy(zero_copy_only=False) == trace
    rows = np.flatnonzero(mask)
    if not len(rows):
        return None
    at = pos.take(pa.array(rows))
    ok = at.is_valid().to_numpy(zero_copy_only=False)
    rows = rows[ok]
    if not len(rows):
        return None
    op_rows = ops["row"].take(at.filter(pa.array(ok))).to_numpy(zero_copy_only=False).astype(np.int64)
    tokens = kernels["tokens"].take(pa.array(rows)).to_numpy(zero_copy_only=False)
    names = host_ops["name"].take(pa.array(op_rows)).to_pylist()
    dims = host_ops["input_dims"].take(pa.array(op_rows)).to_pylist()
    ratios = []
    for nm, d, t in zip(names, dims, tokens.tolist(), strict=True):
        got = work.gemm(nm, d)
        if got is None or t is None or not t == t or t <= 0:
            continue
        routed = got[1].m if got[0].grouped else got[1].batch
        if routed % int(t) == 0 and 1 <= routed // int(t) <= experts:
            ratios.append(routed // int(t))
    return _mode(ratios) if ratios and len(set(ratios)) >= 1 else None


def size_disagreements(found: ModelDims, arch: Any, world_size: int = 1) -> list[str]:
    """Where the sizes found in a trace and ``--model``'s architecture (``arch``) disagree, one
    phrase each (``"hidden size 2048 (--model: 4096)"``). A tensor-parallel rank holds a
    ``world_size`` shard of heads, widths, the vocabulary and the experts."""
    tp = max(1, world_size)

    def shards(v: int | None) -> set[int]:
        return {v} if v is None else {v, max(1, v // tp)}

    checks = [
        ("hidden size", found.hidden, {arch.hidden_size}),
        ("attention heads", found.heads, shards(arch.num_attention_heads)),
        ("KV heads", found.kv_heads, shards(arch.num_key_value_heads)),
        ("head size", found.head_dim, {arch.head_dim} if not arch.is_mla else {found.head_dim}),
        ("layers", found.layers, {arch.num_hidden_layers}),
        (
            "MLP width",
            found.intermediate,
            shards(arch.intermediate_size) if arch.dense_layers else {found.intermediate},
        ),
        ("vocabulary", found.vocab, shards(arch.vocab_size)),
        ("experts", found.experts, shards(arch.num_experts) if arch.is_moe else {None}),
        ("experts per token", found.experts_per_tok, {arch.num_experts_per_tok} if arch.is_moe else {None}),
        (
            "expert width",
            found.expert_intermediate,
            shards(arch.expert_intermediate_size) if arch.is_moe else {None},
        ),
    ]
    out = []
    for what, got, want in checks:
        if got is None or got in want:
            continue
        shown = max(v for v in want if v is not None) if any(v is not None for v in want) else "none"
        out.append(f"{what} {got} (--model: {shown})")
    return out
