"""The zoo: the configurations ``fixtures/zoo/`` holds, and the command that captures them.

Each case is a tiny configuration (2-3 layers, small hidden size: the traces stay small) of one
HF model type in one attention implementation, SDPA backend, dtype and serving mode, captured with
truth ranges (``docs/accuracy.md``). Together the cases cover the block layouts the analyzer has to
handle and every option of ``capture`` at least once (not the cross product).

``python -m analyzer.capture.zoo OUT_DIR [--jobs N] [--only NAME,...] [--device cuda]`` captures
every case (or the ``--only`` ones) into ``OUT_DIR/<case>/trace.json.gz`` + ``meta.json`` (several
processes share the GPU; kernels do not depend on timing). It imports torch and transformers only
(and Triton for the ``triton_fused`` experts case: :mod:`analyzer.capture.fused_experts`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_GQA = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512}  # fmt: skip
LLAMA = {"model_type": "llama", **_GQA}
DRAFT = {**LLAMA, "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128}
MOE = {"moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2}

#: name -> (config, capture options, what the case covers)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "llama-sdpa-bf16": (LLAMA, {}, "dense GQA, RMSNorm + SwiGLU; SDPA, default backend"),
    "llama-eager-bf16": (LLAMA, {"attn": "eager"}, "eager attention (matmul, softmax, matmul)"),
    "llama-sdpa-flash-fp16": (
        LLAMA,
        {"sdpa_backend": "flash", "dtype": "fp16"},
        "SDPA FlashAttention backend, fp16",
    ),
    "llama-mha-sdpa-efficient-bf16": (
        {**LLAMA, "num_key_value_heads": 4},
        {"sdpa_backend": "efficient"},
        "SDPA memory-efficient backend (MHA: it takes no GQA)",
    ),  # fmt: skip
    "llama-sdpa-cudnn-bf16": (LLAMA, {"sdpa_backend": "cudnn", "shapes": False}, "SDPA cuDNN backend"),
    "llama-sdpa-math-fp32": (LLAMA, {"sdpa_backend": "math", "dtype": "fp32"}, "SDPA math backend, fp32"),
    "llama-flex-bf16": (LLAMA, {"attn": "flex_attention"}, "flex attention (Triton kernels + block mask)"),
    "llama-static-cache-bf16": (
        LLAMA,
        {"mode": "static-cache"},
        "static cache: compiled decode in CUDA graphs",
    ),
    "llama-cb-paged-sdpa-bf16": (
        LLAMA,
        {"mode": "continuous-batching", "attn": "paged|sdpa"},
        "continuous batching (no CUDA graph replays here), mixed steps",
    ),  # fmt: skip
    "llama-assisted-bf16": (
        LLAMA,
        {"assistant": DRAFT, "batch": 1, "new_tokens": 12},
        "assisted generation with a 1-layer draft (batch 1)",
    ),
    "llama-cb-many-sdpa-bf16": (
        LLAMA,
        {"mode": "continuous-batching", "attn": "paged|sdpa", "requests": 8, "prompt": 40, "new_tokens": 4},
        "continuous batching of 8 requests: some finish while later prompts are still prefilled",
    ),  # fmt: skip
    "llama-cb-wide-sdpa-bf16": (
        LLAMA,
        {
            "mode": "continuous-batching",
            "attn": "paged|sdpa",
            "cuda_graphs": False,
            "requests": 24,
            "prompt": 8,
            "new_tokens": 8,
            "batch_tokens": 64,
        },
        "continuous batching of 24 short requests: a step of decodes alone packs more tokens than a verify",
    ),  # fmt: skip
    "llama-cb-graphs-sdpa-bf16": (
        LLAMA,
        {"mode": "continuous-batching", "attn": "paged|sdpa", "cuda_graphs": True},
        "continuous batching with its steps replayed from CUDA graphs",
    ),  # fmt: skip
    "llama-assisted-noshape-bf16": (
        LLAMA,
        {"assistant": DRAFT, "batch": 1, "new_tokens": 12, "shapes": False},
        "assisted generation without recorded shapes (draft / target told apart by layers)",
    ),
    "llama-forward-bf16": (LLAMA, {"mode": "forward", "shapes": False}, "one forward pass"),
    "qwen2-sampling-bf16": ({"model_type": "qwen2", **_GQA}, {"sampling": True}, "qkv bias; sampling"),
    "qwen2-cb-paged-eager-bf16": (
        {"model_type": "qwen2", **_GQA},
        {"mode": "continuous-batching", "attn": "paged|eager", "cuda_graphs": False, "shapes": False},
        "continuous batching without CUDA graphs, eager paged",
    ),  # fmt: skip
    "mistral-sdpa-fp16": (
        {"model_type": "mistral", **_GQA, "sliding_window": 64},
        {"dtype": "fp16"},
        "sliding window",
    ),  # fmt: skip
    "qwen3-sdpa-bf16": ({"model_type": "qwen3", **_GQA, "head_dim": 32}, {"shapes": False}, "q/k norms"),
    "qwen3-static-cache-bf16": (
        {"model_type": "qwen3", **_GQA, "head_dim": 32},
        {"mode": "static-cache", "shapes": False},
        "q/k norms under compiled decode",
    ),  # fmt: skip
    "gemma2-eager-bf16": (
        {"model_type": "gemma2", **_GQA, "head_dim": 32},
        {"attn": "eager"},
        "sandwich norms, softcapping, GELU-tanh gate",
    ),  # fmt: skip
    "gemma3-sdpa-bf16": (
        {"model_type": "gemma3_text", **_GQA, "head_dim": 32, "sliding_window": 64},
        {"shapes": False},
        "sandwich + q/k norms, local/global layers",
    ),  # fmt: skip
    "olmo2-sdpa-fp32": ({"model_type": "olmo2", **_GQA}, {"dtype": "fp32"}, "post-norms, q/k norms, fp32"),
    "olmo2-noshape-bf16": (
        {"model_type": "olmo2", **_GQA},
        {"shapes": False},
        "post-norms, q/k norms, bf16, without shapes",
    ),  # fmt: skip
    "phi3-sdpa-bf16": ({"model_type": "phi3", **_GQA, "pad_token_id": 0}, {}, "fused qkv and fused gate/up"),
    "gpt2-sdpa-fp16": (
        {
            "model_type": "gpt2",
            "n_embd": 128,
            "n_layer": 2,
            "n_head": 4,
            "vocab_size": 512,
            "n_positions": 256,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
        {"dtype": "fp16"},
        "LayerNorm + GELU, learned positions, Conv1D",
    ),  # fmt: skip
    "gpt-neox-sdpa-bf16": (
        {
            "model_type": "gpt_neox",
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "vocab_size": 512,
            "rotary_pct": 0.25,
            "use_parallel_residual": True,
        },
        {"shapes": False},
        "partial rotary, parallel residual, fused qkv",
    ),  # fmt: skip
    "opt-sdpa-fp16": (
        {
            "model_type": "opt",
            "hidden_size": 128,
            "ffn_dim": 256,
            "word_embed_proj_dim": 64,
            "do_layer_norm_before": False,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "vocab_size": 512,
            "max_position_embeddings": 512,
        },
        {"dtype": "fp16"},
        "post-norm blocks, learned positions, embeddings projected in and out (OPT-350m's layout)",
    ),
    "phi-eager-fp16": (
        {
            "model_type": "phi",
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "vocab_size": 512,
            "partial_rotary_factor": 0.5,
        },
        {"attn": "eager", "dtype": "fp16"},
        "parallel attention+MLP, partial rotary, GELU",
    ),  # fmt: skip
    "falcon-sdpa-bf16": (
        {
            "model_type": "falcon",
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_kv_heads": 1,
            "vocab_size": 512,
            "new_decoder_architecture": False,
            "multi_query": True,
            "parallel_attn": True,
            "bias": False,
        },
        {"shapes": False},
        "multi-query, parallel attention, LayerNorm + GELU",
    ),  # fmt: skip
    "mixtral-loop-bf16": (
        {"model_type": "mixtral", **_GQA, "num_local_experts": 8, "num_experts_per_tok": 2},
        {"experts": "eager"},
        "MoE routed only, experts as a loop",
    ),  # fmt: skip
    "qwen2-moe-bmm-bf16": (
        {"model_type": "qwen2_moe", **_GQA, **MOE, "shared_expert_intermediate_size": 128},
        {"experts": "batched_mm"},
        "MoE with a gated shared expert, experts as bmm",
    ),  # fmt: skip
    "qwen2-moe-loop-noshape-bf16": (
        {"model_type": "qwen2_moe", **_GQA, **MOE, "shared_expert_intermediate_size": 128},
        {"experts": "eager", "shapes": False},
        "MoE with a gated shared expert, experts as a loop, without shapes",
    ),  # fmt: skip
    "qwen3-moe-grouped-bf16": (
        {"model_type": "qwen3_moe", **_GQA, **MOE, "head_dim": 32},
        {"experts": "grouped_mm"},
        "MoE routed only, experts as grouped_mm",
    ),  # fmt: skip
    "qwen3-moe-fused-bf16": (
        {"model_type": "qwen3_moe", **_GQA, **MOE, "head_dim": 32},
        {"experts": "triton_fused"},
        "MoE routed only, experts as our own Triton fused-MoE kernel (fused_moe_kernel)",
    ),  # fmt: skip
    "olmoe-sdpa-bf16": (
        {"model_type": "olmoe", **_GQA, **MOE, "intermediate_size": 64},
        {"shapes": False},
        "MoE routed only (loop), q/k norms",
    ),  # fmt: skip
    "deepseek-v3-mla-bf16": (
        {
            "model_type": "deepseek_v3",
            **_GQA,
            "num_hidden_layers": 3,
            "num_key_value_heads": 4,
            "moe_intermediate_size": 64,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "n_group": 2,
            "topk_group": 1,
            "q_lora_rank": 64,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16,
            "v_head_dim": 32,
        },
        {},
        "MLA, dense-then-MoE, shared expert, grouped top-k",
    ),  # fmt: skip
    "deepseek-v2-mla-bf16": (
        {
            "model_type": "deepseek_v2",
            **_GQA,
            "num_hidden_layers": 3,
            "num_key_value_heads": 4,
            "moe_intermediate_size": 64,
            "n_routed_experts": 8,
            "n_shared_experts": 2,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16,
            "v_head_dim": 32,
            "topk_method": "greedy",
        },
        {"shapes": False},
        "MLA without q LoRA, MoE",
    ),  # fmt: skip
    "gpt-oss-eager-bf16": (
        {
            "model_type": "gpt_oss",
            **_GQA,
            "intermediate_size": 128,
            "head_dim": 32,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": 64,
        },
        {"attn": "eager"},
        "MoE with biased fused-layout experts, sinks (eager)",
    ),  # fmt: skip
}


def spec_for(name: str, out_dir: Path, device: str = "cuda", **over: Any) -> Any:
    from analyzer.capture.hf import CaptureSpec

    config, opts, _ = CASES[name]
    kw: dict[str, Any] = {"batch": 2, "prompt": 48, "new_tokens": 6, **opts, **over}
    if kw.get("assistant"):
        kw["batch"] = 1  # transformers assists one sequence at a time
    if kw.get("mode") == "continuous-batching":
        kw.setdefault("requests", 4)
    return CaptureSpec(config=dict(config), output=str(out_dir / name / "trace.json.gz"), device=device, **kw)


def capture_case(name: str, out_dir: str, device: str, over: dict[str, Any]) -> tuple[str, str]:
    """Capture one case (in a worker process); return (name, 'ok ...' or the error)."""
    from analyzer.capture.hf import capture

    t0 = time.perf_counter()
    try:
        spec = spec_for(name, Path(out_dir), device, **over)
        meta = capture(spec)
        meta["case"] = name
        meta["covers"] = CASES[name][2]
        (Path(out_dir) / name / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        size = os.path.getsize(spec.output)
        return name, f"ok {time.perf_counter() - t0:.0f}s {size / 1e6:.2f}MB {len(meta['steps'])} steps"
    except Exception as exc:  # one broken case must not cost the others
        return name, f"FAILED {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"


def identity_check(out_dir: str, device: str) -> tuple[str, str]:
    """Capture one case with and without truth ranges: the kernel-name sequences must be equal."""
    import gzip

    from analyzer.capture.hf import capture

    names = []
    for truth in (True, False):
        spec = spec_for("llama-sdpa-bf16", Path(out_dir) / "_identity", device, truth=truth)
        spec.output = str(Path(out_dir) / "_identity" / f"truth-{truth}.json.gz")
        capture(spec)
        with gzip.open(spec.output, "rt", encoding="utf-8") as f:
            ev = json.load(f)["traceEvents"]
        gpu = sorted(
            (e["ts"], e["name"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        )
        names.append([n for _, n in gpu])
    same = names[0] == names[1]
    out = {"same_kernel_sequence": same, "kernels": [len(n) for n in names]}
    (Path(out_dir) / "identity.json").write_text(json.dumps(out) + "\n", encoding="utf-8")
    return "identity", json.dumps(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analyzer.capture.zoo", description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--only", "--cases", default="", metavar="NAME[,NAME]", help="capture only these cases")
    p.add_argument("--device", default="cuda")
    p.add_argument("--set", action="append", default=[], help="override a capture option, KEY=JSON")
    p.add_argument("--identity", action="store_true", help="also check kernels with/without truth ranges")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"error: unknown case(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    over = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    failed = 0
    with concurrent.futures.ProcessPoolExecutor(max(1, a.jobs)) as pool:
        futs = [pool.submit(capture_case, n, a.out_dir, a.device, over) for n in names]
        if a.identity:
            futs.append(pool.submit(identity_check, a.out_dir, a.device))
        for fut in concurrent.futures.as_completed(futs):
            name, msg = fut.result()
            failed += msg.startswith("FAILED")
            print(f"{name}: {msg}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
