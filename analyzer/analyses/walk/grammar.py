"""The engine-neutral grammar of a decoder forward: one pass along a device's kernels in time order
that gives every GEMM op its role from the region it is in and what comes next (:func:`_role`),
numbers the layers and hands the generic kernels to the region defaults.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

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
from analyzer.analyses.walk.moe import _mark_routers
from analyzer.analyses.walk.positions import _gemm_ops, _next_where, _norm_like
from analyzer.analyses.walk.regions import _label_generic
from analyzer.analyses.walk.registry import (
    _ADD_OPS,
    _ID,
    _V,
    ATTENTION,
    DEFAULT_THRESHOLDS,
    GEMM_STAGES,
    GENERIC,
    LONE_POW,
    MOE_ROUTER,
    OUTPUT_ROWS,
    ROLE_DOWN,
    ROLE_EXPERT,
    ROLE_GATE_UP,
    ROLE_LM_HEAD,
    ROLE_MOE_GATE,
    ROLE_NONE,
    ROLE_O,
    ROLE_POST_NORM_QKV,
    ROLE_QKV,
    ROLE_QKV_MORE,
    SAMPLING_LIKE,
)
from analyzer.knowledge.structure_rules import Thresholds
from analyzer.tables.positions import row_sequence

SECOND_HEAD = _ID("second-head")


NO_MLP = _ID("block-without-mlp")


DOWN_BY_SHAPE = _ID("down-by-shape")


MIXER_SPAN = _ID("mixer-span")  # a mixer's projections, labelled before the walk (analyses/mixers.py)


MOE_SAMPLING_TOPK = _ID("moe-sampling-topk")


TAIL_NEG = _ID("tail-neg")


HOST_INPUTS = _ID("host-input-boundary")


PROLOGUE_SHIFT = _ID("prologue-shift")


_MOE_ROUTING = _V("moe_routing_stages")


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
    gemm_kn: Callable[[int], tuple[int, int] | None] | None = None,
) -> None:
    """Assign GEMM roles, layers and region stages along one device's time-ordered kernels.
    ``topk_rows`` / ``pow_rows`` / ``reduce_rows`` (per kernel row): :func:`topk_candidates`,
    launched by ``aten::pow``, :func:`reduction_rows`. ``why`` (per kernel row): the id of the rule
    that set the stage, updated for every kernel a rule here relabels; ``th``: the thresholds;
    ``fired``: rule code -> kernels, counted for the rules whose decision the stage column does not
    show (layers only, or a stage a later rule replaces); ``gemm_kn`` (optional): kernel row -> its
    GEMM op's (K, N), read on demand for the few GEMMs whose role needs it.

    Regions of a decoder layer: ``attn_in`` (after the input norm: QKV GEMMs, RoPE, KV store),
    ``attn`` (attention), ``attn_out`` (after the O GEMM: residual add, post-attention norm),
    ``mlp_in`` (between gate/up GEMMs and the down GEMM: activation), ``mlp_out`` (after the down
    GEMM: residual add, next input norm), ``moe`` / ``moe_experts`` (routing, expert GEMMs), ``tail``
    (after the LM head: sampling). A GEMM's role follows from its region and what comes next.
    """
    why = defaultdict(int) if why is None else why  # (read for the marks of the passes before)
    rows = row_sequence(seq)
    n = len(rows)
    demoted = _demote_lone_pow(rows, stage, pow_rows[seq], reduce_rows[seq], why)
    if fired is not None and demoted:
        fired[LONE_POW] += demoted  # the region labels them next: the final stage names that rule
    st = list(map(stage.__getitem__, rows))
    # norm-like: a norm stage, or a name with a norm's word (tested once per distinct name; no
    # per-kernel tuples: millions of them would dominate the memory of a 10 GB trace)
    names = list(map(norm.__getitem__, rows))
    by_name = {x: _norm_like("", x) for x in set(names)}
    normish = np.fromiter(map(by_name.__getitem__, names), bool, n)
    del names
    kinds = {s: i for i, s in enumerate(dict.fromkeys(st))}
    code = np.fromiter(map(kinds.__getitem__, st), np.int32, n)

    def stages(*sets: Any) -> np.ndarray:
        """Per position: its stage (as ``st`` holds it) is in one of ``sets``."""
        return np.array([any(s in x for x in sets) for s in kinds], bool)[code]

    normish |= stages(("norm",))

    gemm = stages(GEMM_STAGES)
    op_first, op_last = _gemm_ops(seq, gemm, norm, launch)
    gathers = _demote_output_row_gathers(
        rows, stage, stages(("embedding",)), stages(ATTENTION), op_first, normish, why
    )
    if gathers:
        if fired is not None:  # the region labels them next: the final stage names that rule
            fired[OUTPUT_ROWS] += gathers
        st = list(map(stage.__getitem__, rows))
        kinds = {s: i for i, s in enumerate(dict.fromkeys(st))}
        code = np.fromiter(map(kinds.__getitem__, st), np.int32, n)
    hard = normish | stages(ATTENTION, ("embedding",))
    if _mark_routers(
        rows,
        st,
        stage,
        norm,
        op_names,
        (op_first, op_last),
        hard,
        stages(("moe_expert_gemm",)),
        topk_rows,
        why,
    ):
        st = list(map(stage.__getitem__, rows))
        kinds = {s: i for i, s in enumerate(dict.fromkeys(st))}
        code = np.fromiter(map(kinds.__getitem__, st), np.int32, n)
    blocker = normish | stages(ATTENTION, _MOE_ROUTING, ("embedding",))
    router = stages(("moe_gate_gemm",))
    boundary = _host_input_boundaries(stages(("memcpy", "memset")), stages(("embedding",)), op_last, normish)
    anchor = stages(ATTENTION, SAMPLING_LIKE, ("embedding", "moe_sort", "moe_expert_gemm")) | boundary
    # what follows each GEMM op, seen from the position after it: the next anchor kernel; the next
    # anchor or GEMM ("gemm" for a GEMM); whether a GEMM comes before the next norm / attention /
    # routing / embedding kernel
    after = op_last + 1
    at = _next_where(anchor, after).tolist()
    # a host-input boundary ends the forward as the next forward's lookup would
    follow = [("embedding" if boundary[q] else st[q]) if q < n else "" for q in at]
    anchor_at = at  # per GEMM op: the position of the next anchor kernel after it
    next_anchor_or_gemm = _next_where(anchor | gemm, after)
    at = next_anchor_or_gemm.tolist()
    lead = [("gemm" if not anchor[q] else "embedding" if boundary[q] else st[q]) if q < n else "" for q in at]
    # a router GEMM ends the MLP before it (Qwen2-MoE runs its shared expert first)
    at = _next_where(gemm | blocker | router, after).tolist()
    gemm_ahead = [q < n and bool(gemm[q]) and not router[q] for q in at]
    # a norm before the next anchor: a block follows this GEMM (the MLP), not the anchor's projections
    norm_ahead = (_next_where(normish, after) < np.asarray(anchor_at)).tolist()
    # a RoPE-named kernel (the rotary module's cos / sin) right after a GEMM op, before the next
    # GEMM or anchor: the GEMM is the rotary module's frequency product, not a projection
    rotary_next = (_next_where(stages(("rope",)), after) < next_anchor_or_gemm).tolist()
    op_index = np.full(n + 1, -1, np.int64)  # position -> the GEMM op starting there
    op_index[op_first] = np.arange(len(op_first))
    # only these positions change the walk's state; the runs between them take the region as it is
    events = np.zeros(n, bool)
    events[op_first] = True
    events |= (
        normish | boundary | stages(ATTENTION, _MOE_ROUTING, ("embedding", "sampling", "moe_expert_gemm"))
    )
    region = "pre"
    layer_no = -1
    norm_seen = False
    fresh = False  # no GEMM op since an embedding lookup (a trace may begin mid-forward)
    after_mixer = False  # the last GEMM op was a token mixer's output projection
    after_down = False  # the last GEMM op was an MLP's down projection
    gate_up_row = -1  # the kernel row of this MLP's last gate / up projection
    last_head = -1  # the GEMM op that took the LM head's role, if it was the last GEMM op
    opened: list[int] = []  # GEMM ops that opened a forward as its first projection
    region_of = [""] * n
    layer_of = [-1] * n  # lists: numpy item assignment per kernel is slower
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
        k = int(op_index[p])
        if k >= 0:
            b = int(op_last[k])
            if router[p]:  # found by _mark_routers
                role, region, rid = "moe_gate_gemm", "moe", MOE_ROUTER
            elif why[rows[p]] == MIXER_SPAN:
                # a token mixer's projection (STR052, before the walk): its input projections open a
                # layer as QKV GEMMs do, its output projection ends the mixer as an O GEMM does
                role, rid = st[p], MIXER_SPAN
                after_mixer = role == "o_gemm"
                if role == "o_gemm":
                    region = "attn_out"
                elif region not in ("attn_in", "attn"):
                    region, layer_no = "attn_in", layer_no + 1
            elif region == "tail" and last_head == k - 1 and anchor_at[k - 1] > p:
                # two GEMMs after the final norm with nothing between: an output projection, then
                # the LM head (OPT-350m's project_out): the last one is the head
                for q in range(int(op_first[k - 1]), int(op_last[k - 1]) + 1):
                    if stage[rows[q]] == "lm_head_gemm":
                        stage[rows[q]] = "gemm"
                        why[rows[q]] = SECOND_HEAD
                role, rid = "lm_head_gemm", SECOND_HEAD
            elif (
                region == "mlp_in"
                and gemm_ahead[k]
                and _add_before_gemm(rows, b + 1, gemm, op_names)
                and _reads_gate_up(gemm_kn, rows[p], gate_up_row)
            ):
                # a GEMM reading the gate / up projections' output is the down projection, whatever
                # follows it (a post-norm layer's q_proj before its q_norm)
                role, region, rid = "down_gemm", "mlp_out", DOWN_BY_SHAPE
            elif region == "mlp_out" and not norm_seen and after_down and follow[k] in ATTENTION:
                # right after an MLP's down projection, no norm between: a post-norm layer's QKV
                role, region, layer_no, rid = "qkv_gemm", "attn_in", layer_no + 1, ROLE_POST_NORM_QKV
            else:
                routing_next = lead[k] in ("moe_topk", "moe_sort", "sampling", "moe_expert_gemm")
                opens = fresh and not rotary_next[k]
                role, region, layer_no, rid = _role(
                    region,
                    follow[k],
                    gemm_ahead[k],
                    norm_seen,
                    layer_no,
                    routing_next,
                    opens,
                    norm_ahead[k],
                    after_mixer,
                )
                if role == "lm_head_gemm" and anchor_at[k] < n and boundary[anchor_at[k]]:
                    rid = HOST_INPUTS
                if opens and role == "qkv_gemm":
                    opened.append(k)
            if fired is not None and rid in (NO_MLP, DOWN_BY_SHAPE):
                fired[rid] += b - p + 1  # shape roles may restate the stage: the rule still decided
            if rid != MIXER_SPAN:
                after_mixer = False
            after_down = role == "down_gemm"
            if role == "gate_up_gemm":
                gate_up_row = rows[p]
            last_head = k if role == "lm_head_gemm" else -1
            fresh = fresh and bool(rotary_next[k])  # the rotary module's product opens nothing
            norm_seen = False
            for q in range(p, b + 1):
                if stage[rows[q]] in GEMM_STAGES:
                    stage[rows[q]] = role
                    why[rows[q]] = rid
                region_of[q] = region
                layer_of[q] = -1 if region in ("pre", "tail") else layer_no
            p = b + 1
            continue
        if s == "embedding" or boundary[p]:
            region, layer_no, norm_seen, fresh = "pre", -1, False, True
        elif s in ATTENTION:
            region, norm_seen = "attn", False
        elif s in _MOE_ROUTING and region in ("attn_out", "mlp_in", "moe"):
            region = "moe"
        elif s == "sampling" and region == "moe":
            stage[rows[p]] = "moe_topk"
            why[rows[p]] = MOE_SAMPLING_TOPK
        elif s == "moe_expert_gemm":
            region = "moe_experts"
        elif normish[p]:
            norm_seen = True
        region_of[p] = region
        layer_of[p] = -1 if region in ("pre", "tail") else layer_no
        p += 1
    _demote_embedding_projection(rows, stage, region_of, layer_of, op_first, op_last, opened, why)
    # one pass finds the positions the three fix-ups below look at (none relabels another's)
    # (stages the walk itself sets are GEMM roles and moe_topk: only the candidates need a look)
    marked = ("sampling", "embedding", "rope")
    marks = [q for q in np.flatnonzero(stages(marked)).tolist() if stage[rows[q]] in marked]
    _demote_sampling_before_layers(rows, stage, region_of, marks, why)
    _label_embedding_scale(rows, stage, op_names, marks, why)
    _label_position_ids(rows, stage, op_names, marks, why)
    for q in marks:
        if stage[rows[q]] == "rope" and region_of[q] == "tail":
            stage[rows[q]] = "sampling"  # an aten::neg after the LM head (logits processing) is no RoPE
            why[rows[q]] = TAIL_NEG
    was_generic = stages(GENERIC)
    # where each run of QKV GEMMs begins (a run begins where a GEMM op does); the labelling below
    # changes no QKV role, so the norm shapes and the prologue shift read the same positions
    qkv_starts = [
        q
        for q in op_first.tolist()
        if stage[rows[q]] == "qkv_gemm" and (q == 0 or stage[rows[q - 1]] != "qkv_gemm")
    ]
    # a quantized linear's input quantization (STR049, STR053) sits between the norm and its GEMM:
    # the norm's shape is read up to the quantization's first kernel
    gemm_inputs = []
    for q in qkv_starts:
        while q > 0 and stage[rows[q - 1]] == "quantize":
            q -= 1
        gemm_inputs.append(q)
    shape = _norm_shape(rows, norm, op_names, normish, was_generic, gemm_inputs, th)
    regions = {r: i for i, r in enumerate(dict.fromkeys(region_of))}
    region_code = np.fromiter(map(regions.__getitem__, region_of), np.int32, n)
    # the generic kernels now: the fix-ups made generic kernels of marked ones only (and took
    # some generic ones: an embedding's scale)
    candidates = was_generic.copy()
    candidates[marks] = True
    generic_at = [q for q in np.flatnonzero(candidates).tolist() if stage[rows[q]] in GENERIC]
    _label_generic(
        seq, stage, op_names, region_of, region_code, generic_at, norm, normish, shape, why, th, rows=rows
    )
    attn_in = region_code == regions["attn_in"] if "attn_in" in regions else np.zeros(n, bool)
    _label_inner_norms(rows, stage, attn_in, normish, was_generic, shape, norm, why, th, op_names)
    moved = _shift_prologue_to_next_layer(rows, stage, layer_of, qkv_starts)
    if fired is not None and moved:
        fired[PROLOGUE_SHIFT] += moved
    layer[seq] = layer_of


def _role(
    region: str,
    follow: str,
    gemm_ahead: bool,
    norm_seen: bool,
    layer_no: int,
    routing_next: bool = False,
    opens_forward: bool = False,
    norm_ahead: bool = True,
    after_mixer: bool = False,
) -> tuple[str, str, int, str]:
    """(role, new region, layer number, the deciding rule's id) of a GEMM from where we are and
    what comes next. ``opens_forward``: the first GEMM op after an embedding lookup, no RoPE kernel
    right after it."""
    if region == "attn":
        return "o_gemm", "attn_out", layer_no, ROLE_O
    if region == "attn_in":
        return "qkv_gemm", "attn_in", layer_no, ROLE_QKV_MORE
    if region in ("attn_out", "mlp_in"):
        # a norm, then GEMMs that reach the next anchor with no norm between: this layer has no MLP
        # (a token mixer's block); the GEMMs are the next layer's projections or the LM head
        no_mlp = region == "attn_out" and norm_seen and not norm_ahead
        if no_mlp and after_mixer and not gemm_ahead and follow in ("sampling", "embedding", ""):
            return "lm_head_gemm", "tail", layer_no, NO_MLP
        if region == "attn_out" and routing_next:
            return "moe_gate_gemm", "moe", layer_no, ROLE_MOE_GATE
        if no_mlp and follow in ATTENTION:
            return "qkv_gemm", "attn_in", layer_no + 1, NO_MLP
        if gemm_ahead:
            return "gate_up_gemm", "mlp_in", layer_no, ROLE_GATE_UP
        return "down_gemm", "mlp_out", layer_no, ROLE_DOWN
    if region == "moe":
        return "moe_expert_gemm", "moe_experts", layer_no, ROLE_EXPERT
    if region == "moe_experts" and not norm_seen:
        return "moe_expert_gemm", "moe_experts", layer_no, ROLE_EXPERT
    # pre, mlp_out, moe_experts (after a norm), tail
    if norm_seen and follow in ATTENTION:
        return "qkv_gemm", "attn_in", layer_no + 1, ROLE_QKV
    if norm_seen and follow in ("sampling", "embedding", ""):
        return "lm_head_gemm", "tail", layer_no, ROLE_LM_HEAD
    if region == "pre" and follow in ATTENTION and opens_forward:
        # the first projection of a post-norm block (OLMo-2: no norm before layer 0's q_proj)
        return "qkv_gemm", "attn_in", layer_no + 1, ROLE_POST_NORM_QKV
    return "gemm", region, layer_no, ROLE_NONE


def _add_before_gemm(rows: list[int], q: int, gemm: np.ndarray, op_names: Sequence[str | None]) -> bool:
    """Whether, from position ``q`` up to the next GEMM, an add op runs or nothing does: a block ends
    there (a residual add, or a projection of the block's output). Between an MLP's gate / up and its
    down projection its activation runs."""
    if q < len(rows) and gemm[q]:
        return True
    while q < len(rows) and not gemm[q]:
        if op_names[rows[q]] in _ADD_OPS:
            return True
        q += 1
    return False


def _reads_gate_up(
    gemm_kn: Callable[[int], tuple[int, int] | None] | None,
    r: int,
    gate_up_row: int,
) -> bool:
    """Whether the GEMM op at kernel row ``r`` reads what the MLP's gate / up projection (at kernel
    row ``gate_up_row``) wrote: its K is that projection's N (half of it for a fused gate and up),
    and differs from that projection's K (a square MLP cannot tell)."""
    if gemm_kn is None or gate_up_row < 0:
        return False
    kn, gate_up = gemm_kn(r), gemm_kn(gate_up_row)
    if kn is None or gate_up is None:
        return False
    k, n = gate_up
    return kn is not None and kn[0] != k and kn[0] in (n, n // 2)
