"""Provider attribution where kernel names collide: the provider of a shared name from its context.

Contract (pure over the kernels' columns, the launching host ops and :class:`ProviderFacts`, the
validated ``rules/providers.toml``, whose header is the spec):

* Only kernels whose rule is listed under ``[[shared]]`` change; every other kernel keeps the
  provider its rule gave (a GEMM launched by ``aten::mm`` stays hipBLASLt's).
* For a shared kernel, first hit wins: a ``named`` marker in its normalized name; the provider its
  launching host op names (``[ops]``), when that is one of the entry's providers; the one entry
  provider the host ops of its input name, when exactly one is named; the entry's ``origin`` when
  the input's host ops name providers but none of the entry's (a framework running the library's
  own code, such as transformers calling flash-linear-attention); else ``unknown``.
* Decided once per distinct (input, rule, name, launching op) and mapped back (no loop per kernel).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.knowledge.provider_ops import ProviderFacts
from analyzer.tables.dictionaries import dict_isin, dict_strings

__all__ = ["UNKNOWN", "attribute_providers", "providers_from_context", "run_providers"]

UNKNOWN = "unknown"


def attribute_providers(
    kernels: pa.Table,
    cols: dict[str, Any],
    op_names: Sequence[str | None],
    host_ops: pa.Table,
    facts: ProviderFacts | None,
) -> pa.Array:
    """The provider column of classification (``cols``: ``rule_id``, ``norm_name``, ``provider`` by
    name, per row of ``kernels``; ``op_names`` the launching op per row) with shared names decided
    from context. ``facts`` None: unchanged."""
    if facts is None or not facts.shared:
        return cols["provider"]
    return providers_from_context(
        kernels["trace_id"], cols["rule_id"], cols["norm_name"], cols["provider"], op_names,
        lambda: run_providers(host_ops, facts), facts,
    )  # fmt: skip


def run_providers(host_ops: pa.Table, facts: ProviderFacts) -> dict[int, frozenset[str]]:
    """Per input (``trace_id``): the providers its cpu_ops' names say (``[ops]``), each name once."""
    if host_ops.num_rows == 0:
        return {}
    ops = host_ops
    if "category" in ops.column_names:
        ops = ops.filter(pa.array(dict_isin(ops["category"], ["cpu_op"])))
    names = dict_strings(ops["name"])
    per_name = [facts.op_provider(n) for n in names.dictionary.to_pylist()]
    said = np.array([p is not None for p in per_name], bool)
    idx = names.indices.to_numpy(zero_copy_only=False)
    keep = said[idx]
    if not keep.any():
        return {}
    pairs = pd.DataFrame(
        {"t": ops["trace_id"].to_numpy(zero_copy_only=False)[keep], "n": idx[keep]}
    ).drop_duplicates()
    out: dict[int, set[str]] = {}
    for t, n in zip(pairs["t"].tolist(), pairs["n"].tolist(), strict=True):
        out.setdefault(int(t), set()).add(per_name[n])  # type: ignore[arg-type]
    return {t: frozenset(v) for t, v in out.items()}


def providers_from_context(
    trace_id: Any,
    rule_id: Any,
    norm_name: Any,
    provider: Any,
    host_op: Sequence[str | None] | Any,
    run: dict[int, frozenset[str]] | Any,
    facts: ProviderFacts,
) -> pa.Array:
    """The provider per row (a dictionary string array). ``host_op``: the launching op's name per
    row (None: none recorded); ``run``: :func:`run_providers` of the host ops, or a callable giving
    it (asked only when a shared kernel has no deciding op)."""
    rid = dict_strings(_arrow(rule_id))
    shared = dict_isin(rid, list(facts.shared))
    prov = dict_strings(_arrow(provider))
    if not shared.any():
        return prov
    rows = np.flatnonzero(shared)
    take = pa.array(rows)
    names = dict_strings(_arrow(norm_name))
    frame = pd.DataFrame(
        {
            "t": np.asarray(_arrow(trace_id).take(take).to_numpy(zero_copy_only=False), np.int64),
            "r": rid.indices.take(take).to_numpy(zero_copy_only=False),
            "n": names.indices.take(take).to_numpy(zero_copy_only=False),
            "o": pd.factorize(np.asarray(_ops_at(host_op, rows), object), use_na_sentinel=False)[0],
        }
    )
    first = ~frame.duplicated().to_numpy()
    combo = frame.groupby(["t", "r", "n", "o"], sort=False).ngroup().to_numpy()
    uniq_rows = rows[first]  # one row per distinct combination, in the order ngroup numbers them
    uniq_combo = combo[first]
    rid_u = rid.take(pa.array(uniq_rows)).to_pylist()
    name_u = names.take(pa.array(uniq_rows)).to_pylist()
    trace_u = _arrow(trace_id).take(pa.array(uniq_rows)).to_pylist()
    op_u = _ops_at(host_op, uniq_rows)
    run_cache: list[dict[int, frozenset[str]]] = []

    def run_of(t: int) -> frozenset[str]:
        if not run_cache:
            run_cache.append(run() if callable(run) else (run or {}))
        return run_cache[0].get(int(t), frozenset())

    decided = np.empty(len(uniq_rows), object)
    for i, (r, n, t, op) in enumerate(zip(rid_u, name_u, trace_u, op_u, strict=True)):
        entry = facts.shared[r]
        got = entry.named_provider(n or "")
        if got is None:
            ctx = facts.op_provider(op)
            if ctx in entry.providers:
                got = ctx
        if got is None:
            ran = run_of(t)
            said = ran & set(entry.providers)
            if len(said) == 1:
                got = next(iter(said))
            elif not said and ran and entry.origin is not None:
                got = entry.origin
            else:
                got = UNKNOWN
        decided[uniq_combo[i]] = got
    values = pa.array(decided[combo].tolist(), pa.string())
    out = pc.replace_with_mask(prov.cast(pa.string()), pa.array(shared), values)
    return dict_strings(out)


def _arrow(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    return pa.array(values)


def _ops_at(host_op: Any, rows: np.ndarray) -> list[str | None]:
    """The launching op names at ``rows``."""
    if isinstance(host_op, (pa.Array, pa.ChunkedArray)):
        return _arrow(host_op).take(pa.array(rows)).to_pylist()
    return np.asarray(host_op, object)[rows].tolist() if len(rows) else []
