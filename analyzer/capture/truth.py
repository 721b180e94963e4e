"""Truth ranges and exact step annotations for a HF causal LM, written while it runs (needs torch).

Contract: :class:`Instrumentation` adds ``torch.profiler.record_function`` ranges and nothing else.
It launches no kernel, copies no tensor and reads no device value, so the kernels of an
instrumented run are the kernels of a plain one (``tests/test_capture_truth.py`` checks the op
sequence). Two kinds of range (``docs/accuracy.md``):

* ``lkm::truth region=<region>`` around each module or function call that launches kernels: the
  region follows from the module's class and attribute name (:func:`module_regions`) or from the
  model's own functions (rotary, attention interface, mask creation, the cache's ``update``);
* ``lkm::step phase=<prefill|decode|mixed> q= bs= kv= [tokens=] [model=draft]`` around each forward
  step and the sampling after it: a step begins at a model forward and ends where the next one begins
  (or the run ends), so steps never overlap and each forward's token choice is in its step.

Inside ``torch.compile`` tracing every hook returns at once, so compiled code (and the CUDA graphs
replayed from it) holds no range; a compiled forward gets its step range from a wrapper around the
compiled callable, outside the compiled region. The first forward of each model in a run is its
prefill; every later one (draft steps and verify steps alike) is decode.

Imports torch (and transformers lazily) only: it runs on machines without the analyzer's extras.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

TRUTH_PREFIX = "lkm::truth region="
STEP_PREFIX = "lkm::step "

#: every region a capture writes (``rules/truth.toml`` gives each its accepted stages)
REGIONS = (
    "embedding",
    "norm",
    "rope",
    "qkv_proj",
    "o_proj",
    "attention",
    "attention_mask",
    "kv_cache_update",
    "gate_up_proj",
    "down_proj",
    "activation",
    "lm_head",
    "moe_router",
    "experts",
    "expert_weights",
    "shared_expert",
    "moe_block",
    "attention_module",
    "mixer",
    "mixer_in_proj",
    "mixer_out_proj",
    "mixer_norm",
    "quantize",
    "mlp",
    "layer",
    "model",
)

_QKV = {
    "q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value", "c_attn", "wqkv", "qkv", "query",
    "key", "value", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_proj", "kv_b_proj", "q_attn",
    "kv_proj",
}  # fmt: skip
_O = {"o_proj", "out_proj", "wo", "attn_out"}
_O_IN_ATTENTION = {"dense", "c_proj", "proj"}
_GATE_UP = {"gate_proj", "up_proj", "gate_up_proj", "fc1", "c_fc", "dense_h_to_4h", "w1", "w3", "fc_in", "wi"}
_DOWN = {"down_proj", "fc2", "dense_4h_to_h", "w2", "fc_out"}
_DOWN_IN_MLP = {"c_proj", "wo", "proj", "dense"}
_ROUTER_NAMES = {"gate", "router", "shared_expert_gate", "moe_gate"}
_ACT_NAMES = {"act", "act_fn", "activation_fn", "activation", "act_func"}
_LAYER_LISTS = {"layers", "h", "blocks", "layer", "decoder_layers"}
_MIXER_OUT = _O | {"output", "linear_out", "out"}
#: the token mixers that replace softmax attention (state-space, linear-attention, recurrent and short-
#: convolution mixers), by their class name: Mamba-1/2 ``*Mixer`` / ``*MambaLayer``, Gated DeltaNet,
#: Kimi's delta attention, lightning attention, short convolutions, RG-LRU blocks, RWKV time mixing, mLSTM
_MIXER_CLS = re.compile(
    r"(Mixer|MambaLayer|DeltaNet|DeltaAttention|LightningAttention|ShortConv\w*|RecurrentBlock|"
    r"Rwkv\w*Attention|LSTMLayer)$"
)
_ROPE_FN = re.compile(r"(?i)^(apply_rotary\w*|apply_rope\w*|\w*rotary_pos_emb\w*)$")
_ATTN_FN = re.compile(r"^\w*attention_forward$")
_MASK_FN = re.compile(r"^create_\w*mask\w*$")


def truth_name(region: str) -> str:
    return f"{TRUTH_PREFIX}{region}"


def step_name(
    phase: str,
    q: int,
    bs: int,
    kv: int | None = None,
    *,
    tokens: int | None = None,
    model: str | None = None,
    extra: dict[str, int] | None = None,
) -> str:
    """``lkm::step phase=.. q=.. bs=.. kv=..`` plus ``tokens=`` (when q x bs is not exact) and
    ``model=draft``: keys after ``kv`` are extra to the grammar of ``rules/annotations.toml``."""
    s = f"lkm::step phase={phase} q={q} bs={bs}"
    if kv is not None:
        s += f" kv={kv}"
    if tokens is not None:
        s += f" tokens={tokens}"
    for k, v in (extra or {}).items():
        s += f" {k}={v}"
    if model and model != "target":
        s += f" model={model}"
    return s


class _Range:
    """One open ``record_function`` range (entered and left on the same thread)."""

    __slots__ = ("rf",)

    def __init__(self, name: str) -> None:
        self.rf = torch.autograd.profiler.record_function(name)
        self.rf.__enter__()

    def close(self) -> None:
        self.rf.__exit__(None, None, None)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


# ----------------------------------------------------------------------------- regions of modules


def _cls(mod: nn.Module) -> str:
    return type(mod).__name__


def _is_linear(mod: nn.Module) -> bool:
    return isinstance(mod, nn.Linear) or _cls(mod) in ("Conv1D", "Linear")


def _is_activation(mod: nn.Module, name: str) -> bool:
    m = type(mod).__module__
    return (
        m.startswith("torch.nn.modules.activation")
        or m.startswith("transformers.activations")
        or (name in _ACT_NAMES and not list(mod.children()))
    )


def _region_of(mod: nn.Module, name: str, ctx: tuple[str, ...], parent: str = "") -> str | None:
    """The region of one module given its attribute name, its ancestors' regions (outermost first)
    and its parent's class name."""
    cls = _cls(mod)
    low, lname = cls.lower(), name.lower()
    if not ctx:
        return "model"
    inner = ctx[-1]
    if "experts" in ctx or "shared_expert" in ctx:  # an expert's own projections are expert work
        return "activation" if _is_activation(mod, lname) else None
    if "mixer" in ctx:  # a mixer: its projections and norm; the rest (conv, scan, gates) is its core
        if "norm" in low and "normal" not in low:
            return "mixer_norm"
        if _is_linear(mod):
            return "mixer_out_proj" if lname in _MIXER_OUT else "mixer_in_proj"
        return None
    if "moe_router" in ctx:  # a router's own layers (a router MLP) are routing
        return None
    if "rotary" in low or lname in ("rotary_emb", "rope"):
        return "rope"
    if isinstance(mod, nn.Embedding) or low.endswith("embedding") or low.endswith("embeddings"):
        return "embedding"
    if "norm" in low and "normal" not in low:
        return "norm"
    if isinstance(mod, nn.Softmax) and inner == "attention_module":
        return None  # an attention's softmax as a module (CPM-Ant's): the attention's own, no activation
    if _is_activation(mod, lname):
        return "activation"
    if _holds_experts(mod):
        # a block of its own experts and router (JetMoE's mixture of attention heads, its `experts`)
        return "moe_block"
    if lname == "experts" or low.endswith("experts"):
        return "experts"
    if lname.startswith("shared_expert") and lname != "shared_expert_gate":
        return "shared_expert"
    if inner == "moe_block" and (lname in _ROUTER_NAMES or "router" in low):
        return "moe_router"
    if "router" in low or "topkrouter" in low:
        return "moe_router"
    if _is_linear(mod):
        if lname == "lm_head" or (inner == "model" and "head" in lname):
            return "lm_head"
        if lname in _QKV and inner != "mlp":  # an MLP's key/value (RWKV channel mixing) is not attention
            return "qkv_proj"
        if (
            (lname in _O and inner != "mlp")  # an MLP's `Wo` (ModernBERT) is its down projection
            or (inner == "attention_module" and lname in _O_IN_ATTENTION)
            or (lname == "dense" and parent.endswith("SelfOutput"))
        ):
            return "o_proj"
        if lname in _GATE_UP or (lname == "dense" and parent.endswith("Intermediate")):
            return "gate_up_proj"  # BERT-style blocks: `intermediate.dense` is the MLP's up projection
        if lname == "dense" and parent.endswith("Output") and not parent.endswith("SelfOutput"):
            return "down_proj"  # ... and the layer's `output.dense` its down projection
        if lname in _DOWN or (inner == "mlp" and lname in _DOWN_IN_MLP):
            return "down_proj"
        return None
    if cls.endswith("SelfOutput"):
        return "layer"  # BERT-style: the attention's output projection, the residual add and the norm
    if _MIXER_CLS.search(cls) and not name.isdigit():
        return "mixer"
    if low.endswith("attention") or lname in ("self_attn", "attn", "attention", "self_attention"):
        # (before the MoE test: a mixture of attention heads keeps its experts inside the
        # attention, JetMoE's `experts` MoA: the attention is still the attention module)
        return "attention_module"
    if hasattr(mod, "experts"):
        return "moe_block"
    if "mlp" in low or "feedforward" in low or lname in ("mlp", "feed_forward", "ffn", "ff"):
        return "mlp"
    if name.isdigit() and inner in ("attention_module", "mlp"):
        # an item of a list of attentions or MLPs (LongCat-Flash's two per layer): its list's region
        # (a list never runs: its items' calls are the ranges)
        return inner
    if name.isdigit() or low.endswith("decoderlayer") or low.endswith("block"):
        return "layer"
    if low.endswith("model") and any(isinstance(c, nn.ModuleList) for c in mod.children()):
        return "model"
    return None


def _holds_experts(mod: nn.Module) -> bool:
    """An MoE block that keeps its experts as expert modules of its own, not one ``experts``
    attribute (JetMoE's MoE and mixture of attention heads: ``input_linear`` and ``output_linear``,
    both parallel experts)."""
    return any(_cls(c).lower().endswith("experts") for c in mod.children())


def module_regions(model: nn.Module) -> dict[nn.Module, str]:
    """The truth region of each module of ``model`` that gets one (the others inherit their parent's)."""
    out: dict[nn.Module, str] = {}

    def visit(mod: nn.Module, name: str, ctx: tuple[str, ...], parent_list: bool, parent: str = "") -> None:
        region = _region_of(mod, name, ctx, parent)
        if region is None and parent_list and name.isdigit() and ctx and ctx[-1] == "model":
            region = "layer"
        if region is not None and mod not in out:
            out[mod] = region
        sub = (*ctx, region) if region is not None else ctx
        is_list = isinstance(mod, nn.ModuleList) and name in _LAYER_LISTS
        for cname, child in mod.named_children():
            visit(child, cname, sub, is_list, _cls(mod))

    visit(model, "", (), False)
    # the LM head is the model's output embedding, whatever it is called (`output_projection`,
    # `embed_out`, a `decoder` inside an `lm_head` module ...)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Module) and out.get(head) in (None, "lm_head"):
        out[head] = "lm_head"
    return out


def modeling_modules(model: nn.Module) -> list[Any]:
    """The ``transformers.models.*`` Python modules the model's classes come from."""
    names = {type(m).__module__ for m in model.modules()}
    return [
        sys.modules[n] for n in sorted(names) if n.startswith("transformers.models.") and n in sys.modules
    ]


# ----------------------------------------------------------------------------- instrumentation


class _State:
    __slots__ = ("seen", "kv", "role")

    def __init__(self, role: str) -> None:
        self.role, self.seen, self.kv = role, False, 0


class _AttentionFunctions:
    """Stands in for a modeling module's ``ALL_ATTENTION_FUNCTIONS``: every function it hands out
    runs inside the ``attention`` region."""

    def __init__(self, inner: Any, wrap: Callable[[Callable[..., Any], str], Callable[..., Any]]) -> None:
        self._inner, self._wrap = inner, wrap

    def get_interface(self, impl: Any, default: Callable[..., Any]) -> Callable[..., Any]:
        return self._wrap(self._inner.get_interface(impl, default), "attention")

    def __getitem__(self, key: str) -> Callable[..., Any]:
        return self._wrap(self._inner[key], "attention")

    def get(self, key: str, default: Any = None) -> Any:
        fn = self._inner.get(key, default)
        return self._wrap(fn, "attention") if callable(fn) else fn

    def __contains__(self, key: object) -> bool:
        return key in self._inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_GATHERS = frozenset({
    torch.Tensor.__getitem__, torch.Tensor.index_select, torch.index_select, torch.Tensor.gather,
    torch.gather, torch.Tensor.take, torch.take, torch.nn.functional.embedding,
})  # fmt: skip


_MATMULS = frozenset({
    torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm,
    torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.nn.functional.linear, torch.einsum,
})  # fmt: skip


class _WeightUses(torch.overrides.TorchFunctionMode):
    """Puts each call of ``funcs`` that takes one of ``uses``' parameters (by id) as an argument
    inside that parameter's truth range; every other torch call passes through untouched."""

    def __init__(self, uses: dict[int, str], funcs: frozenset[Any], first_only: bool) -> None:
        super().__init__()
        self.uses, self.funcs, self.first_only = uses, funcs, first_only

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in self.funcs and args:
            seen = args[:1] if self.first_only else args
            name = next((self.uses[id(a)] for a in seen if id(a) in self.uses), None)
            if name is not None:
                r = _Range(name)
                try:
                    return func(*args, **kwargs)
                finally:
                    r.close()
        return func(*args, **kwargs)


class Instrumentation:
    """Install truth ranges and step annotations on models for the duration of a ``with`` block.

    Args:
        truth: write the ``lkm::truth`` ranges (else only the steps).
        steps: write ``lkm::step`` ranges at each model forward (``False`` where the caller
            annotates steps itself, e.g. continuous batching's batch step).
    """

    def __init__(self, *, truth: bool = True, steps: bool = True) -> None:
        self.truth, self.steps = truth, steps
        self.written: list[str] = []  # the step annotations, in order
        self._models: dict[int, _State] = {}
        self._hooks: list[Any] = []
        self._undo: list[Callable[[], None]] = []
        self._step: _Range | None = None
        self._step_thread: int | None = None
        self._suppress = threading.local()
        self._lock = threading.Lock()

    # -- public ---------------------------------------------------------------------------

    def add_model(self, model: nn.Module, role: str = "target") -> None:
        """Instrument ``model`` (``role``: ``target`` or ``draft``)."""
        self._models[id(model)] = _State(role)
        if self.steps:
            self._hooks.append(model.register_forward_pre_hook(self._forward_step, with_kwargs=True))
            self._patch_compiled_call(model)
        if self.truth:
            regions = module_regions(model)
            for mod, region in regions.items():
                name = truth_name(region)
                self._hooks.append(mod.register_forward_pre_hook(functools.partial(self._enter, name)))
                self._hooks.append(mod.register_forward_hook(self._leave, always_call=True))
                if region == "experts":
                    self._watch_expert_weights(mod)
                elif region == "mixer":
                    self._watch_mixer_weights(mod, regions)
            for pymod in modeling_modules(model):
                self._patch_functions(pymod)
            self._patch_cache_updates()

    def reset(self) -> None:
        """A new run begins: each model's next forward is its prefill again."""
        self.end_step()
        for st in self._models.values():
            st.seen, st.kv = False, 0

    def begin_step(self, name: str) -> None:
        """Close the open step (if any) and open ``name`` on this thread."""
        self.end_step()
        self.written.append(name)
        self._step = _Range(name)
        self._step_thread = threading.get_ident()

    def end_step(self) -> None:
        if self._step is not None:
            self._step.close()
            self._step = None

    @property
    def suppressed(self) -> bool:
        return bool(getattr(self._suppress, "on", False))

    def close(self) -> None:
        self.end_step()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- hooks ----------------------------------------------------------------------------

    def _enter(self, name: str, mod: nn.Module, args: Any) -> None:
        if _compiling() or self.suppressed:
            return
        stack = mod.__dict__.setdefault("_lkm_truth_stack", [])
        stack.append(_Range(name))

    def _leave(self, mod: nn.Module, args: Any, output: Any) -> None:
        if _compiling() or self.suppressed:
            return
        stack = mod.__dict__.get("_lkm_truth_stack")
        if stack:
            stack.pop().close()

    def _forward_step(self, mod: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if _compiling() or self.suppressed:
            return
        self._step_for(mod, args, kwargs)

    def _step_for(self, mod: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        st = self._models.get(id(mod))
        if st is None:
            return
        ids = kwargs.get("input_ids")
        if ids is None and args and isinstance(args[0], torch.Tensor):
            ids = args[0]
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if ids is None:
            return
        bs, q = int(ids.shape[0]), int(ids.shape[1]) if ids.dim() > 1 else 1
        past = cache_length(kwargs.get("past_key_values", kwargs.get("cache")))
        phase = "decode" if st.seen else "prefill"
        kv = (past if past is not None else (st.kv if st.seen else 0)) + q
        st.seen, st.kv = True, kv
        self.begin_step(step_name(phase, q, bs, kv, model=st.role))

    def _watch_expert_weights(self, mod: nn.Module) -> None:
        """Inside the experts module's forward, an indexing of its own weights (``gate_up_proj[ids]``:
        the per-token gather of expert weights before a bmm) runs inside an ``expert_weights`` range.
        The range begins after the pre-hook's ``experts`` range, so it is the innermost one."""
        name = truth_name("expert_weights")
        uses = {id(p): name for p in mod.parameters(recurse=False)}
        self._watch_weight_uses(mod, uses, _GATHERS, first_only=True)

    def _watch_mixer_weights(self, mod: nn.Module, regions: dict[nn.Module, str]) -> None:
        """Inside a mixer's forward, a matmul with one of its projections' weights outside that
        projection's forward (Mamba-1's ``dt_proj.weight @ x``) runs inside the projection's range:
        it is the projection's work, however the code calls it."""
        uses = {
            id(c.weight): truth_name(regions[c])
            for c in mod.modules()
            if regions.get(c) in ("mixer_in_proj", "mixer_out_proj")
            and isinstance(getattr(c, "weight", None), torch.Tensor)
        }
        self._watch_weight_uses(mod, uses, _MATMULS, first_only=False)

    def _watch_weight_uses(
        self, mod: nn.Module, uses: dict[int, str], funcs: frozenset[Any], first_only: bool
    ) -> None:
        """During ``mod``'s forward, :class:`_WeightUses` of ``uses`` over ``funcs``."""
        if not uses:
            return
        inst = self

        def pre(m: nn.Module, args: Any) -> None:
            if _compiling() or inst.suppressed:
                return
            mode = _WeightUses(uses, funcs, first_only)
            mode.__enter__()
            m.__dict__.setdefault("_lkm_weight_modes", []).append(mode)

        def post(m: nn.Module, args: Any, output: Any) -> None:
            modes = m.__dict__.get("_lkm_weight_modes")
            if modes:
                modes.pop().__exit__(None, None, None)

        self._hooks.append(mod.register_forward_pre_hook(pre))
        self._hooks.append(mod.register_forward_hook(post, always_call=True))

    # -- patches --------------------------------------------------------------------------

    def _patch_compiled_call(self, model: nn.Module) -> None:
        """HF generate runs compiled decode forwards through ``get_compiled_call``: the step range
        goes around the compiled callable, which then runs with every hook silent."""
        orig = getattr(model, "get_compiled_call", None)
        if orig is None:
            return
        inst = self

        def get_compiled_call(*a: Any, **kw: Any) -> Callable[..., Any]:
            fn = orig(*a, **kw)

            def stepped(*args: Any, **kwargs: Any) -> Any:
                inst._step_for(model, args, kwargs)
                inst._suppress.on = True
                try:
                    return fn(*args, **kwargs)
                finally:
                    inst._suppress.on = False

            return stepped

        model.get_compiled_call = get_compiled_call  # type: ignore[method-assign]
        self._undo.append(lambda: model.__dict__.pop("get_compiled_call", None))

    def _wrap(self, fn: Callable[..., Any], region: str) -> Callable[..., Any]:
        if getattr(fn, "_lkm_region", None) == region:
            return fn
        name, inst = truth_name(region), self

        @functools.wraps(fn)
        def ranged(*args: Any, **kwargs: Any) -> Any:
            if _compiling() or inst.suppressed:
                return fn(*args, **kwargs)
            r = _Range(name)
            try:
                return fn(*args, **kwargs)
            finally:
                r.close()

        ranged._lkm_region = region  # type: ignore[attr-defined]
        return ranged

    def _set(self, owner: Any, attr: str, value: Any) -> None:
        old = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        setattr(owner, attr, value)
        self._undo.append(lambda: setattr(owner, attr, old))

    def _patch_functions(self, pymod: Any) -> None:
        for attr, val in list(vars(pymod).items()):
            if getattr(val, "_lkm_region", None) or isinstance(val, _AttentionFunctions):
                continue
            if attr == "ALL_ATTENTION_FUNCTIONS":
                self._set(pymod, attr, _AttentionFunctions(val, self._wrap))
            elif not callable(val) or isinstance(val, type):
                continue
            elif _ROPE_FN.match(attr):
                self._set(pymod, attr, self._wrap(val, "rope"))
            elif _ATTN_FN.match(attr):
                self._set(pymod, attr, self._wrap(val, "attention"))
            elif _MASK_FN.match(attr):
                self._set(pymod, attr, self._wrap(val, "attention_mask"))

    def _patch_cache_updates(self) -> None:
        for cls in _cache_classes():
            if "update" in cls.__dict__ and not getattr(cls.__dict__["update"], "_lkm_region", None):
                self._set(cls, "update", self._wrap(cls.__dict__["update"], "kv_cache_update"))


def _cache_classes() -> Iterator[type]:
    """Every KV-cache class of the installed transformers whose ``update`` a model calls."""
    try:
        from transformers import cache_utils
    except ImportError:
        return
    base = getattr(cache_utils, "Cache", None)
    mods = [cache_utils]
    try:
        from transformers.generation.continuous_batching import cache as cb_cache

        mods.append(cb_cache)
    except ImportError:
        pass
    for m in mods:
        for val in vars(m).values():
            if isinstance(val, type) and val.__module__ == m.__name__ and "update" in val.__dict__:
                if (base is not None and issubclass(val, base)) or val.__name__.endswith("Cache"):
                    yield val


def cache_length(cache: Any) -> int | None:
    """Tokens in a cache when known without touching the device (a dynamic cache's tensor shape)."""
    if cache is None:
        return 0
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    layer = layers[0]
    if type(layer).__name__ != "DynamicLayer":
        return None
    if not getattr(layer, "is_initialized", False):
        return 0
    keys = getattr(layer, "keys", None)
    return int(keys.shape[-2]) if keys is not None and keys.numel() else 0


__all__ = [
    "REGIONS",
    "STEP_PREFIX",
    "TRUTH_PREFIX",
    "Instrumentation",
    "cache_length",
    "module_regions",
    "modeling_modules",
    "step_name",
    "truth_name",
]
