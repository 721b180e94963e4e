"""Kernel libraries and quantized linear layers for a HF capture (needs torch; each library only for
the option that names it).

Engines rarely run transformers' own eager kernels: they patch in a Triton op library, run linear
attention through flash-linear-attention and serve quantized weights. Two capture options stand for
that (``docs/capture.md``):

* ``kernels`` — a comma list of ``liger`` (Liger Kernel's Triton RMSNorm / LayerNorm, RoPE,
  SwiGLU / GeGLU and fused-MoE kernels, patched into the built model by its ``apply_liger_kernel_to_<type>``
  with Liger's defaults for the family; its loss kernels stay off, inference computes no loss) and
  ``fla`` (flash-linear-attention: transformers picks its Triton Gated DeltaNet / KDA kernels for
  the linear-attention layers when it is importable; the option makes that a checked requirement).
* ``quant`` — one torchao scheme for the decoder's ``nn.Linear`` layers (never the LM head or a MoE
  router), each on a path that needs no compiled package beyond PyTorch (:data:`QUANTS`).

Contract: :func:`prepare` runs after the model is built and before the truth instrumentation is
installed, so the truth ranges wrap the library's functions as they wrap transformers' own (Liger
replaces a modeling module's ``apply_rotary_pos_emb``, which then runs in the ``rope`` region;
quantized linears keep their class and names, so they keep their projection regions). With truth
ranges on, the activation quantization inside a quantized linear runs in an
``lkm::truth region=quantize`` range. :meth:`Prepared.undo` restores every module attribute the
libraries changed, so the next capture in the same process starts from plain transformers.
Nothing here launches a kernel of its own (quantizing the weights runs once, before the warm-up).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from analyzer.capture.truth import truth_name

__all__ = [
    "KERNELS",
    "QUANTS",
    "QUANTIZE_REGION",
    "LibraryError",
    "Prepared",
    "check_options",
    "hub_functions",
    "parse_kernels",
    "prepare",
    "versions",
]

#: kernel library -> what it patches
KERNELS = {
    "liger": "Liger Kernel Triton ops (RMSNorm/LayerNorm, RoPE, SwiGLU/GeGLU, fused MoE) patched into the model",
    "fla": "flash-linear-attention Triton kernels for the linear-attention layers (transformers' own pick)",
}

#: quantization scheme -> (torchao config, what runs)
QUANTS = {
    "fp8-row": "Float8DynamicActivationFloat8WeightConfig(PerRow, kernel TORCH): per-row dynamic e4m3 "
    "activations, e4m3 weights, torch._scaled_mm",
    "fp8-tensor": "Float8DynamicActivationFloat8WeightConfig(PerTensor, kernel TORCH): per-tensor dynamic "
    "e4m3 activations, e4m3 weights, torch._scaled_mm",
    "int8-wo": "Int8WeightOnlyConfig(PerRow): int8 weights dequantized to the activation dtype, then mm",
    "int8-dq": "Int8DynamicActivationInt8WeightConfig(PerRow): per-token dynamic int8 activations, "
    "int8 weights, torch._int_mm",
    "int4-wo": "Int4WeightOnlyConfig(group 128, tile_packed_to_4d): tinygemm aten._weight_int4pack_mm",
    "int8-pack": "int8 per-channel weights through aten._weight_int8pack_mm (PyTorch's own int8 "
    "weight-only kernel; not torchao)",
}

#: the truth region of the activation quantization inside a quantized linear
QUANTIZE_REGION = "quantize"

_FP8 = ("fp8-row", "fp8-tensor")
_NEEDS_BF16 = ("int4-wo",)
_DISTRIBUTIONS = {"liger": "liger-kernel", "fla": "flash-linear-attention", "torchao": "torchao"}
_SKIP_LINEARS = ("lm_head", "router", "shared_expert_gate")


class LibraryError(ValueError):
    """A library option that cannot be applied (unknown name, missing package, model it does not fit)."""


def parse_kernels(kernels: str | None) -> tuple[str, ...]:
    """``"liger,fla"`` -> ``("liger", "fla")``; checked against :data:`KERNELS`."""
    names = tuple(k.strip() for k in (kernels or "").split(",") if k.strip())
    bad = [k for k in names if k not in KERNELS]
    if bad:
        raise LibraryError(f"unknown kernel library {bad[0]!r} (use {', '.join(KERNELS)})")
    return names


def check_options(kernels: str | None, quant: str | None, *, device: str, dtype: str) -> None:
    """Refuse combinations that cannot run, before anything is built."""
    parse_kernels(kernels)
    if quant is None:
        return
    if quant not in QUANTS:
        raise LibraryError(f"unknown quantization {quant!r} (use {', '.join(QUANTS)})")
    if quant in _NEEDS_BF16 and dtype != "bf16":
        raise LibraryError(f"--quant {quant} needs --dtype bf16 (tinygemm takes bf16 activations)")
    if (quant in _FP8 or quant == "int4-wo") and not device.startswith("cuda"):
        raise LibraryError(f"--quant {quant} runs on a GPU only (its kernels have no CPU path here)")


def versions(kernels: tuple[str, ...], quant: str | None) -> dict[str, str]:
    """The versions of the libraries the options use (``meta.json``)."""
    names = list(kernels) + (["torchao"] if quant and quant != "int8-pack" else [])
    out = {}
    for n in names:
        try:
            out[_DISTRIBUTIONS[n]] = importlib.metadata.version(_DISTRIBUTIONS[n])
        except importlib.metadata.PackageNotFoundError:
            out[_DISTRIBUTIONS[n]] = "not installed"
    return out


@dataclasses.dataclass
class Prepared:
    """What :func:`prepare` did: ``meta`` for ``meta.json``; :meth:`undo` puts every patch back."""

    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    _undo: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def prepare(
    model: nn.Module, *, kernels: str | None, quant: str | None, truth: bool, device: str, dtype: str
) -> Prepared:
    """Apply ``kernels`` and ``quant`` to the built ``model`` (see the module docstring)."""
    check_options(kernels, quant, device=device, dtype=dtype)
    names = parse_kernels(kernels)
    out = Prepared()
    if not names and quant is None:  # a plain capture: nothing to patch, nothing to record
        return out
    out.meta["kernels"] = list(names) or None
    out.meta["quant"] = quant
    out.meta["library_versions"] = versions(names, quant)
    try:
        if "fla" in names:
            _require_fla(model)
        if "liger" in names:
            out.meta["liger"] = _apply_liger(model, out)
        if quant is not None:
            out.meta["quantized"] = _quantize(model, quant, dtype)
            if truth:
                _range_activation_quantization(quant, out)
        out.meta["kernel_functions"] = hub_functions(model) or None
    except Exception:
        out.undo()
        raise
    return out


# ----------------------------------------------------------------------------- fla


def hub_functions(model: nn.Module) -> dict[str, str]:
    """The functions of the model's modeling modules that transformers resolves at import to an
    installed package or its own torch fallback (``use_kernel_func_from_hub_with_fallback``): name ->
    ``module.qualname`` of the implementation that runs."""
    out: dict[str, str] = {}
    for pymod in _modeling_modules(model):
        for attr, val in vars(pymod).items():
            if not inspect.isfunction(val):
                continue
            free = val.__code__.co_freevars
            if "implementation" not in free or "is_new_implementation" not in free:
                continue
            cells = dict(zip(free, val.__closure__ or (), strict=True))
            impl = cells["implementation"].cell_contents
            out[attr] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
    return out


def _require_fla(model: nn.Module) -> None:
    if importlib.util.find_spec("fla") is None:
        raise LibraryError(
            "kernels fla: flash-linear-attention is not installed (pip install flash-linear-attention)"
        )
    picked = {k: v for k, v in hub_functions(model).items() if v.startswith("fla.")}
    if not picked:
        model_type = getattr(model.config, "model_type", "?")
        raise LibraryError(
            f"kernels fla: transformers runs no fla kernel for model type {model_type!r} (its linear-attention "
            "functions resolved to the torch fallback, or it has none)"
        )


# ----------------------------------------------------------------------------- liger


def _apply_liger(model: nn.Module, out: Prepared) -> dict[str, Any]:
    try:
        from liger_kernel.transformers import monkey_patch
    except ImportError as exc:
        raise LibraryError(f"kernels liger: liger-kernel is not importable ({exc})") from None
    model_type = getattr(model.config, "model_type", None)
    apply_fn = monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply_fn is None:
        raise LibraryError(f"kernels liger: Liger has no patch for model type {model_type!r}")
    # Liger's own defaults per family (rope is off where the family's rotary is partial, e.g. Qwen3-Next),
    # its loss kernels off: inference computes no loss, and a fused linear + cross-entropy forward
    # would replace the model's own forward
    params = inspect.signature(apply_fn).parameters
    kwargs = {k: False for k in ("cross_entropy", "fused_linear_cross_entropy") if k in params}
    options = {k: p.default for k, p in params.items() if isinstance(p.default, bool)} | kwargs
    snapshot = _snapshot_modules("transformers.")
    try:
        apply_fn(model=model, **kwargs)
    finally:
        changed = _restore_later(snapshot, out)
    return {"apply": apply_fn.__name__, "options": options, "module_attributes": changed}


def _snapshot_modules(prefix: str) -> dict[str, dict[str, Any]]:
    return {n: dict(vars(m)) for n, m in list(sys.modules.items()) if n.startswith(prefix) and m is not None}


def _restore_later(before: dict[str, dict[str, Any]], out: Prepared) -> list[str]:
    """Register the undo of every module attribute changed since ``before``; return their names."""
    changed = []
    for name, old in before.items():
        mod = sys.modules.get(name)
        if mod is None:
            continue
        now = vars(mod)
        for attr in [a for a in now if a not in old or now[a] is not old[a]]:
            changed.append(f"{name}.{attr}")
            if attr in old:
                out._undo.append(functools.partial(setattr, mod, attr, old[attr]))
            else:
                out._undo.append(functools.partial(_delattr, mod, attr))
    return sorted(changed)


def _delattr(owner: Any, attr: str) -> None:
    with contextlib.suppress(AttributeError):
        delattr(owner, attr)


# ----------------------------------------------------------------------------- quantization


def _linear_filter(module: nn.Module, fqn: str) -> bool:
    """The decoder's linear layers: never the LM head, a router or a shared-expert gate (engines
    keep those in high precision), and only shapes the kernels take."""
    if not isinstance(module, nn.Linear):
        return False
    last = fqn.rsplit(".", 1)[-1]
    if last in _SKIP_LINEARS or (last == "gate" and ".mlp." in f".{fqn}"):
        return False
    n, k = module.weight.shape
    return n % 16 == 0 and k % 16 == 0


def _torchao_config(quant: str) -> Any:
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        PerRow,
        PerTensor,
    )
    from torchao.quantization.quantize_.common import KernelPreference

    if quant in _FP8:
        gran = PerRow() if quant == "fp8-row" else PerTensor()
        # TORCH: torch._scaled_mm and torchao's eager quantize; AUTO would pick mslk where installed
        return Float8DynamicActivationFloat8WeightConfig(
            granularity=gran, kernel_preference=KernelPreference.TORCH, set_inductor_config=False
        )
    if quant == "int8-wo":
        return Int8WeightOnlyConfig(granularity=PerRow(), set_inductor_config=False)
    if quant == "int8-dq":
        return Int8DynamicActivationInt8WeightConfig(granularity=PerRow(), set_inductor_config=False)
    # tile_packed_to_4d: tinygemm (aten); "plain" and "preshuffled" need the mslk package
    return Int4WeightOnlyConfig(
        group_size=128, int4_packing_format="tile_packed_to_4d", set_inductor_config=False
    )


def _quantize(model: nn.Module, quant: str, dtype: str) -> dict[str, Any]:
    names = [n for n, m in model.named_modules() if _linear_filter(m, n)]
    if quant == "int4-wo":  # tinygemm groups of 128 along K
        names = [n for n in names if model.get_submodule(n).weight.shape[1] % 128 == 0]
    if not names:
        raise LibraryError(f"quant {quant}: the model has no linear layer the kernels take")
    keep = set(names)
    if quant == "int8-pack":
        for n in names:
            _int8_pack(model.get_submodule(n))
    else:
        try:
            from torchao.quantization import quantize_
        except ImportError as exc:
            raise LibraryError(f"quant {quant}: torchao is not importable ({exc})") from None
        quantize_(model, _torchao_config(quant), filter_fn=lambda m, fqn: fqn in keep)
    weight_types = sorted({type(model.get_submodule(n).weight).__name__ for n in names})
    return {"linears": len(names), "weight_types": weight_types, "config": QUANTS[quant]}


def _int8_pack(linear: nn.Linear) -> None:
    """Per-output-channel symmetric int8 weights, multiplied by ``aten._weight_int8pack_mm``."""
    w = linear.weight.detach()
    scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.clamp(torch.round(w.float() / scale[:, None]), -128, 127).to(torch.int8)
    linear.weight = nn.Parameter(q.contiguous(), requires_grad=False)
    linear.register_buffer("weight_scale", scale.to(w.dtype))
    bias = linear.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(
            x.reshape(-1, x.shape[-1]), linear.weight, linear.weight_scale.to(x.dtype)
        )
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y + bias if bias is not None else y

    linear.forward = forward  # type: ignore[method-assign]


def _range_activation_quantization(quant: str, out: Prepared) -> None:
    """Run torchao's activation quantization inside a linear in the ``quantize`` truth region."""
    if quant in _FP8:
        mod_name = "torchao.quantization.quantize_.workflows.float8.float8_tensor"
    elif quant == "int8-dq":
        mod_name = "torchao.quantization.quantize_.workflows.int8.int8_tensor"
    else:
        return  # weight-only: no activation quantization
    pymod = importlib.import_module(mod_name)
    attr = "_choose_quant_func_and_quantize_tensor"
    fn = getattr(pymod, attr)
    setattr(pymod, attr, _ranged(fn, truth_name(QUANTIZE_REGION)))
    out._undo.append(functools.partial(setattr, pymod, attr, fn))


def _ranged(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def ranged(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return ranged


def _modeling_modules(model: nn.Module) -> Iterator[Any]:
    names = {type(m).__module__ for m in model.modules()}
    for n in sorted(names):
        if n.startswith("transformers.models.") and n in sys.modules:
            yield sys.modules[n]
