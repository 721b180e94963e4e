"""The structure pass of one run: the inputs the structure rules read, found once, and the one driver
that runs the rules over each device's kernels and applies their decisions in the registry's order.

Contract: :meth:`StructureRun.of` finds, once per run, what the rules read per kernel row (the
normalised names, the top-k, ``pow``, reduction and softmax candidates, the operand facts, the
GEMM shapes read on demand); :meth:`StructureRun.decide_groups` decides which rule groups'
preconditions hold (``[[group]]`` in ``rules/structure.toml``); :meth:`StructureRun.structure` runs,
on one device's kernels in launch order, the passes before the walk (:data:`PASSES_BEFORE_WALK`,
sorted by their rule's position in the registry, each gated by its group), the layer walk
(:func:`analyzer.analyses.walk.grammar.walk_sequence`, whose steps are ordered the same way), its
self-check, and the passes after it (:data:`PASSES_AFTER_WALK`). Every pass reads the kernels and
returns its :class:`~analyzer.analyses.walk.decisions.Decisions`; only the driver writes the stage
list and the rule codes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.analyses import attention_gates, convolutions, dequantize, mixers, rotary_tables, weight_gathers
from analyzer.analyses.walk import eager_ops, grammar, moe, positions, registry, selfcheck
from analyzer.analyses.walk.decisions import Decisions, codes_at
from analyzer.analyses.walk.registry import ATTENTION, REGION_RULE_CODES
from analyzer.analyses.walk.sequence import NO_COPY_FACTS, CopyFacts
from analyzer.knowledge.structure_rules import StructureKnowledge
from analyzer.tables import launches
from analyzer.tables.dictionaries import dict_isin, pylist

SDPA_FRONT_END = registry.KNOWLEDGE.code_of("sdpa-front-end")


@dataclass
class StructureRun:
    """What the structure rules read, per kernel row, found once for the run, and the driver that runs
    them over one device's segment in the registry's order."""

    stage: list[str]
    why: Any
    op_names: list[str | None]
    op_dims: dict[int, Any]
    norm: list[str]
    launch: np.ndarray
    topk: np.ndarray
    pow_rows: np.ndarray
    reduce_rows: np.ndarray
    softmax: np.ndarray
    int_cast: np.ndarray
    vec_scale: np.ndarray
    gemm_kn: Callable[[int], tuple[int, int] | None] | None
    th: Any
    layer: np.ndarray
    front: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    trig: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # launched by a cos / sin op
    # launched by a row maximum (a router's selection), by an op a mixer's anchor may be, by a convolution
    select: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    anchors: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    convs: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    masked: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # a multiply by a mask
    copies: CopyFacts = NO_COPY_FACTS  # what recorded types and shapes say of each copy
    counts: Counter = field(default_factory=Counter)
    groups: dict[str, bool] = field(default_factory=dict)  # rule group -> its precondition held
    suspects: list[int] = field(default_factory=list)  # kernel rows the layer grammar has no place for
    inputs: Callable[[int], list[list[int]] | None] | None = None  # a kernel row's op's input dims, on demand

    @classmethod
    def of(
        cls,
        kernels: pa.Table,
        host_ops: pa.Table,
        cols: dict[str, Any],
        stage: list[str],
        why: Any,
        op_names: list[str | None],
        op_dims: dict[int, Any],
        op_column: pa.DictionaryArray,
        th: Any,
        join: launches.OpJoin,
    ) -> StructureRun:
        norm = pylist(cols["norm_name"])
        facts = dequantize.operand_facts(kernels, host_ops, op_column, join)
        inputs = inputs_on_demand(kernels, host_ops, join)
        run = cls(
            stage, why, op_names, op_dims, norm,
            kernels["launch_op_id"].to_numpy(zero_copy_only=False),
            moe.topk_candidates(norm, op_column),
            dict_isin(op_column, list(registry.POW_OPS)),
            eager_ops.reduction_rows(cols["norm_name"], op_column),
            eager_ops.softmax_rows(cols["norm_name"], op_column, stage),
            facts.int_cast, facts.vec_scale, gemm_shapes_on_demand(op_names, inputs), th,
            np.full(kernels.num_rows, -1, np.int64),
        )  # fmt: skip
        run.trig = dict_isin(op_column, list(registry.KNOWLEDGE.set_of("rotary_trig_ops")))
        run.select = dict_isin(op_column, list(registry.KNOWLEDGE.set_of("selection_ops")))
        run.anchors = dict_isin(op_column, list(mixers.ANCHOR_CANDIDATE_OPS))
        run.convs = dict_isin(op_column, list(convolutions.CONV_OPS))
        run.inputs = inputs
        run.masked = facts.masked
        run.copies = CopyFacts(
            facts.widen, facts.narrow, facts.scalar, module_copies(kernels, host_ops, join)
        )
        return run

    def count(self, rule: int, kernels: int) -> None:
        if kernels:
            self.counts[rule] += kernels

    def decide_groups(
        self, know: StructureKnowledge, op_column: pa.DictionaryArray, seen: Mapping[str, int]
    ) -> None:
        """Whether each rule group's precondition (``[[group]]`` in rules/structure.toml) holds on the
        run: where it does not, its rules could change nothing, and they do not run. ``seen``: the
        stages the names and op hints gave."""

        def launched(*keys: str) -> bool:
            ops = [op for k in keys for op in know.set_of(k)]
            return bool(dict_isin(op_column, ops).any())

        held = {
            "quantized-linears": bool(self.int_cast.any())
            or launched("quantized_gemm_ops", "weight_only_gemm_ops", "float_out_gemm_ops"),
            "expert-weights": bool(self.topk.any())
            or (bool(self.select.any()) and weight_gathers.has_stacked_gathers(self.op_names, self.op_dims)),
            "mixture-of-experts": bool(self.topk.any()) or any(s.startswith("moe_") for s in seen),
            "composed-attention": bool(self.softmax.any()),
            "sdpa-front-end": bool(self.front.any()),
            "rotary-tables": bool(self.trig.any()),
            "token-mixers": "linear_attention" in seen
            or launched("depthwise_conv_ops", "mixer_anchor_ops", "stabilizer_ops")
            or mixers.has_products(self.op_names, self.op_dims),
            "gated-attention": launched("gate_activation_ops"),
            # an attention kernel by name, or a composed attention's softmax (the walk's attention)
            "sparse-attention": bool(self.topk.any())
            and (any(s in ATTENTION for s in seen) or bool(self.softmax.any())),
            "model-code-host-ops": op_column.null_count < len(op_column),
            "kv-cache-writes": launched("kv_write_ops") or "kv_cache_store" in seen,
        }
        self.groups = {g.name: held[g.name] for g in know.groups}

    def runs(self, rule: str) -> bool:
        """Whether ``rule`` runs: its group's precondition held (a rule in no group always runs;
        every group runs where the preconditions were not decided)."""
        group = _GROUP_OF.get(rule)
        return group is None or self.groups.get(group, True)

    def decide(self, step: Pass, seg: np.ndarray) -> Decisions:
        """One pass's decisions over the device's kernels ``seg``."""
        d = Decisions(self.stage, self.why)
        step.run(self, seg, d)
        return d

    def structure(self, seg: np.ndarray) -> str | None:
        """The structure rules over one device's kernels ``seg`` (in launch order); the self-check's
        reason when the walk cannot be trusted (the caller then keeps the names' answers)."""
        held: Counter = Counter()  # the passes' counts, kept where the walk is kept
        suspect: list[int] = []
        for step in PASSES_BEFORE_WALK:
            if self.runs(step.rule):
                self.decide(step, seg).apply(self.stage, self.why, held)
        grammar.walk_sequence(
            seg, self.stage, self.norm, self.op_names, self.launch, self.layer, self.topk, self.pow_rows,
            self.reduce_rows, self.why, self.th, self.counts, self.gemm_kn, self.runs, suspect, self.inputs,
            self.copies,
        )  # fmt: skip
        problem = selfcheck.structure_problem(seg, self.stage, self.layer, self.th)
        if problem:
            return problem
        self.counts.update(held)
        self.suspects.extend(suspect)
        for step in PASSES_AFTER_WALK:
            if self.runs(step.rule):
                self.decide(step, seg).apply(self.stage, self.why, self.counts)
        return None

    def mixers_alone(self, seg: np.ndarray) -> None:
        """Where the walk was dropped: the token mixers found from the names' answers alone."""
        if self.runs(MIXER_SPAN.rule):
            self.decide(MIXER_SPAN, seg).apply(self.stage, self.why, self.counts)


@dataclass(frozen=True)
class Pass:
    """A structure rule that runs as a pass of its own over one device's kernels: ``rule`` the name
    the registry gives it (its position orders the passes), ``run(structure run, kernels, decisions)``
    records its decisions."""

    rule: str
    run: Callable[[StructureRun, np.ndarray, Decisions], None]


def _activation_quantize(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    eager_ops.mark_activation_quantize(seg, d.stage, r.op_names, r.launch, d.why)


def _weight_dequantize(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    dequantize.mark_weight_dequantize(
        seg, d.stage, r.op_names, r.launch, r.int_cast, r.vec_scale, d.why, r.th
    )


def _expert_weight_gathers(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    # a router's top-k, or where none ran its selection by row maximum (a sparse mixer)
    chosen = r.topk if r.topk.any() or not len(r.select) else r.select
    weight_gathers.mark_expert_weight_gathers(seg, d.stage, r.op_names, r.op_dims, chosen, d.why, r.th)


def _composed_attention(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    eager_ops.compose_attention(seg, d.stage, r.norm, r.op_names, r.launch, r.softmax, d.why)


def _sdpa_front_end(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    # after composing: it reaches back past the front end
    d.label(seg[r.front[seg]].tolist(), registry.COMPOSED_ATTENTION, SDPA_FRONT_END)


_LAYOUT_COPY_WORDS = registry.KNOWLEDGE.words("layout_copy_words")


def _mixer_spans(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    # before the walk: the walk takes a mixer's projections as they are (its block is not attention
    # and an MLP)
    def layout(row: int) -> bool:  # a layout-only copy by its name (no dtype cast)
        return all(w in r.norm[row] for w in _LAYOUT_COPY_WORDS)

    def fused_norm(row: int) -> bool:  # a norm of one kernel, by its name
        return positions._fused_norm(r.norm[row])

    # the anchors' candidates at once: kernels of an anchor's op, and this segment's linear_attention
    # ones by name
    candidates = r.anchors.copy()
    candidates[[x for x in seg.tolist() if r.stage[x] == "linear_attention"]] = True
    d.count(
        mixers.MIXER_SPAN,
        mixers.mark_mixers(
            seg,
            d.stage,
            r.op_names,
            r.op_dims,
            d.why,
            r.th,
            r.launch,
            r.inputs,
            layout,
            fused_norm,
            candidates,
            r.masked if len(r.masked) else None,
        ),  # fmt: skip
    )


def _convolution_gemms(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    d.count(
        convolutions.CONVOLUTION_GEMM,
        convolutions.mark_convolution_gemms(seg[r.convs[seg]], d.stage, r.op_names, d.why),
    )


def _short_convolutions(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    d.count(
        convolutions.SHORT_CONVOLUTION,
        convolutions.mark_short_convolutions(
            seg, d.stage, r.op_names, r.op_dims, d.why, REGION_RULE_CODES, r.convs
        ),
    )


def _output_gates(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    d.count(
        attention_gates.OUTPUT_GATE,
        attention_gates.mark_output_gates(seg, d.stage, r.op_names, d.why, r.copies),
    )


def _input_gates(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    codes = codes_at(r.why, seg)
    d.count(
        attention_gates.INPUT_GATE, attention_gates.mark_input_gates(seg, d.stage, r.op_names, d.why, codes)
    )


def _rotary_tables(r: StructureRun, seg: np.ndarray, d: Decisions) -> None:
    # before the walk: a rotary table's GEMM inside the layers is no projection
    d.count(
        rotary_tables.ROTARY_TABLE,
        rotary_tables.mark_rotary_tables(seg, d.stage, r.op_names, r.trig, d.why, r.th, r.gemm_kn),
    )


def _in_registry_order(*passes: Pass) -> tuple[Pass, ...]:
    return tuple(sorted(passes, key=lambda p: registry.KNOWLEDGE.code_of(p.rule)))


MIXER_SPAN = Pass("mixer-span", _mixer_spans)

#: The passes before the layer walk, in the registry's order.
PASSES_BEFORE_WALK = _in_registry_order(
    Pass("activation-quantize", _activation_quantize),
    Pass("weight-dequantize", _weight_dequantize),
    Pass("expert-weight-gather", _expert_weight_gathers),
    Pass("composed-attention", _composed_attention),
    Pass("sdpa-front-end", _sdpa_front_end),
    MIXER_SPAN,
    Pass("convolution-gemm", _convolution_gemms),
    Pass("rotary-table", _rotary_tables),
)

#: The passes after the walk and its self-check, in the registry's order.
PASSES_AFTER_WALK = _in_registry_order(
    Pass("attention-output-gate", _output_gates),
    Pass("attention-input-gate", _input_gates),
    Pass("short-convolution", _short_convolutions),
)

_GROUP_OF = {rule: g.name for g in registry.KNOWLEDGE.groups for rule in g.rules}


_MODULE_COPY_OPS = sorted(registry.KNOWLEDGE.set_of("module_copy_ops"))


def module_copies(
    kernels: pa.Table, host_ops: pa.Table, join: launches.OpJoin | None = None
) -> np.ndarray | None:
    """Per kernel row: launched inside an op of a module's own code that copies
    (``module_copy_ops``: ``Tensor.repeat``); None where no such op ran (the usual trace)."""
    if host_ops.num_rows == 0 or not dict_isin(host_ops["name"], _MODULE_COPY_OPS).any():
        return None
    found = launches.joined(kernels, host_ops, join)
    if found is None:
        return None
    ops, pos = found
    out = np.zeros(kernels.num_rows, bool)
    at = np.flatnonzero(pos.is_valid().to_numpy(zero_copy_only=False))
    op_rows = ops["row"].take(pos.take(pa.array(at))).to_numpy(zero_copy_only=False)
    out[at] = launches.inside_ops(host_ops, op_rows, _MODULE_COPY_OPS)
    return out


def inputs_on_demand(
    kernels: pa.Table, host_ops: pa.Table, join: launches.OpJoin | None = None
) -> Callable[[int], list[list[int]] | None] | None:
    """Kernel row -> the input dims of its launching op, read from the host ops when asked (a rule
    asks for a few kernels: no per-kernel shape lists on a 10 GB trace); None without host ops."""
    found = launches.joined(kernels, host_ops, join)
    if found is None or "input_dims" not in host_ops.column_names:
        return None
    ops, pos = found
    op_row, dims = ops["row"], host_ops["input_dims"]

    def inputs(r: int) -> list[list[int]] | None:
        p = pos[r].as_py()
        if p is None:
            return None
        d = dims[op_row[p].as_py()].as_py()
        return [list(x) if x is not None else [] for x in d] if d else None

    return inputs


def gemm_shapes_on_demand(
    op_names: list[str | None], inputs: Callable[[int], list[list[int]] | None] | None
) -> Callable[[int], tuple[int, int] | None] | None:
    """Kernel row -> (K, N) of its launching GEMM op (from :func:`inputs_on_demand`); None without
    host ops."""
    if inputs is None:
        return None

    def kn(r: int) -> tuple[int, int] | None:
        return positions.gemm_shape(op_names[r], inputs(r))

    return kn
