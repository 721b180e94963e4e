"""The sweep's layer cut: how many layers of a model's config keep one full period of its layer pattern.

**The layer cut** (:func:`layer_plan`). The layer count becomes the shortest prefix that holds one
full period of the model's layer pattern after its leading exception (``k + p``: the smallest
``k + p`` such that layer ``i`` is like layer ``i - p`` for every ``i >= k + p``), at least 2 and
at most :data:`MAX_LAYERS`. The pattern is read from the config, never from the family's name:

* every list of the config as long as the layer count (``layer_types``, ``mlp_layer_types``,
  ``no_rope_layers``, ``layers_block_type``, ``attention_layers``, per-layer sizes ...) and every
  string of that length (a hybrid pattern such as ``M-M*-``) is one component of a layer's kind;
* an increasing list of layer indices (``moe_layers``, ``full_attn_idxs``, ``mlp_only_layers``,
  ``cross_attention_layers``, ...: a name ending in ``layers``, ``idxs`` or ``indices``) is one
  component (in the list or not);
* an integer named like a period (``*period``, ``*interval``, ``*_step``, ``*every*``, ``*freq``,
  ``*pattern``: ``sliding_window_pattern``, ``attn_layer_period``, ``decoder_sparse_step``,
  ``no_rope_layer_interval`` ...) of 2 or more adds ``i mod value``;
* a count of leading dense layers (``first_k_dense_replace``, ``num_dense_layers``) adds
  ``i < value``; a short list named ``*types`` that the layers cycle through (``block_types``)
  adds ``i mod len``;
* a count of trailing layers (``num_kv_shared_layers``) is cut to one period of its own, after the
  rest.

The cut config gets the first ``L`` entries of each per-layer list and the indices below ``L`` of
each index list; periods and leading counts stay.

Pure functions of config dicts; no import of torch or transformers.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: the most layers a cut keeps (a longer pattern is cut here, and the meta says so)
MAX_LAYERS = 12

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "num_blocks")
_NOT_LAYER_LIST = {"model_type", "transformers_version", "_name_or_path"}
_INDEX_LIST = re.compile(r"(layers|idxs|indices|layer_ids)$")
_PERIOD = re.compile(r"(period|interval|_step$|every|freq|pattern)")
_NOT_PERIOD = re.compile(r"^(time_step|step_kernel|max_window)")
_LEADING = re.compile(r"^(first_k_dense_replace|num_dense_layers|first_k_dense|n_dense_layers)$")
_TRAILING = re.compile(r"^num_kv_shared_layers$")
_CYCLE = re.compile(r"types$")


def layer_keys(d: dict[str, Any]) -> list[str]:
    """The config's layer-count keys, the one that counts the decoder's layer list first (the smallest:
    a config may also count sub-layers, e.g. two attention blocks per layer)."""
    keys = [k for k in _LAYER_KEYS if is_int(d.get(k)) and d[k] > 0]
    return sorted(keys, key=lambda k: (d[k], _LAYER_KEYS.index(k)))


def is_int(v: Any) -> bool:
    """An int that is not a bool (config values mix both)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _index_list(key: str, v: Any, n: int) -> bool:
    return (
        bool(_INDEX_LIST.search(key))
        and isinstance(v, list)
        and all(is_int(x) for x in v)
        and all(0 <= x < n for x in v)
        and all(a < b for a, b in zip(v, v[1:], strict=False))
    )


def _per_layer(key: str, v: Any, n: int) -> bool:
    if key in _NOT_LAYER_LIST or n <= 2:
        return False
    if isinstance(v, str):  # a pattern string such as "M-M*-", never a word
        return len(v) == n and not any(c.islower() or c == "." for c in v)
    return isinstance(v, (list, tuple)) and len(v) == n


def _components(
    d: dict[str, Any], key: str, n: int
) -> tuple[list[tuple[str, list[Any]]], list[str], list[str], list[str]]:
    comps: list[tuple[str, list[Any]]] = []
    per_layer, index_lists, trailing = [], [], []
    for k, v in sorted(d.items()):
        if k in _LAYER_KEYS or v is None or isinstance(v, dict):
            continue
        if _index_list(k, v, n):
            index_lists.append(k)
            s = set(v)
            comps.append((k, [i in s for i in range(n)]))
        elif _per_layer(k, v, n):
            per_layer.append(k)
            comps.append((k, [json.dumps(x) if isinstance(x, (list, dict)) else x for x in v]))
        elif is_int(v) and _PERIOD.search(k) and not _NOT_PERIOD.search(k) and v >= 2:
            comps.append((k, [i % v for i in range(n)]))
        elif is_int(v) and _LEADING.match(k) and v > 0:
            comps.append((k, [i < v for i in range(n)]))
        elif is_int(v) and _TRAILING.match(k) and 0 < v < n:
            trailing.append(k)
        elif isinstance(v, list) and _CYCLE.search(k) and 1 < len(v) < n:
            comps.append((k, [json.dumps(v[i % len(v)]) for i in range(n)]))
    return comps, per_layer, index_lists, trailing


def cut_length(sig: list[Any]) -> tuple[int, int]:
    """``(k + p, p)``: the shortest prefix of ``sig`` that holds every kind of layer of ``sig`` and ends
    with one full period ``sig[k:k + p]`` that the layers after it repeat (checked up to layer
    ``max(16, k + 4p)``: a pattern may end irregularly, e.g. a hybrid's last attention layers)."""
    kinds = set(sig)
    for total in range(1, len(sig) + 1):
        if set(sig[:total]) != kinds:
            continue
        for p in range(1, total + 1):
            end = min(len(sig), max(16, total + 3 * p))
            if all(sig[i] == sig[i - p] for i in range(total, end)):
                return total, p
    return len(sig), len(sig)


def layer_plan(d: dict[str, Any]) -> dict[str, Any]:
    """``{"layers": L, "overrides": {...}, "components": [...], "note": str}`` for one (text) config dict;
    sub-configs (``*_config``) with layers of their own are cut the same way."""
    over: dict[str, Any] = {}
    notes, components = [], []
    for k, v in sorted(d.items()):
        if isinstance(v, dict) and k.endswith("_config") and layer_keys(v):
            sub = layer_plan(v)
            if sub["overrides"]:
                over[k] = sub["overrides"]
            components += [f"{k}.{c}" for c in sub["components"]]
            if sub["note"]:
                notes.append(f"{k}: {sub['note']}")
    keys = layer_keys(d)
    if not keys:
        return {"layers": None, "default_layers": None, "overrides": over, "components": components,
                "note": "; ".join(notes)}  # fmt: skip
    key = keys[0]
    n = int(d[key])
    comps, per_layer, index_lists, trailing = _components(d, key, n)
    head = n - max((int(d[k]) for k in trailing), default=0)
    sig = [tuple(c[1][i] for c in comps) for i in range(head)]
    best, period = cut_length(sig) if sig else (1, 1)
    layers = max(2, best)
    if trailing:
        layers += period
    if layers > MAX_LAYERS:
        notes.append(f"the pattern needs {layers} layers: cut at {MAX_LAYERS}")
        layers = MAX_LAYERS
    layers = min(layers, n)
    if layers != n:
        over[key] = layers
        for k in keys[1:]:
            over[k] = max(1, round(d[k] * layers / n))
        for k in per_layer:
            over[k] = d[k][:layers]
        for k in index_lists:
            over[k] = [i for i in d[k] if i < layers]
        for k in trailing:
            over[k] = min(int(d[k]), period)
    return {
        "layers": layers,
        "default_layers": n,
        "overrides": over,
        "components": [c[0] for c in comps] + trailing + components,
        "note": "; ".join(notes),
    }
