"""A GEMM op's role from the region the layer walk is in and what comes next (the region state
machine's default decision, :func:`_role`; the grammar's named exceptions come first in
:func:`analyzer.analyses.walk.grammar._gemm_op`).

Contract: a pure function of the walk's state; it reads no kernels.
"""

from __future__ import annotations

from analyzer.analyses.walk.registry import (
    _ID,
    ATTENTION,
    ROLE_DOWN,
    ROLE_EXPERT,
    ROLE_GATE_UP,
    ROLE_LM_HEAD,
    ROLE_MOE_GATE,
    ROLE_NONE,
    ROLE_O,
    ROLE_POST_NORM_QKV,
    ROLE_QKV,
    ROLE_QKV_MORE,
)

NO_MLP = _ID("block-without-mlp")
_FORWARD_END = ("sampling", "embedding", "")  # what follows a forward's last GEMM: its end


def _role(
    region: str,
    follow: str,
    gemm_ahead: bool,
    norm_seen: bool,
    layer_no: int,
    routing_next: bool = False,
    opens_forward: bool = False,
    norm_ahead: bool = True,
    after_mixer: bool = False,
) -> tuple[str, str, int, str]:
    """(role, new region, layer number, the deciding rule's id) of a GEMM from where we are and
    what comes next. ``opens_forward``: the first GEMM op after an embedding lookup, no RoPE kernel
    right after it."""
    if region == "attn":
        return "o_gemm", "attn_out", layer_no, ROLE_O
    if region == "attn_in":
        return "qkv_gemm", "attn_in", layer_no, ROLE_QKV_MORE
    if region in ("attn_out", "mlp_in"):
        # a norm, then GEMMs that reach the next anchor with no norm between: this layer has no MLP
        # (a token mixer's block); the GEMMs are the next layer's projections or the LM head
        no_mlp = region == "attn_out" and norm_seen and not norm_ahead
        if no_mlp and after_mixer and not gemm_ahead and follow in _FORWARD_END:
            return "lm_head_gemm", "tail", layer_no, NO_MLP
        if region == "attn_out" and routing_next:
            return "moe_gate_gemm", "moe", layer_no, ROLE_MOE_GATE
        if no_mlp and follow in ATTENTION:
            return "qkv_gemm", "attn_in", layer_no + 1, NO_MLP
        if gemm_ahead:
            return "gate_up_gemm", "mlp_in", layer_no, ROLE_GATE_UP
        return "down_gemm", "mlp_out", layer_no, ROLE_DOWN
    if region == "moe":
        return "moe_expert_gemm", "moe_experts", layer_no, ROLE_EXPERT
    if region == "moe_experts" and not norm_seen:
        return "moe_expert_gemm", "moe_experts", layer_no, ROLE_EXPERT
    # pre, mlp_out, moe_experts (after a norm), tail
    if norm_seen and follow in ATTENTION:
        return "qkv_gemm", "attn_in", layer_no + 1, ROLE_QKV
    if norm_seen and follow in _FORWARD_END:
        return "lm_head_gemm", "tail", layer_no, ROLE_LM_HEAD
    if region == "pre" and follow in ATTENTION and opens_forward:
        # the first projection of a post-norm block (OLMo-2: no norm before layer 0's q_proj)
        return "qkv_gemm", "attn_in", layer_no + 1, ROLE_POST_NORM_QKV
    if region == "moe_experts":
        # a norm ended the expert block: what the next GEMM opens is not known, but no expert's
        return "gemm", "mlp_out", layer_no, ROLE_NONE
    return "gemm", region, layer_no, ROLE_NONE
