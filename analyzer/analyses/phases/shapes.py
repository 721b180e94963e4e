"""A step's phase from its attention ops' recorded shapes, and the packed steps of a continuous batcher.

Contract: :func:`attention_shapes` reads the attention host ops (``rules/attention_ops.toml``) of
each trace once; :func:`_step_shapes` finds a step's first one. The rest work per step on those
shapes: the phase by the query and key lengths (:func:`phase_from_shape`), a packed step's phase
(:func:`phase_of_packed`) and decode tokens by request bookkeeping (:func:`packed_decode_tokens`),
the steps the shapes cannot tell (:func:`_every_token_scored`, :func:`_padded_or_replayed`), and
the prefills of a run without a KV cache that are decodes (:func:`recomputed_prefix`, which
relabels in place).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.analyses.phases.registry import (
    DEFAULT_THRESHOLDS,
    RECOMPUTED_PREFIX,
    SHAPE_ONE_TOKEN,
    SHAPE_PREFILL,
    SHAPE_VERIFY,
)
from analyzer.knowledge.attention_ops import AttentionOps
from analyzer.tables import launches
from analyzer.tables.dictionaries import dict_strings


def attention_shapes(
    host_ops: pa.Table, table: AttentionOps, attention_launchers: np.ndarray
) -> dict[int, dict[str, np.ndarray]]:
    """Per trace, the attention host ops of ``table`` with recorded input shapes, in start order:
    ``start``, ``ext`` (external id, -1: none), ``batch`` (-1: packed), ``q`` (query length),
    ``kv`` (key length, -1: unknown), ``layout`` (the layout's id), ``head`` (head size, -1: unknown)
    and ``scores`` (a composed layout: ``kv`` is the scores' last dimension, which a sink column
    concatenated before the softmax widens by one).

    Each op is read by its own layout (``rules/attention_ops.toml``): the backends put the query
    length in different dimensions. An op of a ``composed`` layout (a plain matmul) counts only
    where it encloses one of ``attention_launchers`` (the host-op rows that launched attention
    kernels: the matmul's own bmm)."""
    if host_ops.num_rows == 0 or "input_dims" not in host_ops.column_names:
        return {}
    names = dict_strings(host_ops["name"])
    layouts = [table.layout(n) for n in names.dictionary.to_pylist()]
    known = np.asarray([lay is not None for lay in layouts] + [False], bool)
    composed = np.asarray([lay is not None and lay.composed for lay in layouts] + [False], bool)
    codes = names.indices.fill_null(len(layouts)).to_numpy(zero_copy_only=False)
    wanted = known[codes]
    maybe = np.flatnonzero(wanted & composed[codes])
    if len(maybe):
        # a composed layout's op counts where it encloses an attention kernel's launching op
        inside = launches.enclosing_op(host_ops, maybe, attention_launchers)
        wanted[maybe] = False
        wanted[maybe[np.unique(inside[inside >= 0])]] = True
    rows = np.flatnonzero(wanted)
    if len(rows) == 0:
        return {}
    sel = host_ops.select(["trace_id", "external_id", "start_ns"]).take(pa.array(rows))
    group_names, first, inverse = launches.distinct_op_shapes(host_ops, rows)
    dims_of = host_ops["input_dims"].take(pa.array(rows[first])).to_pylist()
    group_layouts = [
        table.layout(nm, d) if nm is not None else None for nm, d in zip(group_names, dims_of, strict=True)
    ]
    read = [_read_layout(lay, d) for lay, d in zip(group_layouts, dims_of, strict=True)]
    ok = np.array([r is not None for r in read], bool)[inverse]
    trace = sel["trace_id"].to_numpy(zero_copy_only=False)
    start = sel["start_ns"].to_numpy(zero_copy_only=False)
    ok &= ~pd.isna(start)
    if not ok.any():
        return {}
    vals = np.array([r if r is not None else (0, 0, 0, 0) for r in read], np.int64)[inverse]
    lay_id = np.array([lay.id if lay else "" for lay in group_layouts], object)[inverse]
    scores = np.array([bool(lay and lay.composed) for lay in group_layouts], bool)[inverse]
    ext = sel["external_id"].fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    out = {}
    for t in np.unique(trace[ok]).tolist():
        m = np.flatnonzero(ok & (trace == t))
        m = m[np.argsort(start[m].astype(np.int64), kind="stable")]
        out[int(t)] = {
            "start": start[m].astype(np.int64),
            "ext": ext[m],
            "batch": vals[m, 0],
            "q": vals[m, 1],
            "kv": vals[m, 2],
            "layout": lay_id[m],
            "head": vals[m, 3],
            "scores": scores[m],
        }
    return out


def _read_layout(lay: Any, dims: Any) -> tuple[int, int, int, int] | None:
    """(batch, query length, key length, head size) of one attention op's input shapes by its
    layout (:meth:`~analyzer.knowledge.attention_ops.AttentionLayout.read`; -1: not given), or None
    when the shapes do not fit the layout."""
    got = lay.read(dims) if lay is not None else None
    return None if got is None else (got.batch, got.q, got.kv, got.head)


def _launchers_of(
    kernels: pa.Table, host_ops: pa.Table, which: np.ndarray, join: launches.OpJoin | None = None
) -> np.ndarray:
    """The host-op rows that launched the kernels ``which`` marks (their innermost launching op)."""
    rows = np.flatnonzero(which)
    found = launches.joined(kernels, host_ops, join) if len(rows) else None
    if found is None:
        return np.empty(0, np.int64)
    ops, pos = found
    at = pos.take(pa.array(rows))
    at = at.filter(at.is_valid())
    return np.unique(ops["row"].take(at).to_numpy(zero_copy_only=False).astype(np.int64))


def _step_shapes(
    seg: np.ndarray, df: Any, shapes: dict[str, np.ndarray] | None
) -> tuple[int, int, int, tuple[int, int], bool] | None:
    """(batch, query length, key length, model key, whether the key length is the scores') of one
    step's first attention op, else None.

    The ops are the step's by host time (their start within the launch calls of the step's
    kernels), so ops that launch no kernel themselves (the SDPA front end above its backend, the
    math backend above its matmuls) count too; without launch calls, by the attention kernels'
    launching op. The model key is the number of attention ops of that layout and their head size."""
    if not shapes:
        return None
    if df["launched"][seg].any():
        launch = df["launch"][seg][df["launched"][seg]]
        lo = np.searchsorted(shapes["start"], int(launch.min()), side="left")
        hi = np.searchsorted(shapes["start"], int(launch.max()), side="right")
        pos = np.arange(lo, hi)
    else:
        att = seg[df["is_attn"][seg]]
        ext = df["ext"][att]
        ext = ext[ext == ext].astype(np.int64) if len(ext) else np.empty(0, np.int64)  # NaN: no host op
        pos = np.flatnonzero(np.isin(shapes["ext"], ext) & (shapes["ext"] >= 0))
    if len(pos) == 0:
        return None
    first = int(pos[0])
    same = int((shapes["layout"][pos] == shapes["layout"][first]).sum())
    key = (same, int(shapes["head"][first]))
    scores = bool(shapes["scores"][first]) if "scores" in shapes else False
    return int(shapes["batch"][first]), int(shapes["q"][first]), int(shapes["kv"][first]), key, scores


# a decode step scores this many query tokens per sequence at most (one, or a speculation's
# candidates being verified); a longer continuation of a cached sequence is a prefill chunk
MAX_VERIFY_TOKENS = int(DEFAULT_THRESHOLDS.max_verify_tokens)


def phase_from_shape(
    batch: int, q: int, kv: int, max_verify: int = MAX_VERIFY_TOKENS, scores: bool = False
) -> str:
    """Phase of a step from its attention op's query length ``q`` and key length ``kv`` (-1: unknown):
    one query token per sequence is decode; a few tokens appended to a longer cached context are
    a speculation being verified (decode); a query as long as its keys, or a long chunk, is prefill.
    ``scores``: ``kv`` is the scores' width, which one sink column per head widens (gpt-oss
    concatenates its sinks before the softmax): a query with one key more than its tokens there is
    a prefill over its own keys, not a verify over a one-token context."""
    if q == 1:
        return "decode"
    if 0 < q < kv - scores and q <= max_verify:
        return "decode"
    return "prefill"


def _shape_rule(q: int, kv: int, max_verify: int, scores: bool = False) -> str:
    """The id of the rule :func:`phase_from_shape` decided by."""
    if q == 1:
        return SHAPE_ONE_TOKEN
    if 0 < q < kv - scores and q <= max_verify:
        return SHAPE_VERIFY
    return SHAPE_PREFILL


def _is_packed(batch: int, q: int, rows_out: int) -> bool:
    """Several sequences packed into one attention call (continuous batching: HF's paged attention,
    varlen kernels): the LM head scores more rows than the attention op has sequences, and fewer
    than its query tokens (a forward that scores every position, full-logits prefill or a
    speculation's verify, is one sequence per attention batch row, not a packing)."""
    return rows_out > 1 and rows_out > max(batch, 1) and rows_out < q * max(batch, 1)


def phase_of_packed(q: int, kv: int, rows_out: int) -> str:
    """Phase of a packed step from its total query tokens ``q``, total keys ``kv`` (-1: unknown) and
    the rows the LM head scores (one per sequence): no cached context is a prefill of new prompts;
    at most one token per sequence is decode; otherwise the step appends prompt chunks to cached
    sequences beside other sequences, which a continuous batcher schedules with decodes: mixed
    (``docs/accuracy.md`` names the case it gets wrong: several prompt chunks and no decode)."""
    if 0 < kv <= q:
        return "prefill"
    if q <= rows_out:
        return "decode"
    return "mixed"


def packed_decode_tokens(
    steps: Sequence[tuple[int, int, int] | None], packed: Sequence[bool]
) -> list[int | None]:
    """Decode tokens of each packed step by request bookkeeping; None where it cannot be told.

    ``steps``: per step in time order, (query tokens, key tokens, LM-head rows) or None. A packed
    step's keys less its queries are the cached context of the requests it continues; when that
    equals the previous step's keys, every request of the previous step continues (one LM-head row
    each) and the rest are new prompts. A continued request decodes unless its prompt was cut at the
    previous step's end: a continuous batcher fills a token budget (the largest step) with decodes
    first and prompt chunks after, so only a step that filled the budget leaves one prompt cut. A
    step with no cached context is a prefill (0); one token per row is decode. Where requests
    finished in between, or the counts contradict each other, the split stays undecided (None)."""
    known = [t[0] for t in steps if t is not None and t[0] > 0]
    budget = max(known, default=0)
    # a token budget shows as a cap that several steps reach; without that evidence a full-sized step
    # may or may not have cut a prompt, and the split after it stays undecided
    capped = known.count(budget) >= 2
    out: list[int | None] = [None] * len(steps)
    for i, (t, pk) in enumerate(zip(steps, packed, strict=True)):
        if t is None or not pk:
            continue
        q, kv, rows = t
        if q <= 0 or rows <= 0:
            continue
        ph = phase_of_packed(q, kv, rows)
        if ph != "mixed":  # no cached context, or one token per row
            out[i] = 0 if ph == "prefill" else q
            continue
        prev = steps[i - 1] if i > 0 else None
        if prev is None or kv < 0 or prev[1] <= 0 or prev[2] <= 0 or kv - q != prev[1]:
            continue
        prev_decode = out[i - 1] if packed[i - 1] else (0 if prev[0] > prev[2] else prev[0])
        full = prev[0] == budget and (prev_decode is None or prev_decode < prev[0])
        if full and not capped:
            continue
        cut = int(full)
        continued = prev[2]
        decode, new = continued - cut, rows - continued
        if decode >= 0 and new >= 0 and q - decode >= new + cut:
            out[i] = decode
    return out


def _every_token_scored(
    hits: Sequence[tuple[int, int, int, tuple[int, int]] | None], rows_out: Sequence[int]
) -> list[bool]:
    """Per step: one sequence (or a batch unknown) of several query tokens over a cached context
    whose every token the LM head scores: a continuous batcher's step of decodes alone (one token
    per request, packed), or one sequence continued with every logit kept (a speculation's verify,
    a perplexity window)."""
    return [
        h is not None and h[0] <= 1 and 1 < h[1] < h[2] and r == h[1]
        for h, r in zip(hits, rows_out, strict=True)
    ]


def _padded_or_replayed(
    segments: list[np.ndarray],
    df: Any,
    hits: Sequence[tuple[int, int, int, tuple[int, int]] | None],
    packed: Sequence[bool],
) -> list[int]:
    """Steps of a continuous batcher whose phase the trace cannot show: packed steps whose key
    length is the same on every one of them (two or more: padded to the cache's size), and, in a
    run with packed steps, graph replays without shapes."""
    at = [i for i, pk in enumerate(packed) if pk and hits[i] is not None]
    if not at:
        return []
    keys = {hits[i][2] for i in at}  # type: ignore[index]
    longest = max(hits[i][1] for i in at)  # type: ignore[index]
    # the same key length on every packed step, longer than any step's queries (not new prompts)
    padded = len(at) >= 2 and len(keys) == 1 and min(keys) > longest
    out = list(at) if padded else []
    for i, seg in enumerate(segments):
        if hits[i] is None and len(seg) and df["graph"][seg].mean() > 0.5:
            out.append(i)
    return sorted(out)


def recomputed_prefix(
    hits: Sequence[tuple[int, int, int, Any] | None],
    packed: Sequence[bool],
    phases: list[str | None],
    rules: list[str],
    evidence: list[list[str]],
) -> list[int]:
    """PHS035: a model run without a KV cache recomputes every sequence at each step. A step whose
    shapes say prefill (its query as long as its keys: no cached context) but whose query is the
    previous such step's plus one token per sequence, with the same batch and model, is that
    previous step continued by one generated token: a decode step (its tokens: every token it
    runs, as the engine's own step says). The first step of such a run stays the prefill. Returns
    the steps relabelled."""
    out = []
    for i in range(1, len(hits)):
        h, g = hits[i], hits[i - 1]
        if h is None or g is None or packed[i] or packed[i - 1] or rules[i] != SHAPE_PREFILL:
            continue
        if rules[i - 1] not in (SHAPE_PREFILL, RECOMPUTED_PREFIX):
            continue
        same = h[0] == g[0] and h[0] > 0 and h[3] == g[3]
        if same and h[1] == g[1] + 1 and h[2] == h[1] and g[2] == g[1]:
            phases[i] = "decode"
            evidence[i].append(rules[i])
            rules[i] = RECOMPUTED_PREFIX
            out.append(i)
    return out
