"""GEMM roles from recorded shapes against a model's known dimensions: an independent oracle the tests
compare the walk with (production uses :mod:`analyzer.analyses.shape_roles`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from analyzer.analyses.walk.positions import gemm_shape
from analyzer.tables.launches import launching_op_rows


def gemm_roles_from_shapes(kernels: pa.Table, host_ops: pa.Table, arch: Any, tp: int = 1) -> list[str | None]:
    """Role per kernel from its op's (K, N) checked against the layer dimensions; None if undecidable.

    ``arch`` is an :class:`analyzer.knowledge.architectures.ModelArch`; with tensor parallelism each rank holds
    1/tp of the column-parallel outputs (QKV, gate/up, LM head) and of the row-parallel inputs (O,
    down). When two roles share a shape (Llama's q_proj and o_proj are both hidden x hidden) the
    kernel gets None: shapes alone cannot tell them apart.
    """
    h = arch.hidden_size
    q, kv = arch.q_dim // tp, arch.kv_dim // tp
    inter = arch.intermediate_size // tp
    shapes: dict[tuple[int, int], set[str]] = {}

    def add(k_in: int, n_out: int, role: str) -> None:
        shapes.setdefault((k_in, n_out), set()).add(role)

    for n_out in {q, kv, q + 2 * kv}:
        add(h, n_out, "qkv_gemm")
    add(q, h, "o_gemm")
    if arch.is_moe:
        add(h, arch.num_experts, "moe_gate_gemm")
        e = arch.expert_intermediate_size
        for n_out in (e, 2 * e):
            add(h, n_out, "moe_expert_gemm")
        add(e, h, "moe_expert_gemm")
    if not arch.is_moe or arch.dense_layers:
        for n_out in (inter, 2 * inter):
            add(h, n_out, "gate_up_gemm")
        add(inter, h, "down_gemm")
    for v in {arch.vocab_size, arch.vocab_size // tp}:
        add(h, v, "lm_head_gemm")
    found = launching_op_rows(kernels, host_ops)
    if found is None:
        return [None] * kernels.num_rows
    ops, pos = found
    names = ops["name"].combine_chunks().cast(pa.string()).take(pos).to_pylist()
    dims = host_ops["input_dims"].take(ops["row"].take(pos)).to_pylist()
    out: list[str | None] = []
    for name, d in zip(names, dims, strict=True):
        shape = gemm_shape(name, [list(x) for x in d] if d is not None else None)
        roles = shapes.get(shape) if shape else None
        if shape and roles is None and name in ("aten::bmm", "aten::baddbmm") and d is not None:
            roles = _bmm_expert_roles(d, arch)
        out.append(next(iter(roles)) if roles and len(roles) == 1 else None)
    return out


def _bmm_expert_roles(d: Any, arch: Any) -> set[str] | None:
    """HF eager MoE multiplies gathered expert weights [E, out, in] by tokens [E, in, n]."""
    if not arch.is_moe or len(d) < 2 or len(d[0]) != 3:
        return None
    e = arch.expert_intermediate_size
    out_f, in_f = d[0][1], d[0][2]
    if (in_f, out_f) in {(arch.hidden_size, e), (arch.hidden_size, 2 * e), (e, arch.hidden_size)}:
        return {"moe_expert_gemm"}
    return None
