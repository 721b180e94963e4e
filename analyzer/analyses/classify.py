"""Kernels -> stage, category, provider, rule id, decoded tile fields, GEMM role and layer.

Contract (pure over the kernels and host_ops tables):

1. **Names.** Every distinct kernel name is normalised and matched once against the rule table
   (``rules/kernels.toml``, first match wins) and the result is mapped back to every launch.
2. **Host ops.** A generic framework kernel (stage ``elementwise``) launched by a host op whose name
   says what it does (``rules/ops.toml``: ``aten::silu`` -> activation, ``aten::topk`` -> sampling ...)
   takes that stage.
3. **Structure** (:mod:`analyzer.analyses.walk`). On each device the kernels form a repeating
   per-layer sequence (norm -> QKV GEMM -> RoPE / KV store -> attention -> O GEMM -> norm -> MLP or MoE). One pass over
   that sequence gives every GEMM its role (``qkv_gemm`` ... ``lm_head_gemm``, ``moe_gate_gemm``,
   expert GEMMs), numbers the decoder layers (``layer``) and gives the generic kernels between the
   anchors the stage of the region they sit in (an eager RMSNorm's pow/mean/rsqrt/mul -> norm, an
   eager RoPE's mul/neg/cat/add -> rope, the trailing KV-cache cat/copy -> kv_cache_store ...).
   This works without host ops (CUDA-graph replay, rocprof, nsys), so shapes are never required.
4. **Shapes.** Where host-op input shapes are recorded, :mod:`analyzer.analyses.shape_roles` gives
   a GEMM the role its (K, N) names uniquely among the model's sizes (STR044); the tests compare the
   walk with an independent oracle from the model's config (``tests/shape_oracle.py``).
"""

from __future__ import annotations

import array
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses import mixers, providers, shape_roles, unexplained, weight_gathers
from analyzer.analyses.structure_run import StructureRun
from analyzer.analyses.walk import registry
from analyzer.analyses.walk.registry import GENERIC
from analyzer.knowledge import kernel_rules as rules_mod
from analyzer.knowledge.op_hints import op_hint_ids
from analyzer.knowledge.structure_rules import StructureKnowledge
from analyzer.knowledge.taxonomy import MEMORY_STAGES
from analyzer.tables import launches
from analyzer.tables.dictionaries import dict_from_codes, dict_isin, dict_strings, dict_take, pylist

# --------------------------------------------------------------------------- entry point


def classify_kernels(
    kernels: pa.Table, host_ops: pa.Table, ruleset: Any, op_hints: Mapping[str, str]
) -> pa.Table:
    """Add the classification columns (README.md 'Output columns') to ``kernels``: ``ruleset`` the kernel rules,
    ``op_hints`` host-op name -> stage for generic kernels (``rules/ops.toml``)."""
    return classify_and_check(kernels, host_ops, ruleset, op_hints)[0]


def classify_and_check(
    kernels: pa.Table,
    host_ops: pa.Table,
    ruleset: Any,
    op_hints: Mapping[str, str],
    provider_facts: Any = None,
    model: Any = None,
    structure: StructureKnowledge | None = None,
    fired: Counter | None = None,
    join: launches.OpJoin | None = None,
    groups: dict[str, bool] | None = None,
) -> tuple[pa.Table, list[str]]:
    """:func:`classify_kernels` and its self-check: the table (with ``stage_source``, how each
    kernel's stage was decided: :data:`SOURCES`, and ``stage_rule``, the id of the rule that gave
    it) and the warnings for what could not be decided. ``structure``: the registry with the run's
    thresholds (default: ``rules/structure.toml``); ``fired`` (optional): counts kernels per id of
    the rules that decide layers only (and of the self-check that drops a walk); ``groups``
    (optional): filled with whether each rule group of the registry ran (its precondition held)."""
    know = structure if structure is not None else registry.KNOWLEDGE
    th = know.thresholds
    join = join if join is not None else launches.OpJoin.of(kernels, host_ops)
    cols = classify_by_name(kernels, ruleset)
    op_names, op_dims, op_column = launching_ops(kernels, host_ops, join)
    cols["provider"] = providers.attribute_providers(kernels, cols, op_names, host_ops, provider_facts)
    stage = cols["stage"]
    vocab: dict[str, int] = {}  # stage -> code: per-kernel copies of the stage as int16, not lists
    rule_ids, why = _rule_codes(cols["rule_id"], know)
    apply_op_hints(stage, op_names, op_hints, op_dims, why, _hint_codes(rule_ids), th)
    by_names = _stage_codes(stage, vocab)
    run = StructureRun.of(kernels, host_ops, cols, stage, why, op_names, op_dims, op_column, th, join)
    run.front = in_attention_front_end(kernels, host_ops, by_names, vocab, join)
    run.decide_groups(know, op_column, vocab)
    if groups is not None:
        groups.update(run.groups)
    why_names = array.array("h", why)  # what the names and op hints said: kept where the walk is dropped
    names_of = list(vocab)
    undecided: list[str] = []
    for seg in _device_segments(kernels):
        problem = run.structure(seg)
        if problem:
            # not found with confidence: keep what the names said (role-free GEMMs, generic kernels),
            # and the mixers found from them
            for r in seg.tolist():
                stage[r] = names_of[by_names[r]]
                why[r] = why_names[r]
            run.layer[seg] = -1
            undecided.append(problem)
            run.counts[registry.SELF_CHECK] += len(seg)
            run.mixers_alone(seg)
    dur = kernels["dur_ns"].to_numpy(zero_copy_only=False)
    foreign = unexplained.foreign_ops_warning(why, op_names, run.layer, dur, th, run.counts)
    misplaced = unexplained.activation_in_attention_input_warning(
        run.suspects, run.norm, run.layer, dur, th, run.counts
    )
    shaped, disagree = _apply_shape_roles(kernels, host_ops, stage, model, th, join, why)
    final = _stage_codes(stage, vocab)
    roleless = _roleless_gemms(run, final, vocab, dur, th)
    lost = _attention_outside_layers(run, final, vocab, dur, th, ruleset.taxonomy.stage_category)
    source = _stage_sources(by_names, final, vocab, shaped)
    codes = np.frombuffer(why, np.int16).copy()
    codes[shaped] = SHAPE_ROLES
    if fired is not None:
        fired.update({rule_ids[c]: n for c, n in run.counts.items()})
    stage_names = list(vocab)
    extra = {
        "stage": dict_from_codes(final, stage_names),
        "category": dict_from_codes(
            final, [ruleset.taxonomy.stage_category.get(s, "other") for s in stage_names]
        ),
        **{c: cols[c] for c in ("provider", "rule_id")},
        **_late_columns(cols),
        "layer": pa.array(np.where(run.layer >= 0, run.layer, 0).astype(np.int32), mask=run.layer < 0),
        "stage_source": dict_strings(source),
        "stage_rule": _used_codes(codes, rule_ids),
    }
    out = _with_columns(
        kernels.set_column(kernels.schema.get_field_index("norm_name"), "norm_name", cols["norm_name"]), extra
    )
    extra_warnings = [w for w in (foreign, misplaced, roleless, lost, disagree) if w]
    return out, [*_check_warnings(out, undecided), *extra_warnings]


def _roleless_gemms(
    run: StructureRun, final: np.ndarray, vocab: Mapping[str, int], dur: np.ndarray, th: Any
) -> str | None:
    """STR059's warning: GEMMs inside the layers (a layer number) that kept no role (``gemm``)."""
    roleless = (final == vocab["gemm"]) & (run.layer >= 0) if "gemm" in vocab else np.zeros(0, bool)
    if roleless.any():  # a GEMM a named rule gave the role-free stage is explained (STR064, STR068)
        roleless &= ~np.isin(np.asarray(run.why), registry.NAMED_ROLE_FREE)
    return unexplained.roleless_gemm_warning(roleless, run.norm, run.layer, dur, th, run.counts)


def _attention_outside_layers(
    run: StructureRun,
    final: np.ndarray,
    vocab: Mapping[str, int],
    dur: np.ndarray,
    th: Any,
    category: Mapping[str, str],
) -> str | None:
    """STR060's warning: attention kernels in no layer, where the walk found layers."""
    found = run.layer >= 0
    attention = [c for s, c in vocab.items() if category.get(s) == "attention"]
    outside = np.isin(final, attention) & ~found if found.any() else np.zeros(len(final), bool)
    return unexplained.attention_outside_layers_warning(outside, run.norm, run.layer, dur, th, run.counts)


def _with_columns(table: pa.Table, columns: Mapping[str, Any]) -> pa.Table:
    """``table`` with ``columns`` set (replaced where present, appended otherwise)."""
    for name, arr in columns.items():
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, arr)
        else:
            table = table.append_column(name, arr)
    return table


def _device_segments(kernels: pa.Table) -> list[np.ndarray]:
    """The timed kernels' rows per (input, device), each in launch order."""
    tid = kernels["trace_id"].to_numpy(zero_copy_only=False)
    dev = kernels["device"].to_numpy(zero_copy_only=False)
    order = np.lexsort((kernels["start_ns"].to_numpy(zero_copy_only=False), dev, tid))
    timed = ~kernels["aggregate"].to_numpy(zero_copy_only=False)
    ordered = order[timed[order]]
    segment = tid[ordered].astype(np.int64) * 65536 + dev[ordered].astype(np.int64)
    return [seg for seg in np.split(ordered, np.flatnonzero(np.diff(segment)) + 1) if len(seg)]


# --------------------------------------------------------------------------- self-check

#: How a kernel's stage was decided (the ``stage_source`` column; the summary's ``classification``).
SOURCES = ("by_name_rule", "by_shapes", "by_structure", "role_free")
ROLE_FREE = frozenset({"gemm", "elementwise", "other"})
TRAINING_WARNING = "training, not inference: no phases or inference findings"


def _apply_shape_roles(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    model: Any,
    th: Any = registry.DEFAULT_THRESHOLDS,
    join: launches.OpJoin | None = None,
    why: Any = None,
) -> tuple[np.ndarray, str | None]:
    """GEMM roles from recorded shapes (:mod:`analyzer.analyses.shape_roles`): taken where the
    layer walk gave none (``gemm``) or the same one; where the two disagree the walk's role stays
    and, above ``th.shape_disagreement`` of the time shapes decide, the reason is reported. An O
    projection the walk took right after an attention kernel (``why``: ROLE_O) is anchored by that
    kernel: a shape cannot tell it from a down projection (MLA's heads x value size is no hidden
    size), so it is not counted as a disagreement; nor is a token mixer's projection (``why``:
    MIXER_SPAN, anchored by its scan or convolution: an MLP's shapes). Returns the kernels whose role shapes decided,
    and that reason (or None)."""
    n = kernels.num_rows
    shaped = np.zeros(n, bool)
    if host_ops.num_rows == 0 or n == 0:
        return shaped, None
    # each input's own sizes: a joined run may hold several models' traces
    traces = np.unique(kernels["trace_id"].to_numpy(zero_copy_only=False)).tolist()
    roles: dict[int, str] = {}
    dims = None
    for t in traces:
        one = None if len(traces) == 1 else int(t)
        shapes = shape_roles.gemm_shapes(kernels, host_ops, stage, one, join)  # read once for both
        d = shape_roles.model_dims(kernels, host_ops, stage, model, one, shapes)
        if d is not None:
            dims = dims or d
            roles.update(shape_roles.roles_from_shapes(kernels, host_ops, stage, d, one, shapes))
    if dims is None:
        return shaped, None
    dur = kernels["dur_ns"].to_numpy(zero_copy_only=False)
    decided = other = 0
    said: Counter = Counter()
    for r, role in roles.items():
        decided += int(dur[r])
        if stage[r] == role or stage[r] == "gemm":
            stage[r] = role
            shaped[r] = True
        elif why is not None and (
            (stage[r] == "o_gemm" and why[r] == registry.ROLE_O) or why[r] == registry.MIXER_SPAN
        ):
            # anchored by the attention before it, or by a token mixer's anchor (its scan or
            # convolution) between its projections: shapes do not judge it
            decided -= int(dur[r])
        else:
            other += int(dur[r])
            said[(stage[r], role)] += int(dur[r])
    if decided and other > th.shape_disagreement * decided:
        (walk, shape), _ = said.most_common(1)[0]
        return shaped, (
            f"GEMM roles from shapes (hidden {dims.hidden}, vocab {dims.vocab}) and from the layer "
            f"structure disagree on {100 * other / decided:.1f}% of the GEMM time shapes decide "
            f"(mostly {walk} by structure, {shape} by shape): the structure's roles are kept"
        )
    return shaped, None


SHAPE_ROLES = registry.KNOWLEDGE.code_of("shape-roles")
EMBEDDING_LOOKUP = registry.KNOWLEDGE.code_of("embedding-lookup")


def _rule_codes(rule_id: pa.Array, know: StructureKnowledge) -> tuple[list[str], array.array]:
    """The rule-id vocabulary of a run and each kernel's code in it, from the kernel rules' ids.

    Codes 0.. are the structure rules in registry order (what the walk writes), then the kernel
    rules' ids that occur, then the op hints' (:func:`_hint_codes`). Kept as a typed array: the walk
    sets one code per relabelled kernel, and the column is built from its buffer at once."""
    ids = [r.id for r in know.rules]
    col = dict_strings(rule_id)
    names = [x if x is not None else "UNCLASSIFIED" for x in col.dictionary.to_pylist()]
    at = {x: i for i, x in enumerate(ids)}
    for x in names:
        if x not in at:
            at[x] = len(ids)
            ids.append(x)
    lut = np.asarray([at[x] for x in names] + [at.get("UNCLASSIFIED", 0)], np.int16)
    idx = col.indices.fill_null(len(names)).to_numpy(zero_copy_only=False)
    return ids, array.array("h", lut[idx].tobytes())


_HINT_IDS = op_hint_ids()  # read once at import: an analysis opens no file


def _hint_codes(ids: list[str]) -> dict[str, int]:
    """Host op -> the code of the op hint that names it (appended to ``ids``)."""
    out: dict[str, int] = {}
    for op, hid in _HINT_IDS.items():
        if hid not in ids:
            ids.append(hid)
        out[op] = ids.index(hid)
    return out


def _used_codes(codes: np.ndarray, ids: list[str]) -> pa.DictionaryArray:
    """The ``stage_rule`` column: ``codes`` over ``ids``, the dictionary cut to the ids used."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(ids)))
    remap = np.zeros(len(ids), np.int16)
    remap[used] = np.arange(len(used), dtype=np.int16)
    return pa.DictionaryArray.from_arrays(pa.array(remap[codes]), pa.array([ids[i] for i in used.tolist()]))


def _stage_codes(stage: list[str], vocab: dict[str, int]) -> np.ndarray:
    """``stage`` as int16 codes of ``vocab`` (grown with any stage not in it yet)."""
    for x in set(stage):
        vocab.setdefault(x, len(vocab))
    return np.fromiter(map(vocab.__getitem__, stage), np.int16, len(stage))


def _stage_sources(
    by_names: np.ndarray, fin: np.ndarray, vocab: dict[str, int], shaped: np.ndarray | None = None
) -> pa.DictionaryArray:
    """Per kernel: role_free (a stage that names no role), by_shapes (a GEMM role its recorded
    shape decided), by_structure (the layer walk changed it), else by_name_rule (the kernel rule
    table or the launching host op's name). ``by_names`` / ``fin``: the stage codes (``vocab``)
    before the structure and at the end."""
    free = np.array([x in ROLE_FREE for x in vocab], bool)[fin] if vocab else np.zeros(0, bool)
    out = np.where(free, 3, np.where(fin != by_names, 2, 0)).astype(np.int8)
    if shaped is not None:
        out[shaped & ~free] = 1
    return pa.DictionaryArray.from_arrays(pa.array(out), pa.array(list(SOURCES)))


def classification_shares(stage_source: Any, dur_ns: Any) -> dict[str, float]:
    """Share of kernel time per :data:`SOURCES` (the summary's ``classification``), from the
    ``stage_source`` and ``dur_ns`` columns (pandas or Arrow); zeros for an empty run."""
    codes = dict_strings(pa.array(stage_source) if isinstance(stage_source, pd.Series) else stage_source)
    dur = np.nan_to_num(np.asarray(dur_ns, np.float64))
    total = float(dur.sum())
    idx = codes.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    names = codes.dictionary.to_pylist()
    by = np.bincount(idx[idx >= 0], dur[idx >= 0], len(names)) if len(names) else np.zeros(0)
    got = dict(zip(names, by.tolist(), strict=True))
    return {s: round(got.get(s, 0.0) / total, 6) if total > 0 else 0.0 for s in SOURCES}


_BACKWARD_WORDS = registry.KNOWLEDGE.words("backward_words")


def is_training(kernels: pa.Table) -> bool:
    """A training run: an optimizer kernel, or backward kernels by name (tested once per distinct
    name and stage)."""
    if kernels.num_rows == 0:
        return False
    if dict_isin(kernels["stage"], ["optimizer"]).any():
        return True
    names = dict_strings(kernels["norm_name"] if "norm_name" in kernels.column_names else kernels["name"])
    return any(u and any(w in u for w in _BACKWARD_WORDS) for u in names.dictionary.to_pylist())


def _check_warnings(kernels: pa.Table, undecided: list[str]) -> list[str]:
    """The self-check's warnings: structure that could not be decided, and a training trace."""
    out = []
    for why in dict.fromkeys(undecided):
        out.append(
            f"layer structure not found with confidence ({why}): "
            "GEMMs keep the role-free stage `gemm`, generic kernels `elementwise`"
        )
    if is_training(kernels):
        out.append(TRAINING_WARNING)
    return out


# --------------------------------------------------------------------------- 1. names


_INT_FIELDS = ("tile_m", "tile_n", "tile_k", "split_k")
# read by nothing before the output: kept per distinct name until the end (_late_columns), not held
# per kernel through the layer walk
_LATE_FIELDS = (*_INT_FIELDS, "group_key")


def classify_by_name(kernels: pa.Table, ruleset: Any) -> dict[str, Any]:
    """Rule-table result per row, computed once per distinct name (STYLE habit 9).

    ``stage`` is a Python list (later passes refine it); the other fields are Arrow arrays, those of
    :data:`_LATE_FIELDS` per distinct name (``per_name``, by ``name_codes``: :func:`_late_columns`).
    """
    names = kernels["name"].combine_chunks()
    if not isinstance(names, pa.DictionaryArray):
        names = names.dictionary_encode()
    uniq = names.dictionary.to_pylist()
    by_name = {r["name"]: r for r in rules_mod.classify_names(uniq, ruleset)}
    indices = names.indices
    cols: dict[str, Any] = {"name_codes": indices, "per_name": {}}
    for f in ("norm_name", "stage", "provider", "rule_id", *_LATE_FIELDS):
        per_name = pa.array([by_name[u][f] for u in uniq], pa.int32() if f in _INT_FIELDS else pa.string())
        if f in _LATE_FIELDS:
            cols["per_name"][f] = per_name
        else:
            cols[f] = dict_take(per_name, indices)
    # memcpy/memset rows are classified by kind, whatever their name says (the memory stages are
    # named as the activity kinds)
    kind = kernels["kind"].combine_chunks()
    memory = pa.array(list(MEMORY_STAGES))
    is_mem = pc.and_(
        pc.is_in(kind, memory),
        pc.invert(pc.is_in(cols["stage"], memory)),
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


def _late_columns(cols: Mapping[str, Any]) -> dict[str, pa.Array]:
    """The :data:`_LATE_FIELDS` per kernel, from :func:`classify_by_name`'s values per name."""
    at = cols["name_codes"]
    return {
        f: values.take(at) if f in _INT_FIELDS else dict_take(values, at)
        for f, values in cols["per_name"].items()
    }


# --------------------------------------------------------------------------- 2. host-op hints


def launching_ops(
    kernels: pa.Table, host_ops: pa.Table, join: launches.OpJoin | None = None
) -> tuple[list[str | None], dict[int, Any], pa.DictionaryArray]:
    """Name of the innermost cpu_op that launched each kernel (External id), the input shapes of
    those ops that may be embedding lookups or expert-weight gathers, and of batched GEMM ops (by
    kernel row), and the names again as one dictionary
    column (null: no launching op) for masks tested once per distinct op (:func:`dict_isin`)."""
    n = kernels.num_rows
    found = launches.joined(kernels, host_ops, join)
    if found is None:
        return [None] * n, {}, dict_strings(pa.nulls(n, pa.string()))
    ops, pos = found
    names = dict_strings(ops["name"]).take(pos)
    is_gather = pc.fill_null(
        pc.is_in(names.dictionary, pa.array(list(_SHAPED_OPS))).take(names.indices), False
    )
    rows = np.flatnonzero(is_gather.to_numpy(zero_copy_only=False))
    dims: dict[int, Any] = {}
    if len(rows):
        op_rows = ops["row"].take(pos.take(pa.array(rows)))
        got = host_ops["input_dims"].take(op_rows).to_pylist()
        dims = dict(zip(rows.tolist(), got, strict=True))
        # F.embedding dispatches to aten::index_select on CUDA: the op around it says the gather is
        # a lookup, with or without recorded shapes (the Kineto reader keeps these ops)
        inside = launches.inside_ops(host_ops, op_rows.to_numpy(zero_copy_only=False), _EMBEDDING_OPS)
        for r in rows[inside].tolist():
            dims[r] = EMBEDDING_OP  # launched inside nn.Embedding's op: a lookup, whatever the table size
    return pylist(names), dims, names


def in_attention_front_end(
    kernels: pa.Table,
    host_ops: pa.Table,
    codes: np.ndarray,
    vocab: Mapping[str, int],
    join: launches.OpJoin | None = None,
) -> np.ndarray:
    """Per kernel: a generic, GEMM or softmax kernel launched inside ``aten::scaled_dot_product_attention``.

    The SDPA front end prepares its inputs (contiguous copies, the boolean mask turned into an
    additive one) and, on the math backend, computes attention from matmuls and a softmax: all of
    it is attention, whatever the launching op's own name says. ``codes``: each kernel's stage as
    its code in ``vocab`` (:func:`_stage_codes`)."""
    n = kernels.num_rows
    found = launches.joined(kernels, host_ops, join)
    if found is None or not dict_isin(host_ops["name"], list(_ATTENTION_FRONT_ENDS)).any():
        return np.zeros(n, bool)
    ops, pos = found
    wanted = np.array([k in _FRONT_END_PARTS for k in vocab], bool)[codes]
    rows = np.flatnonzero(wanted & pos.is_valid().to_numpy(zero_copy_only=False))
    out = np.zeros(n, bool)
    if len(rows):
        op_rows = ops["row"].take(pos.take(pa.array(rows))).to_numpy(zero_copy_only=False)
        out[rows] = launches.inside_ops(host_ops, op_rows, _ATTENTION_FRONT_ENDS)
    return out


_GATHER_OPS = registry.KNOWLEDGE.words("gather_ops")
_EMBEDDING_OPS = registry.KNOWLEDGE.words("embedding_ops")
# the ops whose input shapes the rules read: embedding lookups (STR001), expert-weight gathers and
# the batched GEMMs after them (STR050), depthwise convolutions (STR052)
_SHAPED_OPS = sorted(
    {*_GATHER_OPS, *weight_gathers.WEIGHT_GATHER_OPS, *weight_gathers.BATCHED_GEMM_OPS, *mixers.CONV_OPS}
)
_ATTENTION_FRONT_ENDS = registry.KNOWLEDGE.words("attention_front_end_ops")
# what a kernel launched inside the SDPA front end may have been called by its name or op: generic
# work, a GEMM (the math backend's matmuls), its softmax (an op hint says sampling)
_FRONT_END_PARTS = registry.KNOWLEDGE.set_of("front_end_parts") | registry.GEMM_STAGES
EMBEDDING_OP = "inside aten::embedding"  # an op_dims value: the gather runs inside an embedding op


def _is_embedding_lookup(op: str, dims: Any, th: Any = registry.DEFAULT_THRESHOLDS) -> bool:
    """A gather from a [vocab, hidden] table: many more rows than columns, and a vocabulary's rows."""
    if op not in _GATHER_OPS or dims is None or len(dims) == 0:
        return False
    if dims == EMBEDDING_OP:
        return True
    table = dims[0]
    return (
        table is not None
        and len(table) == 2
        and table[0] >= th.embedding_min_rows
        and table[0] >= th.embedding_rows_per_column * table[1]
    )


def _from_activations(op: str, dims: Any) -> bool:
    """A gather whose recorded source has fewer rows than columns: rows of activations (a MoE
    block's tokens), never a vocabulary's table; outside an embedding op."""
    if op not in _GATHER_OPS or not dims or dims == EMBEDDING_OP:
        return False
    src = dims[0]
    return isinstance(src, list) and len(src) == 2 and 0 < src[0] < src[1]


def apply_op_hints(
    stage: list[str],
    op_names: Sequence[str | None],
    table: Mapping[str, str],
    op_dims: dict[int, Any] | None = None,
    why: Any = None,
    hint_codes: Mapping[str, int] | None = None,
    th: Any = registry.DEFAULT_THRESHOLDS,
) -> None:
    """Generic kernels take the stage their launching host op names (``table``), and gathers that
    are embedding lookups (:func:`_is_embedding_lookup`) take ``embedding``; ``why`` (per kernel)
    records the deciding rule's code (``hint_codes``: host op -> its hint's code)."""
    op_dims = op_dims or {}
    why = {} if why is None else why
    hint_codes = hint_codes or {}
    # only ops the table names or that can be an embedding's gather matter: test each distinct op
    # once, then visit just their kernels
    wanted = {op: op in table or op in _GATHER_OPS for op in set(op_names) if op is not None}
    for i, op in enumerate(op_names):
        if op is None or not wanted[op]:
            continue
        if stage[i] == "embedding" and _from_activations(op, op_dims.get(i)):
            stage[i] = "elementwise"  # a lookup's kernel by name, gathering rows of activations
            why[i] = EMBEDDING_LOOKUP
        elif stage[i] in GENERIC:
            d = op_dims.get(i)
            if _is_embedding_lookup(op, d, th):
                stage[i] = "embedding"
                why[i] = EMBEDDING_LOOKUP
                continue
            s = table.get(op)
            if s is not None and (s != "embedding" or d is None or _is_embedding_lookup(op, d, th)):
                stage[i] = s
                code = hint_codes.get(op)
                if code is not None:
                    why[i] = code
