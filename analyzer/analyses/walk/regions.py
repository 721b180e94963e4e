"""The region defaults: generic kernels (a bare ATen add, copy or multiply) take the stage of the region
of a decoder layer they sit in (``rules/structure.toml`` ``[regions]``), refined by the norm, KV-cache,
rotary and MoE rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from analyzer.analyses.walk.decisions import Decisions
from analyzer.analyses.walk.eager_ops import _between_fused_norms, _has_norm_signal
from analyzer.analyses.walk.kv_cache import (
    _CACHE_READ_OPS,
    _KV_OPS,
    STRONG_WRITE,
    _kv_update_positions,
    _name_write,
    _write_kind,
)
from analyzer.analyses.walk.model_code import _label_first_norm, _label_rotary_module
from analyzer.analyses.walk.moe import _label_moe_block
from analyzer.analyses.walk.positions import _cluster_bounds, _is_add, _norm_windows, gemm_elements, numel
from analyzer.analyses.walk.registry import (
    _ADD_OPS,
    _COPY_OPS,
    _ID,
    _REGION_RULE,
    COMPOSED_ATTENTION,
    DEFAULT_THRESHOLDS,
    GEMM_STAGES,
    GENERIC,
    KNOWLEDGE,
    MOE_BLOCK,
)
from analyzer.analyses.walk.sequence import NO_COPY_FACTS, CopyFacts
from analyzer.knowledge.structure_rules import Thresholds

SANDWICH_NORM = _ID("sandwich-norm")
BLOCK_INNER_NORM = _ID("block-inner-norm")


ROUTER_CAST = _ID("router-cast")


RESIDUAL_ADD = _ID("residual-add")


KV_UPDATE = _ID("kv-update")


KV_UPDATE_BEFORE_GEMM = _ID("kv-update-before-gemm")


KV_UPDATE_BY_NAME = _ID("kv-update-by-name")


ATTENTION_INPUT_COPIES = _ID("attention-input-copies")


# Region -> stage for generic kernels found there (rules/structure.toml [regions]); "attn": between
# the attention kernel and the O GEMM, the attention interface's own work (output transpose ...)
_REGION_STAGE = dict(KNOWLEDGE.regions)


def _label_generic(
    seq: np.ndarray,
    decide: Callable[[], Decisions],
    op_names: Sequence[str | None],
    region_of: list[str],
    region_code: np.ndarray,
    generic_at: np.ndarray,
    norm: Sequence[str] = (),
    normish: np.ndarray | None = None,
    shape: dict[str, tuple[int, int]] | None = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
    rows: Sequence[int] | None = None,  # seq as Python ints, where the caller holds them
    kv: bool = True,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
    copies: CopyFacts = NO_COPY_FACTS,
) -> Iterator[Decisions]:
    """Generic kernels (at the increasing positions ``generic_at``) take the stage of the region they
    sit in (``region_code``: ``region_of`` as one integer per region name, so the runs of one region
    are found at once). Each region's labelling changes and reads only its own positions, so the
    decisions are yielded a few regions at a time (``decide()`` makes the next set, read through to
    the kernels as the caller has applied the sets before): a 10 GB trace never holds them all. A
    generic kernel no specific rule took keeps the region's rule code, whether or not the region's
    default stage reached it. ``kv``: the KV-cache update rules run (their group's precondition
    held). ``copies``: what recorded types and shapes say of each copy (a widening one is no
    norm's tail, a module's own no attention input copy, a scalar's cast no attention output)."""
    d = decide()
    stage, why = d.stage, d.why
    rows = seq.tolist() if rows is None else rows
    n = len(rows)
    gap = int(th.norm_cluster_gap)
    clusters = _cluster_bounds(np.flatnonzero(normish), gap) if shape and normish is not None else None
    starts = [0, *(np.flatnonzero(np.diff(region_code)) + 1).tolist()]
    ends = [*starts[1:], n]
    cut = np.searchsorted(np.asarray(generic_at, np.int64), np.asarray([*starts, n], np.int64)).tolist()
    first = 0  # the first of generic_at the current set of decisions covers
    for k, (p, q) in enumerate(zip(starts, ends, strict=True)):
        if p >= n:
            break
        if d.size() > _BATCH:  # a few regions' decisions at a time
            _region_codes(d, seq, region_of, region_code, generic_at[first : cut[k]])
            yield d
            d = decide()
            stage, why, first = d.stage, d.why, cut[k]
        reg = region_of[p]
        run = generic_at[cut[k] : cut[k + 1]].tolist()  # one region's positions as ints at a time
        if run and reg == "pre":
            _label_first_norm(rows, run, p, q, stage, norm, op_names, why, th, inputs, copies.widen)
            _label_rotary_module(rows, p, q, stage, op_names, why, th)
        if not run or reg not in _REGION_STAGE:
            continue
        if reg in ("attn", "mlp_in") and shape and clusters is not None:
            run = _label_block_inner_norms(rows, run, p, q, clusters, shape, norm, stage, why)
        target = _REGION_STAGE[reg]
        run = _label_module_work(reg, rows, run, p, q, stage, op_names, why, inputs, copies.scalar)
        if reg == "moe_experts":
            continue
        if reg in ("attn_out", "mlp_out"):
            inside = (
                _norm_windows(clusters, p, q, shape, rows, norm, op_names)
                if shape and clusters is not None
                else None
            )
            if inside:
                _label_sandwich(rows, run, p, q, inside, stage, op_names, norm, why)
                continue
            run = _label_router_casts(rows, run, q, stage, op_names, why)
            run = _label_residual_add(rows, run, stage, op_names, why)
            if reg == "mlp_out":
                target = "norm" if _has_norm_signal(rows, run, op_names, stage, p, q) else "elementwise"
        if reg == "tail":
            run = _label_tail(rows, run, p, q, stage, op_names, norm, why, inputs)
        if reg == "attn_in" and kv:
            inner = _inner_norms(clusters, p, q, shape, rows, norm, op_names)
            run = _label_attention_input_outside(
                rows, run, p, q, inner, stage, op_names, norm, why, th, copies.module
            )
        d.label(seq[np.asarray(run, np.int64)], target, _REGION_RULE.get(reg, MOE_BLOCK))
    _region_codes(d, seq, region_of, region_code, generic_at[first:])
    yield d


_BATCH = 1 << 16  # decisions per set (each a few tens of bytes)


def _label_module_work(
    reg: str,
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    inputs: Callable[[int], list[list[int]] | None] | None,
    scalar: np.ndarray | None = None,
) -> list[int]:
    """The named rules of one region [p, q) before its default: the attention module's arithmetic
    after the attention kernel (STR035; ``scalar``, per kernel row: a scalar's cast), a router's
    selection without a top-k (STR071), the expert block (STR025, which labels all of its kernels);
    returns the kernels left for the default."""
    if reg == "attn":
        return _label_attention_module_work(rows, run, stage, op_names, why, scalar)
    if reg == "moe":
        return _label_selection_router(rows, run, p, q, stage, op_names, why)
    if reg == "moe_experts":
        _label_moe_block(rows, run, p, q, stage, op_names, why, inputs)
        return []
    return run


SELECTION_ROUTER = _ID("selection-router")
_SELECTION_OPS = KNOWLEDGE.set_of("selection_ops")
_SCORE_OPS = KNOWLEDGE.set_of("score_ops")
_TOPK_OPS = KNOWLEDGE.set_of("topk_ops")
_ROUTING_TAIL = KNOWLEDGE.set_of("routing_tail_ops") | KNOWLEDGE.set_of("selection_tail_ops")


def _label_selection_router(
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
) -> list[int]:
    """STR071: in a MoE region [p, q) with no top-k op, a router that selects by row maximum ends at
    the last score normaliser after its first selection and the routing tail after it: its generic
    kernels are routing (moe_topk); returns the kernels left for the region's default (dispatch)."""
    ops = [op_names[rows[i]] for i in range(p, q)]
    sel = next((i for i, op in enumerate(ops) if op in _SELECTION_OPS), None)
    if sel is None or any(op in _TOPK_OPS for op in ops):
        return run
    scored = [i for i in range(sel, len(ops)) if ops[i] in _SCORE_OPS]
    if not scored:
        return run
    end = scored[-1]
    while end + 1 < len(ops) and ops[end + 1] in _ROUTING_TAIL:
        end += 1
    return _label_where(rows, run, lambda i: i <= p + end, stage, why, "moe_topk", SELECTION_ROUTER)


_ATTENTION_OUTPUT_OPS = KNOWLEDGE.set_of("attention_output_ops")


def _label_attention_module_work(
    rows: Sequence[int],
    run: list[int],
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    scalar: np.ndarray | None = None,
) -> list[int]:
    """STR035: between the attention kernel and the O GEMM, a generic kernel whose op is no part of the
    interface's output work (a copy, a cast, dropout), or a cast of a scalar (``scalar``, per kernel
    row, recorded shapes: DiffLlama's lambda cast), is the attention module's own arithmetic
    (DiffLlama's difference of two attention maps): elementwise; returns the kernels left for the
    region's default (attention). A kernel with no launching op stays attention."""

    def own(i: int) -> bool:
        op = op_names[rows[i]]
        if op is None:
            return False
        return op not in _ATTENTION_OUTPUT_OPS or (scalar is not None and bool(scalar[rows[i]]))

    return _label_where(rows, run, own, stage, why, "elementwise", _REGION_RULE["attn"])


def _label_where(
    rows: Sequence[int],
    run: list[int],
    take: Callable[[int], bool],
    stage: list[str],
    why: Any,
    s: str,
    code: int,
) -> list[int]:
    """The positions of ``run`` that ``take`` holds for take stage ``s``, decided by rule ``code``;
    returns the others (left for the region's default)."""
    left = []
    for i in run:
        if take(i):
            stage[rows[i]] = s
            why[rows[i]] = code
        else:
            left.append(i)
    return left


NEXT_FORWARD_PROLOGUE = _ID("next-forward-prologue")
LM_HEAD_EPILOGUE = _ID("lm-head-epilogue")
_SOFTCAP_OPS = KNOWLEDGE.set_of("softcap_ops")


def _label_lm_head_epilogue(
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    stage: list[str],
    op_names: Sequence[str | None],
    why: Any,
    inputs: Callable[[int], list[list[int]] | None] | None = None,
) -> list[int]:
    """STR063: right after the LM head GEMM (just before the tail [p, q)), its bias add, a logit
    softcap (divide, tanh, multiply), or the scales and casts of all its logits that the sampler
    copies again later (``inputs``: recorded shapes), are the model's own output work; returns the
    generic kernels left for the tail's default."""
    h = p - 1 if p > 0 and stage[rows[p - 1]] == "lm_head_gemm" else p
    if h >= q or stage[rows[h]] != "lm_head_gemm" or h + 1 >= q:
        return run
    first = h + 1
    rescaled = _logit_epilogue(rows, h, q, stage, op_names, inputs)
    if rescaled:
        picked = rescaled
    elif op_names[rows[first]] in _ADD_OPS and stage[rows[first]] in GENERIC:
        picked = [first]
    else:
        # (a cast of the logits to fp32 may come first: divide, tanh, multiply after it)
        t = next((i for i in range(first, first + 3) if i < q and op_names[rows[i]] in _SOFTCAP_OPS), None)
        if t is None or t + 1 >= q:
            return run
        picked = [i for i in range(first, t + 2) if i == t or stage[rows[i]] in GENERIC]
        if len(picked) != t + 2 - first:
            return run
    for i in picked:
        stage[rows[i]] = "elementwise"
        why[rows[i]] = LM_HEAD_EPILOGUE
    done = set(picked)
    return [i for i in run if i not in done]


_EPILOGUE_OPS = KNOWLEDGE.set_of("logit_epilogue_ops") | _SOFTCAP_OPS  # (a softcap's tanh between them)


def _logit_epilogue(
    rows: Sequence[int],
    h: int,
    q: int,
    stage: list[str],
    op_names: Sequence[str | None],
    inputs: Callable[[int], list[list[int]] | None] | None,
) -> list[int]:
    """The positions right after the LM head GEMM at ``h`` of scales, casts and softcaps that read
    all its logits, where a later copy before ``q``, after other work, reads them again (the
    sampler's own copy, after the generation loop's bookkeeping); none without recorded shapes."""
    if inputs is None or h + 1 >= q or op_names[rows[h + 1]] not in _EPILOGUE_OPS:
        return []
    io = gemm_elements(op_names[rows[h]], inputs(rows[h]))
    if io is None:
        return []
    logits = io[1]

    def reads_logits(i: int) -> bool:
        got = inputs(rows[i])
        return bool(got) and bool(got[0]) and numel(got[0]) == logits > 0

    picked = []
    i = h + 1
    while (
        i < q
        and op_names[rows[i]] in _EPILOGUE_OPS
        and (stage[rows[i]] in GENERIC or op_names[rows[i]] in _SOFTCAP_OPS)  # (the tanh: an activation)
        and reads_logits(i)
    ):
        picked.append(i)
        i += 1
    # the sampler's copy comes after the generation loop's own work (a copy right after the run:
    # the sampler's cast then its copy, assisted decoding's)
    if not picked:
        return []
    again = any(op_names[rows[j]] in _COPY_OPS and reads_logits(j) for j in range(i + 1, q))
    return picked if again and not reads_logits(i) else []


def _label_tail(
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    stage: list[str],
    op_names: Sequence[str | None],
    norm: Sequence[str],
    why: Any,
    inputs: Callable[[int], list[list[int]] | None] | None,
) -> list[int]:
    """After the LM head: the model's own output work (STR063), then, where a later forward's
    embedding lookup ends the tail, the next forward's input preparation (STR062); returns the
    generic kernels left for the tail's default (sampling)."""
    run = _label_lm_head_epilogue(rows, run, p, q, stage, op_names, why, inputs)
    if q < len(rows) and stage[rows[q]] == "embedding":
        run = _label_next_forward_prologue(rows, run, p, q, stage, norm, why)
    return run


def _label_next_forward_prologue(
    rows: Sequence[int], run: list[int], p: int, q: int, stage: list[str], norm: Sequence[str], why: Any
) -> list[int]:
    """STR062: in a tail [p, q) that a later forward's embedding lookup ends, the generic kernels after its last
    device-to-host copy (the generation loop's stop check) are the next forward's input preparation;
    returns the generic kernels left for the tail's default."""
    if not norm:
        return run
    sync = next(
        (i for i in range(q - 1, p - 1, -1) if stage[rows[i]] == "memcpy" and "DtoH" in norm[rows[i]]), None
    )
    if sync is None:
        return run
    return _label_where(rows, run, lambda i: i > sync, stage, why, "elementwise", NEXT_FORWARD_PROLOGUE)


def _inner_norms(
    clusters: tuple[list[int], list[int]] | None,
    p: int,
    q: int,
    shape: dict[str, tuple[int, int]] | None,
    rows: Sequence[int],
    norm: Sequence[str],
    op_names: Sequence[str | None],
) -> set[int]:
    """Positions in [p, q) of the norms of the learned shape, but their write ops (not a cast)."""
    if not shape or clusters is None:
        return set()
    inside = _norm_windows(clusters, p, q, shape, rows, norm)
    return {i for i in inside if _OP_WRITES.get(op_names[rows[i]], 0) != STRONG_WRITE}


def _label_block_inner_norms(
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    clusters: tuple[list[int], list[int]],
    shape: dict[str, tuple[int, int]],
    norm: Sequence[str],
    stage: list[str],
    why: Any,
) -> list[int]:
    """STR067: between an attention kernel and its O projection, or inside an MLP before its down
    projection, the generic kernels a norm of the learned shape covers are that block's inner norm
    (a sub-LN); returns the generic kernels left for the region's default."""
    inside = _norm_windows(clusters, p, q, shape, rows, norm)
    if not inside:
        return run
    for i in run:
        if i in inside:
            stage[rows[i]] = "norm"
            why[rows[i]] = BLOCK_INNER_NORM
    return [i for i in run if i not in inside]


def _label_sandwich(
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    inside: set[int],
    stage: list[str],
    op_names: Sequence[str | None],
    norm: Sequence[str],
    why: Any,
) -> None:
    """Sandwich norms (Gemma): norms may come before and after the residual add (STR028)."""
    last = max(inside)
    for i in run:
        # a window's first kernel is the norm's leading cast: an add there is the residual add
        # before the norm (Mamba's fp32 residual: no cast, the add right before the pow)
        lead_add = i - 1 not in inside and _is_add(rows[i], op_names)
        if i in inside and not lead_add and not _between_fused_norms(rows, i, p, q, norm, op_names):
            stage[rows[i]] = "norm"
        elif i > last + 1 or (i == last + 1 and not _is_add(rows[i], op_names)):
            # after the region's last norm: the next block's input work (a post-norm block's
            # residual add comes right after its norm)
            stage[rows[i]] = "elementwise"
        elif _is_add(rows[i], op_names) or stage[rows[i]] == "residual_add":
            stage[rows[i]] = "residual_add"  # by op, or the rule's 16-bit add
        else:
            stage[rows[i]] = "elementwise"
        why[rows[i]] = SANDWICH_NORM
    if q < len(rows) and stage[rows[q]] == "moe_gate_gemm":
        # casts after the norm, right before the router's GEMM, are the router's (DeepSeek's router
        # multiplies in fp32)
        for i in reversed(run):
            if stage[rows[i]] != "elementwise" or i in inside:
                break
            stage[rows[i]] = "moe_topk"
            why[rows[i]] = ROUTER_CAST


def _label_router_casts(
    rows: Sequence[int], run: list[int], q: int, stage: list[str], op_names: Sequence[str | None], why: Any
) -> list[int]:
    """The casts right before a router's GEMM (ending the region at ``q``: its input and weight cast
    to float32 after a shared expert's down projection, ERNIE 4.5) are the router's (STR029);
    returns the generic kernels before them."""
    if q >= len(rows) or stage[rows[q]] != "moe_gate_gemm":
        return run
    k = len(run)
    while k and run[k - 1] == q - (len(run) - k) - 1 and op_names[rows[run[k - 1]]] in _COPY_OPS:
        k -= 1
    for i in run[k:]:
        stage[rows[i]] = "moe_topk"
        why[rows[i]] = ROUTER_CAST
    return run[:k]


def _label_residual_add(
    rows: Sequence[int], run: list[int], stage: list[str], op_names: Sequence[str | None], why: Any
) -> list[int]:
    """After the O or down projection the residual add opens the block, the input norm of the next
    block follows: the add is the residual; returns the generic kernels after it."""
    add = next((i for i in run if _is_add(rows[i], op_names)), None)
    if add is None:
        return run
    stage[rows[add]] = "residual_add"
    why[rows[add]] = RESIDUAL_ADD
    return [i for i in run if i > add]


def _attention_input_parts(
    rows: Sequence[int], run: list[int], p: int, q: int, stage: list[str]
) -> tuple[list[tuple[list[int], bool]], set[int]]:
    """The attention input's parts, split at GEMMs (MLA's kv decompression: the part before it ends
    at a GEMM, the last part at attention), each a list of its generic kernels and of the writes the
    op hints named already (``index_copy_`` ...), with the last part flagged; and those named writes."""
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
    return parts, named


def _label_attention_input(
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    stage: list[str],
    op_names: Sequence[str | None],
    norm: Sequence[str],
    why: Any,
    th: Thresholds,
    module_copy: np.ndarray | None = None,
) -> list[int]:
    """The KV-cache update and the attention's own input copies in the attention input (STR031-STR033,
    STR045; a copy of a module's own op, ``module_copy`` per kernel row, is none of its input copies);
    returns the generic kernels left for the region default."""
    parts, named = _attention_input_parts(rows, run, p, q, stage)
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
            STRONG_WRITE if i in named else _OP_WRITES.get(o, 0) for i, o in zip(part, ops, strict=True)
        )
        # without launching ops (a graph replay), stores are told by their kernel names, where the
        # attention's own input work follows them (STR045)
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
    if module_copy is not None:
        reads = {i for i in reads if not module_copy[rows[i]]}
    if not kv_rows and not reads:
        return run
    for i in kv_rows:
        stage[rows[i]] = "kv_cache_store"
        why[rows[i]] = kv_rule
    for i in reads:
        stage[rows[i]] = COMPOSED_ATTENTION
        why[rows[i]] = reads_rule
    return [i for i in run if i not in kv_rows and i not in reads]


def _label_attention_input_outside(
    rows: Sequence[int],
    run: list[int],
    p: int,
    q: int,
    inner: set[int],
    stage: list[str],
    op_names: Sequence[str | None],
    norm: Sequence[str],
    why: Any,
    th: Thresholds,
    module_copy: np.ndarray | None,
) -> list[int]:
    """The attention input's KV-cache update and input copies (:func:`_label_attention_input`) over
    the kernels of ``run`` outside ``inner``: a q / k norm's kernels (the learned norm shape around
    a norm cluster, STR041's) are neither RoPE's repeated sequence nor the cache's writes (a cat or a
    store the shape's tail reaches is a write still), and a module's own copies (``module_copy``,
    per kernel row) are no input copies (STR033); returns the kernels left for the region default."""
    seen = [i for i in run if i not in inner] if inner else run
    left = _label_attention_input(rows, seen, p, q, stage, op_names, norm, why, th, module_copy)
    return sorted({*left, *(i for i in run if i in inner)}) if inner else left


def _region_codes(
    d: Decisions, seq: np.ndarray, region_of: list[str], region_code: np.ndarray, generic_at: np.ndarray
) -> None:
    """A generic kernel no specific rule took is its region's: the region's rule code, though a
    region default may not have reached it (before a residual add). Found at once per region."""
    if not len(generic_at):
        return
    lut = np.full(int(region_code.max()) + 1, -1, np.int16)
    for reg in dict.fromkeys(region_of):
        rule = _REGION_RULE.get(reg)
        if rule is not None:
            lut[int(region_code[region_of.index(reg)])] = rule
    at = np.asarray(generic_at, np.int64)
    rule_at = lut[region_code[at]]
    rows_at = seq[at]
    free = rule_at >= 0
    if d.why.mine:
        free &= ~np.isin(rows_at, np.fromiter(d.why.mine, np.int64, len(d.why.mine)))
    for rule in np.unique(rule_at[free]).tolist():
        d.label(rows_at[free & (rule_at == rule)], None, rule)


# :func:`_write_kind` of each op that is not a named store, looked up once per kernel
_OP_WRITES = {op: _write_kind(False, op) for op in (*_KV_OPS, *_CACHE_READ_OPS)}
