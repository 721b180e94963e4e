"""Decoder models with random weights for ``capture``, and the greedy loop that runs them.

Contract: nothing is downloaded. :func:`build_model` takes a HF ``config.json`` path or a built-in
name of ``rules/models.toml`` (through :func:`analyzer.knowledge.architectures.load_model`) and returns a
:class:`CausalLM`: ``reset(batch, max_len)`` empties the KV cache, ``step(input_ids)`` runs one
forward over the new tokens and returns the last position's logits ``[batch, vocab]``.

Backends: ``transformers`` (``AutoModelForCausalLM.from_config`` with ``attn_implementation="sdpa"``,
random init) when that package is installed and knows the ``model_type``; else ``reference``, a
small self-contained decoder written here (RMSNorm, RoPE, GQA attention through
``F.scaled_dot_product_attention`` over a preallocated KV cache, fused QKV and gate+up projections
with SwiGLU, optional MoE MLP). The kernels differ between the two (HF runs separate q/k/v and
gate/up GEMMs and an eager RMSNorm; the reference fuses them like vLLM), the shapes do not.

:func:`greedy_generate` is the loop ``capture`` profiles: one prefill step over the prompt, then
one decode step per further token, each optionally wrapped in a caller's step annotation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import json
import tomllib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from analyzer.errors import UsageError
from analyzer.knowledge import architectures

BACKENDS = ("auto", "transformers", "reference")
DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}
INIT_STD = 0.02  # the HF default initializer_range: keeps random activations finite over many layers


def torch_dtype(name: str) -> torch.dtype:
    """``bf16`` / ``fp16`` / ``fp32`` (or the long names) as a torch dtype."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r} (use bf16, fp16 or fp32)") from None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What to build: the architecture (layers already truncated) and the raw HF config when given."""

    arch: architectures.ModelArch
    config: dict[str, Any] | None = None  # a config.json's own keys, passed whole to transformers


def resolve_model(spec: str, layers: int | None = None) -> ModelSpec:
    """The architecture named by ``spec`` (built-in name or config.json), with ``layers`` layers."""
    arch = architectures.load_model(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    config = _config_file(path) if path.is_file() else _builtin_config(arch)
    if layers is not None:
        if layers < 1:
            raise UsageError(f"--layers must be at least 1, got {layers}")
        if layers < arch.num_hidden_layers:
            arch = dataclasses.replace(arch, num_hidden_layers=layers)
            if config is not None:
                config = {**config, "num_hidden_layers": layers}
    return ModelSpec(arch=arch, config=config)


def _config_file(path: Path) -> dict[str, Any]:
    config = json.loads(path.read_text(encoding="utf-8"))  # load_model already read it once
    if "hidden_size" not in config:
        for nested in ("text_config", "language_config", "llm_config"):
            if isinstance(config.get(nested), dict):
                return dict(config[nested])
    return config


def _builtin_config(arch: architectures.ModelArch) -> dict[str, Any] | None:
    """The rules/models.toml table of a built-in: HF key names, so transformers takes it as is."""
    with open(architectures.MODELS_TOML, "rb") as f:
        models = tomllib.load(f).get("model") or {}
    for key, entry in models.items():
        if entry.get("name", key) == arch.name:
            return {k: v for k, v in entry.items() if k not in ("name", "aliases", "source")}
    return None


class CausalLM:
    """A decoder with a KV cache: ``reset`` then ``step`` once per forward."""

    backend = "none"

    def __init__(self, arch: architectures.ModelArch, device: torch.device, dtype: torch.dtype) -> None:
        self.arch = arch
        self.device = device
        self.dtype = dtype

    def reset(self, batch: int, max_len: int) -> None:
        raise NotImplementedError

    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def build_model(
    spec: str | ModelSpec,
    *,
    layers: int | None = None,
    device: str = "cpu",
    dtype: str = "bf16",
    backend: str = "auto",
    seed: int = 0,
) -> CausalLM:
    """A model of the given architecture with random weights, on ``device``, in eval mode.

    ``backend``: ``transformers``, ``reference`` or ``auto`` (transformers when installed and it
    knows the model type, else reference).
    """
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r} (use {', '.join(BACKENDS)})")
    ms = spec if isinstance(spec, ModelSpec) else resolve_model(spec, layers)
    tdtype = torch_dtype(dtype)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch sees no CUDA device")
    torch.manual_seed(seed)
    if backend in ("auto", "transformers"):
        if transformers_available():
            try:
                lm = _build_transformers(ms, dev, tdtype, required=backend == "transformers")
            except Exception as exc:  # auto: a transformers version we do not handle -> the reference
                if backend == "transformers" or isinstance(exc, UsageError):
                    raise
                warnings.warn(
                    f"transformers could not build {ms.arch.name} ({type(exc).__name__}: {exc}); "
                    "using the reference decoder",
                    stacklevel=2,
                )
                lm = None
            if lm is not None:
                return lm
        elif backend == "transformers":
            raise UsageError("--backend transformers, but the transformers package is not installed")
    return ReferenceCausalLM(ms.arch, dev, tdtype)


# ----------------------------------------------------------------------------- transformers


def _hf_config_dict(ms: ModelSpec) -> dict[str, Any]:
    """HF config keys for the architecture: the config.json's own when given, else from ModelArch."""
    if ms.config is not None:
        return dict(ms.config)
    a = ms.arch
    d: dict[str, Any] = {
        "model_type": a.model_type,
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": a.num_hidden_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab_size,
        "tie_word_embeddings": a.tie_word_embeddings,
    }
    if a.is_moe:
        d.update(
            num_experts=a.num_experts,
            num_experts_per_tok=a.num_experts_per_tok,
            moe_intermediate_size=a.expert_intermediate_size,
            decoder_sparse_step=a.decoder_sparse_step,
            mlp_only_layers=list(a.mlp_only_layers),
            norm_topk_prob=True,
        )
    if a.is_mla:
        d.update(
            q_lora_rank=a.q_lora_rank,
            kv_lora_rank=a.kv_lora_rank,
            qk_nope_head_dim=a.qk_nope_head_dim,
            qk_rope_head_dim=a.qk_rope_head_dim,
            v_head_dim=a.v_head_dim,
        )
    return d


def _build_transformers(
    ms: ModelSpec, device: torch.device, dtype: torch.dtype, required: bool
) -> CausalLM | None:
    import transformers

    d = _hf_config_dict(ms)
    model_type = str(d.pop("model_type", ms.arch.model_type))
    for key in (
        "architectures",
        "auto_map",
        "quantization_config",
        "torch_dtype",
        "dtype",
        "_name_or_path",
        "transformers_version",
    ):
        d.pop(key, None)  # remote code, quantized checkpoints and dtypes are not what we build here
    try:
        config = transformers.AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError) as exc:
        if required:
            raise UsageError(f"transformers does not know model_type {model_type!r}: {exc}") from None
        return None
    config.initializer_range = INIT_STD
    try:
        with torch.device(device):
            try:
                model = transformers.AutoModelForCausalLM.from_config(
                    config, dtype=dtype, attn_implementation="sdpa"
                )
            except TypeError:  # transformers < 4.56 calls it torch_dtype
                model = transformers.AutoModelForCausalLM.from_config(
                    config, torch_dtype=dtype, attn_implementation="sdpa"
                )
    except ValueError as exc:
        if required:
            raise UsageError(f"transformers cannot build {model_type!r}: {exc}") from None
        return None
    model.to(device=device, dtype=dtype).eval()
    return HFCausalLM(ms.arch, device, dtype, model)


class HFCausalLM(CausalLM):
    """A transformers ``*ForCausalLM`` driven step by step with its own dynamic cache."""

    backend = "transformers"

    def __init__(
        self, arch: architectures.ModelArch, device: torch.device, dtype: torch.dtype, model: Any
    ) -> None:
        super().__init__(arch, device, dtype)
        self.model = model
        params = inspect.signature(model.forward).parameters
        # transformers 5.2x renamed past_key_values to cache; older versions only know the first
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self._cache: Any = None

    def reset(self, batch: int, max_len: int) -> None:
        self._cache = None

    @torch.inference_mode()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": input_ids, "use_cache": True}
        if self._cache is not None:
            kwargs[self._cache_kw] = self._cache
        if self._keep_kw:
            kwargs[self._keep_kw] = 1  # the LM head over the last position only, as generate() does
        out = self.model(**kwargs)
        keys = out.keys()
        self._cache = (
            out["cache"] if "cache" in keys else out["past_key_values"] if "past_key_values" in keys else None
        )
        return out.logits[:, -1, :]


# ----------------------------------------------------------------------------- reference decoder


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(F, "rms_norm"):  # one fused kernel where torch has it (2.4+)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """GQA self-attention over a preallocated ``[batch, kv_heads, max_len, head_dim]`` cache."""

    def __init__(self, arch: architectures.ModelArch) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            arch.num_attention_heads,
            arch.num_key_value_heads,
            arch.head_dim,
        )
        self.qkv_proj = nn.Linear(arch.hidden_size, arch.qkv_out_features, bias=False)
        self.o_proj = nn.Linear(arch.o_in_features, arch.hidden_size, bias=False)
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def reset(self, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: int) -> torch.Tensor:
        assert self.k_cache is not None and self.v_cache is not None, "reset() first"
        b, q_len, _ = x.shape
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split((q_dim, kv_dim, kv_dim), dim=-1)
        q = q.view(b, q_len, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, q_len, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, q_len, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        end = pos + q_len
        self.k_cache[:, :, pos:end] = k
        self.v_cache[:, :, pos:end] = v
        keys, values = self.k_cache[:, :, :end], self.v_cache[:, :, :end]
        mask = None
        causal = q_len > 1 and pos == 0
        if q_len > 1 and pos > 0:  # a chunk after cached tokens: causal within the chunk, all of the past
            mask = torch.ones(q_len, end, dtype=torch.bool, device=x.device).tril(diagonal=pos)
        out = _sdpa(q, keys, values, mask, causal, self.heads // self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, q_dim))


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool, groups: int
) -> torch.Tensor:
    if groups > 1:
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        except TypeError:  # torch < 2.5: no enable_gqa, repeat the KV heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


class MLP(nn.Module):
    """SwiGLU with one fused gate+up GEMM."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.inter = inter
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class MoE(nn.Module):
    """Top-k routed experts (softmax router, renormalized top-k weights), looped per active expert."""

    def __init__(self, arch: architectures.ModelArch) -> None:
        super().__init__()
        self.top_k = arch.num_experts_per_tok
        self.gate = nn.Linear(arch.hidden_size, arch.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(arch.hidden_size, arch.expert_intermediate_size) for _ in range(arch.num_experts)
        )
        self.shared = (
            MLP(arch.hidden_size, arch.expert_intermediate_size * arch.n_shared_experts)
            if arch.n_shared_experts
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        # a host sync per layer (which experts are hit), as transformers' eager MoE does
        for e in chosen.unique().tolist():
            token, slot = (chosen == e).nonzero(as_tuple=True)
            y = self.experts[e](flat.index_select(0, token)) * weights[token, slot].unsqueeze(-1)
            out.index_add_(0, token, y)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, arch: architectures.ModelArch, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size)
        self.self_attn = Attention(arch)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size)
        self.mlp: nn.Module = (
            MoE(arch) if arch.is_moe_layer(index) else MLP(arch.hidden_size, arch.intermediate_size)
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class ReferenceDecoder(nn.Module):
    """A Llama / Qwen3(-MoE)-shaped decoder: embedding, layers, final norm, LM head."""

    def __init__(self, arch: architectures.ModelArch, rope_theta: float = 500_000.0) -> None:
        super().__init__()
        if arch.is_mla:
            raise UsageError(
                f"{arch.name}: the reference decoder has no MLA attention; install transformers "
                "(pip install transformers) to capture it"
            )
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope_theta = rope_theta
        self.pos = 0

    def init_weights(self, std: float = INIT_STD) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    def reset(self, batch: int, max_len: int) -> None:
        p = next(self.parameters())
        for layer in self.layers:
            layer.self_attn.reset(batch, max_len, p.device, p.dtype)
        half = self.arch.head_dim // 2
        inv = 1.0 / (self.rope_theta ** (torch.arange(half, device=p.device, dtype=torch.float32) / half))
        freqs = torch.outer(torch.arange(max_len, device=p.device, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(p.dtype), emb.sin().to(p.dtype)
        self.pos = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        q_len = input_ids.shape[1]
        pos = self.pos
        cos, sin = self.cos[pos : pos + q_len], self.sin[pos : pos + q_len]
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, pos)
        self.pos = pos + q_len
        # the LM head over the last position only, as serving engines do
        return self.lm_head(self.norm(x[:, -1, :]))


class ReferenceCausalLM(CausalLM):
    backend = "reference"

    def __init__(self, arch: architectures.ModelArch, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(arch, device, dtype)
        with torch.device(device):
            model = ReferenceDecoder(arch)
        model.init_weights()
        self.model = model.to(dtype=dtype).eval()

    def reset(self, batch: int, max_len: int) -> None:
        self.model.reset(batch, max_len)

    @torch.inference_mode()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)


# ----------------------------------------------------------------------------- generation


StepContext = Callable[[str, int, int, int], contextlib.AbstractContextManager[Any]]


@torch.inference_mode()
def greedy_generate(
    lm: CausalLM, input_ids: torch.Tensor, new_tokens: int, annotate: StepContext | None = None
) -> torch.Tensor:
    """Generate ``new_tokens`` tokens greedily: one prefill step, then ``new_tokens - 1`` decode steps.

    ``annotate(phase, q, bs, kv)`` returns a context entered around each forward step and its
    sampling; ``q`` is the step's query tokens per sequence, ``kv`` the keys each query attends to
    (cached + new). Returns the generated ids ``[batch, new_tokens]``.
    """
    if new_tokens < 1:
        raise UsageError(f"--new-tokens must be at least 1, got {new_tokens}")
    bs, prompt = input_ids.shape
    lm.reset(bs, prompt + new_tokens)
    ids, kv, out = input_ids, 0, []
    for i in range(new_tokens):
        q = ids.shape[1]
        kv += q
        ctx = annotate("prefill" if i == 0 else "decode", q, bs, kv) if annotate else contextlib.nullcontext()
        with ctx:
            logits = lm.step(ids)
            ids = logits.argmax(dim=-1, keepdim=True)
        out.append(ids)
    return torch.cat(out, dim=1)


def random_prompt(lm: CausalLM, batch: int, prompt: int, seed: int = 0) -> torch.Tensor:
    """``[batch, prompt]`` random token ids on the model's device."""
    if batch < 1 or prompt < 1:
        raise UsageError(f"--batch and --prompt must be at least 1, got {batch} and {prompt}")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, lm.arch.vocab_size, (batch, prompt), generator=g).to(lm.device)


def param_count(lm: CausalLM) -> int:
    model = getattr(lm, "model", None)
    return sum(p.numel() for p in model.parameters()) if model is not None else 0


def describe(lm: CausalLM) -> dict[str, Any]:
    """Settings worth recording beside a capture (meta.json)."""
    a = lm.arch
    return {
        "model": a.name,
        "model_type": a.model_type,
        "backend": lm.backend,
        "layers": a.num_hidden_layers,
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab_size,
        "num_experts": a.num_experts,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "device": str(lm.device),
        "params": param_count(lm),
        "params_b": round(param_count(lm) / 1e9, 3) if param_count(lm) else None,
    }


__all__ = [
    "BACKENDS",
    "CausalLM",
    "HFCausalLM",
    "ModelSpec",
    "ReferenceCausalLM",
    "ReferenceDecoder",
    "build_model",
    "describe",
    "greedy_generate",
    "random_prompt",
    "resolve_model",
    "torch_dtype",
    "transformers_available",
]
