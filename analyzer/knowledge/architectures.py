"""Model architectures (built-in rules/models.toml or a HF config.json) and the shapes they imply.

Contract: :func:`load_model` and :func:`load_builtin_models` read files; everything else is a pure
function of a :class:`ModelArch`. Shapes follow the seeds' decoder layer: QKV GEMM, O GEMM,
gate+up GEMM, down GEMM per dense layer; router gate GEMM and two expert GEMMs per MoE layer; the
LM head once. GEMM roles use the stage names of ``rules/taxonomy.toml`` (``qkv_gemm``, ``o_gemm``, ...).
Weight shapes are (in_features, out_features), i.e. (K, N) of ``y[M, N] = x[M, K] @ W[K, N]``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

from analyzer.errors import InputError
from analyzer.knowledge import loader
from analyzer.paths import RULES_DIR

MODELS_TOML = RULES_DIR / "models.toml"

# Trailing name parts that do not change the architecture ("Qwen3-30B-A3B-Instruct-2507").
_VARIANT_SUFFIXES = {"instruct", "chat", "base", "hf", "it", "fp8", "bf16", "thinking", "2507"}


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """The shape-relevant part of a decoder-only LLM config (HF config.json key names)."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    quant_method: str | None = None
    source: str = ""
    aliases: tuple[str, ...] = ()

    # ---------------------------------------------------------------------------- structure

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds a compressed latent."""
        return self.kv_lora_rank is not None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has an MoE MLP, as transformers decides it."""
        if not self.is_moe or layer < self.first_k_dense_replace or layer in self.mlp_only_layers:
            return False
        return (layer + 1) % max(self.decoder_sparse_step, 1) == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    @property
    def dense_layers(self) -> int:
        return self.num_hidden_layers - self.moe_layers

    # ------------------------------------------------------------------------- attention dims

    @property
    def q_dim(self) -> int:
        """Query width: heads x head_dim (MLA: heads x (nope + rope))."""
        if self.is_mla:
            return self.num_attention_heads * ((self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0))
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (= of V) per token: kv_heads x head_dim (MLA: cached latent + RoPE key)."""
        if self.is_mla:
            return (self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0)
        return self.num_key_value_heads * self.head_dim

    @property
    def qkv_out_features(self) -> int:
        """Output width of the fused QKV GEMM: (heads + 2 kv_heads) x head_dim.

        MLA fuses the two down-projections instead (q_a + kv_a, SGLang/vLLM "fused_qkv_a_proj"):
        q_lora_rank + kv_lora_rank + qk_rope_head_dim; without q_lora_rank the full q_proj joins it.
        """
        if self.is_mla:
            q = self.q_lora_rank if self.q_lora_rank is not None else self.q_dim
            return q + self.kv_dim
        return self.q_dim + 2 * self.kv_dim

    @property
    def o_in_features(self) -> int:
        """Input width of the O GEMM: heads x head_dim (MLA: heads x v_head_dim)."""
        if self.is_mla:
            return self.num_attention_heads * (self.v_head_dim or self.head_dim)
        return self.q_dim

    @property
    def gate_up_out_features(self) -> int:
        """Output width of the fused gate+up GEMM of a dense layer: 2 x intermediate_size."""
        return 2 * self.intermediate_size

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def kv_bytes_per_token(self, dtype_bytes: float = 2) -> float:
        """KV-cache bytes of one token over all layers (seeds: 2 x L x kv_heads x head_dim x B).

        MLA caches one latent per token and layer: (kv_lora_rank + qk_rope_head_dim) x L x B.
        """
        if self.is_mla:
            return self.kv_dim * self.num_hidden_layers * dtype_bytes
        return 2 * self.num_hidden_layers * self.kv_dim * dtype_bytes

    # ------------------------------------------------------------------------------- GEMMs

    def gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each weight GEMM of one layer (of one expert for experts).

        Keys: ``qkv_gemm``, ``o_gemm``, ``lm_head_gemm``; ``gate_up_gemm``/``down_gemm`` when the
        model has dense-MLP layers; ``moe_gate_gemm`` (router), ``moe_expert_gate_up``,
        ``moe_expert_down`` for MoE; ``shared_expert_gate_up``/``shared_expert_down`` when shared
        experts exist (all fused into one GEMM pair); ``q_b_proj``/``kv_b_proj`` for MLA.
        """
        h = self.hidden_size
        shapes: dict[str, tuple[int, int]] = {
            "qkv_gemm": (h, self.qkv_out_features),
            "o_gemm": (self.o_in_features, h),
        }
        if self.is_mla:
            heads, nope = self.num_attention_heads, self.qk_nope_head_dim or 0
            if self.q_lora_rank is not None:
                shapes["q_b_proj"] = (self.q_lora_rank, self.q_dim)
            shapes["kv_b_proj"] = (self.kv_lora_rank or 0, heads * (nope + (self.v_head_dim or 0)))
        if self.dense_layers:
            shapes["gate_up_gemm"] = (h, self.gate_up_out_features)
            shapes["down_gemm"] = (self.intermediate_size, h)
        if self.is_moe:
            e = self.expert_intermediate_size
            shapes["moe_gate_gemm"] = (h, self.num_experts)
            shapes["moe_expert_gate_up"] = (h, 2 * e)
            shapes["moe_expert_down"] = (e, h)
            if self.n_shared_experts:
                shapes["shared_expert_gate_up"] = (h, 2 * e * self.n_shared_experts)
                shapes["shared_expert_down"] = (e * self.n_shared_experts, h)
        shapes["lm_head_gemm"] = (h, self.vocab_size)
        return shapes

    def weight_bytes(self, role: str, dtype_bytes: float = 2) -> float:
        """Bytes of one weight matrix of a GEMM role (:meth:`gemm_shapes`); KeyError if absent."""
        k, n = self.gemm_shapes()[role]
        return k * n * dtype_bytes

    def param_count(self, active: bool = False) -> int:
        """Weight-matrix parameters (embeddings, attention, MLP/experts, router, LM head; norms and
        biases left out). ``active``: only the experts one token uses."""
        s = self.gemm_shapes()
        per = {role: k * n for role, (k, n) in s.items()}
        attn = per["qkv_gemm"] + per["o_gemm"] + per.get("q_b_proj", 0) + per.get("kv_b_proj", 0)
        dense_mlp = per.get("gate_up_gemm", 0) + per.get("down_gemm", 0)
        experts = self.num_experts_per_tok if active else self.num_experts
        moe_mlp = (
            per.get("moe_gate_gemm", 0)
            + experts * (per.get("moe_expert_gate_up", 0) + per.get("moe_expert_down", 0))
            + per.get("shared_expert_gate_up", 0)
            + per.get("shared_expert_down", 0)
        )
        layers = self.num_hidden_layers * attn + self.dense_layers * dense_mlp + self.moe_layers * moe_mlp
        embed = self.vocab_size * self.hidden_size
        return layers + embed + (0 if self.tie_word_embeddings else per["lm_head_gemm"])


# ----------------------------------------------------------------------------------- parsing


def _first(d: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return None


def from_hf_config(config: dict[str, Any], name: str | None = None, source: str = "") -> ModelArch:
    """A :class:`ModelArch` from a HF config dict (multimodal ``text_config`` nesting included)."""
    if not isinstance(config, dict):
        raise InputError("model config: not a JSON object")
    d = dict(config)
    if "hidden_size" not in d:
        for nested in ("text_config", "language_config", "llm_config"):
            if isinstance(d.get(nested), dict):
                d = {**d[nested], **{k: d[k] for k in ("_name_or_path", "name") if k in d}}
                break

    def need(key: str) -> int:
        value = d.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"model config: missing or invalid '{key}'")
        return value

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    kv_lora = d.get("kv_lora_rank")
    head_dim = _first(d, "head_dim") or hidden // heads
    if kv_lora is not None:
        # transformers' DeepseekV3Config sets head_dim to the RoPE width; keep the seeds' meaning.
        head_dim = d.get("qk_nope_head_dim") or head_dim
    experts = _first(d, "num_experts", "num_local_experts", "n_routed_experts") or 0
    quant = d.get("quantization_config")
    quant_method = d.get("quant_method") or (quant.get("quant_method") if isinstance(quant, dict) else None)
    intermediate = _first(d, "intermediate_size", "moe_intermediate_size")
    if not isinstance(intermediate, int):
        raise InputError("model config: missing or invalid 'intermediate_size'")
    return ModelArch(
        name=name or str(_first(d, "name", "_name_or_path", "model_type", "kind") or "model"),
        model_type=str(_first(d, "model_type", "kind") or "unknown"),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=need("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=_first(d, "num_key_value_heads") or heads,
        head_dim=int(head_dim),
        vocab_size=need("vocab_size"),
        num_experts=int(experts),
        num_experts_per_tok=int(_first(d, "num_experts_per_tok", "experts_per_token", "moe_topk") or 0),
        moe_intermediate_size=d.get("moe_intermediate_size") if experts else None,
        n_shared_experts=int(d.get("n_shared_experts") or 0),
        first_k_dense_replace=int(d.get("first_k_dense_replace") or 0),
        decoder_sparse_step=int(d.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
        q_lora_rank=d.get("q_lora_rank"),
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=d.get("qk_nope_head_dim"),
        qk_rope_head_dim=d.get("qk_rope_head_dim"),
        v_head_dim=d.get("v_head_dim"),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        dtype=str(_first(d, "dtype", "torch_dtype") or "bfloat16"),
        quant_method=quant_method,
        source=source or str(d.get("source", "")),
        aliases=tuple(d.get("aliases", ())),
    )


def from_meta_arch(d: dict[str, Any]) -> ModelArch:
    """The ``arch`` dict of a fixture's meta.json (HF keys, ``kind`` for model_type)."""
    return from_hf_config(d, name=d.get("name") or d.get("kind"), source="meta.json arch")


def _name_key(text: str) -> str:
    """Compare names ignoring case, punctuation, an org prefix and variant suffixes."""
    tokens = re.findall(r"[a-z0-9]+", text.lower().rsplit("/", 1)[-1])
    while len(tokens) > 1 and tokens[-1] in _VARIANT_SUFFIXES:
        tokens.pop()
    return "".join(tokens)


def load_builtin_models(path: str | Path | None = None) -> dict[str, ModelArch]:
    """All [model.<key>] tables of rules/models.toml (or ``path``), keyed by table key."""
    return dict(loader.load(path if path is not None else MODELS_TOML, _parse_models))


def _parse_models(data: dict[str, Any], path: Path) -> dict[str, ModelArch]:
    models = data.get("model") or {}
    if not isinstance(models, dict):
        raise loader.fail(path, "model", "must be [model.<key>] tables")
    out = {}
    for key, entry in models.items():
        if not isinstance(entry, dict):
            raise loader.fail(path, f"model.{key}", "must be a table")
        try:
            out[key] = from_hf_config(entry, name=entry.get("name") or key)
        except InputError as exc:
            raise loader.fail(path, f"model.{key}", str(exc)) from None
    return out


@functools.cache
def _builtins() -> dict[str, ModelArch]:
    return load_builtin_models()


def find_builtin(name: str) -> ModelArch | None:
    """The built-in model called ``name`` (key, display name or alias), or None."""
    wanted = _name_key(name)
    if not wanted:
        return None
    for key, arch in _builtins().items():
        if wanted in {_name_key(key), _name_key(arch.name), *(_name_key(a) for a in arch.aliases)}:
            return arch
    return None


def load_model(spec: str) -> ModelArch:
    """A built-in name (``"llama-3-8b"``, ``"meta-llama/Meta-Llama-3-8B"``) or a path to a HF
    config.json (or to the directory holding one). Raises InputError with one line otherwise."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"cannot read model config {path}: {exc}") from None
        try:
            name = config.get("_name_or_path") if isinstance(config, dict) else None
            return from_hf_config(config, name=name or path.parent.name or path.stem, source=str(path))
        except InputError as exc:
            raise InputError(f"{path}: {exc}") from None
    arch = find_builtin(spec)
    if arch is None:
        known = ", ".join(a.name for a in _builtins().values())
        raise InputError(f"unknown model '{spec}': not a config.json path nor a built-in ({known})")
    return arch
