"""``capture``: profile a model with random weights the right way in one command, then analyze it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from analyzer.errors import UsageError

#: the --quant schemes (analyzer/capture/libraries.py QUANTS; listed here so the CLI imports no torch)
QUANTS = ("fp8-row", "fp8-tensor", "int8-wo", "int8-dq", "int4-wo", "int8-pack")


@click.command("capture")
@click.option(
    "--model",
    "model_spec",
    required=True,
    metavar="CONFIG_OR_NAME",
    help="HF config.json (or its folder) or built-in name of rules/models.toml, e.g. llama-3-8b.",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Trace to write (.json or .json.gz).",
)
@click.option("--layers", type=int, help="Keep only the first N decoder layers (all by default).")
@click.option("--batch", default=1, show_default=True, help="Sequences per step.")
@click.option(
    "--prompt", default=128, show_default=True, help="Prompt tokens per sequence (the prefill step)."
)
@click.option(
    "--new-tokens",
    default=8,
    show_default=True,
    help="Tokens to generate: one prefill step, then N-1 decode steps.",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    help="Default: cuda; without a GPU capture stops (exit 2) unless --device cpu asks for the CPU "
    "(a CPU trace has no GPU kernels: analyze rejects it; for testing the capture itself).",
)
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["auto", "transformers", "reference"]),
    default="auto",
    show_default=True,
    help="transformers (random init, SDPA) when installed, else the built-in reference decoder.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the random weights and prompt.")
@click.option(
    "--meta",
    "meta_path",
    type=click.Path(dir_okay=False),
    help="Write the capture settings (model, shapes, steps, versions) as JSON here.",
)
@click.option("--analyze", "do_analyze", is_flag=True, help="Analyze the trace and print the summary.")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), help="With --analyze: write the summary here."
)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the HTML report here.")
@click.option(
    "--mode",
    type=click.Choice(["generate", "continuous-batching", "static-cache", "forward"]),
    help="Run HF transformers' own serving path instead of the step loop (docs/capture.md).",
)
@click.option("--truth", is_flag=True, help="Also write lkm::truth region ranges (docs/accuracy.md).")
@click.option(
    "--attn", metavar="IMPL", help="Attention implementation: eager, sdpa, flex_attention, paged|sdpa ..."
)
@click.option(
    "--sdpa-backend",
    type=click.Choice(["flash", "efficient", "cudnn", "math"]),
    help="Force one SDPA backend.",
)
@click.option(
    "--experts",
    metavar="IMPL",
    help="MoE experts implementation: eager, batched_mm, grouped_mm, triton_fused (ours) ...",
)
@click.option(
    "--kernels",
    metavar="LIB[,LIB]",
    help="Kernel libraries patched into the model: liger (Triton norm / RoPE / SwiGLU), fla (linear attention).",
)
@click.option(
    "--quant",
    type=click.Choice(QUANTS),
    help="Quantize the decoder's linear layers (torchao; int8-pack: aten._weight_int8pack_mm).",
)
@click.option("--sampling", is_flag=True, help="Sample (temperature, top-k, top-p) instead of greedy.")
@click.option("--assistant", metavar="CONFIG", help="Draft model's config.json: assisted generation.")
@click.option("--requests", default=4, show_default=True, help="Continuous batching: requests.")
@click.option("--batch-tokens", type=click.IntRange(min=1), default=None,
              help="Continuous batching: token budget per step (default: the prompt length, at least 16).")  # fmt: skip
@click.option("--no-shapes", is_flag=True, help="Record no host-op input shapes.")
def command(
    model_spec: str,
    output: str,
    layers: int | None,
    batch: int,
    prompt: int,
    new_tokens: int,
    device: str | None,
    dtype: str,
    backend: str,
    seed: int,
    meta_path: str | None,
    do_analyze: bool,
    json_path: str | None,
    report_path: str | None,
    mode: str | None = None,
    truth: bool = False,
    attn: str | None = None,
    sdpa_backend: str | None = None,
    experts: str | None = None,
    kernels: str | None = None,
    quant: str | None = None,
    sampling: bool = False,
    assistant: str | None = None,
    requests: int = 4,
    batch_tokens: int | None = None,
    no_shapes: bool = False,
) -> int:
    """Profile one greedy generate of a model with random weights (nothing is downloaded).

    Builds the model from a HF config.json or a built-in name, runs a warm-up generate, then a
    profiled one: a prefill step over the prompt and NEW_TOKENS-1 decode steps, each inside an
    ``lkm::step phase=.. q=.. bs=.. kv=..`` annotation, under torch.profiler with input shapes
    recorded. The trace is written with export_chrome_trace (gzip when -o ends in .gz). With
    --analyze (or --json / --report) the trace is then analyzed like ``llm-kernel-map analyze``.
    Needs torch: pip install 'llm-kernel-map[capture]'.
    """
    from analyzer.capture import require_torch

    require_torch()
    from analyzer.capture.model import build_model
    from analyzer.capture.profile import capture_generate
    from analyzer.output import write_json

    device = _checked_device(output, device)
    hf_path = any((mode, truth, attn, sdpa_backend, experts, kernels, quant, sampling, assistant, no_shapes))
    if hf_path:
        meta = _capture_hf(
            model_spec, output, layers=layers, batch=batch, prompt=prompt, new_tokens=new_tokens,
            device=device, dtype=dtype, seed=seed, mode=mode or "generate", truth=truth, attn=attn or "sdpa",
            sdpa_backend=sdpa_backend, experts=experts, kernels=kernels, quant=quant, sampling=sampling, assistant=assistant,
            requests=requests, batch_tokens=batch_tokens, shapes=not no_shapes,
        )  # fmt: skip
        _echo_hf_capture(output, meta, dtype=dtype, device=device, truth=truth, kernels=kernels, quant=quant)
        if meta_path:
            Path(meta_path).parent.mkdir(parents=True, exist_ok=True)
            Path(meta_path).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    else:
        t0 = time.perf_counter()
        lm = build_model(model_spec, layers=layers, device=device, dtype=dtype, backend=backend, seed=seed)
        meta = capture_generate(lm, output, batch=batch, prompt=prompt, new_tokens=new_tokens, seed=seed)
        meta["seconds"] = round(time.perf_counter() - t0, 1)
        size = Path(output).stat().st_size
        click.echo(
            f"captured {output} ({size / 1e6:.1f} MB): {meta['model']} x{meta['layers']} layers "
            f"({meta['backend']}, {meta['dtype']}, {device}), batch {batch}, prompt {prompt}, "
            f"{new_tokens} new tokens = 1 prefill + {new_tokens - 1} decode steps",
            err=True,
        )
        if meta_path:
            write_json(meta, meta_path)
    if do_analyze or json_path or report_path:
        _analyze(output, model_spec, json_path, report_path, print_text=do_analyze)
    return 0


def _checked_device(output: str, device: str | None) -> str:
    """The device to capture on (cuda unless --device cpu); UsageError for a bad -o name or no GPU."""
    import torch

    if not output.endswith((".json", ".json.gz")):
        raise UsageError(f"-o {output}: the trace name must end in .json or .json.gz")
    if device != "cpu" and not torch.cuda.is_available():
        # profiling the CPU instead writes a trace without GPU kernels, which analyze rejects
        raise UsageError(
            f"no GPU: torch {torch.__version__} sees no CUDA/ROCm device, and capture profiles GPU "
            "kernels; run it on a GPU machine, or pass --device cpu to profile the CPU on purpose"
        )
    return device or "cuda"


def _echo_hf_capture(
    output: str,
    meta: dict[str, Any],
    *,
    dtype: str,
    device: str,
    truth: bool,
    kernels: str | None,
    quant: str | None,
) -> None:
    """The one-line summary of a capture through transformers, on stderr."""
    click.echo(
        f"captured {output} ({Path(output).stat().st_size / 1e6:.1f} MB): {meta['model_type']} x{meta['layers']} "
        f"layers ({meta['attn']}, {dtype}, {device}, {meta['mode']}), {len(meta['steps'])} steps"
        f"{', truth ranges' if truth else ''}"
        f"{f', kernels {kernels}' if kernels else ''}{f', quant {quant}' if quant else ''}",
        err=True,
    )


def _config_of(spec: str, layers: int | None) -> dict[str, Any]:
    """A config.json (or its folder) as a dict, or a built-in name's HF keys."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UsageError(f"--model {spec}: not a readable config.json ({e})") from None
        for nested in ("text_config", "language_config", "llm_config"):
            if "hidden_size" not in config and isinstance(config.get(nested), dict):
                config = dict(config[nested])
    else:
        from analyzer.capture.model import resolve_model

        ms = resolve_model(spec)
        if ms.config is None:
            raise UsageError(f"--model {spec}: no HF config for this built-in; pass a config.json")
        config = {"model_type": ms.arch.model_type, **ms.config}
    if layers is not None:
        if layers < 1:
            raise UsageError(f"--layers must be at least 1, got {layers}")
        config["num_hidden_layers"] = min(layers, int(config.get("num_hidden_layers", layers)))
    return config


def _capture_hf(
    spec: str, output: str, *, layers: int | None, assistant: str | None, **kw: Any
) -> dict[str, Any]:
    from analyzer.capture import hf

    if not hf_available():
        raise UsageError(
            "--mode/--truth/--attn/--kernels/--quant ... need transformers: pip install transformers"
        )
    config = _config_of(spec, layers)
    draft = _config_of(assistant, None) if assistant else None
    try:
        return hf.capture(hf.CaptureSpec(config=config, output=output, assistant=draft, **kw))
    except hf.CaptureError as e:
        raise UsageError(str(e)) from None


def hf_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def _analyze(
    trace: str, model_spec: str, json_path: str | None, report_path: str | None, print_text: bool
) -> None:
    from analyzer.options import Options
    from analyzer.output import write_json, write_report
    from analyzer.report import text
    from analyzer.results.summary import build_summary
    from analyzer.runtime.driver import RunPolicy, analyze

    analysis = analyze([trace], Options(model=model_spec), RunPolicy(keep_host_ops=True))
    summary = build_summary(analysis)
    if print_text:
        text.render(summary, sys.stdout)
    if json_path:
        write_json(summary, json_path)
        click.echo(f"wrote {json_path}", err=True)
    if report_path:
        try:
            from analyzer.report import html
        except ModuleNotFoundError as e:
            if e.name != "analyzer.report.html":
                raise
            raise UsageError("--report: this install has no HTML reporter (analyzer.report.html)") from None
        write_report(html.HtmlReporter(analysis.kernels), summary, report_path)
        click.echo(f"wrote {report_path}", err=True)
