"""The sweep's size cap: config overrides that keep a model under the caps, checked on the meta device.

**The size cap** (:func:`size_plan`): at most :data:`CAPS` ``["params_per_layer"]`` parameters per
decoder layer (the model's parameters without its embeddings and LM head, over the layers it has)
and at most ``["experts"]`` routed experts (an expert loop launches kernels per expert: the cap
keeps the trace small) and ``["vocab"]`` entries in each vocabulary. Over the cap, the routed
experts are cut first, then the widths shrink together by one factor: hidden size, attention
heads (the key/value heads by the factor, the query heads by the GQA ratio, so the ratio stays),
linear-attention and SSM heads, every intermediate size; head dimensions, LoRA ranks, state sizes
and convolution widths stay. Expert counts stay a multiple of the expert groups and at least twice
the top-k. ``--tiny`` uses far smaller caps to try every type on a CPU in minutes.

:func:`scale_widths`, :func:`cap_experts`, :func:`cap_vocab` and :func:`merge` are pure functions of
config dicts; :func:`count_params` and :func:`size_plan` build the model on the meta device (torch
and transformers, imported when called).
"""

from __future__ import annotations

import math
import re
from typing import Any

from analyzer.capture.sweep_layers import is_int
from analyzer.capture.sweep_types import quiet

#: the fewest query heads a shrunk config keeps (some models split heads in groups of 4: CodeGen)
MIN_HEADS = 4
#: size caps: on the device, and --tiny (CPU debugging)
CAPS = {
    "device": {"params_per_layer": 250_000_000, "experts": 32, "vocab": 65_536},
    "tiny": {"params_per_layer": 2_000_000, "experts": 8, "vocab": 1_024},
}

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
        heads_key = next((k for k, v in level.items() if _HEADS.match(k) and is_int(v) and v > 0), None)
        ratio = f
        hidden_per_head = None
        if heads_key is not None:
            heads = level[heads_key]
            kv_key = next((k for k, v in level.items() if _KV_HEADS.match(k) and is_int(v) and v > 0), None)
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
            if not is_int(v) or v <= 0:
                if _FFN.search(k) and isinstance(v, list) and v and all(is_int(x) for x in v):
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
        if not _EXPERTS.match(path[-1]) or not is_int(v) or v < 2:
            continue
        parent = path[:-1]
        topk = max([by[q] for q in by if q[:-1] == parent and _TOPK.match(q[-1]) and is_int(by[q])] or [1])
        groups = max(
            [by[q] for q in by if q[:-1] == parent and _GROUPS.match(q[-1]) and is_int(by[q])] or [1]
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
    vocab = d.get("vocab_size") if is_int(d.get("vocab_size")) else None
    for path, v in items:
        if _VOCAB.search(path[-1]) and is_int(v) and v > cap:
            _set(over, path, cap)
    new_vocab = over.get("vocab_size", vocab)
    if new_vocab:
        for path, v in items:
            if path[-1].endswith("token_id") and is_int(v) and v >= new_vocab:
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
    with torch.device("meta"), quiet():
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
