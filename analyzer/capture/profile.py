"""Profile inference steps the way the analyzer reads them: torch.profiler with shapes, one
``lkm::step`` annotation per forward step, a Chrome trace on exit.

The analyzer's phase split trusts an engine's own step annotation over anything it can infer
(README.md, "How it works": Phases). This module writes ours, ``lkm::step phase=<prefill|decode|mixed> q=<query tokens per
sequence> bs=<batch> kv=<kv length>`` (``rules/annotations.toml``, id ``lkm``), as a
``torch.profiler.record_function`` range around each forward, so kernels launched inside it get
that step's phase and token count (q x bs).

Three pieces, usable on their own:

* :func:`step_annotation` — a context manager around one forward step;
* :func:`annotate_step` — a decorator for an engine's step function, with a ``describe`` callback
  that reads the phase, q, bs and kv off the step's arguments (:func:`describe_batch` helps);
* :class:`profile_steps` — a context manager (or decorator) that runs ``torch.profiler.profile``
  with ``record_shapes=True`` over CPU (+ CUDA when available) and exports the trace on exit
  (gzip when the path ends in ``.gz``).

A manual generate loop (HF-style; ``cache=`` instead of ``past_key_values=`` in transformers 5.2x)::

    from analyzer.capture import profile_steps, step_annotation

    def generate(model, prompt, new_tokens):
        cache, ids, kv = None, prompt, 0
        for i in range(new_tokens):
            kv += ids.shape[1]
            with step_annotation("prefill" if i == 0 else "decode", q=ids.shape[1], bs=ids.shape[0], kv=kv):
                out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache, ids = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

    generate(model, prompt, 4)          # warm-up: library setup and autotuning stay out of the trace
    with profile_steps("hf.json.gz"):
        generate(model, prompt, 32)

vLLM (v1; one ``execute_model`` call per scheduler step, run in-process with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; the attribute path to the model runner differs between
versions)::

    from analyzer.capture import annotate_step, describe_batch, profile_steps

    def describe(scheduler_output, *args, **kwargs):
        sched = scheduler_output.num_scheduled_tokens          # request id -> tokens this step
        done = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        done.update(zip(cached.req_ids, cached.num_computed_tokens))
        ids = list(sched)
        return describe_batch([sched[r] for r in ids], [done.get(r, 0) + sched[r] for r in ids])

    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    runner.execute_model = annotate_step(describe)(runner.execute_model)
    llm.generate(prompts[:2], params)                          # warm-up
    with profile_steps("vllm.json.gz"):
        llm.generate(prompts, params)

A step whose requests all run one query token is ``decode``; all more than one, ``prefill``; both,
``mixed`` (chunked prefill batched with decodes). Speculative decoding verifies several tokens per
request: describe those steps yourself.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from analyzer.errors import UsageError

PHASES = ("prefill", "decode", "mixed")
F = TypeVar("F", bound=Callable[..., Any])


def annotation_name(phase: str, q: int | None = None, bs: int | None = None, kv: int | None = None) -> str:
    """``lkm::step phase=.. q=.. bs=.. kv=..``; fields left None are omitted (the order is fixed)."""
    if phase not in PHASES:
        raise UsageError(f"step phase must be one of {', '.join(PHASES)}, got {phase!r}")
    parts = [f"lkm::step phase={phase}"]
    for key, value in (("q", q), ("bs", bs), ("kv", kv)):
        if value is not None:
            if int(value) < 0:
                raise UsageError(f"step annotation {key} must not be negative, got {value}")
            parts.append(f"{key}={int(value)}")
    return " ".join(parts)


@contextlib.contextmanager
def step_annotation(
    phase: str, q: int | None = None, bs: int | None = None, kv: int | None = None
) -> Iterator[None]:
    """Mark one forward step (and its sampling) for the analyzer's phase split.

    Args:
        phase: ``prefill``, ``decode`` or ``mixed``.
        q: query tokens per sequence in this step (the mean when they differ; 1 for decode).
        bs: sequences in the batch.
        kv: keys each query attends to: cached tokens plus this step's (the longest, when they differ).
    """
    with torch.profiler.record_function(annotation_name(phase, q, bs, kv)):
        yield


def describe_batch(
    query_lens: Sequence[int], kv_lens: Sequence[int] | None = None
) -> tuple[str, int, int, int | None]:
    """(phase, q, bs, kv) of a batch from each sequence's query tokens this step and KV length.

    ``decode`` when every sequence runs one token, ``prefill`` when all run more, ``mixed`` when
    both kinds are batched. ``q`` is the mean query length (rounded), ``kv`` the longest KV length.
    """
    lens = [int(x) for x in query_lens if int(x) > 0]
    if not lens:
        raise UsageError("describe_batch: no sequence runs a token in this step")
    decode = sum(1 for x in lens if x == 1)
    phase = "decode" if decode == len(lens) else "prefill" if decode == 0 else "mixed"
    kv = max(int(x) for x in kv_lens) if kv_lens else None
    return phase, max(1, round(sum(lens) / len(lens))), len(lens), kv


def annotate_step(
    describe: Callable[..., tuple[str, int | None, int | None, int | None]],
) -> Callable[[F], F]:
    """Decorate an engine's step function: each call runs inside the step annotation that
    ``describe(*args, **kwargs)`` returns as (phase, q, bs, kv). Return None from ``describe`` to
    leave a call (a warm-up, an empty step) unannotated."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def stepped(*args: Any, **kwargs: Any) -> Any:
            d = describe(*args, **kwargs)
            if d is None:
                return fn(*args, **kwargs)
            with step_annotation(*d):
                return fn(*args, **kwargs)

        return stepped  # type: ignore[return-value]

    return wrap


def activities(cuda: bool | None = None) -> list[torch.profiler.ProfilerActivity]:
    """CPU, plus CUDA when ``cuda`` (default: when a CUDA device is available)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda if cuda is not None else torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


class profile_steps(contextlib.ContextDecorator):  # noqa: N801 - reads as a function at call sites
    """Profile the enclosed code with ``torch.profiler`` and write a Chrome trace on exit.

    Usable as ``with profile_steps(path) as prof:`` or as ``@profile_steps(path)`` on a function
    (each call profiled; the last one's trace stays at ``path``). ``record_shapes`` is on because
    the roofline needs the host ops' input shapes; stacks are off (they multiply the trace size).

    Args:
        path: where to write the trace (``.json`` or ``.json.gz``); None keeps it in memory only
            (``self.prof``).
        cuda: record CUDA activity; default when a CUDA device is available.
        with_stack: record Python stacks.
        profiler_kwargs: passed on to ``torch.profiler.profile``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        cuda: bool | None = None,
        record_shapes: bool = True,
        with_stack: bool = False,
        **profiler_kwargs: Any,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.cuda = cuda if cuda is not None else torch.cuda.is_available()
        self.kwargs = {
            "activities": activities(self.cuda),
            "record_shapes": record_shapes,
            "with_stack": with_stack,
            **profiler_kwargs,
        }
        self.prof: torch.profiler.profile | None = None

    def __enter__(self) -> torch.profiler.profile:
        self.prof = torch.profiler.profile(**self.kwargs)
        self.prof.__enter__()
        return self.prof

    def __exit__(self, *exc: Any) -> bool:
        assert self.prof is not None
        if self.cuda:
            torch.cuda.synchronize()  # every launched kernel finishes inside the profiled window
        self.prof.__exit__(*exc)
        if self.path is not None and exc[0] is None:
            export_trace(self.prof, self.path)
        return False


def export_trace(prof: torch.profiler.profile, path: str | os.PathLike[str], compresslevel: int = 6) -> Path:
    """Write the profile as a Chrome trace; gzip it (at ``compresslevel``) when the name ends in ``.gz``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        if path.suffix == ".gz":
            with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=compresslevel) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        else:
            shutil.move(raw, path)
    return path


def capture_generate(
    lm: Any,
    path: str | os.PathLike[str],
    *,
    batch: int,
    prompt: int,
    new_tokens: int,
    warmup: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Profile one greedy generate of ``lm`` (an :class:`analyzer.capture.model.CausalLM`) into ``path``.

    A warm-up generate of two tokens runs first (library handles, autotuning and allocator growth
    stay out of the trace), then the profiled one: a prefill step over ``prompt`` tokens and
    ``new_tokens - 1`` decode steps, each inside its ``lkm::step`` annotation. Returns the settings
    and the annotations written, for a meta.json.
    """
    from analyzer.capture.model import describe, greedy_generate, random_prompt

    ids = random_prompt(lm, batch, prompt, seed=seed)
    if warmup:
        greedy_generate(lm, ids, min(2, new_tokens))
    written: list[str] = []

    def annotate(phase: str, q: int, bs: int, kv: int) -> contextlib.AbstractContextManager[None]:
        written.append(annotation_name(phase, q, bs, kv))
        return step_annotation(phase, q, bs, kv)

    cuda = lm.device.type == "cuda"
    with profile_steps(path, cuda=cuda):
        greedy_generate(lm, ids, new_tokens, annotate=annotate)
    meta = describe(lm)
    meta.update(
        batch=batch,
        prompt=prompt,
        new_tokens=new_tokens,
        seed=seed,
        warmup=warmup,
        torch=torch.__version__,
        steps=written,
    )
    if cuda:
        meta["gpu"] = torch.cuda.get_device_name(lm.device)
    return meta


__all__ = [
    "PHASES",
    "activities",
    "annotate_step",
    "annotation_name",
    "capture_generate",
    "describe_batch",
    "export_trace",
    "profile_steps",
    "step_annotation",
]
