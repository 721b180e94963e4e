"""The library cases: tiny configurations captured with a kernel library or quantized linear layers
(issue 34), and the command that captures them, each in its own process.

Like the zoo (:mod:`analyzer.capture.zoo`) every case is a small configuration of one HF model type,
captured with truth ranges and step annotations (bf16, batch 2, a 48-token prefill and 5 decode
steps), but with ``kernels`` (Liger, flash-linear-attention) or ``quant`` (torchao FP8 / int8 / int4,
PyTorch's int8 weight-only kernel) set (:mod:`analyzer.capture.libraries`). The output has the zoo's
layout, ``OUT_DIR/<case>/trace.json.gz`` + ``meta.json``, so a case can join ``fixtures/zoo``.

``python -m analyzer.capture.library_cases OUT_DIR [--jobs N] [--only NAME,...] [--timeout S]
[--deadline S]`` starts one process per case (a library's patches and transformers' import-time
choice of fla are process-wide, and a crash or a hang costs only its case), ``--jobs`` at a time on
the one GPU, the linear-attention cases first, each killed after ``--timeout`` seconds; past
``--deadline`` seconds (or on SIGTERM) no case is started and the running ones are ended.
``--pack DIR`` then writes ``DIR/{liger,fla,quant}.tar.xz`` (the case folders) and the manifest. ``OUT_DIR/manifest.json`` is rewritten as each case ends: per case
its status (``ok`` / ``failed`` / ``timeout``), seconds, trace size, steps, the library versions,
the GPU kernels by name with their counts and truth regions, and for a failure the end of its log
(``OUT_DIR/<case>/log.txt``). Exit status 0 when every case was captured, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_GQA = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512}  # fmt: skip
# the quantized cases: hidden 256, so no weight is 128 x 128 (torchao 0.18 reads a per-tensor scale of
# a 128 x 128 weight as 128 x 128 block scaling) and every K is a multiple of tinygemm's group of 128
_QGQA = {**_GQA, "hidden_size": 256, "intermediate_size": 512, "head_dim": 64}
LLAMA = {"model_type": "llama", **_GQA}
QWEN3 = {"model_type": "qwen3", **_GQA, "head_dim": 32}
_MOE = {"moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2}
# linear-attention layers (Gated DeltaNet) with fla-sized heads, then one full-attention layer
_GDN = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "full_attention"]}  # fmt: skip

#: name -> (config, capture options, what the case covers)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    # ---- Liger Kernel (Triton norm / RoPE / activation / fused MoE) patched into the model
    "liger-llama-bf16": (LLAMA, {"kernels": "liger"}, "Liger RMSNorm, RoPE, SwiGLU on Llama"),
    "liger-qwen3-bf16": (QWEN3, {"kernels": "liger"}, "Liger RMSNorm (q/k norms too), RoPE, SwiGLU on Qwen3"),
    "liger-mistral-bf16": (
        {"model_type": "mistral", **_GQA, "sliding_window": 64},
        {"kernels": "liger"},
        "Liger on Mistral (sliding window)",
    ),
    "liger-gemma3-bf16": (
        {"model_type": "gemma3_text", **_GQA, "head_dim": 32, "sliding_window": 64},
        {"kernels": "liger"},
        "Liger RMSNorm with offset (sandwich and q/k norms), GeGLU on Gemma 3",
    ),
    "liger-phi3-bf16": (
        {"model_type": "phi3", **_GQA, "pad_token_id": 0},
        {"kernels": "liger"},
        "Liger SwiGLU on a fused gate_up projection",
    ),
    "liger-qwen3-moe-bf16": (
        {"model_type": "qwen3_moe", **_GQA, **_MOE, "head_dim": 32},
        {"kernels": "liger"},
        "Liger fused MoE (router histogram / scatter, fused up+SwiGLU and down GEMMs, gather-sum)",
    ),
    # ---- flash-linear-attention under linear-attention / hybrid families
    "fla-qwen3-next-bf16": (
        {
            "model_type": "qwen3_next",
            **_GQA,
            **_GDN,
            **_MOE,
            "head_dim": 32,
            "shared_expert_intermediate_size": 128,
        },
        {"kernels": "fla"},
        "fla chunk / fused-recurrent Gated DeltaNet in a hybrid MoE (torch causal conv1d)",
    ),
    "fla-qwen3-5-bf16": (
        {"model_type": "qwen3_5_text", **_GQA, **_GDN, "head_dim": 32},
        {"kernels": "fla"},
        "fla Gated DeltaNet in a dense hybrid (Qwen3.5 text)",
    ),
    "fla-olmo-hybrid-bf16": (
        {"model_type": "olmo_hybrid", **_GQA, **_GDN, "pad_token_id": 0, "eos_token_id": 1},
        {"kernels": "fla"},
        "fla Gated DeltaNet in OLMo hybrid",
    ),
    "fla-kimi-linear-bf16": (
        {
            "model_type": "kimi_linear",
            **_GQA,
            "num_key_value_heads": 4,
            "moe_intermediate_size": 64,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "kv_lora_rank": 32,
            "q_lora_rank": None,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 32,
            "v_head_dim": 32,
            "linear_head_dim": 64,
            "linear_num_heads": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "mlp_layer_types": ["dense", "sparse"],
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        {"kernels": "fla"},
        "fla Kimi delta attention (KDA) beside MLA, MoE",
    ),  # fmt: skip
    "liger-fla-qwen3-next-bf16": (
        {
            "model_type": "qwen3_next",
            **_GQA,
            **_GDN,
            **_MOE,
            "head_dim": 32,
            "shared_expert_intermediate_size": 128,
        },
        {"kernels": "liger,fla"},
        "Liger norms / RoPE beside fla Gated DeltaNet",
    ),
    # ---- quantized linear layers (torchao; PyTorch's int8 weight-only kernel)
    "fp8-row-llama-bf16": ({"model_type": "llama", **_QGQA}, {"quant": "fp8-row"}, "FP8 dynamic per-row"),
    "fp8-row-qwen3-bf16": (
        {"model_type": "qwen3", **_QGQA},
        {"quant": "fp8-row"},
        "FP8 dynamic per-row, q/k norms",
    ),
    "fp8-tensor-llama-bf16": (
        {"model_type": "llama", **_QGQA},
        {"quant": "fp8-tensor"},
        "FP8 dynamic per-tensor",
    ),
    "fp8-tensor-mistral-bf16": (
        {"model_type": "mistral", **_QGQA, "sliding_window": 64},
        {"quant": "fp8-tensor"},
        "FP8 dynamic per-tensor, sliding window",
    ),
    "int8-wo-llama-bf16": (
        {"model_type": "llama", **_QGQA},
        {"quant": "int8-wo"},
        "int8 weight-only (torchao)",
    ),
    "int8-wo-qwen2-bf16": (
        {"model_type": "qwen2", **_QGQA},
        {"quant": "int8-wo"},
        "int8 weight-only, qkv bias",
    ),
    "int4-wo-llama-bf16": (
        {"model_type": "llama", **_QGQA},
        {"quant": "int4-wo"},
        "int4 weight-only, tinygemm",
    ),
    "int4-wo-qwen3-bf16": (
        {"model_type": "qwen3", **_QGQA},
        {"quant": "int4-wo"},
        "int4 weight-only, q/k norms",
    ),
    "int8-dq-llama-bf16": (
        {"model_type": "llama", **_QGQA},
        {"quant": "int8-dq"},
        "int8 dynamic activations, _int_mm",
    ),
    "int8-pack-llama-bf16": (
        {"model_type": "llama", **_QGQA},
        {"quant": "int8-pack"},
        "int8 weight-only through aten._weight_int8pack_mm",
    ),
    "liger-fp8-row-llama-bf16": (
        {"model_type": "llama", **_QGQA},
        {"kernels": "liger", "quant": "fp8-row"},
        "Liger norms / RoPE / SwiGLU with FP8 per-row linears (an engine-like layer)",
    ),
}


def spec_for(name: str, out_dir: Path, device: str = "cuda", **over: Any) -> Any:
    from analyzer.capture.hf import CaptureSpec

    config, opts, _ = CASES[name]
    kw: dict[str, Any] = {"batch": 2, "prompt": 48, "new_tokens": 6, **opts, **over}
    return CaptureSpec(config=dict(config), output=str(out_dir / name / "trace.json.gz"), device=device, **kw)


def capture_one(name: str, out_dir: Path, device: str, over: dict[str, Any]) -> dict[str, Any]:
    """Capture one case in this process; write its meta.json and return it."""
    from analyzer.capture.hf import capture

    spec = spec_for(name, out_dir, device, **over)
    Path(spec.output).parent.mkdir(parents=True, exist_ok=True)
    meta = capture(spec)
    meta["case"] = name
    meta["covers"] = CASES[name][2]
    (out_dir / name / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


def kernel_summary(trace: Path) -> list[dict[str, Any]]:
    """The trace's GPU kernels by name: count and the truth regions they were launched in."""
    with gzip.open(trace, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    ranges: dict[int, list[tuple[float, float, str]]] = collections.defaultdict(list)
    launches: dict[Any, tuple[int, float]] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") == "user_annotation" and name.startswith("lkm::truth region="):
            ranges[e["tid"]].append((e["ts"], e["ts"] + e.get("dur", 0), name.split("=", 1)[1]))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = (e["tid"], e["ts"])
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        row = out.setdefault(e["name"], {"name": e["name"], "count": 0, "regions": collections.Counter()})
        row["count"] += 1
        tid, ts = launches.get(e.get("args", {}).get("correlation"), (None, None))
        inner = [r for r in ranges.get(tid, []) if r[0] <= ts <= r[1]] if tid is not None else []
        row["regions"][min(inner, key=lambda r: r[1] - r[0])[2] if inner else "-"] += 1
    return [{**r, "regions": dict(r["regions"])} for r in sorted(out.values(), key=lambda r: -r["count"])]


class _Stopped(Exception):
    """SIGTERM reached the runner (an outer ``timeout``): its cases are ended, the manifest kept."""


def _run_all(
    names: list[str], out_dir: Path, device: str, jobs: int, timeout: float, deadline: float, sets: list[str]
) -> int:
    manifest: dict[str, Any] = {"cases": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    # the linear-attention cases first: their Triton autotuning makes them the slowest
    pending = sorted(names, key=lambda n: "fla" not in (CASES[n][1].get("kernels") or ""))
    running: dict[str, tuple[subprocess.Popen[bytes], float, Any]] = {}
    start = time.monotonic()

    def write() -> None:
        (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")

    def end(name: str, rc: int | None, late: bool) -> None:
        proc, t0, log = running.pop(name)
        if rc is None:  # the cases run in their own sessions: end the whole group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        manifest["cases"][name] = _result(name, out_dir, rc, late, time.monotonic() - t0)
        print(f"{name}: {manifest['cases'][name]['status']}", flush=True)
        write()

    def stop(*_: Any) -> None:
        raise _Stopped

    old = signal.signal(signal.SIGTERM, stop)
    try:
        while pending or running:
            out_of_time = time.monotonic() - start > deadline
            while pending and len(running) < max(1, jobs) and not out_of_time:
                name = pending.pop(0)
                (out_dir / name).mkdir(parents=True, exist_ok=True)
                log = open(out_dir / name / "log.txt", "wb")  # noqa: SIM115 (closed when the case ends)
                cmd = [sys.executable, "-m", "analyzer.capture.library_cases", str(out_dir), "--one", name,
                       "--device", device, *(a for s in sets for a in ("--set", s))]  # fmt: skip
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                running[name] = (proc, time.monotonic(), log)
            if out_of_time and pending:
                manifest["not_started"] = list(pending)
                pending = []
            time.sleep(0.5)
            for name, (proc, t0, _) in list(running.items()):
                rc = proc.poll()
                late = rc is None and (time.monotonic() - t0 > timeout or out_of_time)
                if rc is not None or late:
                    end(name, rc, late)
    except (_Stopped, KeyboardInterrupt):
        manifest["stopped"] = "the runner was stopped; running cases were ended"
        manifest["not_started"] = manifest.get("not_started", []) + list(pending)
        for name in list(running):
            end(name, None, True)
    finally:
        signal.signal(signal.SIGTERM, old)
    manifest["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write()
    done = len(manifest["cases"]) == len(names)
    return 0 if done and all(c["status"] == "ok" for c in manifest["cases"].values()) else 1


def _result(name: str, out_dir: Path, rc: int | None, late: bool, seconds: float) -> dict[str, Any]:
    case = out_dir / name
    res: dict[str, Any] = {"covers": CASES[name][2], "options": CASES[name][1], "seconds": round(seconds, 1)}
    trace, meta = case / "trace.json.gz", case / "meta.json"
    if rc == 0 and trace.exists() and meta.exists():
        m = json.loads(meta.read_text(encoding="utf-8"))
        res.update(status="ok", trace_mb=round(trace.stat().st_size / 1e6, 3), steps=len(m.get("steps", [])))
        for key in (
            "library_versions",
            "liger",
            "quantized",
            "kernel_functions",
            "gpu",
            "torch",
            "transformers",
        ):
            res[key] = m.get(key)
        try:
            res["kernels"] = kernel_summary(trace)
        except (OSError, ValueError, KeyError) as exc:
            res["kernels_error"] = f"{type(exc).__name__}: {exc}"
    else:
        res["status"] = "timeout" if late else "failed"
        res["returncode"] = rc
        log = case / "log.txt"
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.exists() else []
        res["error"] = "\n".join(lines[-40:])
    return res


def group_of(name: str) -> str:
    """The archive a case goes into: ``fla`` (linear attention), ``liger`` or ``quant``."""
    kernels = CASES[name][1].get("kernels") or ""
    return "fla" if "fla" in kernels else "liger" if "liger" in kernels else "quant"


def pack(out_dir: Path, dest: Path) -> list[Path]:
    """``dest/<group>.tar.xz`` of the case folders (trace, meta, log) and ``dest/manifest.json``."""
    import shutil
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[Path]] = collections.defaultdict(list)
    for case in sorted(p for p in out_dir.iterdir() if p.is_dir() and p.name in CASES):
        groups[group_of(case.name)].append(case)
    written = []
    for group, cases in groups.items():
        path = dest / f"{group}.tar.xz"
        with tarfile.open(path, "w:xz") as tar:
            for case in cases:
                tar.add(case, arcname=case.name)
        written.append(path)
    if (out_dir / "manifest.json").exists():
        shutil.copy(out_dir / "manifest.json", dest / "manifest.json")
        written.append(dest / "manifest.json")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m analyzer.capture.library_cases", description=__doc__.splitlines()[0]
    )
    p.add_argument("out_dir")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--only", "--cases", default="", metavar="NAME[,NAME]", help="capture only these cases")
    p.add_argument("--device", default="cuda")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds before a case is killed")
    p.add_argument(
        "--deadline",
        type=float,
        default=1e9,
        help="seconds for the whole run: later cases are not started, running ones ended",
    )
    p.add_argument("--set", action="append", default=[], help="override a capture option, KEY=JSON")
    p.add_argument(
        "--pack", metavar="DIR", help="then write DIR/{liger,fla,quant}.tar.xz and DIR/manifest.json"
    )
    p.add_argument("--one", metavar="NAME", help=argparse.SUPPRESS)  # the worker: one case, this process
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    a = p.parse_args(argv)
    if a.list:
        for name, (_, opts, covers) in CASES.items():
            print(f"{name}: {json.dumps(opts)} - {covers}")
        return 0
    out_dir = Path(a.out_dir)
    over = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    if a.one:
        capture_one(a.one, out_dir, a.device, over)
        return 0
    names = [n for n in a.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"error: unknown case(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    rc = _run_all(names, out_dir, a.device, a.jobs, a.timeout, a.deadline, a.set)
    if a.pack:
        for path in pack(out_dir, Path(a.pack)):
            print(f"packed {path} ({path.stat().st_size / 2**20:.2f} MiB)", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
