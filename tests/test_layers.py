"""Unit tests on hand-built sequences for the per-layer structure walk (analyzer/analyses/walk/).

They pin what must stay true of :func:`walk_sequence` and :func:`_role` (a Llama-like SDPA decoder, a
MoE block, the boundary rules the code states), not their known failures: the generalization work may
replace the heuristic together with these tests, saying so.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from analyzer.analyses.walk.eager_ops import reduction_rows
from analyzer.analyses.walk.grammar import _role, walk_sequence
from analyzer.analyses.walk.kv_cache import CACHE_READ, STRONG_WRITE, WEAK_WRITE, _kv_update_positions
from analyzer.analyses.walk.moe import topk_candidates
from analyzer.tables.dictionaries import dict_isin, dict_strings

# (stage after the rule table, kernel name, launching host op) of one kernel
Kernel = tuple[str, str, "str | None"]

NORM: Kernel = ("norm", "rmsnorm_kernel", None)
GEMM: Kernel = ("gemm", "nvjet_sm90_tst_128x64", None)
ROPE: Kernel = ("rope", "rotary_embedding_kernel", None)
KV: Kernel = ("kv_cache_store", "reshape_and_cache_flash_kernel", None)
ATTN: Kernel = ("flash_attention", "flash_fwd_kernel", None)
ADD: Kernel = ("residual_add", "vectorized_elementwise_kernel<add>", "aten::add")
ACT: Kernel = ("activation", "act_and_mul_kernel", None)

# one Llama-like SDPA decoder layer: norm, QKV GEMM, RoPE, KV store, attention, O GEMM, residual add,
# norm, gate/up GEMM, activation, down GEMM, residual add
LAYER = [NORM, GEMM, ROPE, KV, ATTN, GEMM, ADD, NORM, GEMM, ACT, GEMM, ADD]
LAYER_STAGES = [
    "norm",
    "qkv_gemm",
    "rope",
    "kv_cache_store",
    "flash_attention",
    "o_gemm",
    "residual_add",
    "norm",
    "gate_up_gemm",
    "activation",
    "down_gemm",
    "residual_add",
]
HEAD = [("embedding", "indexSelectLargeIndex", None)]
TAIL = [NORM, GEMM, ("sampling", "topk_kernel", None)]


def op_rows(names: list[str], ops: list[str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The walk's per-row masks, as classify computes them: top-k candidates, ``aten::pow``,
    reductions."""
    column = dict_strings(pa.array(ops, pa.string()))
    reduce = reduction_rows(pa.array(names, pa.string()), column)
    return topk_candidates(names, column), dict_isin(column, ["aten::pow"]), reduce


def walk(kernels: list[Kernel]) -> tuple[list[str], list[int]]:
    """Run the walk over one device's kernels in time order; each kernel its own launching op."""
    n = len(kernels)
    stage = [k[0] for k in kernels]
    layer = np.full(n, -1, np.int64)
    names, ops = [k[1] for k in kernels], [k[2] for k in kernels]
    walk_sequence(
        np.arange(n),
        stage,
        names,
        ops,
        np.arange(n, dtype=np.float64),  # distinct launch ids: no two GEMM kernels form one op
        layer,
        *op_rows(names, ops),
    )
    return stage, layer.tolist()


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_llama_like_forward_gets_roles_and_layers(layers):
    # GIVEN an embedding, N Llama-like SDPA layers, the final norm, the LM head and sampling
    kernels = HEAD + LAYER * layers + TAIL
    # WHEN the structure is walked
    stage, layer = walk(kernels)
    # THEN every GEMM has its role, the other kernels keep their stage
    assert stage == ["embedding"] + LAYER_STAGES * layers + ["norm", "lm_head_gemm", "sampling"]
    # AND the layers are numbered 0..N-1, each layer's input norm in its own layer; the embedding,
    # the LM head and sampling belong to none, the final norm to the last layer
    expect = [-1] + [i for i in range(layers) for _ in LAYER] + [layers - 1, -1, -1]
    assert layer == expect


def test_forward_without_embedding_kernel_starts_at_the_first_norm():
    # GIVEN a forward whose embedding is not a kernel of its own (CUDA-graph replay without it)
    stage, layer = walk(LAYER * 2 + TAIL)
    # THEN the first layer's input norm still belongs to layer 0 and the roles are the same
    assert stage == LAYER_STAGES * 2 + ["norm", "lm_head_gemm", "sampling"]
    assert layer[: len(LAYER)] == [0] * len(LAYER)


def test_an_embedding_kernel_starts_a_new_forward():
    # GIVEN two forwards of two layers each on one device
    stage, layer = walk((HEAD + LAYER * 2 + TAIL) * 2)
    # THEN the second forward's layers are numbered from 0 again
    one = [-1] + [0] * len(LAYER) + [1] * len(LAYER) + [1, -1, -1]
    assert layer == one + one
    assert stage.count("lm_head_gemm") == 2 and stage.count("qkv_gemm") == 4


def test_unfused_q_k_v_projections_are_all_qkv():
    # GIVEN separate q, k and v projections (three GEMMs before RoPE and attention)
    layer = [NORM, GEMM, GEMM, GEMM, ROPE, ATTN, GEMM, ADD, NORM, GEMM, ACT, GEMM, ADD]
    stage, _ = walk(HEAD + layer + TAIL)
    # THEN all three are qkv_gemm, and the rest of the layer is as in a fused layer
    assert stage[1:14] == [
        "norm",
        "qkv_gemm",
        "qkv_gemm",
        "qkv_gemm",
        "rope",
        "flash_attention",
        "o_gemm",
    ] + [
        "residual_add",
        "norm",
        "gate_up_gemm",
        "activation",
        "down_gemm",
        "residual_add",
    ]


def test_split_k_reduction_belongs_to_its_gemm():
    # GIVEN a QKV GEMM followed by its split-K reduction (a GEMM-stage kernel of its own)
    reduce: Kernel = ("gemm", "splitKreduce_kernel", None)
    layer = [NORM, GEMM, reduce, ROPE, ATTN, GEMM, ADD, NORM, GEMM, ACT, GEMM, ADD]
    stage, layer_no = walk(HEAD + layer + TAIL)
    # THEN both are the QKV GEMM (one logical GEMM), and the O GEMM is still recognised after attention
    assert stage[2:4] == ["qkv_gemm", "qkv_gemm"]
    assert stage[6] == "o_gemm" and layer_no[2:4] == [0, 0]


def test_moe_block_gets_router_expert_and_accumulate_stages():
    # GIVEN a MoE decoder layer: attention half, norm, router GEMM, top-k, sort, expert GEMMs (one
    # classified as generic gemm), an elementwise combine, the residual add, then the next layer
    moe = [
        NORM,
        GEMM,
        ROPE,
        KV,
        ATTN,
        GEMM,
        ADD,
        NORM,
        GEMM,  # router
        ("moe_topk", "topkGatingSoftmax", None),
        ("moe_sort", "moe_align_block_size_kernel", None),
        ("elementwise", "vectorized_elementwise_kernel<copy>", None),  # dispatch
        ("moe_expert_gemm", "fused_moe_kernel", None),
        ("moe_expert_gemm", "fused_moe_kernel", None),
        ("elementwise", "vectorized_elementwise_kernel<sum>", None),  # combine
        ADD,
    ]
    stage, layer = walk(HEAD + moe * 2 + TAIL)
    one = [
        "norm",
        "qkv_gemm",
        "rope",
        "kv_cache_store",
        "flash_attention",
        "o_gemm",
        "residual_add",
        "norm",
        "moe_gate_gemm",
        "moe_topk",
        "moe_sort",
        "moe_sort",
        "moe_expert_gemm",
        "moe_expert_gemm",
        "moe_accumulate",
    ]
    # THEN the router is moe_gate_gemm, dispatch before the last expert GEMM is moe_sort, the combine
    # after it moe_accumulate, and the next layer opens with its QKV GEMM
    assert stage[1 : 1 + len(one)] == one
    assert stage[1 + len(moe) : 1 + len(moe) + len(one)] == one
    assert layer[1 : 1 + len(moe)] == [0] * len(moe)
    assert layer[1 + len(moe) : 1 + 2 * len(moe)] == [1] * len(moe)


def test_generic_gemm_after_routing_is_an_expert_gemm():
    # GIVEN expert GEMMs that the rule table only knows as generic GEMMs, after the router's top-k
    moe = [NORM, GEMM, ATTN, GEMM, ADD, NORM, GEMM, ("moe_topk", "topk", None), GEMM, GEMM, ADD]
    stage, _ = walk(HEAD + moe + TAIL)
    # THEN the router is moe_gate_gemm and both GEMMs after routing are expert GEMMs
    assert stage[7:11] == ["moe_gate_gemm", "moe_topk", "moe_expert_gemm", "moe_expert_gemm"]


def test_eager_generic_kernels_take_their_region_stage():
    # GIVEN an eager layer after the op hints (rules/ops.toml: aten::pow/mean/rsqrt -> norm, aten::neg
    # -> rope): RMSNorm as pow/mean/rsqrt + a generic mul, RoPE as neg + generic cat/mul/add, the KV
    # update as a trailing generic copy_
    ew = "elementwise"
    eager_norm = [
        ("norm", "vectorized_elementwise_kernel<pow>", "aten::pow"),
        ("norm", "reduce_kernel<mean>", "aten::mean"),
        ("norm", "vectorized_elementwise_kernel<rsqrt>", "aten::rsqrt"),
        (ew, "vectorized_elementwise_kernel<mul>", "aten::mul"),
    ]
    eager_rope = [
        ("rope", "neg_kernel", "aten::neg"),
        (ew, "cat_kernel", "aten::cat"),
        (ew, "mul_kernel", "aten::mul"),
        (ew, "add_kernel", "aten::add"),
    ]
    kv_copy = (ew, "copy_kernel", "aten::copy_")
    layer = [*eager_norm, GEMM, *eager_rope, kv_copy, ATTN, GEMM, ADD, *eager_norm, GEMM, ACT, GEMM, ADD]
    stage, layer_no = walk(HEAD + layer * 2 + TAIL)
    first = stage[1 : 1 + len(layer)]
    # THEN the generic mul of the input norm before the first QKV GEMM is norm (input norm of layer 0),
    # RoPE's generic kernels are rope, the trailing copy before attention is the KV-cache store, the
    # post-attention norm's mul is norm
    assert first[:5] == ["norm"] * 4 + ["qkv_gemm"]
    assert first[5:10] == ["rope"] * 4 + ["kv_cache_store"]
    assert first[10:13] == ["flash_attention", "o_gemm", "residual_add"]
    assert first[13:17] == ["norm"] * 4
    assert first[17:] == ["gate_up_gemm", "activation", "down_gemm", "residual_add"]
    # AND the next layer's eager input norm (after the residual add) is norm, in the next layer
    second = stage[1 + len(layer) : 1 + 2 * len(layer)]
    assert second[:5] == ["norm"] * 4 + ["qkv_gemm"]
    assert layer_no[1 + len(layer) : 1 + len(layer) + 5] == [1] * 5


# --- _role: one GEMM from the region it is in and what follows it -------------------------------------------


@pytest.mark.parametrize(
    ("region", "follow", "gemm_ahead", "norm_seen", "routing_next", "expect"),
    [
        # after attention: the O projection
        ("attn", "", False, False, False, ("o_gemm", "attn_out", 3)),
        # a second GEMM after the input norm's QKV GEMM: still QKV (unfused q/k/v)
        ("attn_in", "flash_attention", False, False, False, ("qkv_gemm", "attn_in", 3)),
        # after the O GEMM, a GEMM with another before the next norm: gate/up; without: down
        ("attn_out", "", True, True, False, ("gate_up_gemm", "mlp_in", 3)),
        ("mlp_in", "", False, False, False, ("down_gemm", "mlp_out", 3)),
        # after the O GEMM, routing next: the MoE router
        ("attn_out", "moe_topk", False, True, True, ("moe_gate_gemm", "moe", 3)),
        # after routing, and between expert GEMMs before a norm: experts
        ("moe", "", False, False, False, ("moe_expert_gemm", "moe_experts", 3)),
        ("moe_experts", "", False, False, False, ("moe_expert_gemm", "moe_experts", 3)),
        # after a norm, attention next: the next layer's QKV GEMM
        ("mlp_out", "flash_attention", False, True, False, ("qkv_gemm", "attn_in", 4)),
        ("moe_experts", "paged_attention", False, True, False, ("qkv_gemm", "attn_in", 4)),
        ("pre", "mla_attention", False, True, False, ("qkv_gemm", "attn_in", 4)),
        # after a norm, sampling / a new forward / nothing next: the LM head
        ("mlp_out", "sampling", False, True, False, ("lm_head_gemm", "tail", 3)),
        ("mlp_out", "embedding", False, True, False, ("lm_head_gemm", "tail", 3)),
        ("mlp_out", "", False, True, False, ("lm_head_gemm", "tail", 3)),
        # no norm before it: a GEMM the structure cannot name stays generic, the region unchanged
        ("mlp_out", "flash_attention", False, False, False, ("gemm", "mlp_out", 3)),
        ("pre", "sampling", False, False, False, ("gemm", "pre", 3)),
    ],
)
def test_role_from_region_and_what_follows(region, follow, gemm_ahead, norm_seen, routing_next, expect):
    # GIVEN the walk's state at a GEMM (in layer 3) WHEN its role is decided THEN (role, region, layer)
    assert _role(region, follow, gemm_ahead, norm_seen, 3, routing_next)[:3] == expect


# --- attention by composition, norms inside the attention input, the self-check (issue 21) -------

EW = "vectorized_elementwise_kernel<mul>"
SOFTMAX: Kernel = ("sampling", "softmax_warp_forward<float>", "aten::_softmax")
# HF eager attention: repeat_kv copy, QK^T bmm, scale, mask add, softmax, PV bmm, output transpose copy
EAGER_ATTN = [
    ("elementwise", "elementwise_kernel<copy>", "aten::copy_"),
    ("gemm", "nvjet_sm90_tst_8x64", "aten::bmm"),
    ("elementwise", EW, "aten::mul"),
    ("elementwise", "elementwise_kernel<add>", "aten::add"),
    SOFTMAX,
    ("gemm", "nvjet_sm90_tst_64x8", "aten::bmm"),
    ("elementwise", "elementwise_kernel<copy>", "aten::copy_"),
]
EAGER_LAYER = [NORM, GEMM, ROPE, KV, *EAGER_ATTN, GEMM, ADD, NORM, GEMM, ACT, GEMM, ADD]


def walk_composed(kernels: list[Kernel]) -> tuple[list[str], list[int]]:
    from analyzer.analyses.walk.eager_ops import compose_attention

    n = len(kernels)
    stage = [k[0] for k in kernels]
    args = ([k[1] for k in kernels], [k[2] for k in kernels], np.arange(n, dtype=np.float64))
    compose_attention(np.arange(n), stage, *args)
    layer = np.full(n, -1, np.int64)
    walk_sequence(np.arange(n), stage, *args, layer, *op_rows(args[0], args[1]))
    return stage, layer.tolist()


def test_eager_attention_is_attention_and_its_bmms_are_never_projections():
    # GIVEN Llama-like layers whose attention is composed (matmul -> scale / mask -> softmax -> matmul)
    stage, layer = walk_composed(HEAD + EAGER_LAYER * 2 + TAIL)
    # THEN the composed stretch is attention and the projections around it keep their roles
    one = ["norm", "qkv_gemm", "rope", "kv_cache_store", *["flash_attention"] * len(EAGER_ATTN)]
    one += ["o_gemm", "residual_add", "norm", "gate_up_gemm", "activation", "down_gemm", "residual_add"]
    assert stage == ["embedding", *one, *one, "norm", "lm_head_gemm", "sampling"]
    assert max(layer) == 1


def test_softmax_after_the_lm_head_stays_sampling():
    # GIVEN sampling with a softmax (logits -> probabilities) after the LM head, then the next forward
    tail = [NORM, GEMM, SOFTMAX, ("sampling", "multinomial_kernel", None)]
    stage, _ = walk_composed((HEAD + LAYER + tail) * 2)
    # THEN that softmax is the sampler's: no GEMM follows it before the next norm / embedding
    assert stage.count("sampling") == 4 and "flash_attention" in stage


def test_a_gemm_with_no_attention_anywhere_is_reported():
    from analyzer.analyses.walk.selfcheck import structure_problem

    # GIVEN GEMMs and generic kernels only (the attention could not be located)
    kernels = [NORM, GEMM, ("elementwise", EW, None), GEMM] * 3
    stage, layer = walk(kernels)
    # THEN the self-check says why the structure cannot be trusted
    why = structure_problem(np.arange(len(kernels)), stage, np.array(layer))
    assert why is not None and "no attention located" in why
    # AND a well-formed forward passes it
    ok = HEAD + LAYER * 3 + TAIL
    stage, layer = walk(ok)
    assert structure_problem(np.arange(len(ok)), stage, np.array(layer)) is None


def test_post_norm_first_projection_is_qkv_but_the_rotary_product_is_not() -> None:
    # GIVEN a GEMM before the first layer with no norm before it and attention ahead (OLMo-2's
    # post-norm blocks: layer 0's q_proj opens the forward)
    assert _role("pre", "flash_attention", False, False, 3, opens_forward=True)[:3] == (
        "qkv_gemm",
        "attn_in",
        4,
    )
    # GIVEN the same, but not the first GEMM after an embedding (a trace that begins mid-forward),
    # or with a RoPE kernel (cos / sin) right after it (the rotary module's product): no role
    assert _role("pre", "flash_attention", False, False, 3)[:3] == ("gemm", "pre", 3)


def test_walk_post_norm_forward_and_a_trace_that_begins_mid_layer() -> None:
    # GIVEN an embedding, the rotary module (its frequency GEMM, then cos / sin), and post-norm
    # layers: q_proj, q norm, k_proj, k norm, v_proj, RoPE, attention, o_proj, post norm, MLP
    cos: Kernel = ("rope", "cos_kernel_cuda", "aten::cos")
    cast: Kernel = ("elementwise", "direct_copy_kernel_cuda", "aten::copy_")  # inv_freq expanded
    post = [GEMM, NORM, GEMM, NORM, GEMM, ROPE, ATTN, GEMM, NORM, ADD, GEMM, ACT, GEMM, NORM, ADD]
    stage, _ = walk(HEAD + [cast, GEMM, cos] + post * 2 + TAIL)
    # THEN the frequency GEMM is RoPE and layer 0's first projection is a QKV GEMM
    assert stage[2] == "rope"
    assert stage[4] == "qkv_gemm" and stage[6] == "qkv_gemm"
    # GIVEN the same layers without the embedding (the capture began inside a forward): the first
    # GEMM with attention ahead stays role-free
    stage, _ = walk(post[7:] + post + TAIL)
    assert stage[0] == "gemm"


def test_an_embedding_projection_and_an_output_projection_are_no_layer_gemms() -> None:
    # GIVEN OPT-350m's layout: the token and the learned position lookups, the embeddings' own
    # projection (project_in) and the positions' add, post-norm layers of three projection GEMMs,
    # the last norm, the output projection (project_out) and the LM head
    emb: Kernel = ("embedding", "indexSelectLargeIndex", None)
    add: Kernel = ("elementwise", "vectorized_elementwise_kernel<add>", "aten::add")
    post = [GEMM, GEMM, GEMM, ATTN, GEMM, ADD, NORM, GEMM, ACT, GEMM, ADD, NORM]
    stage, layer = walk([emb, add, emb, GEMM, add] + post * 2 + [GEMM, GEMM, ("sampling", "argmax", None)])
    # THEN project_in is role-free and outside the layers, each layer opens with its three QKV
    # GEMMs, and of the two GEMMs after the last norm the second is the LM head
    assert stage[3] == "gemm" and layer[3] == -1
    assert stage[5:8] == ["qkv_gemm"] * 3 and stage[17:20] == ["qkv_gemm"] * 3
    assert stage[-3:-1] == ["gemm", "lm_head_gemm"]
    # GIVEN the same layers with no embedding projection: layer 0's first GEMM stays its projection
    stage, _ = walk([emb, add, emb, add] + post * 2 + [GEMM, ("sampling", "argmax", None)])
    assert stage[4:7] == ["qkv_gemm"] * 3 and stage[-2] == "lm_head_gemm"


def test_copies_after_the_cache_writes_are_the_attentions_and_gathers_the_caches() -> None:
    # GIVEN RoPE on q and k, two index_copy_ writes, a paged cache's two gathers and the attention
    # interface's three contiguous copies before attention
    rope = [("mul", "aten::mul"), ("neg", "aten::neg"), ("cat", "aten::cat"), ("add", "aten::add")]
    tail = [("ic", "aten::index_copy_")] * 2 + [("g", "aten::gather")] * 2 + [("cp", "aten::copy_")] * 3
    tokens = tuple(rope + rope + tail)
    writes = tuple([0, 0, STRONG_WRITE, 0] * 2 + [STRONG_WRITE] * 2 + [CACHE_READ] * 2 + [WEAK_WRITE] * 3)
    kv, attention = _kv_update_positions(tokens, writes, True)
    # THEN the update is the two writes and the gathers; the copies are the attention's
    assert kv == frozenset({8, 9, 10, 11})
    assert attention == frozenset({12, 13, 14})
    # GIVEN only plain copies as writes (a cache slice written with copy_): they stay the update
    kv, attention = _kv_update_positions(
        tuple(rope + [("cp", "aten::copy_")] * 2), (0,) * 4 + (WEAK_WRITE,) * 2
    )
    assert kv == frozenset({4, 5}) and attention == frozenset()


def test_mla_latent_update_is_the_first_two_cache_writes_after_rope() -> None:
    # GIVEN MLA's region before the kv decompression GEMM: RoPE on q and on k whose kernels differ
    # (other vectorization) but whose ops repeat, the latent cache's two cats, then the query cat
    unit = [("mul", "aten::mul"), ("sub", "aten::sub"), ("cat", "aten::cat")]
    other = [("mul_v", "aten::mul"), ("sub", "aten::sub"), ("cat_v", "aten::cat")]
    tokens = tuple(unit + other + [("cat", "aten::cat")] * 3)
    writes = (0, 0, STRONG_WRITE) * 2 + (STRONG_WRITE,) * 3
    kv, attention = _kv_update_positions(tokens, writes, False)
    assert kv == frozenset({6, 7}) and attention == frozenset()


def test_ropes_repeat_is_the_one_ending_last_not_a_shorter_one_before_it() -> None:
    # GIVEN MLA's region before the kv decompression GEMM where q and the latent are scaled first
    # (three multiplies: a short repeat of its own), then RoPE on q and on k, the latent cache's
    # two cats and the query's cat
    scale = [("mul", "aten::mul")] * 3
    unit = [("mul", "aten::mul"), ("mul", "aten::mul"), ("sub", "aten::sub"), ("cat", "aten::cat")]
    tokens = tuple(scale + unit + unit + [("cat", "aten::cat")] * 3)
    writes = (0,) * 3 + (0, 0, 0, STRONG_WRITE) * 2 + (STRONG_WRITE,) * 3
    kv, attention = _kv_update_positions(tokens, writes, False)
    # THEN RoPE ends after its second unit and the update is the two cats after it (not RoPE's own)
    assert kv == frozenset({11, 12}) and attention == frozenset()


def test_the_attention_output_copy_before_the_o_gemm_is_attention() -> None:
    # GIVEN a layer whose attention interface copies its output (transpose + contiguous) before o_proj
    copy: Kernel = ("elementwise", "elementwise_kernel<direct_copy_kernel_cuda>", "aten::copy_")
    layer = LAYER[:5] + [copy] + LAYER[5:]
    stage, _ = walk(HEAD + layer * 2 + TAIL)
    # THEN the copy takes the attention's stage, and the roles around it are unchanged
    first = stage[1 : 1 + len(layer)]
    assert first[5] == "flash_attention"
    assert first[:5] + first[6:] == LAYER_STAGES


def test_a_shared_experts_gated_product_is_its_activation() -> None:
    # GIVEN a MoE layer: router GEMM, top-k, routed expert GEMMs, then a shared expert
    # (gate GEMM, silu, up GEMM, the product, down GEMM) before the combine and the next norm
    mul: Kernel = ("elementwise", "vectorized_elementwise_kernel<MulFunctor>", "aten::mul")
    topk: Kernel = ("moe_topk", "topkGatingSoftmax", None)
    expert: Kernel = ("moe_expert_gemm", "grouped_gemm", None)
    gather: Kernel = ("elementwise", "index_elementwise_kernel", "aten::index")
    moe = LAYER[:7] + [NORM, GEMM, topk, gather, expert, expert, GEMM, ACT, GEMM, mul, GEMM, ADD, ADD]
    stage, _ = walk(HEAD + moe * 2 + TAIL)
    product = 1 + moe.index(mul)
    # THEN the product between the up and the down GEMM is the activation's, not the dispatch's,
    # while the routed experts' token gather stays the dispatch's
    assert stage[product] == "activation"
    assert stage[1 + moe.index(gather)] == "moe_sort"


def test_a_cast_before_the_next_projection_is_no_cache_write() -> None:
    # GIVEN the generic kernels between q_proj (after its q norm) and k_proj: one cast (copy_)
    kv, attention = _kv_update_positions((("bf16_copy", "aten::copy_"),), (WEAK_WRITE,), False)
    # THEN nothing is the KV-cache update (that needs cat / store ops before attention)
    assert kv == frozenset() and attention == frozenset()


def test_a_rotary_tables_outer_product_is_rope_and_a_batched_projection_is_not() -> None:
    from types import SimpleNamespace

    from analyzer.analyses.rotary_tables import mark_rotary_tables

    # GIVEN a cast, a bmm, the halves' cat, then cos and sin (a rotary table), twice: the first bmm an
    # outer product (K = 1), the second a product over a hidden dimension (K = 64)
    ops = ["aten::copy_", "aten::bmm", "aten::cat", "aten::cos", "aten::sin"] * 2
    stage = ["elementwise", "gemm", "elementwise", "rope", "rope"] * 2
    why = [0] * len(ops)
    trig = np.array([op in ("aten::cos", "aten::sin") for op in ops])
    th = SimpleNamespace(rotary_table_reach=3, rope_module_lead=2)
    n = mark_rotary_tables(
        np.arange(len(ops)), stage, ops, trig, why, th, lambda r: (1, 16) if r == 1 else (64, 16)
    )
    # THEN the first table's cast, bmm and cat are RoPE; the second bmm stays a GEMM
    assert n == 3 and stage[:3] == ["rope"] * 3 and stage[6] == "gemm"


def test_a_side_block_after_the_mlp_is_the_layers_own():
    # GIVEN two sandwich-norm layers (the MLP's output normed before its residual add) where the first
    # ends with a side block (Gemma 4's per-layer input: a GEMM, an activation, a multiply, a GEMM, a
    # norm, the residual add)
    mul: Kernel = ("elementwise", "vectorized_elementwise_kernel<mul>", "aten::mul")
    side = [GEMM, ("activation", "gelu_kernel", None), mul, GEMM, NORM, ADD]
    sandwich = [*LAYER[:-1], NORM, ADD]
    stage, layer = walk(HEAD + sandwich + side + sandwich + TAIL)
    first = 1 + len(sandwich)
    # THEN both side GEMMs are role-free `gemm` of layer 0, not the next layer's projections
    assert [stage[first], stage[first + 3]] == ["gemm", "gemm"]
    assert layer[first] == layer[first + 3] == layer[first - 1]
    # AND the next layer still opens at its own QKV projection after its input norm
    nxt = first + len(side)
    assert stage[nxt + 1] == "qkv_gemm" and layer[nxt + 1] == layer[first] + 1
    assert stage.count("qkv_gemm") == 2


def test_a_gemm_and_an_activation_with_no_norm_after_them_stay_the_next_layers():
    # GIVEN the same first layer, but no norm after the second GEMM: attention follows directly (a
    # block that computes an MLP first and its attention after)
    mul: Kernel = ("elementwise", "vectorized_elementwise_kernel<mul>", "aten::mul")
    sandwich = [*LAYER[:-1], NORM, ADD]
    after = [GEMM, ("activation", "gelu_kernel", None), mul, GEMM, ROPE, KV, ATTN, GEMM, ADD]
    stage, _ = walk(HEAD + sandwich + after + TAIL)
    first = 1 + len(sandwich)
    # THEN no side block (STR070 needs that norm): the first GEMM opens the next layer
    assert stage[first] == "qkv_gemm"


def test_after_a_regions_last_norm_only_an_add_right_after_it_is_a_residual_add():
    from analyzer.analyses.walk.regions import _label_sandwich

    # GIVEN a region after a projection: a fused norm (position 0), then a token shift (a copy, a
    # multiply, an add) before the next block's projection
    ops = ["aten::native_layer_norm", "aten::copy_", "aten::mul", "aten::add"]
    stage = ["norm", "elementwise", "elementwise", "residual_add"]
    why = [0] * 4
    _label_sandwich(list(range(4)), [1, 2, 3], 0, 4, {0}, stage, ops, ["layer_norm_kernel"] * 4, why)
    # THEN the shift's add is the next block's input work, not a residual add
    assert stage == ["norm", "elementwise", "elementwise", "elementwise"]
    # AND a post-norm block's add right after its norm is its residual add
    stage = ["norm", "residual_add", "elementwise", "elementwise"]
    ops = ["aten::native_layer_norm", "aten::add", "aten::mul", "aten::copy_"]
    _label_sandwich(list(range(4)), [1, 2, 3], 0, 4, {0}, stage, ops, ["layer_norm_kernel"] * 4, why)
    assert stage[1] == "residual_add" and stage[2:] == ["elementwise", "elementwise"]


def test_a_low_rank_sigmoid_gate_after_a_norm_is_the_norms():
    # GIVEN layers whose input norm is gated (AXK2): after the norm a GEMM, an activation, a GEMM,
    # then the gate's sigmoid and its multiply with the normed input, then the attention
    sigmoid: Kernel = ("activation", "vectorized_elementwise_kernel<sigmoid>", "aten::sigmoid")
    mul: Kernel = ("elementwise", "vectorized_elementwise_kernel<mul>", "aten::mul")
    gate = [GEMM, ("activation", "silu_kernel", None), GEMM, sigmoid, mul]
    gated = [NORM, *gate, *LAYER[1:]]
    stage, layer = walk(HEAD + gated * 2 + TAIL)
    # THEN the gate's GEMMs are its low-rank MLP (STR075), its sigmoid and multiply the norm's
    assert stage[2:7] == ["gate_up_gemm", "activation", "down_gemm", "norm", "norm"]
    # AND the layer's own projections open after it, in the same layer as its norm
    assert stage[7] == "qkv_gemm" and layer[1] == layer[2] == layer[7] == 0
    assert stage.count("qkv_gemm") == 2 and stage.count("lm_head_gemm") == 1


def test_a_gemm_and_an_activation_with_no_sigmoid_after_them_are_no_norm_gate():
    # GIVEN the same GEMM, activation, GEMM after a norm but no sigmoid before the next GEMM (an MLP)
    stage, _ = walk(HEAD + [*LAYER[:7], NORM, GEMM, ACT, GEMM, ADD] + TAIL)
    # THEN they stay the MLP's projections, the norm's nothing
    assert stage[9:12] == ["gate_up_gemm", "activation", "down_gemm"]


def test_a_gemm_after_an_expert_loops_combine_is_a_dense_mlp():
    # GIVEN an expert block as a loop (token gather, expert GEMMs, index_add_ per expert), then with
    # no norm between a dense MLP (LongCat-Flash's first MLP after its MoE block)
    router: Kernel = ("moe_gate_gemm", "nvjet_sm90_tst_64x8", None)
    topk: Kernel = ("moe_topk", "gatherTopK", "aten::topk")
    gather: Kernel = ("elementwise", "index_elementwise_kernel", "aten::index")
    combine: Kernel = ("elementwise", "index_elementwise_kernel<add>", "aten::index_add_")
    expert = [gather, GEMM, ACT, GEMM, combine]
    moe = [NORM, router, topk, *expert, *expert]
    dense = [GEMM, ACT, GEMM]
    attn = LAYER[:7]
    stage, _ = walk(HEAD + attn + moe + dense + [ADD] + TAIL)
    first = 1 + len(attn) + len(moe)
    # THEN the loop's GEMMs are the experts', the MLP after the last combine is dense (STR074)
    assert stage.count("moe_expert_gemm") == 4
    assert stage[first : first + 3] == ["gate_up_gemm", "activation", "down_gemm"]


def test_a_lone_gemm_after_an_expert_loops_combine_stays_the_blocks():
    # GIVEN the same loop, then one GEMM (a shared expert's gate: hidden to one) and its sigmoid
    router: Kernel = ("moe_gate_gemm", "nvjet_sm90_tst_64x8", None)
    topk: Kernel = ("moe_topk", "gatherTopK", "aten::topk")
    gather: Kernel = ("elementwise", "index_elementwise_kernel", "aten::index")
    combine: Kernel = ("elementwise", "index_elementwise_kernel<add>", "aten::index_add_")
    sigmoid: Kernel = ("activation", "vectorized_elementwise_kernel<sigmoid>", "aten::sigmoid")
    moe = [NORM, router, topk, gather, GEMM, ACT, GEMM, combine]
    stage, _ = walk(HEAD + LAYER[:7] + moe + [GEMM, sigmoid, ADD] + TAIL)
    # THEN no dense MLP is found there (STR074 needs another GEMM after it)
    assert "gate_up_gemm" not in stage and "down_gemm" not in stage


def _epilogue(ops: list[str | None], dims: list[list[list[int]]]) -> list[int]:
    """STR063 over an LM head (position 0, ``aten::mm``) and the generic tail after it: the
    positions it took as the model's output work."""
    from analyzer.analyses.walk.regions import _label_lm_head_epilogue

    n = len(ops)
    stage = ["lm_head_gemm"] + ["elementwise"] * (n - 1)
    left = _label_lm_head_epilogue(
        list(range(n)), list(range(1, n)), 1, n, stage, ops, [0] * n, dims.__getitem__
    )
    return sorted(set(range(1, n)) - set(left))


def test_the_models_cast_of_all_its_logits_before_the_samplers_copy_is_its_output_work():
    # GIVEN an LM head writing [2, 50] logits, the model's .float() of them, generate's bookkeeping
    # (a fill, a cat of small tensors), then generate's own copy of the logits and its argmax
    head = [[2, 8], [8, 50]]
    ops = ["aten::mm", "aten::copy_", "aten::fill_", "aten::cat", "aten::copy_", "aten::argmax"]
    dims = [head, [[2, 1, 50], [2, 1, 50]], [[2, 1]], [[2, 3]], [[2, 50], [2, 50]], [[2, 50]]]
    # THEN the model's cast is its output work (STR063), the rest is left to sampling
    assert _epilogue(ops, dims) == [1]
    # AND without the sampler's later copy of the logits, nothing is taken
    assert _epilogue(ops[:4], dims[:4]) == []


def test_a_cast_right_before_another_copy_of_the_logits_is_the_samplers():
    # GIVEN the sampler's own cast of the logits and its second copy right after (assisted decoding)
    head = [[2, 8], [8, 50]]
    ops = ["aten::mm", "aten::copy_", "aten::copy_", "aten::argmax"]
    dims = [head, [[1, 2, 50], [1, 2, 50]], [[1, 2, 50], [1, 2, 50]], [[1, 2, 50]]]
    # THEN nothing there is the model's
    assert _epilogue(ops, dims) == []


def test_a_parallel_blocks_two_adds_after_its_experts_are_residual_adds():
    from analyzer.analyses.walk.moe import _label_moe_block

    # GIVEN an O projection, the router right after it (no norm: a parallel block), the experts,
    # their combine (a sum), then two adds (attention's and the experts' outputs) and the next norm
    stage = ["o_gemm", "moe_gate_gemm", "moe_topk", "elementwise", "moe_expert_gemm", "elementwise"]
    stage += ["elementwise", "elementwise", "norm"]
    ops = [None, None, "aten::topk", "aten::index", None, "aten::sum", "aten::add", "aten::add", None]
    rows = list(range(len(stage)))
    _label_moe_block(rows, [3, 5, 6, 7], 4, 9, stage, ops, [0] * len(stage))
    # THEN both adds are residual adds (STR025), the sum the combine
    assert stage[5:8] == ["moe_accumulate", "residual_add", "residual_add"]
    # AND with a norm between the O projection and the router, the first add combines
    stage = ["o_gemm", "norm", "moe_gate_gemm", "moe_topk", "elementwise", "moe_expert_gemm"]
    stage += ["elementwise", "elementwise", "elementwise", "norm"]
    ops = [None, None, None, "aten::topk", "aten::index", None, "aten::sum", "aten::add", "aten::add", None]
    _label_moe_block(list(range(len(stage))), [4, 6, 7, 8], 5, 10, stage, ops, [0] * len(stage))
    assert stage[6:9] == ["moe_accumulate", "moe_accumulate", "residual_add"]
