"""The region defaults: generic kernels (a bare ATen add, copy or multiply) take the stage of the region
of a decoder layer they sit in (``rules/structure.toml`` ``[regions]``), refined by the norm, KV-cache,
rotary and MoE rules.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Any

import numpy as np

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
from analyzer.analyses.walk.positions import _cluster_bounds, _is_add, _norm_windows
from analyzer.analyses.walk.registry import (
    _ID,
    _REGION_RULE,
    COMPOSED_ATTENTION,
    DEFAULT_THRESHOLDS,
    GEMM_STAGES,
    KNOWLEDGE,
    MOE_BLOCK,
)
from analyzer.knowledge.structure_rules import Thresholds

SANDWICH_NORM = _ID("sandwich-norm")


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


# :func:`_write_kind` of each op that is not a named store, looked up once per kernel
_OP_WRITES = {op: _write_kind(False, op) for op in (*_KV_OPS, *_CACHE_READ_OPS)}
