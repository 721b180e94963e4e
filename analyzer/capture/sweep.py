"""The sweep: every decoder-only causal-LM model type of the installed transformers, captured with truth.

Where the zoo (:mod:`analyzer.capture.zoo`) holds hand-made toy configurations of a few families,
the sweep takes every model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and builds it from its
config class's defaults, changed only where a rule below says so, and captures it with
:func:`analyzer.capture.hf.capture` like the zoo (truth ranges, step annotations, bf16, random
weights, built on the device, one warm-up run, then one profiled ``generate``).

**Which types.** A type of the causal-LM mapping is swept unless one of these holds, checked in
this order (:func:`classify_type`):

1. *encoder-decoder*: its config's default ``is_encoder_decoder`` is true, it is in a seq-to-seq
   mapping, or its causal-LM class takes the ``decoder_config`` of a composite config (the decoder
   half of an encoder-decoder model);
2. *encoder-only*: it is also in ``MODEL_FOR_MASKED_LM_MAPPING_NAMES`` (a bidirectional encoder
   whose causal-LM class is the encoder run with ``is_decoder=True``);
3. *multimodal-only*: its causal-LM class is a ``*ForConditionalGeneration`` (a model of image or
   audio and text; its text decoder is a type of its own in the mapping);
4. *alias*: its causal-LM class's config class belongs to another type of the mapping (``gpt-sw3``
   is ``gpt2`` with its own tokenizer, ``qwen3_5`` the text model ``qwen3_5_text`` ...): swept once,
   under that type.

A swept type that cannot be captured is skipped with the error quoted: it needs a download, a
package that cannot be carried, or it fails to build or run in transformers itself.

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

**The size cap** (:func:`size_plan`): at most :data:`CAPS` ``["params_per_layer"]`` parameters per
decoder layer (the model's parameters without its embeddings and LM head, over the layers it has)
and at most ``["experts"]`` routed experts (an expert loop launches kernels per expert: the cap
keeps the trace small) and ``["vocab"]`` entries in each vocabulary. Over the cap, the routed
experts are cut first, then the widths shrink together by one factor: hidden size, attention
heads (the key/value heads by the factor, the query heads by the GQA ratio, so the ratio stays),
linear-attention and SSM heads, every intermediate size; head dimensions, LoRA ranks, state sizes
and convolution widths stay. Expert counts stay a multiple of the expert groups and at least twice
the top-k. ``--tiny`` uses far smaller caps to try every type on a CPU in minutes.

``python -m analyzer.capture.sweep OUT_DIR [--jobs N] [--only TYPE,...] [--device cuda|cpu] [--tiny]
[--xz] [--timeout S]`` captures each type in a process of its own (a crash or a hang costs only that
type) into ``OUT_DIR/<type>/trace.json.gz`` (``.xz`` with ``--xz``) + ``meta.json``, and keeps
``OUT_DIR/sweep.json`` up to date as types finish: every type of the mapping with its status
(``captured``, ``skipped``, ``excluded``, ``alias``), its reason or error, its config overrides,
layers and parameter counts. ``--plan`` only decides and builds each config on the meta device (no
capture); ``--store FROM`` copies a sweep's output FROM into OUT_DIR the way ``fixtures/sweep``
keeps it. Imports torch and transformers only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: the sweep's capture settings (a prefill of BATCH x PROMPT tokens, NEW_TOKENS - 1 decode steps)
BATCH, PROMPT, NEW_TOKENS = 2, 16, 3
#: the fewest query heads a shrunk config keeps (some models split heads in groups of 4: CodeGen)
MIN_HEADS = 4
#: the most layers a cut keeps (a longer pattern is cut here, and the meta says so)
MAX_LAYERS = 12
#: size caps: on the device, and --tiny (CPU debugging)
CAPS = {
    "device": {"params_per_layer": 250_000_000, "experts": 32, "vocab": 65_536},
    "tiny": {"params_per_layer": 2_000_000, "experts": 8, "vocab": 1_024},
}
SWEEP_JSON = "sweep.json"
FORMAT_VERSION = 1

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "num_blocks")
_NOT_LAYER_LIST = {"model_type", "transformers_version", "_name_or_path"}
_INDEX_LIST = re.compile(r"(layers|idxs|indices|layer_ids)$")
_PERIOD = re.compile(r"(period|interval|_step$|every|freq|pattern)")
_NOT_PERIOD = re.compile(r"^(time_step|step_kernel|max_window)")
_LEADING = re.compile(r"^(first_k_dense_replace|num_dense_layers|first_k_dense|n_dense_layers)$")
_TRAILING = re.compile(r"^num_kv_shared_layers$")
_CYCLE = re.compile(r"types$")

_HIDDEN = re.compile(
    r"^(hidden_size|n_embd|d_model|embedding_dim|lru_width|word_embed_proj_dim|attention_hidden_size)$"
)
_HEADS = re.compile(r"^(num_attention_heads|n_head|n_heads|num_heads|decoder_attention_heads)$")
_KV_HEADS = re.compile(r"^(num_key_value_heads|num_kv_heads|n_head_kv|kv_n_heads|multi_query_group_num)$")
_OTHER_HEADS = re.compile(
    r"^(linear_num_\w*heads|mamba_n_heads|mamba_num_heads|linear_num_heads|index_n_heads)$"
)
_FFN = re.compile(
    r"(intermediate_size|ffn_hidden_size|ffn_dim|^n_inner$|^d_inner$|^ff_dim$|expert_ffn|mamba_d_ssm|"
    r"^d_ff$|router_hidden_size)"
)
_EXPERTS = re.compile(
    r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts)$"
)
_TOPK = re.compile(r"^(num_experts_per_tok|moe_topk|top_k|num_experts_per_token|moe_k|n_activated_experts)$")
_GROUPS = re.compile(r"^(n_group|num_expert_group)$")
_VOCAB = re.compile(r"vocab")


# ----------------------------------------------------------------------------- which types


def classify_type(model_type: str) -> tuple[str, str]:
    """``("sweep", "")``, ``("alias", other type)`` or ``("excluded", why)`` for one type of the mapping."""
    import transformers
    from transformers.models.auto import configuration_auto, modeling_auto

    causal = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    seq2seq = set(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES) | set(
        modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES
    )
    cls_name = causal[model_type]
    cls = getattr(transformers, cls_name, None)
    config_cls = configuration_auto.CONFIG_MAPPING[model_type]
    default_ed = getattr(config_cls, "is_encoder_decoder", False)
    with contextlib.suppress(Exception):
        default_ed = config_cls().is_encoder_decoder
    if default_ed or model_type in seq2seq:
        return "excluded", "encoder-decoder"
    own = getattr(cls, "config_class", None) if cls is not None else None
    if own is not None and getattr(own, "base_config_key", "") == "decoder_config":
        return "excluded", "encoder-decoder (the decoder half of a composite config)"
    if model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "excluded", "encoder-only (also a masked LM: a bidirectional encoder run as a decoder)"
    if cls_name.endswith("ForConditionalGeneration"):
        return "excluded", f"multimodal-only ({cls_name})"
    if own is not None and own.model_type != model_type and own.model_type in causal:
        return "alias", own.model_type
    return "sweep", ""


def model_types() -> list[str]:
    from transformers.models.auto import modeling_auto

    return sorted(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


# ----------------------------------------------------------------------------- defaults


def text_config_key(model_type: str) -> str | None:
    """The sub-config the causal-LM class takes when the type's config is composite (``text_config``)."""
    import transformers
    from transformers.models.auto import configuration_auto, modeling_auto

    cls = getattr(transformers, modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type], None)
    own = getattr(cls, "config_class", None)
    if own is None or own is configuration_auto.CONFIG_MAPPING[model_type]:
        return None
    return getattr(own, "base_config_key", None) or None


def default_config(model_type: str, sub: str | None) -> dict[str, Any]:
    """The defaults of the type's (text) config as a plain dict."""
    from transformers.models.auto import configuration_auto

    cfg = configuration_auto.CONFIG_MAPPING[model_type]()
    if sub:
        cfg = getattr(cfg, sub)
    return cfg.to_dict()


def layer_keys(d: dict[str, Any]) -> list[str]:
    """The config's layer-count keys, the one that counts the decoder's layer list first (the smallest:
    a config may also count sub-layers, e.g. two attention blocks per layer)."""
    keys = [k for k in _LAYER_KEYS if _is_int(d.get(k)) and d[k] > 0]
    return sorted(keys, key=lambda k: (d[k], _LAYER_KEYS.index(k)))


# ----------------------------------------------------------------------------- the layer cut


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _index_list(key: str, v: Any, n: int) -> bool:
    return (
        bool(_INDEX_LIST.search(key))
        and isinstance(v, list)
        and all(_is_int(x) for x in v)
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
        elif _is_int(v) and _PERIOD.search(k) and not _NOT_PERIOD.search(k) and v >= 2:
            comps.append((k, [i % v for i in range(n)]))
        elif _is_int(v) and _LEADING.match(k) and v > 0:
            comps.append((k, [i < v for i in range(n)]))
        elif _is_int(v) and _TRAILING.match(k) and 0 < v < n:
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


# ----------------------------------------------------------------------------- the size cap


def _walk(d: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and k.endswith("_config"):
            out.extend(_walk(v, (*prefix, k)))
        else:
            out.append(((*prefix, k), v))
    return out


def _set(over: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for p in path[:-1]:
        over = over.setdefault(p, {})
    over[path[-1]] = value


def _round(v: float, step: int) -> int:
    return max(step, int(round(v / step)) * step)


def scale_widths(d: dict[str, Any], f: float) -> dict[str, Any]:
    """Overrides that shrink the widths of config dict ``d`` (and its sub-configs) by about ``f``:
    key/value heads to the largest divisor of their count at most ``f`` times it, query heads by the
    GQA ratio, the hidden size with the heads where it is a multiple of them, other heads (linear
    attention, SSM) and intermediate sizes by the same ratio; head dimensions stay."""
    over: dict[str, Any] = {}
    items = _walk(d)
    for parent in sorted({p[:-1] for p, _ in items}):
        level = {p[-1]: v for p, v in items if p[:-1] == parent}
        heads_key = next((k for k, v in level.items() if _HEADS.match(k) and _is_int(v) and v > 0), None)
        ratio = f
        hidden_per_head = None
        if heads_key is not None:
            heads = level[heads_key]
            kv_key = next((k for k, v in level.items() if _KV_HEADS.match(k) and _is_int(v) and v > 0), None)
            kv = level[kv_key] if kv_key else None
            if kv and 1 < kv < heads and heads % kv == 0:
                group = heads // kv  # at least MIN_HEADS query heads (or the default's count)
                new_kv = _divisor_below(kv, max(kv * f, -(-min(MIN_HEADS, heads) // group)))
                new_heads = new_kv * group
                _set(over, (*parent, kv_key), new_kv)
            else:
                new_heads = _divisor_below(heads, max(heads * f, min(MIN_HEADS, heads)))
                if kv and kv == heads:
                    _set(over, (*parent, kv_key), new_heads)
            _set(over, (*parent, heads_key), new_heads)
            ratio = new_heads / heads
            hidden_per_head = (heads, new_heads)
        for k, v in level.items():
            path = (*parent, k)
            if not _is_int(v) or v <= 0:
                if _FFN.search(k) and isinstance(v, list) and v and all(_is_int(x) for x in v):
                    _set(over, path, [_round(x * ratio, 16) for x in v])
                continue
            if _HIDDEN.match(k):
                if hidden_per_head is not None:
                    heads, new_heads = hidden_per_head
                    if v % heads == 0:  # hidden = heads x (hidden / heads) stays so (SSM heads included)
                        _set(over, path, new_heads * (v // heads))
                        continue
                _set(over, path, _round(v * ratio, 64))
            elif _OTHER_HEADS.match(k):
                _set(over, path, max(1, round(v * ratio)))
            elif _FFN.search(k):
                _set(over, path, _round(v * ratio, 16))
    return over


def _divisor_below(n: int, target: float) -> int:
    """The largest divisor of ``n`` at most ``target`` (else the smallest above it; where the largest
    below is under half the target, the target itself): a head count that divides the default
    keeps every divisibility the model asks of it."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    below = [d for d in divisors if d <= target]
    if not below:
        return min(d for d in divisors if d >= target)
    # a count with no divisor near the target (71 heads) shrinks by the factor instead
    return max(below) if max(below) * 2 >= target else max(1, int(target))


def cap_experts(d: dict[str, Any], cap: int, f: float = 1.0) -> dict[str, Any]:
    """Overrides that cut each routed-expert count to ``cap`` (and by ``f``), keeping groups and top-k."""
    over: dict[str, Any] = {}
    items = _walk(d)
    by = {p: v for p, v in items}
    for path, v in items:
        if not _EXPERTS.match(path[-1]) or not _is_int(v) or v < 2:
            continue
        parent = path[:-1]
        topk = max([by[q] for q in by if q[:-1] == parent and _TOPK.match(q[-1]) and _is_int(by[q])] or [1])
        groups = max(
            [by[q] for q in by if q[:-1] == parent and _GROUPS.match(q[-1]) and _is_int(by[q])] or [1]
        )
        floor = max(2 * topk, 2 * groups, 2)
        want = max(floor, min(cap, int(v * f)))
        want = int(math.ceil(want / groups) * groups)
        if want < v:
            _set(over, path, want)
    return over


def cap_vocab(d: dict[str, Any], cap: int) -> dict[str, Any]:
    over: dict[str, Any] = {}
    items = _walk(d)
    vocab = d.get("vocab_size") if _is_int(d.get("vocab_size")) else None
    for path, v in items:
        if _VOCAB.search(path[-1]) and _is_int(v) and v > cap:
            _set(over, path, cap)
    new_vocab = over.get("vocab_size", vocab)
    if new_vocab:
        for path, v in items:
            if path[-1].endswith("token_id") and _is_int(v) and v >= new_vocab:
                _set(over, path, new_vocab - 1)
    return over


def merge(*dicts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, dict) and isinstance(out.get(k), dict):
                out[k] = merge(out[k], v)
            else:
                out[k] = v
    return out


def _apply(d: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    return merge(d, over)


def count_params(
    model_type: str, sub: str | None, over: dict[str, Any], layers: int | None
) -> dict[str, int]:
    """Parameters of the model of ``over`` built on the meta device: total, without embeddings and
    LM head, and per layer."""
    import torch
    import transformers
    from torch import nn

    cfg = transformers.AutoConfig.for_model(model_type, **({sub: over} if sub else over))
    with torch.device("meta"), _quiet():
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    emb = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None:
        emb |= {id(p) for p in out.parameters()}
    body = sum(p.numel() for p in model.parameters() if id(p) not in emb)
    n = layers or _layer_count(model)
    return {"params": total, "body": body, "per_layer": body // max(1, n), "layer_list": _layer_count(model)}


def _layer_count(model: Any) -> int:
    """Length of the model's decoder-layer list: its ModuleList holding the most parameters."""
    from torch import nn

    best, size = 1, -1
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m):
            n = sum(p.numel() for p in m.parameters())
            if n > size:
                best, size = len(m), n
    return best


def size_plan(
    model_type: str,
    sub: str | None,
    d: dict[str, Any],
    over: dict[str, Any],
    layers: int | None,
    caps: dict[str, int],
) -> tuple[dict[str, Any], dict[str, int], str]:
    """Shrink ``over`` until the meta-built model is under the caps; return (overrides, counts, note)."""
    over = merge(
        over, cap_vocab(_apply(d, over), caps["vocab"]), cap_experts(_apply(d, over), caps["experts"])
    )
    counts = count_params(model_type, sub, over, layers)
    f_total, note = 1.0, ""
    for _ in range(8):
        if counts["per_layer"] <= caps["params_per_layer"]:
            break
        f = max(0.05, min(0.95, math.sqrt(caps["params_per_layer"] / counts["per_layer"])))
        f_total *= f
        base = _apply(d, over)
        nxt = merge(over, scale_widths(base, f), cap_experts(base, caps["experts"], f))
        if nxt == over:
            note = "widths at their floor"
            break
        over = nxt
        counts = count_params(model_type, sub, over, layers)
    if f_total < 1.0:
        note = (note + "; " if note else "") + f"widths x{f_total:.3g}"
    return over, counts, note


@contextlib.contextmanager
def _quiet() -> Any:
    import logging
    import warnings

    log = logging.getLogger("transformers")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(old)


def plan(model_type: str, tiny: bool = False) -> dict[str, Any]:
    """The sweep's decision and config for one type (builds on the meta device to count parameters)."""
    decision, why = classify_type(model_type)
    row: dict[str, Any] = {"model_type": model_type, "status": decision, "reason": why}
    if decision != "sweep":
        if decision == "alias":
            row["reason"] = f"alias of {why} (its causal-LM class and config): swept as {why}"
        return row
    sub = text_config_key(model_type)
    with _quiet():
        d = default_config(model_type, sub)
    lp = layer_plan(d)
    caps = CAPS["tiny" if tiny else "device"]
    over, counts, note = size_plan(model_type, sub, d, lp["overrides"], lp["layers"], caps)
    config: dict[str, Any] = {"model_type": model_type, **({sub: over} if sub else over)}
    row.update(
        status="planned",
        reason="",
        config=config,
        layers=lp["layers"] or counts["layer_list"],  # no layer count in the config: the built list
        default_layers=lp.get("default_layers"),
        pattern=lp["components"],
        cut_note=lp["note"],
        size_note=note,
        params=counts["params"],
        params_per_layer=counts["per_layer"],
        caps=caps,
    )
    return row


# ----------------------------------------------------------------------------- capture


def _reason(exc: BaseException, built: bool) -> str:
    """The skip reason of a failed capture: a download, a package, or transformers' own failure."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError | ImportError) or "pip install" in text:
        return "needs a package that cannot be carried"
    if re.search(r"(?i)offline|hf_hub|huggingface\.co|LocalEntryNotFound|trust_remote_code|Can't load", text):
        return "needs a download"
    return "fails to run in transformers" if built else "fails to build in transformers"


def to_xz(gz: Path, xz: Path | None = None, remove: bool = True) -> Path:
    """Recompress ``trace.json.gz`` as ``trace.json.xz`` (xz -9e: about half the size)."""
    import gzip
    import lzma

    xz = xz or gz.with_suffix(".xz")
    with gzip.open(gz, "rb") as f:
        raw = f.read()
    xz.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    if remove:
        gz.unlink()
    return xz


def capture_type(model_type: str, out_dir: Path, device: str, tiny: bool, xz: bool = False) -> dict[str, Any]:
    """Plan and capture one type into ``out_dir/<type>/``; return its row (also written as meta.json)."""
    import gc

    from analyzer.capture import hf

    t0 = time.perf_counter()
    try:
        row = plan(model_type, tiny)
    except Exception as exc:
        return {
            "model_type": model_type,
            "status": "skipped",
            "reason": _reason(exc, False),
            "error": _err(exc),
        }
    if row["status"] != "planned":
        return row
    out = out_dir / model_type / "trace.json.gz"
    built = {"done": False}
    build = hf.build

    def tracked_build(*a: Any, **kw: Any) -> Any:
        model = build(*a, **kw)
        built["done"] = True
        row["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
        return model

    hf.build = tracked_build  # type: ignore[assignment]
    try:
        for attn in ("sdpa", "eager"):
            spec = hf.CaptureSpec(
                config=row["config"], output=str(out), device=device, attn=attn,
                batch=BATCH, prompt=PROMPT, new_tokens=NEW_TOKENS,
            )  # fmt: skip
            try:
                meta = hf.capture(spec)
                break
            except Exception as exc:
                if (
                    attn == "sdpa"
                    and not built["done"]
                    and re.search(r"(?i)sdpa|scaled_dot_product", str(exc))
                ):
                    row["sdpa_error"] = _err(exc)  # the model does not offer SDPA: its eager attention
                    continue
                row.update(status="skipped", reason=_reason(exc, built["done"]), error=_err(exc))
                row["where"] = _where(exc)
                return row
    finally:
        hf.build = build  # type: ignore[assignment]
        gc.collect()
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    if xz:
        out = to_xz(out)
    row.update(status="captured", attn=spec.attn, seconds=round(time.perf_counter() - t0, 1))
    row["trace"] = out.name
    row["trace_bytes"] = out.stat().st_size
    row["steps"] = meta["steps"]
    meta.update(case=model_type, sweep={k: v for k, v in row.items() if k not in ("config", "steps")})
    (out.parent / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n", encoding="utf-8")
    return row


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    frame = next((f for f in reversed(tb) if "transformers" in f.filename), tb[-1] if tb else None)
    if frame is None:
        return ""
    return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"


def _run_one(
    model_type: str, out_dir: Path, device: str, tiny: bool, timeout: int, xz: bool
) -> dict[str, Any]:
    """Capture one type in a process of its own (a crash or a hang costs only that type)."""
    import subprocess

    row_file = out_dir / model_type / "row.json"
    row_file.parent.mkdir(parents=True, exist_ok=True)
    row_file.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "analyzer.capture.sweep",
        str(out_dir),
        "--one",
        model_type,
        "--device",
        device,
    ]
    if tiny:
        cmd.append("--tiny")
    if xz:
        cmd.append("--xz")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        tail = (proc.stderr or "")[-800:]
    except subprocess.TimeoutExpired:
        return {
            "model_type": model_type,
            "status": "skipped",
            "reason": "timed out",
            "error": f"over {timeout} s",
        }
    if row_file.is_file():
        return json.loads(row_file.read_text(encoding="utf-8"))
    return {"model_type": model_type, "status": "skipped", "reason": "crashed", "error": tail}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analyzer.capture.sweep", description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--only", default="", metavar="TYPE[,TYPE]")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the CPU-debugging caps (tiny widths)")
    p.add_argument("--plan", action="store_true", help="only decide and build each config on the meta device")
    p.add_argument("--timeout", type=int, default=300, help="seconds one type may take")
    p.add_argument("--xz", action="store_true", help="recompress each trace as trace.json.xz")
    p.add_argument(
        "--store", metavar="FROM", help="copy a sweep's output FROM into OUT_DIR as the fixtures keep it"
    )
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if a.store:
        return store(Path(a.store), out)
    if a.one:  # the worker process of one type
        row = capture_type(a.one, out, a.device, a.tiny, a.xz)
        (out / a.one).mkdir(parents=True, exist_ok=True)
        (out / a.one / "row.json").write_text(json.dumps(row, default=str) + "\n", encoding="utf-8")
        return 0
    types = [t for t in a.only.split(",") if t] or model_types()
    rows: dict[str, dict[str, Any]] = {}
    if a.plan:
        for t in types:
            try:
                rows[t] = plan(t, a.tiny)
            except Exception as exc:
                rows[t] = {
                    "model_type": t,
                    "status": "skipped",
                    "reason": _reason(exc, False),
                    "error": _err(exc),
                }
            print(
                f"{t}: {rows[t]['status']} {rows[t].get('reason', '')} {rows[t].get('error', '')}", flush=True
            )
        _write_index(out, rows, a)
    else:
        with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
            futs = {pool.submit(_run_one, t, out, a.device, a.tiny, a.timeout, a.xz): t for t in types}
            for fut in concurrent.futures.as_completed(futs):
                row = fut.result()
                rows[row["model_type"]] = row
                extra = (
                    row.get("error", "")
                    or f"{row.get('seconds', '')}s {row.get('trace_bytes', 0) / 1e6:.2f}MB"
                )
                print(f"{row['model_type']}: {row['status']} {row.get('reason', '')} {extra}", flush=True)
                _write_index(out, rows, a)  # as it goes: a run stopped early keeps what it has
    counts: dict[str, int] = {}
    for r in rows.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(json.dumps(counts), flush=True)
    return 0


def store(src: Path, dst: Path) -> int:
    """``fixtures/sweep`` from a sweep's output: each captured type's ``trace.json.xz`` and
    ``meta.json``, and ``sweep.json`` (every type, its status, reason and plan)."""
    import shutil

    doc = json.loads((src / SWEEP_JSON).read_text(encoding="utf-8"))
    dst.mkdir(parents=True, exist_ok=True)
    for row in doc["types"]:
        if row["status"] != "captured":
            continue
        t = row["model_type"]
        (dst / t).mkdir(parents=True, exist_ok=True)
        xz = dst / t / "trace.json.xz"
        if (src / t / "trace.json.xz").is_file():
            shutil.copyfile(src / t / "trace.json.xz", xz)
        else:
            to_xz(src / t / "trace.json.gz", xz, remove=False)
        shutil.copyfile(src / t / "meta.json", dst / t / "meta.json")
        row["trace"], row["trace_bytes"] = "trace.json.xz", xz.stat().st_size
    (dst / SWEEP_JSON).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"stored {sum(r['status'] == 'captured' for r in doc['types'])} traces in {dst}")
    return 0


def _write_index(out: Path, rows: dict[str, dict[str, Any]], a: argparse.Namespace) -> None:
    doc = {
        "format_version": FORMAT_VERSION,
        "device": a.device,
        "tiny": a.tiny,
        "settings": {"batch": BATCH, "prompt": PROMPT, "new_tokens": NEW_TOKENS, "max_layers": MAX_LAYERS},
        "caps": CAPS["tiny" if a.tiny else "device"],
        "versions": _versions(),
        "types": [rows[t] for t in sorted(rows)],
    }
    (out / SWEEP_JSON).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def _err(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:400]


if __name__ == "__main__":
    sys.exit(main())
