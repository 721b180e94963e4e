"""The engine-neutral grammar of a decoder forward: one pass along a device's kernels in time order
that gives every GEMM op its role from the region it is in and what comes next (:func:`_role`),
numbers the layers and hands the generic kernels to the region defaults.

Contract: :func:`walk_sequence` builds the device's :class:`KernelSequence` and runs, in order, the
rules that prepare it (a lone ``pow``, output-row gathers, MoE routers), the look-ahead of every GEMM
op (:class:`_Ahead`), the walk itself (:func:`_walk`: the region state machine, one decision per GEMM
op in :func:`_gemm_op`), the fix-ups around the first layer and the LM head (:func:`_fix_ups`) and
the region defaults with their refinements (:func:`_label_regions`), in the registry's order
(:data:`WALK_STEPS`, checked against ``rules/structure.toml`` by the tests). Every step returns its
:class:`~analyzer.analyses.walk.decisions.Decisions` (a stage and the deciding rule's code per kernel
row) and :meth:`KernelSequence.apply` applies them before the next step reads; the walk writes the
layer numbers.

Regions of a decoder layer: ``attn_in`` (after the input norm: QKV GEMMs, RoPE, KV store), ``attn``
(attention), ``attn_out`` (after the O GEMM: residual add, post-attention norm), ``mlp_in`` (between
gate/up GEMMs and the down GEMM: activation), ``mlp_out`` (after the down GEMM: residual add, next
input norm), ``moe`` / ``moe_experts`` (routing, expert GEMMs), ``tail`` (after the LM head:
sampling); ``pre`` before the first layer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.analyses.walk.between_ops import (
    GemmShapes,
    _add_before_gemm,
    _gated_output,
    _norm_then_gemm,
    _reads_gate_up,
    _same_shape,
)
from analyzer.analyses.walk.block_tests import (
    after_combine,
    before_norm_tail,
    block_follows,
    narrowing,
    norm_gate,
    side_block,
)
from analyzer.analyses.walk.decisions import Decisions, codes_at
from analyzer.analyses.walk.eager_ops import (
    _demote_lone_pow,
    _demote_output_row_gathers,
    _label_inner_norms,
    _norm_shape,
)
from analyzer.analyses.walk.model_code import (
    _demote_embedding_projection,
    _demote_sampling_before_layers,
    _host_input_boundaries,
    _label_embedding_scale,
    _label_position_ids,
    _shift_prologue_to_next_layer,
)
from analyzer.analyses.walk.moe import _mark_routers, expert_block_writes
from analyzer.analyses.walk.positions import _gemm_ops, _next_where, _norm_like
from analyzer.analyses.walk.regions import _label_generic
from analyzer.analyses.walk.registry import (
    _ID,
    _V,
    ATTENTION,
    ATTENTION_GATE_PROJECTION,
    BLOCK_OUTPUT_PROJECTION,
    DEFAULT_THRESHOLDS,
    GEMM_STAGES,
    GENERIC,
    LONE_POW,
    MIXER_SPAN,
    MLP_SUB_NORM,
    MOE_ROUTER,
    OUTPUT_ROWS,
    ROLE_O,
    ROLE_POST_NORM_QKV,
    SAMPLING_LIKE,
    SIDE_BLOCK,
)
from analyzer.analyses.walk.roles import NO_MLP, _role
from analyzer.analyses.walk.sequence import CopyFacts, KernelSequence
from analyzer.analyses.walk.sparse_attention import _demote_attention_index_topk
from analyzer.knowledge.structure_rules import Thresholds
from analyzer.tables.positions import row_sequence

SECOND_HEAD = _ID("second-head")
NARROW_HEAD = _ID("narrow-head")
DOWN_BY_SHAPE = _ID("down-by-shape")
MOE_SAMPLING_TOPK = _ID("moe-sampling-topk")
TAIL_NEG = _ID("tail-neg")
HOST_INPUTS = _ID("host-input-boundary")
PROLOGUE_SHIFT = _ID("prologue-shift")
MLP_AFTER_EXPERTS = _ID("mlp-after-experts")
NORM_GATE = _ID("norm-gate")
_MOE_ROUTING = _V("moe_routing_stages")
_ROUTING_LEADS = ("moe_topk", "moe_sort", "sampling", "moe_expert_gemm")


def _every_rule(_: str) -> bool:
    return True


# the stages the region state machine decides (a GEMM's role; a top-k inside a MoE block), by index
_ROLES = (*sorted(GEMM_STAGES), "moe_expert_gemm", "moe_topk")
_ROLE_INDEX = {s: i for i, s in enumerate(_ROLES)}


#: The walk's steps, by the registry names of the rules each applies, in the order they run (the
#: registry's order: ``tests/test_structure_registry.py`` checks it). The GEMM roles are one step:
#: the region state machine decides each GEMM op by the first of its role rules that holds.
WALK_STEPS = (
    ("lone-pow",),
    ("attention-index-topk",),
    ("output-row-gather",),
    ("moe-router",),
    ("role-o", "role-qkv", "role-qkv-more", "role-post-norm-qkv", "block-output-projection",
     "attention-gate-projection", "role-moe-gate", "host-input-boundary",
     "layer-side-block", "norm-gate", "role-gate-up", "role-down", "mlp-sub-norm", "mlp-after-experts", "role-expert", "role-lm-head", "narrow-head", "second-head", "role-none",
     "block-without-mlp", "down-by-shape", "moe-sampling-topk"),
    ("embedding-projection",),
    ("pre-layer-sampling",),
    ("embedding-scale",),
    ("position-ids",),
    ("tail-neg",),
    ("first-norm", "rotary-module", "moe-block", "moe-shared-gate", "moe-glu-product", "sandwich-norm",
     "block-inner-norm",
     "router-cast", "residual-add", "kv-update", "kv-update-before-gemm", "kv-update-by-name",
     "attention-input-copies", "region-attn-in", "region-attn", "region-attn-out", "region-mlp-in",
     "region-mlp-out", "region-moe", "selection-router", "lm-head-epilogue", "region-tail", "next-forward-prologue"),
    ("inner-norms", "qk-norm-input-copy"),
    ("prologue-shift",),
)  # fmt: skip


def walk_sequence(
    seq: np.ndarray,
    stage: list[str],
    norm: list[str],
    op_names: Sequence[str | None],
    launch: np.ndarray,
    layer: np.ndarray,
    topk_rows: np.ndarray,
    pow_rows: np.ndarray,
    reduce_rows: np.ndarray,
    why: Any = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
    fired: Counter | None = None,
    gemm_kn: GemmShapes | None = None,
    runs: Callable[[str], bool] | None = None,
    suspect: list[int] | None = None,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
    copies: CopyFacts | None = None,
) -> None:
    """Assign GEMM roles, layers and region stages along one device's time-ordered kernels ``seq``.
    Per kernel row: ``stage`` (read and written), ``norm`` (normalised names), ``op_names`` /
    ``launch`` (launching op and its id), ``layer`` (written), ``topk_rows`` / ``pow_rows`` /
    ``reduce_rows`` (:func:`~analyzer.analyses.walk.moe.topk_candidates`, launched by ``aten::pow``,
    :func:`~analyzer.analyses.walk.eager_ops.reduction_rows`), ``why`` (the id of the rule that set
    the stage, updated for every kernel a rule here relabels). ``th``: the thresholds; ``fired``:
    rule code -> kernels, counted for the rules whose decision the stage column does not show (layers
    only, or a stage a later rule replaces); ``gemm_kn`` (optional): kernel row -> its GEMM op's
    (K, N), read on demand for the few GEMMs whose role needs it; ``runs`` (rule name -> whether it
    runs: its group's precondition held; default: every rule runs): without a top-k candidate or a
    routing / expert stage there is no router to find, without host ops no model code's host op,
    without a KV write op or store kernel no KV-cache update. ``suspect`` (optional): filled with the
    kernel rows the layer grammar has no place for (an activation inside an attention input,
    STR058). ``copies`` (optional): what recorded types and shapes say of each copy (a widening one
    is no norm's tail, a module's own is no attention input copy ...)."""
    why = defaultdict(int) if why is None else why  # (read for the marks of the passes before)
    ks = KernelSequence(seq, row_sequence(seq), stage, why, norm, op_names, launch, th, fired)
    ks.inputs = inputs
    if copies is not None:
        ks.copies = copies
    runs = runs if runs is not None else _every_rule
    gemm, op_first, op_last, picked = _prepare(ks, topk_rows, pow_rows[seq], reduce_rows[seq], runs)
    ahead = _look_ahead(ks, gemm, op_first, op_last)
    region_of, layer_of, mem = _walk(ks, ahead, gemm_kn)
    d = ks.decide()
    _demote_embedding_projection(ks.rows, d.stage, region_of, layer_of, op_first, op_last, mem.opened, d.why)
    gates = np.zeros(ks.n, bool)  # a norm gate's kernels: no norm's tail (the norm ends before)
    for p, tail in mem.gate_tails:  # its sigmoid, multiply and casts are the norm's (STR075)
        gates[p : tail.stop] = True
        for q in tail:
            d.stage[ks.rows[q]], d.why[ks.rows[q]] = "norm", NORM_GATE
    ks.apply(d, refresh=bool(mem.gate_tails))
    marks = _fix_ups(ks, region_of, runs)
    _label_regions(ks, region_of, layer_of, op_first, marks, runs("kv-update"), picked, suspect, gates)
    layer[seq] = layer_of


def _prepare(
    ks: KernelSequence,
    topk_rows: np.ndarray,
    pow_at: np.ndarray,
    reduce_at: np.ndarray,
    runs: Callable[[str], bool] = _every_rule,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The rules that run before the walk: a lone ``pow`` is no norm (STR004), a sparse attention's
    key top-k is no sampler's (STR057), the output rows an LM head gathers are not the embedding
    (STR047), MoE routers by their top-k (STR005). Returns the GEMM mask, the GEMM ops' first
    and last positions and the positions of a sparse attention's key selection."""
    rows = ks.rows
    d = ks.decide()
    # the region labels the lone pows next: the final stage names that rule
    d.count(LONE_POW, _demote_lone_pow(rows, d.stage, pow_at, reduce_at, d.why))
    ks.apply(d)
    ks.refresh()
    # norm-like: a norm stage, or a name with a norm's word (tested once per distinct name; no
    # per-kernel tuples: millions of them would dominate the memory of a 10 GB trace)
    names = list(map(ks.names.__getitem__, rows))
    by_name = {x: _norm_like("", x) for x in set(names)}
    ks.normish = np.fromiter(map(by_name.__getitem__, names), bool, ks.n) | ks.stages(("norm",))
    del names
    gemm = ks.stages(GEMM_STAGES)
    op_first, op_last = _gemm_ops(ks.seq, gemm, ks.names, ks.launch)
    # (STR057 below relabels sampling-like kernels only: the lookups and attention stay where they are)
    found = ks.stages(("embedding",)), ks.stages(ATTENTION)
    picked: list[int] = []
    if runs("attention-index-topk"):
        d = ks.decide()
        picked = _demote_attention_index_topk(
            rows, d.stage, topk_rows[ks.seq] & ks.stages(SAMPLING_LIKE), found[1], gemm | ks.normish | found[0],
            d.why,
        )  # fmt: skip
        ks.apply(d, refresh=bool(picked))
    d = ks.decide()
    gathers = _demote_output_row_gathers(rows, d.stage, *found, op_first, ks.normish, d.why)
    d.count(OUTPUT_ROWS, gathers)  # the region labels them next: the final stage names that rule
    ks.apply(d, refresh=gathers > 0)
    hard = ks.normish | ks.stages(ATTENTION, ("embedding",))
    experts = ks.stages(("moe_expert_gemm",))
    if runs("moe-router"):
        d = ks.decide()
        found_router = _mark_routers(
            rows, ks.st, d.stage, ks.names, ks.op_names, (op_first, op_last), hard, experts, topk_rows, d.why
        )
        ks.apply(d, refresh=found_router)
    return gemm, op_first, op_last, picked


@dataclass
class _Ahead:
    """What follows each GEMM op ``k``, seen from the position after it: the next anchor kernel's
    position (``anchor_at``) and stage (``follow``: ``embedding`` at a host-input boundary); the
    next anchor or GEMM (``lead``: ``gemm`` for a GEMM); whether a GEMM comes before the next norm,
    attention, routing or embedding kernel (``gemm_ahead``: a router GEMM ends the MLP before it,
    Qwen2-MoE runs its shared expert first); whether a norm comes before the next anchor
    (``norm_ahead``: a block follows, not the anchor's projections); whether a RoPE-named kernel
    comes before the next GEMM or anchor (``rotary_next``: the rotary module's frequency product).
    Per position: ``gemm``, ``router``, ``boundary`` (a host-input boundary), ``op_index`` (the GEMM
    op starting there, -1 elsewhere) and ``events`` (the positions that change the walk's state)."""

    op_first: np.ndarray
    op_last: np.ndarray
    anchor_at: list[int]
    follow: list[str]
    lead: list[str]
    gemm_ahead: list[bool]
    norm_ahead: list[bool]
    rotary_next: list[bool]
    gemm: np.ndarray
    router: np.ndarray
    boundary: np.ndarray
    op_index: np.ndarray
    events: list[int]


def _look_ahead(ks: KernelSequence, gemm: np.ndarray, op_first: np.ndarray, op_last: np.ndarray) -> _Ahead:
    n, st, normish = ks.n, ks.st, ks.normish
    blocker = normish | ks.stages(ATTENTION, _MOE_ROUTING, ("embedding",))
    router = ks.stages(("moe_gate_gemm",))
    boundary = _host_input_boundaries(
        ks.stages(("memcpy", "memset")), ks.stages(("embedding",)), op_last, normish
    )
    anchor = ks.stages(ATTENTION, SAMPLING_LIKE, ("embedding", "moe_sort", "moe_expert_gemm")) | boundary
    after = op_last + 1
    anchor_at = _next_where(anchor, after).tolist()
    # a host-input boundary ends the forward as the next forward's lookup would
    follow = [("embedding" if boundary[q] else st[q]) if q < n else "" for q in anchor_at]
    next_anchor_or_gemm = _next_where(anchor | gemm, after)
    lead = [
        ("gemm" if not anchor[q] else "embedding" if boundary[q] else st[q]) if q < n else ""
        for q in next_anchor_or_gemm.tolist()
    ]
    at = _next_where(gemm | blocker | router, after).tolist()
    gemm_ahead = [q < n and bool(gemm[q]) and not router[q] for q in at]
    norm_ahead = (_next_where(normish, after) < np.asarray(anchor_at)).tolist()
    rotary_next = (_next_where(ks.stages(("rope",)), after) < next_anchor_or_gemm).tolist()
    op_index = np.full(n + 1, -1, np.int64)
    op_index[op_first] = np.arange(len(op_first))
    # only these positions change the walk's state; the runs between them take the region as it is
    events = np.zeros(n, bool)
    events[op_first] = True
    events |= (
        normish | boundary | ks.stages(ATTENTION, _MOE_ROUTING, ("embedding", "sampling", "moe_expert_gemm"))
    )
    return _Ahead(
        op_first, op_last, anchor_at, follow, lead, gemm_ahead, norm_ahead, rotary_next, gemm, router,
        boundary, op_index, [*np.flatnonzero(events).tolist(), n],
    )  # fmt: skip


@dataclass
class _Memory:
    """What the walk remembers between GEMM ops: whether the last one was a token mixer's output
    projection or an MLP's down projection, the kernel row of this MLP's last gate / up projection,
    the GEMM op that took the LM head's role (if it was the last one) and the GEMM ops that opened a
    forward as its first projection."""

    after_mixer: bool = False
    after_down: bool = False
    last_o: int = -1  # the GEMM op that took the O role, if it was the last one
    gate_up_row: int = -1
    last_head: int = -1
    side_next: int = -1  # the GEMM op that ends a layer's side block (STR070)
    gate_next: int = -1  # the GEMM op that ends a norm's gate (STR075)
    gate_tails: list[tuple[int, range]] = field(default_factory=list)  # norm gates: first GEMM, tail
    opened: list[int] = field(default_factory=list)

    def remember(self, k: int, role: str, rid: int, row: int) -> None:
        """After GEMM op ``k`` (its first kernel row ``row``) took ``role`` by rule ``rid``."""
        if rid != MIXER_SPAN:
            self.after_mixer = False
        self.after_down = role == "down_gemm"
        self.last_o = k if role == "o_gemm" else -1
        if role == "gate_up_gemm":
            self.gate_up_row = row
        self.last_head = k if role == "lm_head_gemm" else -1


def _walk(
    ks: KernelSequence, ahead: _Ahead, gemm_kn: GemmShapes | None
) -> tuple[list[str], list[int], _Memory]:
    """The region state machine along the positions: per position its region and layer number (-1
    before the first layer and after the LM head), and what the walk remembers at its end (the GEMM
    ops that opened a forward, the norm gates' tails)."""
    n, st, rows, stage = ks.n, ks.st, ks.rows, ks.stage
    normish, boundary, op_index, op_last = ks.normish, ahead.boundary, ahead.op_index, ahead.op_last
    # the decisions, one per GEMM kernel: a role's index and its rule's code per position
    roles, index = list(_ROLES), dict(_ROLE_INDEX)  # this walk's roles (a mixer's stage may add one)
    role_at = np.full(n, -1, np.int8)
    rid_at = np.zeros(n, np.int16)
    mem = _Memory()
    region, layer_no = "pre", -1
    norm_seen = False
    fresh = False  # no GEMM op since an embedding lookup (a trace may begin mid-forward)
    region_of = [""] * n
    layer_of = [-1] * n  # lists: numpy item assignment per kernel is slower
    p = 0
    for e in ahead.events:
        if e < p:
            continue  # inside a GEMM op already walked
        if e > p:
            region_of[p:e] = [region] * (e - p)
            layer_of[p:e] = [-1 if region in ("pre", "tail") else layer_no] * (e - p)
        p = e
        if p == n:
            break
        s = st[p]
        k = int(op_index[p])
        if k >= 0:
            b = int(op_last[k])
            role, rid, region, layer_no = _gemm_op(
                ks, (role_at, rid_at), ahead, k, region, layer_no, norm_seen, fresh, mem, gemm_kn
            )
            which = index.get(role)
            if which is None:  # a stage a pass before the walk gave a GEMM (a mixer's projection)
                which = index[role] = len(roles)
                roles.append(role)
            fresh = fresh and bool(ahead.rotary_next[k])  # the rotary module's product opens nothing
            norm_seen = norm_seen and rid == NORM_GATE  # (a norm's gate: its norm still opens)
            for q in range(p, b + 1):
                if stage[rows[q]] in GEMM_STAGES:  # (this op's kernels: no decision of this walk yet)
                    role_at[q] = which
                    rid_at[q] = rid
                region_of[q] = region
                layer_of[q] = -1 if region in ("pre", "tail") else layer_no
            p = b + 1
            continue
        if s == "embedding" or boundary[p]:
            region, layer_no, norm_seen, fresh = "pre", -1, False, True
        elif s in ATTENTION and ks.why[rows[p]] == MIXER_SPAN and region not in ("attn_in", "attn"):
            # a token mixer's own work before its input projection (a token shift, a padding
            # mask: STR052) opens its layer, as the projection would
            region, layer_no, norm_seen = "attn_in", layer_no + 1, False
        elif s in ATTENTION:
            region, norm_seen = "attn", False
        elif s in _MOE_ROUTING and region in ("attn_out", "mlp_in", "moe"):
            region = "moe"
        elif s == "sampling" and region == "moe":
            role_at[p] = _ROLE_INDEX["moe_topk"]
            rid_at[p] = MOE_SAMPLING_TOPK
        elif s == "moe_expert_gemm":
            region = "moe_experts"
        elif normish[p]:
            norm_seen = True
        region_of[p] = region
        layer_of[p] = -1 if region in ("pre", "tail") else layer_no
        p += 1
    d = ks.decide()
    d.label_table(ks.seq, role_at, roles, rid_at)
    ks.apply(d)
    return region_of, layer_of, mem


def _gemm_op(
    ks: KernelSequence,
    decided: tuple[np.ndarray, np.ndarray],
    ahead: _Ahead,
    k: int,
    region: str,
    layer_no: int,
    norm_seen: bool,
    fresh: bool,
    mem: _Memory,
    gemm_kn: GemmShapes | None,
) -> tuple[str, int, str, int]:
    """(role, deciding rule's code, new region, layer number) of GEMM op ``k``; updates ``mem``;
    ``decided``: the walk's decisions so far, per position the role's index and the rule's code (an
    output projection is taken back from the head)."""
    rows, why = ks.rows, ks.why
    p, b = int(ahead.op_first[k]), int(ahead.op_last[k])
    right_after = k > 0 and int(ahead.op_last[k - 1]) + 1 == p  # nothing since the GEMM op before
    if ahead.router[p]:  # found by _mark_routers
        role, region, rid = "moe_gate_gemm", "moe", MOE_ROUTER
    elif why[rows[p]] == MIXER_SPAN:
        # a token mixer's projection (STR052, before the walk): its input projections open a layer
        # as QKV GEMMs do, its output projection ends the mixer as an O GEMM does
        role, rid = ks.st[p], MIXER_SPAN
        mem.after_mixer = role == "o_gemm"
        if role == "o_gemm":
            region = "attn_out"
        elif region not in ("attn_in", "attn"):
            region, layer_no = "attn_in", layer_no + 1
    elif region == "tail" and mem.last_head == k - 1 and ahead.anchor_at[k - 1] > p:
        # two GEMMs after the final norm with nothing between: an output projection, then the LM
        # head (OPT-350m's project_out): the last one is the head
        _take_back(decided, ahead, k - 1, "lm_head_gemm", SECOND_HEAD)
        role, rid = "lm_head_gemm", SECOND_HEAD
    elif (
        region == "mlp_in"
        and ahead.gemm_ahead[k]
        and _add_before_gemm(rows, b + 1, ahead.gemm, ks.op_names)
        and _reads_gate_up(gemm_kn, rows[p], mem.gate_up_row)
    ):
        # a GEMM reading the gate / up projections' output is the down projection, whatever
        # follows it (a post-norm layer's q_proj before its q_norm)
        role, region, rid = "down_gemm", "mlp_out", DOWN_BY_SHAPE
    elif (
        region == "attn_out"
        and not norm_seen
        and mem.last_o == k - 1
        and _gated_output(ks, int(ahead.op_last[k - 1]) + 1, p)
    ):
        # the GEMM after the attention projected a gate (softplus / sigmoid) multiplied into the
        # attention's output: that one was the gate's projection, this one is the O projection
        ks.count(
            ATTENTION_GATE_PROJECTION, _take_back(decided, ahead, k - 1, "o_gemm", ATTENTION_GATE_PROJECTION)
        )
        role, rid = "o_gemm", ROLE_O
    elif (
        region == "mlp_out"
        and not norm_seen
        and mem.after_down
        and block_follows(ahead, k)
        and (ahead.follow[k] in ATTENTION or right_after)
    ):
        if ahead.norm_ahead[k] and right_after:
            # right after the down projection, nothing between, and a norm before the attention (or
            # the forward's end): it projects the block's output (Zamba's shared block's output
            # linear, RWKV's receptance), the next layer opens after it
            role, rid = "gemm", BLOCK_OUTPUT_PROJECTION
        else:
            # right after an MLP's down projection, no norm between: a post-norm layer's QKV
            role, region, layer_no, rid = "qkv_gemm", "attn_in", layer_no + 1, ROLE_POST_NORM_QKV
    else:
        role, region, layer_no, rid = _by_position(
            ks, ahead, k, region, layer_no, norm_seen, fresh, mem, gemm_kn
        )
    if rid in (NO_MLP, DOWN_BY_SHAPE, MLP_SUB_NORM):
        ks.count(rid, b - p + 1)  # shape roles may restate the stage: the rule still decided
    mem.remember(k, role, rid, rows[p])
    return role, rid, region, layer_no


def _by_position(
    ks: KernelSequence,
    ahead: _Ahead,
    k: int,
    region: str,
    layer_no: int,
    norm_seen: bool,
    fresh: bool,
    mem: _Memory,
    gemm_kn: GemmShapes | None,
) -> tuple[str, str, int, int]:
    """(role, new region, layer number, deciding rule's code) of GEMM op ``k`` from where the walk
    is and what comes next (:func:`_role`), but for the up projection before an MLP's inner norm."""
    p, b = int(ahead.op_first[k]), int(ahead.op_last[k])
    if (
        region == "moe_experts"
        and not norm_seen
        and k
        and ahead.gemm_ahead[k]
        and after_combine(ks, int(ahead.op_last[k - 1]) + 1, p)
    ):
        # the experts' outputs were put back in token order and no tokens were gathered since,
        # another GEMM follows: a dense MLP after the expert block (LongCat-Flash's), not the next
        # expert nor a shared expert's gate (STR074)
        return "gate_up_gemm", "mlp_in", layer_no, MLP_AFTER_EXPERTS
    if mem.gate_next == k:  # the norm gate's second GEMM (STR075)
        return "down_gemm", region, layer_no, NORM_GATE
    tail = norm_gate(ks, ahead, k, gemm_kn) if norm_seen else None
    if tail is not None:
        # right after a norm, a low-rank MLP whose output gates the normed input through a sigmoid:
        # the norm's gate (AXK2's gated RMSNorm), not the layer's projections (STR075)
        mem.gate_next = k + 1
        mem.gate_tails.append((p, tail))
        return "gate_up_gemm", region, layer_no, NORM_GATE
    if mem.side_next == k:  # the side block's second GEMM (STR070)
        return "gemm", region, layer_no, SIDE_BLOCK
    if region == "mlp_out" and norm_seen and side_block(ks, ahead, k):
        # after the MLP and a norm, a GEMM, an activation and a GEMM, a norm before the attention:
        # a side block of this layer (Gemma 4's per-layer input), not the next layer's QKV (STR070)
        mem.side_next = k + 1
        return "gemm", region, layer_no, SIDE_BLOCK
    opens = fresh and not ahead.rotary_next[k]
    role, new_region, layer_no, rid = _role(
        region,
        ahead.follow[k],
        ahead.gemm_ahead[k],
        norm_seen,
        layer_no,
        ahead.lead[k] in _ROUTING_LEADS,
        opens,
        ahead.norm_ahead[k],
        mem.after_mixer,
    )
    if (
        role == "down_gemm"
        and region == "mlp_in"
        and _same_shape(gemm_kn, ks.rows[p], mem.gate_up_row)
        and _norm_then_gemm(ks, ahead.gemm, b + 1)
    ):
        # the gate projection's own K and N, a norm and then a GEMM next: the up projection before
        # an MLP's inner norm (STR066)
        role, new_region, rid = "gate_up_gemm", "mlp_in", MLP_SUB_NORM
    if role == "lm_head_gemm" and narrowing(gemm_kn, ks.rows[p], ks.th):
        # far fewer outputs than inputs, whatever follows: no vocabulary (a mixing of the hidden
        # state into a few values, DeepSeek-V4's hyper-connections; its hash router's scores before
        # the experts), the walk stays where it was (STR069)
        role, new_region, rid = "gemm", region, NARROW_HEAD
    at = ahead.anchor_at[k]
    if role == "lm_head_gemm" and at < ks.n and ahead.boundary[at]:
        rid = HOST_INPUTS
    if opens and role == "qkv_gemm":
        mem.opened.append(k)
    return role, new_region, layer_no, rid


def _take_back(decided: tuple[np.ndarray, np.ndarray], ahead: _Ahead, k: int, role: str, rid: int) -> int:
    """GEMM op ``k``'s kernels the walk gave ``role`` take the role-free ``gemm``, decided by rule
    ``rid`` (a later GEMM showed what they were); returns how many."""
    done = 0
    for q in range(int(ahead.op_first[k]), int(ahead.op_last[k]) + 1):
        if decided[0][q] == _ROLE_INDEX[role]:
            decided[0][q] = _ROLE_INDEX["gemm"]
            decided[1][q] = rid
            done += 1
    return done


def _fix_ups(ks: KernelSequence, region_of: list[str], runs: Callable[[str], bool]) -> list[int]:
    """Around the first layer and the LM head: sampling ops before the layers, the embedding's scale,
    position ids, an ``aten::neg`` after the LM head. Returns the positions they looked at (none
    relabels another's; stages the walk itself sets are GEMM roles and moe_topk: only these
    candidates need a look)."""
    rows, stage = ks.rows, ks.stage
    marked = ("sampling", "embedding", "rope")
    marks = [q for q in np.flatnonzero(ks.stages(marked)).tolist() if stage[rows[q]] in marked]
    ops = ks.op_names
    steps: tuple[tuple[str, Callable[[Decisions], None]], ...] = (  # in the registry's order
        (
            "pre-layer-sampling",
            lambda d: _demote_sampling_before_layers(rows, d.stage, region_of, marks, d.why),
        ),
        ("embedding-scale", lambda d: _label_embedding_scale(rows, d.stage, ops, marks, d.why)),
        ("position-ids", lambda d: _label_position_ids(rows, d.stage, ops, marks, d.why)),
        ("tail-neg", lambda d: _tail_neg(rows, d.stage, region_of, marks, d.why)),
    )
    for rule, step in steps:
        if not runs(rule):
            continue
        d = ks.decide()
        step(d)
        ks.apply(d)
    return marks


def _tail_neg(rows: list[int], stage: Any, region_of: list[str], marks: list[int], why: Any) -> None:
    """An ``aten::neg`` after the LM head (logits processing) is no RoPE (STR022)."""
    for q in marks:
        if stage[rows[q]] == "rope" and region_of[q] == "tail":
            stage[rows[q]] = "sampling"
            why[rows[q]] = TAIL_NEG


def _label_regions(
    ks: KernelSequence,
    region_of: list[str],
    layer_of: list[int],
    op_first: np.ndarray,
    marks: list[int],
    kv: bool = True,
    keep: Sequence[int] = (),
    suspect: list[int] | None = None,
    gates: np.ndarray | None = None,
) -> None:
    """The region defaults for the generic kernels (but those at the positions ``keep``: a rule's
    own, STR057), with the model's learned norm shape (read before a norm's gate, ``gates`` per
    position: STR075); the q / k norms inside the attention input; the prologue of the next layer
    moved to it."""
    rows, stage, n = ks.rows, ks.stage, ks.n
    was_generic = ks.stages(GENERIC)
    # where each run of QKV GEMMs begins (a run begins where a GEMM op does); the labelling below
    # changes no QKV role, so the norm shapes and the prologue shift read the same positions
    qkv_starts = [
        q
        for q in op_first.tolist()
        if stage[rows[q]] == "qkv_gemm" and (q == 0 or stage[rows[q - 1]] != "qkv_gemm")
    ]
    # a quantized linear's input quantization (STR049, STR053) sits between the norm and its GEMM,
    # and so may a mixer's own input work (its padding mask, STR052) and a residual's cast to fp32:
    # the norm's shape is read up to the first of them
    span = codes_at(ks.why, ks.seq) == MIXER_SPAN
    gemm_inputs = []
    for q in qkv_starts:
        while q > 0 and (
            stage[rows[q - 1]] == "quantize"
            or before_norm_tail(ks, q - 1, span)
            or (gates is not None and gates[q - 1])
        ):
            q -= 1
        gemm_inputs.append(q)
    shape = _norm_shape(rows, ks.names, ks.op_names, ks.normish, was_generic, gemm_inputs, ks.th, stage)
    regions = {r: i for i, r in enumerate(dict.fromkeys(region_of))}
    region_code = np.fromiter(map(regions.__getitem__, region_of), np.int32, n)
    # the generic kernels now: the fix-ups made generic kernels of marked ones only (and took
    # some generic ones: an embedding's scale)
    candidates = was_generic.copy()
    candidates[marks] = True
    candidates[list(keep)] = False  # a sparse attention's key selection (STR057): not the region's
    # a mixer span's own generic kernels (STR052): not the region's
    candidates &= ~span
    candidates[expert_block_writes(ks, region_of)] = True
    generic_at = _positions_where(np.flatnonzero(candidates), rows, stage, GENERIC)
    for d in _label_generic(
        ks.seq, ks.decide, ks.op_names, region_of, region_code, generic_at, ks.names, ks.normish, shape,
        ks.th, rows, kv, ks.inputs, ks.copies,
    ):  # fmt: skip
        ks.apply(d)
    attn_in = region_code == regions["attn_in"] if "attn_in" in regions else np.zeros(n, bool)
    if suspect is not None:  # an activation in an attention input has no place there (STR058)
        suspect.extend(rows[q] for q in np.flatnonzero(attn_in & ks.stages(("activation",))).tolist())
    d = ks.decide()
    _label_inner_norms(
        rows, d.stage, attn_in, ks.normish, was_generic, shape, ks.names, d.why, ks.th, ks.op_names
    )
    ks.apply(d)
    ks.count(PROLOGUE_SHIFT, _shift_prologue_to_next_layer(rows, stage, layer_of, qkv_starts, gates))


def _positions_where(at: np.ndarray, rows: Sequence[int], stage: list[str], stages: Any) -> np.ndarray:
    """The positions of ``at`` whose kernel's stage is in ``stages``, as an array: read a block of
    positions at a time, so that millions of them are never Python ints all at once."""
    keep = np.zeros(len(at), bool)
    for s in range(0, len(at), _BLOCK):
        keep[s : s + _BLOCK] = [stage[rows[q]] in stages for q in at[s : s + _BLOCK].tolist()]
    return at[keep]


_BLOCK = 1 << 16
