"""Our own fused-MoE experts for HF transformers: sorted, block-padded token-expert pairs and one
Triton grouped-GEMM launch per projection, registered as the experts implementation ``triton_fused``.

Contract: :func:`register` adds ``triton_fused`` to transformers' ``ALL_EXPERTS_FUNCTIONS`` (the
experts interface of ``transformers.integrations.moe``); a model built with
``experts_implementation="triton_fused"`` then runs :func:`triton_fused_experts_forward` in place of
its experts' forward (the experts module stays, so its truth range encloses every launch). The
algorithm is the well-known fused-MoE design of serving engines:

1. **align** (:func:`align_block_size`, plain torch ops): sort the ``tokens x top_k`` token-expert
   pairs by expert, pad each expert's run of rows to a multiple of ``BLOCK_M`` and name the expert
   of every block (``-1``: a block past the last expert's rows). The padded length is an upper
   bound known on the host, so nothing waits for the device;
2. **gate_up**: one ``fused_moe_kernel`` launch computes every expert's ``x @ gate_up_proj[e].T``
   over the sorted rows (a grouped GEMM: each program owns one ``BLOCK_M`` block of one expert);
3. **activation**: the experts module's own ``_apply_gate`` (``act_fn(gate) * up``);
4. **down**: a second ``fused_moe_kernel`` launch with the routing weight multiplied in, each row
   written to its token-expert pair;
5. **sum** over the ``top_k`` copies of each token.

On CUDA the two GEMMs are the Triton kernel (bf16 / fp16 inputs, fp32 accumulation). Elsewhere a
pure-torch reference of the same sorted, padded, block-wise algorithm runs (:func:`reference_gemm`),
so CPU tests check the bookkeeping and the result against the eager experts loop.
Supported layouts: gated experts without bias whose ``gate_up_proj`` is ``(E, 2I, H)`` and
``down_proj`` ``(E, H, I)`` (the zoo's mixtral, qwen3_moe and olmoe: ``--check`` runs all three), or
both transposed (``is_transposed``); anything else raises :class:`FusedExpertsError`.

``python -m analyzer.capture.fused_experts --check`` compares the Triton path with the eager one on
tiny configs on a GPU and exits 1 when they disagree. Imports torch (Triton only when installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import torch

try:  # the GPU path only: the module imports (and the reference runs) without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None

NAME = "triton_fused"
BLOCK_M = 16  # rows of one expert per program: small, since decode steps route few tokens
BLOCK_N = 64
BLOCK_K = 64


class FusedExpertsError(ValueError):
    """An experts module or input the fused path does not support."""


# ----------------------------------------------------------------------------- bookkeeping


@dataclasses.dataclass
class Alignment:
    """Token-expert pairs sorted by expert, each expert's rows padded to a multiple of ``block_m``.

    Pair ``p`` is token ``p // top_k``'s ``p % top_k``-th choice (the row-major order of
    ``top_k_index``). ``sorted_ids[j]`` is the pair in padded row ``j``, or ``num_pairs`` for a
    padding row; ``block_expert[b]`` is the expert of rows ``b*block_m .. (b+1)*block_m - 1``, or
    ``-1`` for a block past the last expert's rows (the launch grid is sized by an upper bound).
    """

    sorted_ids: torch.Tensor  # (rows,) int32
    block_expert: torch.Tensor  # (rows // block_m,) int32
    num_pairs: int
    top_k: int
    block_m: int

    @property
    def rows(self) -> int:
        return int(self.sorted_ids.numel())


def align_block_size(top_k_index: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> Alignment:
    """Sort the pairs of ``top_k_index`` (tokens, top_k) by expert and pad each expert to ``block_m``.

    An expert id of ``num_experts`` or more (an expert-parallel sentinel) drops its pair: it gets no
    row, so its output stays zero. Plain torch ops, no host sync (the row count is an upper
    bound: every pair plus ``block_m - 1`` padding rows per expert).
    """
    tokens, top_k = top_k_index.shape
    num_pairs = tokens * top_k
    dev = top_k_index.device
    bucket = top_k_index.reshape(-1).to(torch.int64).clamp(max=num_experts)  # bucket E: dropped pairs
    # counts per expert by scatter_add (torch.bincount on CUDA reads the maximum back to the host)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    counts = counts[:num_experts]
    order = torch.argsort(bucket, stable=True)  # pair ids, sorted by expert
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    start = torch.cumsum(counts, 0) - counts  # each expert's first position in `order`
    rows = -(-(num_pairs + num_experts * (block_m - 1)) // block_m) * block_m
    sorted_bucket = bucket[order]
    e = sorted_bucket.clamp(max=num_experts - 1)
    rank = torch.arange(num_pairs, device=dev) - start[e]
    dest = torch.where(sorted_bucket < num_experts, pad_start[e] + rank, rows)  # dropped -> spare row
    sorted_ids = torch.full((rows + 1,), num_pairs, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    block_start = torch.arange(0, rows, block_m, device=dev)
    block_expert = torch.searchsorted(pad_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return Alignment(sorted_ids[:rows], block_expert, num_pairs, top_k, block_m)


# ----------------------------------------------------------------------------- layouts


def _check_layout(mod: Any) -> None:
    if getattr(mod, "has_bias", False):
        raise FusedExpertsError(f"{NAME}: {type(mod).__name__} has biased experts (not supported)")
    if not getattr(mod, "has_gate", True) or not hasattr(mod, "gate_up_proj"):
        raise FusedExpertsError(f"{NAME}: {type(mod).__name__} has no fused gate_up_proj (not supported)")
    gu, down = mod.gate_up_proj, mod.down_proj
    if gu.dim() != 3 or down.dim() != 3 or gu.shape[0] != down.shape[0]:
        raise FusedExpertsError(
            f"{NAME}: {type(mod).__name__} weights {tuple(gu.shape)} / {tuple(down.shape)} are not per-expert 3D"
        )


def _kn(weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """An experts weight as a (E, K, N) view: K the input features, N the output features."""
    return weight if transposed else weight.transpose(1, 2)


# ----------------------------------------------------------------------------- the GEMMs


def reference_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    al: Alignment,
    *,
    a_rows_by_token: bool,
    out: torch.Tensor,
    out_rows_by_pair: bool,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """What one ``fused_moe_kernel`` launch computes, block by block in torch (fp32 accumulation).

    ``a``: the input rows (tokens, or padded sorted rows); ``b``: (E, K, N). Block ``i`` of rows
    multiplies its rows of ``a`` (zero for padding rows) by ``b[block_expert[i]]`` and writes every
    row of the block to ``out`` (padded layout) or only its real rows to their pairs' rows.
    """
    ids = al.sorted_ids.to(torch.int64)
    for i, expert in enumerate(al.block_expert.tolist()):
        rows = torch.arange(i * al.block_m, (i + 1) * al.block_m, device=a.device)
        pair = ids[rows]
        ok = (pair < al.num_pairs) & (expert >= 0)
        src = pair.clamp(max=al.num_pairs - 1) // al.top_k if a_rows_by_token else rows
        x = torch.where(ok[:, None], a[src].float(), 0.0)
        acc = x @ b[max(expert, 0)].float() if expert >= 0 else x.new_zeros(al.block_m, b.shape[2])
        if weights is not None:
            acc = acc * torch.where(ok, weights[pair.clamp(max=al.num_pairs - 1)].float(), 0.0)[:, None]
        if out_rows_by_pair:
            out[pair[ok]] = acc[ok].to(out.dtype)
        else:
            out[rows] = acc.to(out.dtype)
    return out


if triton is not None:

    @triton.jit
    def fused_moe_kernel(
        a_ptr,
        b_ptr,
        c_ptr,
        w_ptr,
        sorted_ids_ptr,
        block_expert_ptr,
        N,
        K,
        num_pairs,
        top_k,
        stride_am,
        stride_ak,
        stride_be,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        A_ROWS_BY_TOKEN: tl.constexpr,
        C_ROWS_BY_PAIR: tl.constexpr,
        MUL_ROUTED_WEIGHT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """C[rows of block m, cols of block n] = A[rows] @ B[expert of block m] (fp32 accumulator).

        Program (m, n) owns padded sorted rows m*BLOCK_M.. and output columns n*BLOCK_N..; a row
        holds a token-expert pair (``sorted_ids``) or padding (``num_pairs``); a block of expert -1
        lies past the last expert's rows and computes zeros (masks, no early exit).
        """
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        expert = tl.load(block_expert_ptr + pid_m)
        valid = expert >= 0
        expert64 = tl.maximum(expert, 0).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ids_ptr + offs_m)
        row_ok = (pair < num_pairs) & valid
        if A_ROWS_BY_TOKEN:
            a_row = (pair // top_k).to(tl.int64)
        else:
            a_row = offs_m.to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        b_base = b_ptr + expert64 * stride_be
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            k_ok = kk < K
            a = tl.load(
                a_ptr + a_row[:, None] * stride_am + kk[None, :] * stride_ak,
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            b = tl.load(
                b_base + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                mask=(k_ok[:, None] & n_ok[None, :]) & valid,
                other=0.0,
            )
            acc += tl.dot(a, b)
        if MUL_ROUTED_WEIGHT:
            w = tl.load(w_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
            acc = acc * w[:, None]
        if C_ROWS_BY_PAIR:
            c_row = pair.to(tl.int64)
            c_mask = row_ok[:, None] & n_ok[None, :]
        else:
            c_row = offs_m.to(tl.int64)
            c_mask = (offs_m[:, None] >= 0) & n_ok[None, :]
        tl.store(
            c_ptr + c_row[:, None] * stride_cm + offs_n[None, :] * stride_cn,
            acc.to(c_ptr.dtype.element_ty),
            mask=c_mask,
        )


def triton_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    al: Alignment,
    *,
    a_rows_by_token: bool,
    out: torch.Tensor,
    out_rows_by_pair: bool,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """One ``fused_moe_kernel`` launch: the same contract as :func:`reference_gemm`."""
    if triton is None:
        raise FusedExpertsError(f"{NAME}: the CUDA path needs Triton (pip install triton)")
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        raise FusedExpertsError(f"{NAME}: the Triton path takes bf16 or fp16 (got {a.dtype}, {b.dtype})")
    n, k = b.shape[2], b.shape[1]
    w = weights if weights is not None else al.sorted_ids  # any pointer: not read without MUL_ROUTED_WEIGHT
    grid = (al.rows // al.block_m, triton.cdiv(n, BLOCK_N))
    fused_moe_kernel[grid](
        a, b, out, w, al.sorted_ids, al.block_expert,
        n, k, al.num_pairs, al.top_k,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1),
        A_ROWS_BY_TOKEN=a_rows_by_token,
        C_ROWS_BY_PAIR=out_rows_by_pair,
        MUL_ROUTED_WEIGHT=weights is not None,
        BLOCK_M=al.block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        num_warps=4,
    )  # fmt: skip
    return out


# ----------------------------------------------------------------------------- the experts forward


def triton_fused_experts_forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts interface's forward: (tokens, H) hidden states, (tokens, top_k) expert ids and
    routing weights -> (tokens, H). Triton on CUDA, the torch reference elsewhere."""
    _check_layout(self)
    gemm = triton_gemm if hidden_states.is_cuda else reference_gemm
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    transposed = bool(getattr(self, "is_transposed", False))
    gate_up, down = _kn(self.gate_up_proj, transposed), _kn(self.down_proj, transposed)
    if gate_up.shape[1] != hidden or down.shape[2] != hidden or down.shape[1] * 2 != gate_up.shape[2]:
        raise FusedExpertsError(
            f"{NAME}: {type(self).__name__} weights {tuple(self.gate_up_proj.shape)} / "
            f"{tuple(self.down_proj.shape)} do not fit hidden size {hidden} as a gated MLP"
        )
    al = align_block_size(top_k_index, gate_up.shape[0])
    x = hidden_states.to(gate_up.dtype)
    h = gemm(x, gate_up, al, a_rows_by_token=True, out_rows_by_pair=False,
             out=x.new_empty(al.rows, gate_up.shape[2]))  # fmt: skip
    h = self._apply_gate(h)  # padding rows: act(0) * 0 = 0, never written below
    out = x.new_zeros(al.num_pairs, hidden)  # a dropped pair (sentinel expert) stays zero
    gemm(h.contiguous(), down, al, a_rows_by_token=False, out_rows_by_pair=True, out=out,
         weights=top_k_weights.reshape(-1))  # fmt: skip
    return out.view(tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


def register() -> None:
    """Make ``experts_implementation="triton_fused"`` known to transformers (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(NAME, triton_fused_experts_forward)


# ----------------------------------------------------------------------------- GPU self-check

#: tiny configs for --check: the zoo's shapes and one with K and N edges (hidden 80, 2I = 96)
CHECK_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256,
                  "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe-edges": {"model_type": "qwen3_moe", "hidden_size": 80, "intermediate_size": 160,
                        "moe_intermediate_size": 48, "num_experts": 5, "num_experts_per_tok": 3},
    "mixtral": {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 256,
                "num_local_experts": 8, "num_experts_per_tok": 2},
    "olmoe": {"model_type": "olmoe", "hidden_size": 128, "intermediate_size": 64,
              "num_experts": 8, "num_experts_per_tok": 2},
}  # fmt: skip
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3}  # max |fused - eager| / max |eager|


def experts_module(config: dict[str, Any], dtype: torch.dtype, device: str) -> Any:
    """The first experts module of a 1-layer model of ``config`` (random weights, std 0.02)."""
    import transformers

    d = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(
        config["model_type"], num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0, **d,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    mod = next(m for n, m in model.named_modules() if n.endswith("experts"))
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0.0, 0.02)
    return mod


def eager_experts_forward(mod: Any, *args: Any) -> torch.Tensor:
    """transformers' own loop over experts (the experts class's undecorated forward)."""
    return type(mod).forward.__wrapped__(mod, *args)


def routing(
    tokens: int, num_experts: int, top_k: int, device: str, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Random distinct expert ids per token and softmax-normalised weights (fp32, as routers give)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(tokens, num_experts, generator=g).argsort(dim=-1)[:, :top_k]
    w = torch.rand(tokens, top_k, generator=g).softmax(-1)
    return idx.to(device), w.to(device)


def check(device: str = "cuda", token_counts: tuple[int, ...] = (1, 2, 7, 96, 333)) -> list[dict[str, Any]]:
    """Compare the fused path with transformers' eager loop on each config, dtype and token count."""
    results = []
    for name, config in CHECK_CONFIGS.items():
        for dname, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            mod = experts_module(config, dtype, device)
            for tokens in token_counts:
                idx, w = routing(tokens, mod.num_experts, config["num_experts_per_tok"], device, seed=tokens)
                x = torch.randn(tokens, mod.gate_up_proj.shape[-1], device=device, dtype=dtype)
                with torch.inference_mode():
                    want = eager_experts_forward(mod, x, idx, w.to(dtype))
                    got = triton_fused_experts_forward(mod, x, idx, w.to(dtype))
                err = float((got.float() - want.float()).abs().max())
                scale = float(want.float().abs().max())
                ok = bool(torch.isfinite(got).all()) and err <= TOLERANCE[dname] * scale + 1e-6
                results.append({"config": name, "dtype": dname, "tokens": tokens, "max_abs_err": err,
                                "max_abs_ref": scale, "ok": ok})  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m analyzer.capture.fused_experts", description=__doc__.splitlines()[0]
    )
    p.add_argument("--check", action="store_true", help="compare the Triton path with the eager loop (CUDA)")
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    if not a.check:
        p.print_help()
        return 2
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --check needs a CUDA device (torch sees none)", file=sys.stderr)
        return 2
    if a.device.startswith("cuda") and triton is None:
        print("error: --check needs Triton (pip install triton)", file=sys.stderr)
        return 2
    results = check(a.device)
    for r in results:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['config']:16} {r['dtype']} tokens={r['tokens']:<4} "
              f"max_abs_err={r['max_abs_err']:.3e} (max |eager| {r['max_abs_ref']:.3e})")  # fmt: skip
    bad = sum(not r["ok"] for r in results)
    print(f"{len(results) - bad}/{len(results)} agree within {TOLERANCE} of max |eager|")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
