"""Per-layer structure: GEMM roles, decoder-layer numbers and region stages along each device's kernels.

Contract (pure over lists and arrays that :mod:`analyzer.analyses.classify` hands in):

* :func:`walk_sequence` takes one device's kernels in time order (their stages after the rule table
  and the op hints) and, in one pass, gives every GEMM its role (``qkv_gemm`` ... ``lm_head_gemm``,
  ``moe_gate_gemm``, expert GEMMs; :func:`_role` decides from the region it is in and what follows),
  numbers the decoder layers (``layer``; -1 before the first layer and after the LM head) and gives the
  generic kernels between the anchors the stage of the region they sit in. Without host ops (CUDA-graph
  replay, rocprof, nsys) it still works: shapes are never required.
* :func:`gemm_roles_from_shapes` derives the roles independently from recorded host-op input shapes and
  the model's layer dimensions (None where shapes cannot tell); tests check both agree.
"""

from __future__ import annotations

import array
import bisect
import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.knowledge.structure_rules import Thresholds, load_structure
from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES, DENSE_GEMM_STAGES
from analyzer.knowledge.work_ops import load_work_ops
from analyzer.tables.dictionaries import dict_isin, dict_where
from analyzer.tables.launches import launching_op_rows
from analyzer.tables.positions import row_array, row_sequence

# The stages the walk reads (sets for fast membership; derived from rules/taxonomy.toml):
GEMM_STAGES = frozenset(DENSE_GEMM_STAGES)  # a GEMM the walk gives a role (moe_expert_gemm keeps its own)
ATTENTION = frozenset(ATTENTION_KERNEL_STAGES)  # attention kernels: the anchor of a layer's sequence
# The registry (rules/structure.toml): the rules' ids, the vocabularies and the default thresholds
KNOWLEDGE = load_structure()
_V = KNOWLEDGE.set_of
WORK_OPS = load_work_ops()  # the GEMM layouts (rules/work_ops.toml): read once, as the registry
DEFAULT_THRESHOLDS: Thresholds = KNOWLEDGE.thresholds
# kernels whose stage the structure may refine: generic framework kernels only
GENERIC = _V("generic_stages")  # a bare ATen add is only a guess
SAMPLING_LIKE = _V("sampling_like_stages")  # a top-k after the LM head or in a MoE router


# --------------------------------------------------------------------------- the walk


# --------------------------------------------------------------------------- attention by composition

COMPOSED_ATTENTION = "flash_attention"  # the attention category's general stage (fused or not)
_SOFTMAX_OPS = _V("softmax_ops")
# ops that end the stretch of work before a composed attention: the KV-cache write (and a paged
# cache's gathers of it), RoPE's final add
_BEFORE_ATTENTION_STOP = _V("attention_front_stop_ops")
_KV_WRITE_WORDS = KNOWLEDGE.words("kv_write_words")
_SOFTMAX_WORDS = KNOWLEDGE.words("softmax_words")
_ADD_OPS = _V("add_ops")
_COPY_OPS = _V("copy_ops")
_COPY_WORDS = KNOWLEDGE.words("copy_words")


# generic work inside a composed attention; activation: the tanh of Gemma-2's logit softcapping
_COMPOSED_PARTS = _V("composed_attention_parts")

# the rules of this module, by the names the registry gives them: each constant is the rule's code
# (its position in the registry), what the walk records per kernel in ``why``
_ID = KNOWLEDGE.code_of
COMPOSED = _ID("composed-attention")
LONE_POW = _ID("lone-pow")
MOE_ROUTER = _ID("moe-router")
ROLE_O = _ID("role-o")
ROLE_QKV = _ID("role-qkv")
ROLE_QKV_MORE = _ID("role-qkv-more")
ROLE_POST_NORM_QKV = _ID("role-post-norm-qkv")
ROLE_MOE_GATE = _ID("role-moe-gate")
ROLE_GATE_UP = _ID("role-gate-up")
ROLE_DOWN = _ID("role-down")
ROLE_EXPERT = _ID("role-expert")
ROLE_LM_HEAD = _ID("role-lm-head")
SECOND_HEAD = _ID("second-head")
ROLE_NONE = _ID("role-none")
NO_MLP = _ID("block-without-mlp")
DOWN_BY_SHAPE = _ID("down-by-shape")
MIXER_SPAN = _ID("mixer-span")  # a mixer's projections, labelled before the walk (analyses/mixers.py)
MOE_SAMPLING_TOPK = _ID("moe-sampling-topk")
EMBEDDING_PROJECTION = _ID("embedding-projection")
PRE_LAYER_SAMPLING = _ID("pre-layer-sampling")
EMBEDDING_SCALE = _ID("embedding-scale")
POSITION_IDS = _ID("position-ids")
TAIL_NEG = _ID("tail-neg")
FIRST_NORM = _ID("first-norm")
ROTARY_MODULE = _ID("rotary-module")
MOE_BLOCK = _ID("moe-block")
MOE_SHARED_GATE = _ID("moe-shared-gate")
MOE_GLU_PRODUCT = _ID("moe-glu-product")
SANDWICH_NORM = _ID("sandwich-norm")
ROUTER_CAST = _ID("router-cast")
RESIDUAL_ADD = _ID("residual-add")
KV_UPDATE = _ID("kv-update")
KV_UPDATE_BEFORE_GEMM = _ID("kv-update-before-gemm")
KV_UPDATE_BY_NAME = _ID("kv-update-by-name")
ATTENTION_INPUT_COPIES = _ID("attention-input-copies")
INNER_NORMS = _ID("inner-norms")
QK_NORM_INPUT = _ID("qk-norm-input-copy")
OUTPUT_ROWS = _ID("output-row-gather")
ACTIVATION_QUANTIZE = _ID("activation-quantize")
_QUANT_GEMM_OPS = frozenset(_V("quantized_gemm_ops"))
_QUANT_START_OPS = frozenset(_V("quantize_start_ops"))
_QUANT_CHAIN_OPS = frozenset(_V("quantize_chain_ops"))
_QUANT_PARTS = frozenset(_V("quantize_parts"))
HOST_INPUTS = _ID("host-input-boundary")
PROLOGUE_SHIFT = _ID("prologue-shift")
SELF_CHECK = _ID("structure-self-check")
# the region defaults: region -> (stage, rule id)
_REGION_RULE = {
    reg: _ID(f"region-{reg.replace('_', '-')}")
    for reg in ("attn_in", "attn", "attn_out", "mlp_in", "mlp_out", "moe", "tail")
}
REGION_RULE_CODES = frozenset(_REGION_RULE.values())  # the codes of a decision by position only


def _is_softmax(stage: str, name: str) -> bool:
    return (
        stage in ("sampling", "elementwise")
        and any(w in name.lower() for w in _SOFTMAX_WORDS)
        and "backward" not in name
    )


def mark_activation_quantize(
    seq: np.ndarray, stage: list[str], op_names: list[str | None], launch: np.ndarray, why: Any
) -> int:
    """STR049: right before a quantized GEMM op (``quantized_gemm_ops``: FP8 ``_scaled_mm``, int8
    ``_int_mm`` ...), the generic kernels of its input's quantization (launched by
    ``quantize_chain_ops``: absolute max, scale, clamp, cast) from the first absolute-max / max op
    on (``quantize_start_ops``) are ``quantize``, not the region they sit in. Without such a start
    (no absolute max: a cast alone) nothing changes. Returns the kernels relabelled."""
    rows = seq.tolist()
    done = 0
    for p, r in enumerate(rows):
        if op_names[r] not in _QUANT_GEMM_OPS or (p and launch[rows[p - 1]] == launch[r]):
            continue  # not the first kernel of a quantized GEMM op
        q = p - 1
        start = -1
        while q >= 0 and op_names[rows[q]] in _QUANT_CHAIN_OPS and stage[rows[q]] in _QUANT_PARTS:
            if op_names[rows[q]] in _QUANT_START_OPS:
                start = q
            q -= 1
        for k in range(start, p) if start >= 0 else ():
            stage[rows[k]] = "quantize"
            why[rows[k]] = ACTIVATION_QUANTIZE
            done += 1
    return done


def compose_attention(
    seq: np.ndarray,
    stage: list[str],
    norm: list[str],
    op_names: Sequence[str | None],
    launch: np.ndarray,
    softmax: np.ndarray | None = None,
    why: Any = None,
) -> int:
    """Attention that the framework composes from GEMMs and generic kernels is attention.

    HF eager attention and the math SDPA backend run ``matmul(q, k^T)`` -> scale / mask add ->
    softmax -> (dropout) -> ``matmul(p, v)``: a softmax between two GEMM ops with only generic
    kernels in between. That stretch, the generic work before it back to the KV-cache write (repeat_kv
    copies, the math backend's scaling and causal mask) and the copies after it up to the next GEMM
    (the output transpose) take the attention stage; its GEMMs are never projections. A softmax after
    the LM head (no GEMM follows before a norm or an embedding) stays the sampler's. Returns how many
    attentions were found.

    ``softmax`` (optional, per kernel row): the softmax kernels, found once per distinct name and op
    by the caller. Only the stretches around them are looked at, so a trace without composed
    attention costs one pass over those rows. ``why`` (per kernel row, optional): the id of the rule
    that set each kernel's stage, kept up to date here (as in every relabelling below).
    """
    why = {} if why is None else why
    rows = seq.tolist()
    n = len(rows)
    if softmax is None:
        softmax = np.zeros(max(rows, default=-1) + 1, bool)
        for r in rows:
            softmax[r] = _is_softmax(stage[r], norm[r]) or op_names[r] in _SOFTMAX_OPS
    soft = np.flatnonzero(softmax[seq]).tolist()
    if not soft:
        return 0
    memo: dict[tuple[str, str], tuple[bool, bool, bool, bool]] = {}

    def kind(q: int) -> tuple[bool, bool, bool, bool]:
        """(GEMM, generic part, norm-like, KV-write name) of position q."""
        r = rows[q]
        key = (stage[r], norm[r])
        got = memo.get(key)
        if got is None:
            st, nm = key
            got = memo[key] = (st in GEMM_STAGES, st in _COMPOSED_PARTS, _norm_like(st, nm),
                               any(w in nm for w in _KV_WRITE_WORDS))  # fmt: skip
        return got

    def is_soft(q: int) -> bool:
        return bool(softmax[rows[q]])

    def clean(q: int) -> bool:
        g = kind(q)
        return (g[1] or is_soft(q)) and not g[2]

    def joins(q: int) -> bool:
        """Position q continues the GEMM op at q - 1 (same launching op, or a split-K reduce)."""
        lv, pv = launch[rows[q]], launch[rows[q - 1]]
        return bool(lv == pv) or _is_reduce(norm[rows[q]])

    found = 0
    done = -1
    for s in soft:
        if s <= done or not clean(s):
            continue
        a1 = s - 1  # the GEMM op before: only clean kernels between it and the softmax
        while a1 >= 0 and not kind(a1)[0] and clean(a1):
            a1 -= 1
        if a1 < 0 or not kind(a1)[0]:
            continue
        b0 = s + 1  # the GEMM op after, the same way
        while b0 < n and not kind(b0)[0] and clean(b0):
            b0 += 1
        if b0 >= n or not kind(b0)[0]:
            continue  # a norm, an embedding, a routing kernel ... first: not one attention
        a0 = a1
        while a0 - 1 >= 0 and kind(a0 - 1)[0] and joins(a0):
            a0 -= 1
        b1 = b0
        while b1 + 1 < n and kind(b1 + 1)[0] and joins(b1 + 1):
            b1 += 1
        lo, hi = a0, b1
        while lo - 1 > done and kind(lo - 1)[1] and not kind(lo - 1)[2]:
            op = op_names[rows[lo - 1]]
            if (op in _BEFORE_ATTENTION_STOP) if op is not None else kind(lo - 1)[3]:
                break
            lo -= 1
        while hi + 1 < n and clean(hi + 1) and op_names[rows[hi + 1]] not in _ADD_OPS:
            if op_names[rows[hi + 1]] is None and kind(hi + 1)[3]:
                break
            hi += 1
        for q in range(lo, hi + 1):
            if stage[rows[q]] not in ("memcpy", "memset"):
                stage[rows[q]] = COMPOSED_ATTENTION
                why[rows[q]] = COMPOSED
        done = hi
        found += 1
    return found


def softmax_rows(norm_names: Any, op_column: pa.Array, stage: list[str]) -> np.ndarray:
    """Per kernel row: a softmax kernel (by its name, once per distinct name) or one launched by a
    softmax op (``op_column``: the launching op's name per row); the candidates
    :func:`compose_attention` looks around."""
    out = dict_where(
        norm_names, lambda x: any(w in x.lower() for w in _SOFTMAX_WORDS) and "backward" not in x
    )
    for r in np.flatnonzero(out).tolist():
        out[r] = stage[r] in ("sampling", "elementwise")
    return out | dict_isin(op_column, list(_SOFTMAX_OPS))


def _gemm_ops(
    seq: np.ndarray, gemm: np.ndarray, norm: list[str], launch: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last positions in ``seq`` of each logical GEMM (two arrays): adjacent GEMM
    kernels of one launching op, or a split-K reduction right after its GEMM (``gemm``: a GEMM
    stage at each position)."""
    pos = np.flatnonzero(gemm)
    if not len(pos):
        return np.empty(0, np.int64), np.empty(0, np.int64)
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
    return pos[first], pos[last]


def _next_where(mask: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per position in ``at``: the first position >= it where ``mask`` holds (``len(mask)``: none)."""
    where = np.append(np.flatnonzero(mask), len(mask))
    return where[np.searchsorted(where[:-1], at)]


_SPLITK_REDUCE_WORDS = KNOWLEDGE.words("splitk_reduce_words")


def _is_reduce(name: str) -> bool:
    n = name.lower()
    return any(all(w in n for w in words) for words in _SPLITK_REDUCE_WORDS)


_NORM_WORDS = KNOWLEDGE.words("norm_words")
_MOE_ROUTING = _V("moe_routing_stages")


def _norm_like(stage: str, name: str) -> bool:
    return stage == "norm" or any(w in name for w in _NORM_WORDS)


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


# what follows a router's top-k and still computes the routing weights (gather, renormalise, scale)
_ROUTING_TAIL_OPS = _V("routing_tail_ops")
_ROUTING_PARTS = _V("routing_parts")
_TOPK_OPS = _V("topk_ops")
_TOPK_WORDS = KNOWLEDGE.words("topk_words")


def topk_candidates(norm: Any, op_column: pa.Array) -> np.ndarray:
    """Per kernel row: launched by ``aten::topk``, or without a launching op (``op_column``: the
    launching op's name, null: none) and named like a top-k (tested once per distinct op and
    name); :func:`_mark_routers` looks at these only."""
    out = dict_isin(op_column, list(_TOPK_OPS))
    names = norm if isinstance(norm, list) else list(norm)
    none = np.flatnonzero(op_column.is_null().to_numpy(zero_copy_only=False))
    memo: dict[str, bool] = {}
    for r in none.tolist():
        nm = names[r]
        hit = memo.get(nm)
        if hit is None:
            hit = memo[nm] = any(w in nm.lower() for w in _TOPK_WORDS)
        out[r] = hit
    return out


def _is_topk(stage: str, name: str, op: str | None) -> bool:
    """A router's ``torch.topk`` (a sort or argsort is dispatch, or sampling)."""
    if op is not None:
        return op in _TOPK_OPS
    return stage in SAMPLING_LIKE and any(w in name.lower() for w in _TOPK_WORDS)


def _mark_routers(
    rows: list[int],
    st: list[str],
    stage: list[str],
    norm: list[str],
    op_names: Sequence[str | None],
    ops: tuple[np.ndarray, np.ndarray],
    hard: np.ndarray,
    experts: np.ndarray,
    topk_rows: np.ndarray,
    why: Any,
) -> bool:
    """MoE routers: a GEMM whose output goes to a top-k that more GEMMs follow within the block.

    A router GEMM is followed, before any other GEMM, norm, attention or embedding kernel, by a
    top-k (``aten::topk`` / a top-k or sort kernel); after the top-k another GEMM (the experts) comes
    before any norm, attention or embedding kernel. The LM head's top-k sampling fails the second
    test: the next forward's embedding or input norm comes first. The router GEMM becomes
    ``moe_gate_gemm``; its softmax / sigmoid, top-k and the routing-weight arithmetic right after
    the last top-k become ``moe_topk``. Returns whether any router was found.
    """
    n = len(rows)
    topk = [q for q in np.flatnonzero(topk_rows[row_array(rows)]).tolist() if st[q] in _ROUTING_PARTS]
    topk = [q for q in topk if _is_topk(st[q], norm[rows[q]], op_names[rows[q]])]
    op_first, op_last = ops
    if not topk or not len(op_first):
        return False
    expert_at = np.flatnonzero(experts)  # expert GEMMs a rule named (fused MoE kernels)
    blocks = np.flatnonzero(hard)
    tk = np.asarray(topk, np.int64)
    # per candidate, at once: the last GEMM op before it, the next GEMM (dense or a named expert
    # GEMM) after it, and whether a norm / attention / embedding lies between that op and the next
    k = np.searchsorted(op_first, tk) - 1
    ok = k >= 0
    kk = np.maximum(k, 0)
    a_all, b_all = op_first[kk], op_last[kk]
    ok &= b_all < tk  # not inside a GEMM op
    nxt_dense = np.where(kk + 1 < len(op_first), op_first[np.minimum(kk + 1, len(op_first) - 1)], n)
    e = np.searchsorted(expert_at, tk)
    nxt_expert = expert_at[np.minimum(e, len(expert_at) - 1)] if len(expert_at) else np.full(len(tk), n)
    nxt_all = np.minimum(nxt_dense, np.where(e < len(expert_at), nxt_expert, n))
    ok &= nxt_all < n
    j = np.searchsorted(blocks, b_all + 1)
    blocked = (
        (j < len(blocks)) & (blocks[np.minimum(j, len(blocks) - 1)] < nxt_all)
        if len(blocks)
        else np.zeros(len(tk), bool)
    )
    ok &= ~blocked
    found = False
    done = -1
    for i in np.flatnonzero(ok).tolist():
        t = topk[i]
        if t <= done:
            continue
        a, b, nxt = int(a_all[i]), int(b_all[i]), int(nxt_all[i])
        if any(st[q] not in _ROUTING_PARTS and st[q] not in ("memcpy", "memset") for q in range(b + 1, t)):
            continue
        for q in range(a, b + 1):
            if st[q] in GEMM_STAGES:
                stage[rows[q]] = "moe_gate_gemm"
                why[rows[q]] = MOE_ROUTER
        last = topk[bisect.bisect_left(topk, nxt) - 1]  # the last top-k before the experts
        end = last + 1
        while end < nxt and op_names[rows[end]] in _ROUTING_TAIL_OPS and st[end] in _ROUTING_PARTS:
            end += 1
        for q in range(b + 1, end):
            if st[q] in _ROUTING_PARTS:
                stage[rows[q]] = "moe_topk"
                why[rows[q]] = MOE_ROUTER
        done = nxt
        found = True
    return found


_SCALE_OPS = _V("scale_ops")
_CAST_OPS = _V("cast_ops")


def _label_embedding_scale(
    rows: list[int], stage: list[str], op_names: Sequence[str | None], marks: list[int], why: Any
) -> None:
    """A scaled embedding (Gemma: the looked-up rows times sqrt(hidden)): the multiply launched right
    after the lookup (a cast of the scale before it) is the embedding's."""
    for q in [q for q in marks if stage[rows[q]] == "embedding"]:
        k = q + 1
        while k < len(rows) and op_names[rows[k]] in _CAST_OPS and stage[rows[k]] in GENERIC:
            k += 1
        if k < len(rows) and op_names[rows[k]] in _SCALE_OPS and stage[rows[k]] in GENERIC:
            for j in range(q + 1, k + 1):
                stage[rows[j]] = "embedding"
                why[rows[j]] = EMBEDDING_SCALE


_INDEX_OPS = _V("index_ops")


def _label_position_ids(
    rows: list[int], stage: list[str], op_names: Sequence[str | None], marks: list[int], why: Any
) -> None:
    """A second lookup before the first layer (learned positions after the tokens: OPT) computes its
    indices right before it: the adds right before that lookup (position ids plus an offset) are
    the embedding's, when only generic work and copies ran since the first lookup."""
    lookups = [q for q in marks if stage[rows[q]] == "embedding"]
    for p, q in zip(lookups, lookups[1:], strict=False):
        if q - p < 2 or not all(stage[rows[i]] in _PRE_WORK for i in range(p + 1, q)):
            continue
        k = q - 1
        while k > p and op_names[rows[k]] in _INDEX_OPS and stage[rows[k]] in GENERIC:
            stage[rows[k]] = "embedding"
            why[rows[k]] = POSITION_IDS
            k -= 1


_PRE_WORK = _V("pre_layer_work")


def _demote_sampling_before_layers(
    rows: list[int], stage: list[str], region_of: list[str], marks: list[int], why: Any
) -> None:
    """Between a forward's embedding and its first layer nothing samples a token: a cumsum of the
    position ids, the sort of a flex block mask there is generic work (its name or op says
    ``sampling`` only because samplers use the same kernels)."""
    last_emb = -1
    for q in marks:  # the positions of sampling and embedding kernels (and others, skipped)
        r = rows[q]
        if stage[r] == "embedding":
            last_emb = q
        elif (
            stage[r] == "sampling"
            and region_of[q] == "pre"
            and last_emb >= 0
            and region_of[last_emb] == "pre"
        ):
            # the same "pre" run: no other region between the embedding and here
            if all(x == "pre" for x in region_of[last_emb:q]):
                stage[r] = "elementwise"
                why[r] = PRE_LAYER_SAMPLING


def _demote_embedding_projection(
    rows: list[int],
    stage: list[str],
    region_of: list[str],
    layer_of: list[int],
    op_first: np.ndarray,
    op_last: np.ndarray,
    opened: list[int],
    why: Any,
) -> None:
    """A GEMM that opened a forward as its first layer's first projection (``opened``: the GEMM op
    indices) whose layer then runs one QKV GEMM op more than the other layers do is the embeddings'
    own projection (OPT-350m's project_in, before the learned positions are added): role-free,
    before the first layer, and the work up to the next projection with it."""
    if not opened:
        return
    first = op_first.tolist()
    runs: dict[int, int] = {}  # first op of a run of QKV GEMM ops of one layer -> ops in the run
    head = -1
    for k, q in enumerate(first):
        if stage[rows[q]] != "qkv_gemm":
            head = -1
            continue
        if head >= 0 and layer_of[q] == layer_of[first[head]]:
            runs[head] += 1
        else:
            head = k
            runs[k] = 1
    firsts = set(opened)
    counts = Counter(v for k, v in runs.items() if k not in firsts)
    if not counts:
        return
    usual = counts.most_common(1)[0][0]
    for k in opened:
        if runs.get(k) != usual + 1 or k + 1 >= len(first):
            continue
        for q in range(first[k], first[k + 1]):
            if stage[rows[q]] == "qkv_gemm" and q <= int(op_last[k]):
                stage[rows[q]] = "gemm"
                why[rows[q]] = EMBEDDING_PROJECTION
            region_of[q] = "pre"
            layer_of[q] = -1


_REDUCE_OPS = _V("reduce_ops")
_MEAN_WORDS = KNOWLEDGE.words("mean_words")
POW_OPS = KNOWLEDGE.words("pow_ops")


def reduction_rows(norm_names: Any, op_column: pa.Array) -> np.ndarray:
    """Per kernel row: a reduction, by its launching op (``op_column``) or a mean kernel's name
    (tested once per distinct op and name)."""
    return dict_where(norm_names, lambda x: any(w in x for w in _MEAN_WORDS)) | dict_isin(
        op_column, list(_REDUCE_OPS)
    )


def _host_input_boundaries(
    transfer: np.ndarray, lookup: np.ndarray, op_last: np.ndarray, normish: np.ndarray
) -> np.ndarray:
    """STR048: per position, the first kernel of a run of memory transfers that ends a forward. Where
    the device runs no embedding lookup (the engine embeds the tokens on the host), a run of
    transfers right after a GEMM op and right before a norm is the engine handing the step's output
    to the host and uploading the next step's inputs: the GEMM is the LM head, the norm opens the
    next forward. ``transfer`` / ``lookup`` / ``normish``: per position; ``op_last``: each GEMM op's
    last position."""
    n = len(transfer)
    out = np.zeros(n, bool)
    if lookup.any() or not transfer.any() or not len(op_last):
        return out
    edges = np.diff(np.concatenate([[0], transfer.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)  # runs [start, end)
    gemm_end = np.zeros(n, bool)
    gemm_end[op_last] = True
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if a > 0 and b < n and gemm_end[a - 1] and normish[b]:
            out[a] = True
    return out


def _demote_output_row_gathers(
    rows: list[int],
    stage: list[str],
    lookup: np.ndarray,
    attention: np.ndarray,
    op_first: np.ndarray,
    normish: np.ndarray,
    why: Any,
) -> int:
    """STR047: an embedding lookup (by name) whose attention comes right before it, with one GEMM op
    (the O projection) and no norm between, selects rows of the layer's hidden states (llama.cpp
    keeps only the rows whose logits are computed, ``inp_out_ids``, in the last layer after its
    attention); it opens no forward and takes its region's stage. A forward's own lookup comes
    after the previous forward's norms and MLP, never right after an O projection. Returns the
    kernels relabelled (``lookup`` / ``attention`` / ``normish``: per position)."""
    emb = np.flatnonzero(lookup)
    att = np.flatnonzero(attention)
    if not len(emb) or not len(att):
        return 0
    norm_count = np.concatenate([[0], np.cumsum(normish)])
    last_att = np.searchsorted(att, emb) - 1
    done = 0
    for e, j in zip(emb.tolist(), last_att.tolist(), strict=True):
        if j < 0:
            continue
        a = int(att[j])
        ops = int(np.searchsorted(op_first, e) - np.searchsorted(op_first, a + 1))
        if ops == 1 and norm_count[e] == norm_count[a + 1]:
            stage[rows[e]] = "elementwise"
            why[rows[e]] = OUTPUT_ROWS
            done += 1
    return done


def _demote_lone_pow(
    rows: list[int], stage: list[str], is_pow: np.ndarray, is_reduce: np.ndarray, why: Any
) -> int:
    """``aten::pow`` (``is_pow``, per position) is a norm's square only when a reduction (the mean,
    ``is_reduce``) follows within two kernels; elsewhere (GELU-tanh's ``x ** 3``) it is generic work
    that the region labels."""
    n = len(rows)
    pows = np.flatnonzero(is_pow)
    reduced = np.zeros(len(pows), bool)
    for step in (1, 2):
        at = pows + step
        inside = at < n
        reduced[inside] |= is_reduce[at[inside]]
    demoted = 0
    for q in pows[~reduced].tolist():
        if stage[rows[q]] == "norm":
            stage[rows[q]] = "elementwise"
            why[rows[q]] = LONE_POW
            demoted += 1
    return demoted


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


# Region -> stage for generic kernels found there (rules/structure.toml [regions]); "attn": between
# the attention kernel and the O GEMM, the attention interface's own work (output transpose ...)
_REGION_STAGE = dict(KNOWLEDGE.regions)
_KV_OPS = KNOWLEDGE.words("kv_write_ops")
_NORM_OPS = _V("norm_ops")


def _label_generic(
    seq: np.ndarray,
    stage: list[str],
    op_names: Sequence[str | None],
    region_of: list[str],
    region_code: np.ndarray,
    generic_at: list[int],
    norm: Sequence[str] = (),
    normish: np.ndarray | None = None,
    shape: dict[str, tuple[int, int]] | None = None,
    why: Any = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
    rows: Sequence[int] | None = None,  # seq as Python ints, where the caller holds them
) -> None:
    """Generic kernels (at the increasing positions ``generic_at``) take the stage of the region they
    sit in (``region_code``: ``region_of`` as one integer per region name, so the runs of one region
    are found at once). Each region's labelling changes only its own positions, so the generic
    kernels of every region are the ones found before the first."""
    why = {} if why is None else why
    rows = seq.tolist() if rows is None else rows
    n = len(rows)
    gap = int(th.norm_cluster_gap)
    # with a typed array of codes, the region defaults' codes are set at once afterwards (below)
    codes_at_once = isinstance(why, array.array) and len(generic_at) > 0
    if codes_at_once:
        codes = np.frombuffer(why, np.int16)
        at = seq[np.asarray(generic_at, np.int64)]
        before = codes[at].copy()
    clusters = _cluster_bounds(np.flatnonzero(normish), gap) if shape and normish is not None else None
    starts = [0, *(np.flatnonzero(np.diff(region_code)) + 1).tolist()]
    ends = [*starts[1:], n]
    cut = np.searchsorted(np.asarray(generic_at, np.int64), np.asarray([*starts, n], np.int64)).tolist()
    for k, (p, q) in enumerate(zip(starts, ends, strict=True)):
        if p >= n:
            break
        reg = region_of[p]
        run = generic_at[cut[k] : cut[k + 1]]
        if run and reg == "pre":
            _label_first_norm(rows, run, p, q, stage, norm, why)
            _label_rotary_module(rows, p, q, stage, op_names, why, th)
        if run and reg in _REGION_STAGE:
            target = _REGION_STAGE[reg]
            target_rule = _REGION_RULE.get(reg, MOE_BLOCK)
            if reg == "moe_experts":
                _label_moe_block(rows, run, p, q, stage, op_names, why)
                continue
            if reg in ("attn_out", "mlp_out") and shape and clusters is not None:
                inside = _norm_windows(clusters, p, q, shape, rows, norm)
                if inside:
                    # sandwich norms (Gemma): norms may come before and after the residual add
                    for i in run:
                        if i in inside and not _between_fused_norms(rows, i, p, q, norm, op_names):
                            stage[rows[i]] = "norm"
                        elif _is_add(rows[i], op_names) or stage[rows[i]] == "residual_add":
                            stage[rows[i]] = "residual_add"  # by op, or the rule's 16-bit add
                        else:
                            stage[rows[i]] = "elementwise"
                        why[rows[i]] = SANDWICH_NORM
                    if q < n and stage[rows[q]] == "moe_gate_gemm":
                        # casts after the norm, right before the router's GEMM, are the router's
                        # (DeepSeek's router multiplies in fp32)
                        for i in reversed(run):
                            if stage[rows[i]] != "elementwise" or i in inside:
                                break
                            stage[rows[i]] = "moe_topk"
                            why[rows[i]] = ROUTER_CAST
                    continue
            if reg in ("attn_out", "mlp_out"):
                # the residual add opens the block, the input norm of the next block follows
                add = next((i for i in run if _is_add(rows[i], op_names)), None)
                if add is not None:
                    stage[rows[add]] = "residual_add"
                    why[rows[add]] = RESIDUAL_ADD
                    run = [i for i in run if i > add]
                if reg == "mlp_out":
                    target = "norm" if _has_norm_signal(rows, run, op_names, stage, p, q) else "elementwise"
            if reg == "attn_in":
                # a GEMM inside the region (MLA's kv decompression) splits it: the part before
                # it ends at a GEMM, the last part at attention
                # one pass over the region: its parts (split at GEMMs), each a list of the generic
                # kernels and of the writes the op hints named already (index_copy_ ...)
                parts: list[tuple[list[int], bool]] = []
                part: list[int] = []
                named: set[int] = set()
                generic = set(run)
                for i in range(p, q):
                    x = stage[rows[i]]
                    if x in GEMM_STAGES:
                        parts.append((part, False))
                        part = []
                    elif x == "kv_cache_store":
                        named.add(i)
                        part.append(i)
                    elif i in generic:
                        part.append(i)
                parts.append((part, True))
                kv_rows: set[int] = set()
                reads: set[int] = set()
                kv_rule, reads_rule = KV_UPDATE, ATTENTION_INPUT_COPIES
                for part, last in parts:
                    if not part:
                        continue
                    ops = [op_names[rows[i]] for i in part]
                    names = [norm[rows[i]] for i in part] if norm else [""] * len(part)
                    tokens = tuple(zip(names, ops, strict=True))
                    writes = tuple(
                        STRONG_WRITE if i in named else _OP_WRITES.get(o, 0)
                        for i, o in zip(part, ops, strict=True)
                    )
                    # without launching ops (a graph replay), stores are told by their kernel names,
                    # where the attention's own input work follows them (STR045)
                    opless = last and all(o is None for o in ops)
                    if opless:
                        by_name = tuple(max(w, _name_write(nm)) for w, nm in zip(writes, names, strict=True))
                        opless = bool(by_name) and by_name[-1] != STRONG_WRITE and STRONG_WRITE in by_name
                        writes = by_name if opless else writes
                    kv, attn = _kv_update_positions(
                        tokens, writes, last, int(th.max_square_search), int(th.kv_writes), opless
                    )
                    if opless and kv:
                        kv_rule = reads_rule = KV_UPDATE_BY_NAME
                    kv_rows.update(part[j] for j in kv)
                    reads.update(part[j] for j in attn)
                    if kv and not last:
                        kv_rule = KV_UPDATE_BEFORE_GEMM
                kv_rows -= named
                if kv_rows or reads:
                    for i in kv_rows:
                        stage[rows[i]] = "kv_cache_store"
                        why[rows[i]] = kv_rule
                    for i in reads:
                        stage[rows[i]] = COMPOSED_ATTENTION
                        why[rows[i]] = reads_rule
                    run = [i for i in run if i not in kv_rows and i not in reads]
            for i in run:
                stage[rows[i]] = target
            if not codes_at_once:
                for i in run:
                    why[rows[i]] = target_rule
    if codes_at_once:
        # a generic kernel no specific rule took got its region's stage: the region's rule says so
        lut = np.full(int(region_code.max()) + 1 if len(region_code) else 1, -1, np.int16)
        names = list(dict.fromkeys(region_of))
        for reg in names:
            rule = _REGION_RULE.get(reg)
            if rule is not None:
                lut[int(region_code[region_of.index(reg)])] = rule
        rule_at = lut[region_code[np.asarray(generic_at, np.int64)]]
        take = (codes[at] == before) & (rule_at >= 0)
        codes[at[take]] = rule_at[take]


WEAK_WRITE, STRONG_WRITE, CACHE_READ = 1, 2, 3
_CACHE_READ_OPS = _V("cache_read_ops")


def _write_kind(named: bool, op: str | None) -> int:
    """0: no write; WEAK_WRITE: a plain ``copy_`` (a cache slice's write, or a ``.contiguous()``);
    STRONG_WRITE: a named cache store or a cat / index_copy_ / index_put_ / slice_scatter op;
    CACHE_READ: a gather (a paged cache hands back its keys and values gathered from the blocks)."""
    if named:
        return STRONG_WRITE
    if op in _CACHE_READ_OPS:
        return CACHE_READ
    if op not in _KV_OPS:
        return 0
    return WEAK_WRITE if op in _COPY_OPS else STRONG_WRITE


# :func:`_write_kind` of each op that is not a named store, looked up once per kernel
_OP_WRITES = {op: _write_kind(False, op) for op in (*_KV_OPS, *_CACHE_READ_OPS)}


@functools.lru_cache(maxsize=4096)
def _kv_update_positions(
    tokens: tuple[tuple[str, str | None], ...],
    writes: tuple[int, ...],
    before_attention: bool = True,
    max_search: int = int(DEFAULT_THRESHOLDS.max_square_search),
    kv_writes: int = int(DEFAULT_THRESHOLDS.kv_writes),
    trailing_prep: bool = False,
) -> tuple[frozenset[int], frozenset[int]]:
    """Which generic kernels between the QKV GEMMs and attention are the KV-cache update, and which
    are the attention's own input copies.

    ``tokens`` (kernel name, launching op) and ``writes`` (:func:`_write_kind`) per generic kernel of
    the region, in order. Where only plain copies and gathers follow the last strong write (a cat /
    index_copy_ / named store), the gathers are the update's (a paged cache hands back its keys and
    values) and the copies the attention's (the attention interface's ``.contiguous()`` copies); the
    update is then found before them. The update ends the region with the last two write ops (keys
    and values). RoPE applies one kernel sequence to q and then to k: the last such repeated
    sequence (its unit holds more than write ops) ends RoPE; the generic work between it and the
    two writes (a static cache's lazy fills, its index arithmetic) is the update's, except further
    write ops there (partial rotary concatenates the rotated and the passed-through halves): RoPE's.
    Without a repeated sequence only the trailing writes (at most two) are the update. Where a GEMM,
    not attention, follows (MLA caches the latent before decompressing it; the query's cat may come
    after the update), the update is the first two writes after RoPE. Memoised: the same region
    repeats in every layer and step. ``max_search`` / ``kv_writes``: the thresholds of those names."""
    n = len(tokens)
    if not before_attention:
        end = _last_square_end(tokens, writes, n, max_search)
        if end < n:
            first_writes = [j for j in range(end, n) if writes[j] == STRONG_WRITE][:kv_writes]
            return frozenset(first_writes), frozenset()
        # no repeated RoPE sequence: the first two cat / store ops; plain copies before a GEMM
        # are casts (a q/k norm's, say), never the update
        strong = [j for j in range(n) if writes[j] == STRONG_WRITE]
        return frozenset(strong[:kv_writes] if len(strong) >= kv_writes else ()), frozenset()
    reads: frozenset[int] = frozenset()
    gathered: set[int] = set()
    if trailing_prep and n and not writes[n - 1]:
        # without host ops (a graph replay), the attention's own input work (its mask, its
        # positions: arange, fills) may follow the cache's writes: it is the attention's
        last_write = max((j for j in range(n) if writes[j] == STRONG_WRITE), default=-1)
        if last_write >= 0 and n - last_write - 1 <= _MAX_TRAILING_PREP:
            reads = frozenset(range(last_write + 1, n))
            n = last_write + 1
    if n and writes[n - 1] in (WEAK_WRITE, CACHE_READ):
        last_strong = max((j for j in range(n) if writes[j] == STRONG_WRITE), default=-1)
        after = range(last_strong + 1, n)
        if last_strong >= 0 and all(writes[j] in (WEAK_WRITE, CACHE_READ) for j in after):
            # the cache's gathers belong to its update; the copies after them to the attention
            gathered = {j for j in after if writes[j] == CACHE_READ}
            reads = frozenset(j for j in after if writes[j] == WEAK_WRITE)
            n = last_strong + 1
    tail: list[int] = []
    if trailing_prep and reads:
        # a graph replay's copies are casts and contiguous copies as often as writes: only the
        # named stores (cat, index_copy, scatter) after RoPE's repeated q / k sequence are the
        # update (a cat inside that sequence is RoPE's rotate_half; none after it: no cache, as in
        # training, and nothing here is the update or the attention's)
        end = _last_square_end(tokens, writes, n, max_search)
        strong = [j for j in range(end, n) if writes[j] == STRONG_WRITE][-kv_writes:]
        if end >= n or not strong:
            return frozenset(), frozenset()
        first = min(strong)
        gathers = {j for j in reads if writes[j] == CACHE_READ}  # a paged cache's gathers: the update's
        update = {*strong, *gathers, *(j for j in range(end, first) if not writes[j])}
        return frozenset(update), frozenset(reads - gathers)
    for j in range(n - 1, -1, -1):
        if writes[j] not in (WEAK_WRITE, STRONG_WRITE) or len(tail) == kv_writes:
            break
        tail.append(j)
    if not tail:
        return frozenset(gathered), reads
    first = min(tail)
    end = _last_square_end(tokens, writes, first, max_search)
    out = set(tail) | gathered
    out.update(j for j in range(end, first) if not writes[j])
    return frozenset(out), reads


_MAX_TRAILING_PREP = 8  # an attention's input work after the cache writes: arange, fills, a mask's ops
_STRONG_WRITE_WORDS = KNOWLEDGE.words("kv_store_kernel_words")
_CACHE_READ_WORDS = KNOWLEDGE.words("cache_read_kernel_words")


@functools.lru_cache(maxsize=4096)
def _name_write(name: str) -> int:
    """Without a launching op: a cache store by its kernel's name (cat, index_copy, scatter), else none."""
    if any(w in name for w in _STRONG_WRITE_WORDS):
        return STRONG_WRITE
    return CACHE_READ if any(w in name for w in _CACHE_READ_WORDS) else 0


def _last_square_end(
    tokens: tuple[Any, ...],
    writes: tuple[int, ...],
    limit: int,
    max_search: int = int(DEFAULT_THRESHOLDS.max_square_search),
) -> int:
    """End of the last back-to-back repeated block (unit of >= 2 kernels, not only writes) found
    greedily from the start of ``tokens[:limit]``; ``limit`` when there is none. A kernel is its
    launching op where known (the same op on q and on k may pick another vectorized kernel)."""
    if limit > max_search:
        return limit  # an unrecognised stretch, not a RoPE region: the search is quadratic and more
    tokens = tuple(t[1] or t[0] for t in tokens)
    s, end = 0, None
    while s < limit:
        for size in range((limit - s) // 2, 1, -1):
            if tokens[s : s + size] == tokens[s + size : s + 2 * size] and not all(writes[s : s + size]):
                s += 2 * size
                end = s
                break
        else:
            s += 1
    return limit if end is None else end


def _is_cast(r: int, norm: Sequence[str], op_names: Sequence[str | None]) -> bool:
    op = op_names[r]
    return op in _COPY_OPS if op is not None else any(w in norm[r] for w in _COPY_WORDS)


def _norm_shape(
    rows: list[int],
    norm: Sequence[str],
    op_names: Sequence[str | None],
    normish: np.ndarray,
    was_generic: np.ndarray,
    qkv_l: list[int],
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> dict[str, tuple[int, int]] | None:
    """(lead, tail) of each composed norm of the model, learned from the layers' input norms.

    A norm composed of ATen kernels (cast, pow, mean, add eps, rsqrt, mul, cast, mul by the weight)
    shows only some of its kernels as norm-like. The input norm of a layer ends at its QKV GEMM: the
    generic kernels between its last norm-like kernel and that GEMM are its tail, a cast right
    before its first norm-like kernel its lead. Keyed by the name of the norm's first norm-like
    kernel (an eager norm and a compiled one differ); None when no input norm is found.
    ``qkv_l``: the positions where a run of QKV GEMMs begins, in order.
    """
    n = len(rows)
    if not qkv_l:
        return None
    seen: dict[str, tuple[list[int], list[int]]] = {}
    first, last = (
        np.asarray(x, np.int64) for x in _cluster_bounds(np.flatnonzero(normish), int(th.norm_cluster_gap))
    )
    qkv = np.asarray(qkv_l, np.int64)
    k = np.searchsorted(qkv, last)
    nxt = np.where(k < len(qkv), qkv[np.minimum(k, len(qkv) - 1)], n)
    tail = nxt - last - 1
    # only generic kernels between the cluster and the GEMM (none when the GEMM comes right after)
    other = np.concatenate([[0], np.cumsum(~was_generic)])
    ok = (tail <= th.max_norm_tail) & (other[np.maximum(nxt, last + 1)] == other[last + 1])
    cast_before = (first > 0) & was_generic[np.maximum(first - 1, 0)]
    for c0, t, c in zip(first[ok].tolist(), tail[ok].tolist(), cast_before[ok].tolist(), strict=True):
        leads, tails = seen.setdefault(norm[rows[c0]], ([], []))
        tails.append(t)
        leads.append(int(c and _is_cast(rows[c0 - 1], norm, op_names)))
    if not seen:
        return None
    return {k: (int(np.bincount(lv).argmax()), int(np.bincount(tv).argmax())) for k, (lv, tv) in seen.items()}


def _norm_windows(
    clusters: tuple[list[int], list[int]],
    lo: int,
    hi: int,
    shape: dict[str, tuple[int, int]],
    rows: list[int],
    norm: Sequence[str],
) -> set[int]:
    """Positions in [lo, hi) covered by a norm of its learned shape around each norm-like cluster
    (``clusters``: the first and last positions of every cluster, from :func:`_cluster_bounds`)."""
    first, last = clusters
    out: set[int] = set()
    for k in range(bisect.bisect_left(last, lo), bisect.bisect_left(first, hi)):
        c0, c1 = first[k], last[k]
        got = shape.get(norm[rows[c0]])
        if got is not None:
            out.update(range(max(c0 - got[0], lo), min(c1 + got[1], hi - 1) + 1))
    return out


def _cluster_bounds(
    pos: np.ndarray, gap: int = int(DEFAULT_THRESHOLDS.norm_cluster_gap)
) -> tuple[list[int], list[int]]:
    """The first and the last positions of each run of norm kernels at most ``gap`` apart (pow,
    mean, add, rsqrt), as two lists
    (searched with ``bisect``: one search per region, where numpy's per-call cost would dominate)."""
    if not len(pos):
        return [], []
    cut = np.flatnonzero(np.diff(pos) > gap) + 1
    return pos[np.concatenate([[0], cut])].tolist(), pos[np.concatenate([cut - 1, [len(pos) - 1]])].tolist()


def _label_inner_norms(
    rows: Sequence[int],  # one device's kernels in time order (:func:`row_sequence`)
    stage: list[str],
    attn_in: np.ndarray,
    normish: np.ndarray,
    was_generic: np.ndarray,
    shape: dict[str, tuple[int, int]] | None,
    norm: Sequence[str] = (),
    why: Any = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
    op_names: Sequence[str | None] = (),
) -> None:
    """Norms inside the attention input (Qwen3 / OLMo-2 / Gemma-3 q/k norms) are norms, not RoPE:
    the learned norm shape (:func:`_norm_shape`) is applied to the norm clusters found between the
    QKV GEMM and attention; a copy right before a q / k norm kernel that the learned shape does not
    cover is that norm's input (STR046). ``attn_in``: per position, in that region."""
    why = {} if why is None else why
    n = len(rows)
    inner = attn_in & normish
    if not inner.any():
        return
    if shape is not None:
        bounds = _cluster_bounds(np.flatnonzero(inner), int(th.norm_cluster_gap))
        for q in sorted(_norm_windows(bounds, 0, n, shape, rows, norm)):
            if attn_in[q] and was_generic[q] and stage[rows[q]] in ("rope", *GENERIC):
                stage[rows[q]] = "norm"
                why[rows[q]] = INNER_NORMS
    if op_names:
        # the contiguous copy of the q or k slice right before its norm kernel is the norm's input
        for c in np.flatnonzero(inner).tolist():
            q = c - 1
            if (
                q >= 0
                and attn_in[q]
                and was_generic[q]
                and not normish[q]
                and stage[rows[q]] in ("rope", *GENERIC)
                and _is_cast(rows[q], norm, op_names)
            ):
                stage[rows[q]] = "norm"
                why[rows[q]] = QK_NORM_INPUT


def _label_first_norm(
    rows: list[int], run: list[int], lo: int, hi: int, stage: list[str], norm: Sequence[str], why: Any
) -> None:
    """Before the first layer: the generic kernels of the trailing norm (input norm of layer 0).

    A norm composed of ATen kernels (pow, mean, rsqrt, mul) opens with one cast to fp32; a fused
    norm kernel has no prologue, so the generic kernel before it belongs to what came earlier.
    """
    norms = [i for i in range(lo, hi) if stage[rows[i]] == "norm"]
    if not norms:
        return
    first = norm[rows[norms[0]]] if norm else ""
    start = norms[0]
    if (
        not any(w in first for w in _FUSED_NORM_WORDS)
        and start - 1 >= lo
        and stage[rows[start - 1]] in GENERIC
    ):
        start -= 1
    for i in run:
        if i >= start and stage[rows[i]] in GENERIC:
            stage[rows[i]] = "norm"
            why[rows[i]] = FIRST_NORM


_FUSED_NORM_WORDS = KNOWLEDGE.words("fused_norm_words")


def _between_fused_norms(
    rows: list[int], i: int, lo: int, hi: int, norm: Sequence[str], op_names: Sequence[str | None]
) -> bool:
    """An add right between two fused norm kernels (one kernel each: Liger's, vLLM's) is the
    residual add of a sandwich, not a composed norm's epsilon add."""

    def fused(j: int) -> bool:
        return lo <= j < hi and any(w in norm[rows[j]] for w in _FUSED_NORM_WORDS)

    return _is_add(rows[i], op_names) and fused(i - 1) and fused(i + 1)


def _label_rotary_module(
    rows: list[int],
    lo: int,
    hi: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> None:
    """Before the first layer: the rotary module (HF ``*RotaryEmbedding.forward``) multiplies
    ``inv_freq`` by the positions (a small GEMM), concatenates the halves and takes cos and sin
    (scaled, cast). The GEMM whose result feeds cos/sin and the generic kernels around them are RoPE."""
    ropes = [i for i in range(lo, hi) if stage[rows[i]] == "rope"]
    if not ropes:
        return
    a, b = ropes[0], ropes[-1]
    g = a - 1
    while g >= lo and stage[rows[g]] in GENERIC and op_names[rows[g]] not in _COPY_OPS:
        g -= 1
    if g >= lo and stage[rows[g]] in GEMM_STAGES:
        a = g
        while g >= lo and stage[rows[g]] in GEMM_STAGES:
            g -= 1
        for _ in range(int(th.rope_module_lead)):
            if (
                g >= lo
                and stage[rows[g]] in GENERIC
                and (op_names[rows[g]] is None or op_names[rows[g]] in _COPY_OPS)
            ):
                a = g
                g -= 1
    z = b + 1
    while z < hi and stage[rows[z]] in GENERIC:
        z += 1
    for i in range(a, z):
        if stage[rows[i]] in GENERIC or stage[rows[i]] in GEMM_STAGES:
            stage[rows[i]] = "rope"
            why[rows[i]] = ROTARY_MODULE


def _label_moe_block(
    rows: list[int],
    run: list[int],
    lo: int,
    hi: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
) -> None:
    """Expert block: dispatch before the last expert GEMM, combine after it, then residual + norm."""
    gemms = [i for i in range(lo, hi) if stage[rows[i]] == "moe_expert_gemm"]
    last = gemms[-1] if gemms else lo - 1
    # the residual add is the last add before the next norm (an earlier one combines the routed
    # and shared experts' outputs); an activation after the last expert GEMM (Qwen2-MoE's sigmoid of
    # the shared-expert gate) weighs the combination
    first_norm = next((i for i in range(last + 1, hi) if stage[rows[i]] == "norm"), None)
    adds = [
        i
        for i in run
        if last < i < (first_norm if first_norm is not None else -1) and _is_add(rows[i], op_names)
    ]
    add = adds[-1] if adds else None
    gate = False
    for i in range(last + 1, first_norm if first_norm is not None else hi):
        if stage[rows[i]] == "activation":
            stage[rows[i]] = "moe_accumulate"
            why[rows[i]] = MOE_SHARED_GATE
            gate = True
    if gate:  # the GEMM before that activation is the gate's (hidden -> 1), not an expert's
        g = last
        while g >= lo and stage[rows[g]] == "moe_expert_gemm":
            stage[rows[g]] = "moe_gate_gemm"
            why[rows[g]] = MOE_SHARED_GATE
            g -= 1
    for i in run:
        if i < last and _glu_product(rows, i, lo, stage):
            stage[rows[i]] = "activation"  # act(gate) * up between an expert's two GEMMs
            why[rows[i]] = MOE_GLU_PRODUCT
            continue
        if i < last:
            stage[rows[i]] = "moe_sort"
        elif add is None or i < add:
            stage[rows[i]] = "moe_accumulate"
        elif i == add:
            stage[rows[i]] = "residual_add"
        else:
            stage[rows[i]] = "norm"
        why[rows[i]] = MOE_BLOCK


def _glu_product(rows: list[int], i: int, lo: int, stage: list[str]) -> bool:
    """Position i is a gated MLP's product ``act(gate) * up``, right before the down projection's
    GEMM: the two kernels before it are the activation and a GEMM (gate, act, up or gate, up, act)."""
    if i - 2 < lo or i + 1 >= len(rows) or stage[rows[i + 1]] not in _EXPERT_OR_DENSE_GEMM:
        return False
    a, b = stage[rows[i - 1]], stage[rows[i - 2]]
    return (a == "activation" and b in _EXPERT_OR_DENSE_GEMM) or (
        b == "activation" and a in _EXPERT_OR_DENSE_GEMM
    )


_EXPERT_OR_DENSE_GEMM = GEMM_STAGES | {"moe_expert_gemm"}


def _is_add(r: int, op_names: Sequence[str | None]) -> bool:
    return op_names[r] in _ADD_OPS


def _has_norm_signal(
    rows: list[int], run: list[int], op_names: Sequence[str | None], stage: list[str], lo: int, hi: int
) -> bool:
    if any(stage[rows[i]] == "norm" for i in range(lo, hi)):
        return True
    ops = {op_names[rows[i]] for i in run}
    return bool(ops & _NORM_OPS)


def _shift_prologue_to_next_layer(
    rows: list[int], stage: list[str], layer_of: list[int], qkv_starts: list[int]
) -> int:
    """Norm kernels that precede a layer's QKV GEMM belong to that layer, not the previous one
    (``qkv_starts``: the positions where a run of QKV GEMMs begins; ``layer_of``: each
    position's layer). Returns how many kernels changed layer."""
    moved = 0
    for q in qkv_starts:
        v = layer_of[q]
        k = q - 1
        while k >= 0 and stage[rows[k]] in _PROLOGUE_STAGES:
            moved += layer_of[k] != v
            layer_of[k] = v
            k -= 1
    return moved


_PROLOGUE_STAGES = _V("prologue_stages")


# --------------------------------------------------------------------------- self-check


def structure_problem(
    seq: np.ndarray, stage: list[str], layer: np.ndarray, th: Thresholds = DEFAULT_THRESHOLDS
) -> str | None:
    """Why the walk's answer for one device's kernels cannot be trusted, or None.

    The structure is not found with confidence when the kernels hold GEMMs but no attention was
    located (every role would be a guess), or when the GEMM role sequence of the numbered layers
    does not repeat (the most common per-layer sequence covers under half of the layers; a
    dense-then-MoE mix has two sequences, both repeating).
    """
    st = [stage[r] for r in seq.tolist()]
    kinds = {x: i for i, x in enumerate(dict.fromkeys(st))}
    code = np.fromiter(map(kinds.__getitem__, st), np.int32, len(st))
    del st
    counts = np.bincount(code, minlength=len(kinds))
    names = list(kinds)
    gemms = int(sum(counts[i] for i, x in enumerate(names) if x in GEMM_STAGES or x == "moe_expert_gemm"))
    if gemms < th.min_gemms_for_layers:
        return None
    if not kinds.keys() & ATTENTION:
        return f"no attention located among {gemms} GEMM kernels"
    # one run per layer instance (kernels of one layer number, back to back): its GEMM roles in
    # order, repeats merged; only the GEMM positions are looked at
    role = np.array([x in GEMM_STAGES and x != "gemm" for x in names], bool)[code]
    lay = layer[seq]
    instance = np.concatenate([[0], np.cumsum(lay[1:] != lay[:-1])])
    at = np.flatnonzero(role & (lay >= 0))
    c, inst = code[at], instance[at]
    keep = np.ones(len(at), bool)
    keep[1:] = (inst[1:] != inst[:-1]) | (c[1:] != c[:-1])
    c, inst = c[keep], inst[keep]
    starts = np.flatnonzero(np.concatenate([[True], inst[1:] != inst[:-1]])) if len(inst) else inst
    if len(starts) >= 3:
        seqs = Counter(part.tobytes() for part in np.split(c, starts[1:]))
        if 2 * max(seqs.values()) < len(starts):
            return f"the GEMM role sequence does not repeat over {len(starts)} layers"
    return None


# --------------------------------------------------------------------------- roles from shapes


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


def gemm_shape(op_name: str | None, dims: list[list[int]] | None) -> tuple[int, int] | None:
    """(K, N) of a recorded dense GEMM op from its input shapes (``rules/work_ops.toml``, grouped
    products left out: their weights are experts); None when not a GEMM the table reads."""
    return WORK_OPS.dense_shape(op_name, dims)


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
