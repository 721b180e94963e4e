"""The structure registry as the walk reads it: ``rules/structure.toml`` loaded once, the stage sets
the rules test, the vocabularies and the rule codes every decision records (``stage_rule``).
"""

from __future__ import annotations

from analyzer.knowledge.structure_rules import Thresholds, load_structure
from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES, DENSE_GEMM_STAGES
from analyzer.knowledge.work_ops import load_work_ops

# The stages the walk reads (sets for fast membership; derived from rules/taxonomy.toml):
GEMM_STAGES = frozenset(DENSE_GEMM_STAGES)  # a GEMM the walk gives a role (moe_expert_gemm keeps its own)


ATTENTION = frozenset(ATTENTION_KERNEL_STAGES)  # attention kernels: the anchor of a layer's sequence


# The registry (rules/structure.toml): the rules' ids, the vocabularies and the default thresholds
KNOWLEDGE = load_structure()


_V = KNOWLEDGE.set_of


WORK_OPS = load_work_ops()  # the GEMM layouts (rules/work_ops.toml): read once, as the registry


DEFAULT_THRESHOLDS: Thresholds = KNOWLEDGE.thresholds


# kernels whose stage the structure may refine: generic framework kernels only
GENERIC = _V("generic_stages")  # a bare ATen add is only a guess


SAMPLING_LIKE = _V("sampling_like_stages")  # a top-k after the LM head or in a MoE router


COMPOSED_ATTENTION = "flash_attention"  # the attention category's general stage (fused or not)


_ADD_OPS = _V("add_ops")


_COPY_OPS = _V("copy_ops")


# the rules of this module, by the names the registry gives them: each constant is the rule's code
# (its position in the registry), what the walk records per kernel in ``why``
_ID = KNOWLEDGE.code_of


LONE_POW = _ID("lone-pow")


MOE_ROUTER = _ID("moe-router")


ROLE_O = _ID("role-o")


ROLE_QKV = _ID("role-qkv")


ROLE_QKV_MORE = _ID("role-qkv-more")


ROLE_POST_NORM_QKV = _ID("role-post-norm-qkv")


BLOCK_OUTPUT_PROJECTION = _ID("block-output-projection")
ATTENTION_GATE_PROJECTION = _ID("attention-gate-projection")
SIDE_BLOCK = _ID("layer-side-block")
MIXER_SPAN = _ID("mixer-span")  # a token mixer's projections, labelled before the walk (analyses/mixers.py)
# the rules that give a GEMM the role-free stage `gemm` by name: STR059 does not warn of them
NAMED_ROLE_FREE = (BLOCK_OUTPUT_PROJECTION, ATTENTION_GATE_PROJECTION, SIDE_BLOCK)
MLP_SUB_NORM = _ID("mlp-sub-norm")


ROLE_MOE_GATE = _ID("role-moe-gate")


ROLE_GATE_UP = _ID("role-gate-up")


ROLE_DOWN = _ID("role-down")


ROLE_EXPERT = _ID("role-expert")


ROLE_LM_HEAD = _ID("role-lm-head")


ROLE_NONE = _ID("role-none")


MOE_BLOCK = _ID("moe-block")


OUTPUT_ROWS = _ID("output-row-gather")


SELF_CHECK = _ID("structure-self-check")


# the region defaults: region -> (stage, rule id)
_REGION_RULE = {
    reg: _ID(f"region-{reg.replace('_', '-')}")
    for reg in ("attn_in", "attn", "attn_out", "mlp_in", "mlp_out", "moe", "tail")
}


REGION_RULE_CODES = frozenset(_REGION_RULE.values())  # the codes of a decision by position only


POW_OPS = KNOWLEDGE.words("pow_ops")


_FUSED_NORM_WORDS = KNOWLEDGE.words("fused_norm_words")
