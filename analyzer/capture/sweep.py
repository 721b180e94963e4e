"""The sweep: every decoder-only causal-LM model type of the installed transformers, captured with truth.

Where the zoo (:mod:`analyzer.capture.zoo`) holds hand-made toy configurations of a few families,
the sweep takes every model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and builds it from its
config class's defaults, changed only where a rule of the sweep says so, and captures it with
:func:`analyzer.capture.hf.capture` like the zoo (truth ranges, step annotations, bf16, random
weights, built on the device, one warm-up run, then one profiled ``generate``).

The sweep's rules live in their own modules: which types it takes
(:mod:`analyzer.capture.sweep_types`), the layer cut (:mod:`analyzer.capture.sweep_layers`) and
the size cap (:mod:`analyzer.capture.sweep_sizes`); this module plans each type with them
(:func:`plan`), captures it and keeps the index.

A swept type that cannot be captured is skipped with the error quoted: it needs a download, a
package that cannot be carried, or it fails to build or run in transformers itself.

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
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from analyzer.capture.sweep_layers import MAX_LAYERS, cut_length, layer_plan
from analyzer.capture.sweep_sizes import CAPS, MIN_HEADS, cap_experts, cap_vocab, scale_widths, size_plan
from analyzer.capture.sweep_types import classify_type, default_config, model_types, quiet, text_config_key

__all__ = [
    "BATCH",
    "CAPS",
    "FORMAT_VERSION",
    "MAX_LAYERS",
    "MIN_HEADS",
    "NEW_TOKENS",
    "PROMPT",
    "SWEEP_JSON",
    "cap_experts",
    "cap_vocab",
    "capture_type",
    "classify_type",
    "cut_length",
    "layer_plan",
    "main",
    "model_types",
    "plan",
    "scale_widths",
    "store",
    "to_xz",
]

#: the sweep's capture settings (a prefill of BATCH x PROMPT tokens, NEW_TOKENS - 1 decode steps)
BATCH, PROMPT, NEW_TOKENS = 2, 16, 3
SWEEP_JSON = "sweep.json"
FORMAT_VERSION = 1


def plan(model_type: str, tiny: bool = False) -> dict[str, Any]:
    """The sweep's decision and config for one type (builds on the meta device to count parameters)."""
    decision, why = classify_type(model_type)
    row: dict[str, Any] = {"model_type": model_type, "status": decision, "reason": why}
    if decision != "sweep":
        if decision == "alias":
            row["reason"] = f"alias of {why} (its causal-LM class and config): swept as {why}"
        return row
    sub = text_config_key(model_type)
    with quiet():
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
    ``meta.json``, and ``sweep.json`` (every type, its status, reason and plan). A run of some types
    (``--only``) replaces those types' rows of an existing ``sweep.json`` and keeps the others'."""
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
    stored = sum(r["status"] == "captured" for r in doc["types"])
    if (dst / SWEEP_JSON).is_file():
        kept = json.loads((dst / SWEEP_JSON).read_text(encoding="utf-8"))
        fresh = {r["model_type"]: r for r in doc["types"]}
        rows = [fresh.pop(r["model_type"], r) for r in kept["types"]]
        doc = {**kept, "types": sorted([*rows, *fresh.values()], key=lambda r: r["model_type"])}
    (dst / SWEEP_JSON).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"stored {stored} traces in {dst}")
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
