"""The brief's KV cache (issue 37): its layout (paged or contiguous) and block size, the GQA group,
its dtype and the bytes per token, each from the evidence the trace holds (kernel names, the cache
writes' destination shapes and input types, the model's sizes found) or ``unknown`` with the reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from analyzer.analyses.brief.facts import KV_STORE
from analyzer.analyses.brief.values import DTYPE_BYTES, known, unknown
from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES

_PAGED_WORDS = ("paged", "reshape_and_cache", "page_", "_page", "kv_cache_paged")


def kv_cache(
    facts: Mapping[str, Any],
    present: Collection[str],
    cache_names: Iterable[str],
    dims: Mapping[str, Any],
    dtypes: Mapping[str, Any],
) -> dict[str, Any]:
    """The KV cache: its layout and block size, the GQA group, its dtype and the bytes per token."""
    mla = "mla_attention" in present
    layout, block = _kv_layout(facts, present, cache_names, dims, mla)
    kv_dtype, dtype_ev = _kv_dtype(dtypes)
    return {
        "layout": layout,
        "block_size": block,
        "gqa_group": _gqa_group(dims, mla),
        "dtype": known(kv_dtype, dtype_ev)
        if kv_dtype
        else unknown("no cache write or attention op with recorded input types"),
        "bytes_per_token": _kv_bytes_per_token(dims, mla, kv_dtype, dtype_ev),
    }


def _kv_layout(
    facts: Mapping[str, Any],
    present: Collection[str],
    cache_names: Iterable[str],
    dims: Mapping[str, Any],
    mla: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cache's layout (paged or contiguous) and block size, from kernel names and the writes'
    destination shapes."""
    writes = facts.get("ops", {}).get(KV_STORE, [])
    paged_names = sorted({n for n in cache_names if any(w in n.lower() for w in _PAGED_WORDS)})
    paged_stage = "paged_attention" in present
    layout: dict[str, Any]
    block = unknown("no paged cache's block shape is recorded")
    hd = dims.get("head_dim", {}).get("value")
    dest3 = [w for w in writes if w.get("dest") and len(w["dest"].split("x")) == 3]
    dest4 = [w for w in writes if w.get("dest") and len(w["dest"].split("x")) == 4]
    cat = [w for w in writes if w["op"] == "aten::cat"]
    if paged_names or paged_stage:
        shown = paged_names[:2] or ["a paged_attention kernel"]
        layout = known("paged", f"kernel names: {', '.join(shown)}")
        for w in dest4:
            d = [int(x) for x in w["dest"].split("x")]
            if hd and d[-1] == hd:
                block = known(
                    d[1],
                    f"the paged cache written as [{w['dest'].replace('x', ', ')}] (blocks, block size, KV heads, head size)",
                )
                break
    elif cat and not dest3:
        layout = known("contiguous", "aten::cat grows each layer's keys and values (a dynamic cache)")
        block = known(None, "contiguous: no blocks")
    elif dest3 and hd and all(int(w["dest"].split("x")[-1]) == hd for w in dest3):
        w = dest3[0]
        layout = known(
            "paged",
            f"{w['op']} writes each token into a slot of one flat cache [{w['dest'].replace('x', ', ')}] (slots, KV heads, head size): a paged / slot-indexed cache",
        )
        block = unknown("a flat slot-indexed cache: its block size is not in the shapes")
    elif dest4 := [w for w in dest4 if w["op"] != "aten::cat"]:
        w = dest4[0]
        layout = known(
            "contiguous", f"{w['op']} writes into a per-sequence cache [{w['dest'].replace('x', ', ')}]"
        )
        block = known(None, "contiguous: no blocks")
    elif mla:
        layout = unknown("latent (MLA) attention: the cache's layout is not in the recorded shapes")
    else:
        layout = unknown("no cache write with recorded shapes and no paged kernel name")
    return layout, block


def _gqa_group(dims: Mapping[str, Any], mla: bool) -> dict[str, Any]:
    """Query heads per KV head."""
    heads, kv = dims.get("heads", {}).get("value"), dims.get("kv_heads", {}).get("value")
    if mla:
        return unknown("latent (MLA) attention caches one compressed latent per token, not KV heads")
    if heads and kv:
        return known(
            heads // kv if heads % kv == 0 else heads / kv,
            f"{heads} query heads over {kv} KV heads ({'MHA' if heads == kv else 'MQA' if kv == 1 else 'GQA'})",
        )
    return unknown("heads or KV heads unknown")


def _kv_dtype(dtypes: Mapping[str, Any]) -> tuple[str | None, str]:
    """The cache's dtype and its evidence: the cache writes', else the attention ops' key dtype."""
    written = dtypes.get(KV_STORE, {}).get("value")
    if written and written.get("written") in DTYPE_BYTES:
        return written["written"], "the cache writes' dtype"
    for s in ATTENTION_KERNEL_STAGES:
        v = dtypes.get(s, {}).get("value")
        if v and v.get("key") in DTYPE_BYTES:
            return v["key"], f"the {s} ops' key dtype"
    return None, ""


def _kv_bytes_per_token(
    dims: Mapping[str, Any], mla: bool, kv_dtype: str | None, dtype_ev: str
) -> dict[str, Any]:
    """2 x layers x KV heads x head size x dtype bytes (key and value head sizes apart where they
    differ), per rank."""
    layers, kv = dims.get("layers", {}).get("value"), dims.get("kv_heads", {}).get("value")
    hd, vhd = dims.get("head_dim", {}).get("value"), dims.get("value_head_dim")
    if mla:
        return unknown(
            "latent (MLA) attention: bytes per token are the latent's, not 2 x KV heads x head size"
        )
    if layers and kv and hd and kv_dtype and vhd and vhd != hd:
        return known(
            layers * kv * (hd + vhd) * DTYPE_BYTES[kv_dtype],
            f"{layers} layers x {kv} KV heads x ({hd} key + {vhd} value head size, as the attention ops read "
            f"them) x {DTYPE_BYTES[kv_dtype]} bytes ({kv_dtype}: {dtype_ev}), per rank",
        )
    if layers and kv and hd and kv_dtype:
        return known(
            2 * layers * kv * hd * DTYPE_BYTES[kv_dtype],
            f"2 x {layers} layers x {kv} KV heads x {hd} head size x {DTYPE_BYTES[kv_dtype]} bytes ({kv_dtype}: {dtype_ev}), per rank",
        )
    missing = [
        n
        for n, v in (("layers", layers), ("KV heads", kv), ("head size", hd), ("KV dtype", kv_dtype))
        if not v
    ]
    return unknown(f"{', '.join(missing)} unknown")
