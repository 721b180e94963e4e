"""Capture a HF transformers causal LM in the serving modes users run, with exact step annotations
and optional truth ranges (needs torch and transformers; nothing is downloaded).

Contract: :func:`capture` takes a :class:`CaptureSpec` (a config dict, the attention implementation,
SDPA backend, dtype, mode, sampling, draft model ...), builds the model(s) with random weights, runs
one warm-up of the same workload unprofiled (library setup, autotuning, compilation and CUDA-graph
capture stay out of the trace), then the profiled run, and writes a Kineto trace (``.json.gz``).
It returns the settings and the step annotations written, for a ``meta.json``.

Modes (``--mode``):

* ``generate`` — ``model.generate`` (greedy, or ``sampling``; with ``assistant`` it is assisted
  generation: the draft proposes, the target verifies);
* ``static-cache`` — ``generate`` with ``cache_implementation="static"``; on a GPU transformers
  compiles the decode forward (``mode="reduce-overhead"``: CUDA graphs);
* ``continuous-batching`` — ``model.generate_batch`` over requests of different prompt lengths; the
  scheduler mixes prefill chunks and decode tokens in one batch (``phase=mixed``); its batching
  thread is recorded (``profile_all_threads``);
* ``forward`` — one forward over the prompt (a prefill step).

``kernels`` (Liger, flash-linear-attention) and ``quant`` (torchao FP8 / int8 / int4) patch the built
model before the truth ranges are installed and are undone after (:mod:`analyzer.capture.libraries`).

Imports only torch, transformers, :mod:`analyzer.capture.truth`, :mod:`analyzer.capture.libraries`
(and a library only for the option that names it) and (for ``experts="triton_fused"``)
:mod:`analyzer.capture.fused_experts` with Triton, so it runs where the analyzer's own dependencies
are not installed (``python -m analyzer.capture.zoo`` on a GPU machine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from analyzer.capture import libraries
from analyzer.capture.profile import export_trace
from analyzer.capture.truth import Instrumentation, step_name

MODES = ("generate", "continuous-batching", "static-cache", "forward")
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
FUSED_EXPERTS = "triton_fused"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DROP_KEYS = (
    "architectures", "auto_map", "quantization_config", "torch_dtype", "dtype", "_name_or_path",
    "transformers_version", "name", "aliases", "source",
)  # fmt: skip


class CaptureError(ValueError):
    """A spec that cannot be captured (unknown option, model type or combination)."""


@dataclasses.dataclass
class CaptureSpec:
    """One capture. ``config``: HF config keys (``model_type`` included)."""

    config: dict[str, Any]
    output: str
    device: str = "cuda"
    dtype: str = "bf16"
    attn: str = "sdpa"
    sdpa_backend: str | None = None
    experts: str | None = None  # experts_implementation: eager | batched_mm | grouped_mm | triton_fused ...
    mode: str = "generate"
    sampling: bool = False
    assistant: dict[str, Any] | None = None  # the draft model's config (same vocabulary)
    batch: int = 1
    prompt: int = 32
    new_tokens: int = 8
    requests: int = 4  # continuous batching: requests (prompt lengths spread around ``prompt``)
    batch_tokens: int | None = None  # continuous batching: token budget per step (None: max(16, prompt))
    cuda_graphs: bool | None = None  # continuous batching: None = transformers' choice
    truth: bool = True
    shapes: bool = True
    warmup: bool = True
    seed: int = 0
    kernels: str | None = None  # kernel libraries patched in: liger, fla (analyzer/capture/libraries.py)
    quant: str | None = None  # linear-layer quantization: fp8-row, fp8-tensor, int8-wo, int4-wo ...


def attention_implementations() -> list[str]:
    """The attention implementations the installed transformers offers (``eager`` first)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]


def build(
    config: dict[str, Any], *, dtype: str, device: str, attn: str, experts: str | None, seed: int
) -> Any:
    """A ``*ForCausalLM`` of the config with random weights, in eval mode."""
    import transformers

    d = {k: v for k, v in config.items() if k not in _DROP_KEYS}
    model_type = d.pop("model_type", None)
    if not model_type:
        raise CaptureError("the model config has no model_type")
    if dtype not in DTYPES:
        raise CaptureError(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
    if experts:
        d["experts_implementation"] = experts
    if experts == FUSED_EXPERTS:  # our own Triton fused-MoE kernel, through transformers' experts interface
        from analyzer.capture.fused_experts import register

        register()
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError) as exc:
        raise CaptureError(f"transformers does not know model_type {model_type!r}: {exc}") from None
    cfg.initializer_range = 0.02
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=DTYPES[dtype], attn_implementation=attn
        )
    return model.to(device=device, dtype=DTYPES[dtype]).eval()


def _prompts(spec: CaptureSpec, vocab: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(spec.seed)
    return torch.randint(3, vocab, (spec.batch, spec.prompt), generator=g).to(device)


def _sdpa_context(backend: str | None) -> contextlib.AbstractContextManager[Any]:
    if not backend:
        return contextlib.nullcontext()
    if backend not in SDPA_BACKENDS:
        raise CaptureError(f"unknown SDPA backend {backend!r} (use {', '.join(SDPA_BACKENDS)})")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend]))


def _profiler(spec: CaptureSpec, all_threads: bool) -> torch.profiler.profile:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if spec.device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    kw: dict[str, Any] = {"activities": acts, "record_shapes": spec.shapes}
    if all_threads:  # continuous batching steps run on its own thread
        kw["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    return torch.profiler.profile(**kw)


def _gen_kwargs(spec: CaptureSpec, model: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "max_new_tokens": spec.new_tokens,
        "min_new_tokens": spec.new_tokens,
        "do_sample": spec.sampling,
        "pad_token_id": 0,
        "eos_token_id": None,
    }
    if spec.sampling:
        kw.update(temperature=0.8, top_k=50, top_p=0.95)
    else:
        kw.update(temperature=None, top_k=None, top_p=None)
    if spec.mode == "static-cache":
        kw["cache_implementation"] = "static"
    return kw


class _CBSteps:
    """Continuous batching: one ``lkm::step`` around each batch step of transformers' batch processor,
    described from the requests the scheduler put in it (prefill chunk or one decode token each)."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self.pending = threading.local()
        self.undo: list[Any] = []
        self.threads: set[int] = set()

    def install(self) -> None:
        from transformers.generation.continuous_batching import continuous_api, input_outputs

        io_cls = input_outputs.ContinuousBatchingIOs
        proc_cls = continuous_api.ContinuousBatchProcessor
        prep, step = io_cls.prepare_batch_tensors, proc_cls._generation_step
        me = self

        def prepare_batch_tensors(io: Any, requests_in_batch: Any, *a: Any, **kw: Any) -> Any:
            me.pending.desc = me.describe(requests_in_batch)
            return prep(io, requests_in_batch, *a, **kw)

        def _generation_step(proc: Any, model: Any) -> Any:
            desc = getattr(me.pending, "desc", None)
            me.pending.desc = None
            if desc is None:
                return step(proc, model)
            me.threads.add(threading.get_ident())
            me.inst.begin_step(desc)
            try:
                return step(proc, model)
            finally:
                me.inst.end_step()

        io_cls.prepare_batch_tensors = prepare_batch_tensors
        proc_cls._generation_step = _generation_step
        self.undo = [(io_cls, "prepare_batch_tensors", prep), (proc_cls, "_generation_step", step)]

    def remove(self) -> None:
        for owner, attr, val in self.undo:
            setattr(owner, attr, val)

    @staticmethod
    def describe(requests: Any) -> str:
        q = [int(r.query_length) for r in requests]
        kv = [int(r.state.position_offset) + int(r.query_length) for r in requests]
        # a request runs prefill while prompt tokens remain before this batch (transformers already marks
        # the request DECODING when it schedules the prompt's last chunk)
        prefill = [int(r.state.position_offset) < len(r.state.initial_tokens) for r in requests]
        n_pre = sum(prefill)
        phase = "prefill" if n_pre == len(q) else "decode" if n_pre == 0 else "mixed"
        tokens = sum(q)
        extra = {
            "prefill_tokens": sum(x for x, p in zip(q, prefill, strict=True) if p),
            "decode_tokens": sum(x for x, p in zip(q, prefill, strict=True) if not p),
        }
        mean = max(1, round(tokens / len(q)))
        return step_name(
            phase,
            mean,
            len(q),
            max(kv),
            tokens=tokens if mean * len(q) != tokens else None,
            extra=extra if phase == "mixed" else None,
        )


def _run(spec: CaptureSpec, model: Any, draft: Any, ids: torch.Tensor, inst: Instrumentation | None) -> Any:
    if inst is not None:
        inst.reset()
    try:
        if spec.mode == "forward":
            with torch.inference_mode():
                return model(input_ids=ids, use_cache=False, logits_to_keep=1)
        if spec.mode == "continuous-batching":
            from transformers import GenerationConfig
            from transformers.generation.configuration_utils import ContinuousBatchingConfig

            prompts = _cb_prompts(spec, ids)
            gc = GenerationConfig(**_gen_kwargs(spec, model))
            # a token budget of one prompt per batch: later prompts are chunked beside earlier decodes
            cb = ContinuousBatchingConfig(
                use_cuda_graph=spec.cuda_graphs,
                max_batch_tokens=spec.batch_tokens or max(16, spec.prompt),
                block_size=32,
                num_blocks=max(16, 4 * spec.requests * (2 * spec.prompt + spec.new_tokens) // 32),
            )
            return model.generate_batch(
                prompts, generation_config=gc, continuous_batching_config=cb, progress_bar=False
            )
        kw = _gen_kwargs(spec, model)
        if draft is not None:
            kw["assistant_model"] = draft
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    finally:
        if inst is not None:
            inst.end_step()


def _cb_prompts(spec: CaptureSpec, ids: torch.Tensor) -> list[list[int]]:
    """``requests`` prompts of lengths spread from prompt/2 to 3*prompt/2, so prefill chunks and
    decodes of earlier requests share batches."""
    flat = ids.flatten().tolist()
    n = max(1, spec.requests)
    out = []
    for i in range(n):
        length = max(2, spec.prompt // 2 + (spec.prompt * i) // max(1, n - 1))
        out.append([flat[(i * 7 + j) % len(flat)] for j in range(length)])
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import logging

    log = logging.getLogger("transformers")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def capture(spec: CaptureSpec) -> dict[str, Any]:
    """Capture ``spec`` into ``spec.output``; return the meta dict (settings + steps written)."""
    _check_spec(spec)
    t0 = time.perf_counter()
    with _quiet():
        model, draft = _build_models(spec)
        vocab = int(model.config.get_text_config().vocab_size)
        ids = _prompts(spec, vocab, spec.device)
        cb = spec.mode == "continuous-batching"
        prepared = _prepare_libraries(spec, model)  # before the truth ranges wrap the model's functions
        inst = Instrumentation(truth=spec.truth, steps=not cb)
        inst.add_model(model, "target")
        if draft is not None:
            inst.add_model(draft, "draft")
        cb_steps = _CBSteps(inst) if cb else None
        if cb_steps is not None:
            cb_steps.install()
        try:
            with _sdpa_context(spec.sdpa_backend):
                if spec.warmup:
                    _run(spec, model, draft, ids, inst)
                    if spec.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    inst.written.clear()
                    if cb_steps is not None:
                        cb_steps.threads.clear()
                prof = _profiler(spec, all_threads=cb)
                with prof:
                    _run(spec, model, draft, ids, inst)
                    if spec.device.startswith("cuda"):
                        torch.cuda.synchronize()
        finally:
            inst.close()
            prepared.undo()
            if cb_steps is not None:
                cb_steps.remove()
        export_trace(prof, spec.output, compresslevel=9)  # the zoo's fixtures stay small
    return _capture_meta(spec, model, inst, cb_steps, prepared, t0)


def _check_spec(spec: CaptureSpec) -> None:
    """Raise :class:`CaptureError` for a spec this transformers, device or library set cannot run."""
    if spec.mode not in MODES:
        raise CaptureError(f"unknown mode {spec.mode!r} (use {', '.join(MODES)})")
    if spec.device.startswith("cuda") and not torch.cuda.is_available():
        raise CaptureError("device cuda, but torch sees no CUDA device")
    offered = attention_implementations()
    if spec.attn not in offered:
        raise CaptureError(
            f"unknown attention implementation {spec.attn!r} (this transformers offers {', '.join(offered)})"
        )
    if spec.mode == "continuous-batching" and spec.assistant:
        raise CaptureError("assisted generation does not run under continuous batching")
    try:
        libraries.check_options(spec.kernels, spec.quant, device=spec.device, dtype=spec.dtype)
    except libraries.LibraryError as exc:
        raise CaptureError(str(exc)) from None


def _build_models(spec: CaptureSpec) -> tuple[Any, Any]:
    """The target model and the draft (None without ``assistant``), built by :func:`build`."""
    model = build(
        spec.config,
        dtype=spec.dtype,
        device=spec.device,
        attn=spec.attn,
        experts=spec.experts,
        seed=spec.seed,
    )
    draft = None
    if spec.assistant:
        draft = build(
            spec.assistant,
            dtype=spec.dtype,
            device=spec.device,
            attn=spec.attn,
            experts=None,
            seed=spec.seed + 1,
        )
    return model, draft


def _capture_meta(
    spec: CaptureSpec,
    model: Any,
    inst: Instrumentation,
    cb_steps: _CBSteps | None,
    prepared: libraries.Prepared,
    t0: float,
) -> dict[str, Any]:
    """The meta dict of a finished capture: its settings, versions and the steps written."""
    cb = spec.mode == "continuous-batching"
    meta: dict[str, Any] = {
        "model_type": spec.config.get("model_type"),
        "config": {k: v for k, v in spec.config.items() if k not in _DROP_KEYS},
        "layers": int(getattr(model.config.get_text_config(), "num_hidden_layers", 0) or 0),
        "params": sum(p.numel() for p in model.parameters()),
        "device": spec.device,
        "dtype": spec.dtype,
        "attn": spec.attn,
        "sdpa_backend": spec.sdpa_backend,
        "experts_implementation": spec.experts,
        "mode": spec.mode,
        "sampling": spec.sampling,
        "assistant": spec.assistant,
        "batch": spec.batch,
        "prompt": spec.prompt,
        "new_tokens": spec.new_tokens,
        "requests": spec.requests if cb else None,
        "batch_tokens": (spec.batch_tokens or max(16, spec.prompt)) if cb else None,
        "cuda_graphs": spec.cuda_graphs if cb else None,
        "truth": spec.truth,
        "record_shapes": spec.shapes,
        "seed": spec.seed,
        "torch": torch.__version__,
        "transformers": _tf_version(),
        "steps": list(inst.written),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if cb_steps is not None:
        meta["batching_threads"] = len(cb_steps.threads)
    if spec.kernels or spec.quant:
        meta.update(prepared.meta)
    if spec.device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name(torch.device(spec.device))
    return meta


def _prepare_libraries(spec: CaptureSpec, model: Any) -> libraries.Prepared:
    try:
        return libraries.prepare(
            model,
            kernels=spec.kernels,
            quant=spec.quant,
            truth=spec.truth,
            device=spec.device,
            dtype=spec.dtype,
        )
    except libraries.LibraryError as exc:
        raise CaptureError(str(exc)) from None


def _tf_version() -> str:
    import transformers

    return str(transformers.__version__)


__all__ = [
    "DTYPES",
    "FUSED_EXPERTS",
    "MODES",
    "SDPA_BACKENDS",
    "CaptureError",
    "CaptureSpec",
    "attention_implementations",
    "build",
    "capture",
]
