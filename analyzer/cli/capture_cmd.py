"""``capture``: profile a model with random weights the right way in one command, then analyze it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from analyzer.errors import UsageError


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
@click.option("--device", type=click.Choice(["cuda", "cpu"]), help="Default: cuda when available.")
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
    import torch

    from analyzer.capture.model import build_model
    from analyzer.capture.profile import capture_generate
    from analyzer.cli.output import write_json

    if not output.endswith((".json", ".json.gz")):
        raise UsageError(f"-o {output}: the trace name must end in .json or .json.gz")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
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


def _analyze(
    trace: str, model_spec: str, json_path: str | None, report_path: str | None, print_text: bool
) -> None:
    from analyzer.cli.output import write_json
    from analyzer.pipeline import Options, analyze_paths
    from analyzer.report import text
    from analyzer.results.summary import build_summary

    analysis = analyze_paths([trace], Options(model=model_spec))
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
        html.write_report(analysis, summary, report_path)
        click.echo(f"wrote {report_path}", err=True)
