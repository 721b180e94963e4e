"""STR052 (analyzer/analyses/mixers.py): a token mixer that is not softmax attention, from its input
projection to its output projection, on synthetic rows and on real swept traces with truth."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from analyzer.analyses.mixers import MIXER_SPAN, mark_mixers

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "fixtures" / "sweep"
TH = SimpleNamespace(mixer_reach=400, norm_cluster_gap=3, stabilizer_reach=4, max_norm_tail=2)
CONV = "aten::_conv_depthwise2d"
DEPTHWISE = [[2, 64, 1, 16], [64, 1, 1, 4]]


def _run(seq):
    """seq: (stage, op, dims) per kernel in launch order."""
    stage = [s for s, _, _ in seq]
    ops = [o for _, o, _ in seq]
    dims = {i: d for i, (_, _, d) in enumerate(seq) if d is not None}
    why = [0] * len(seq)
    n = mark_mixers(np.arange(len(seq)), stage, ops, dims, why, TH)
    return stage, why, n


MAMBA_LAYER = [
    ("norm", "aten::rsqrt", None),
    ("norm", "aten::mul", None),
    ("gemm", "aten::mm", None),  # in_proj
    ("elementwise", "aten::copy_", None),
    ("rope", CONV, DEPTHWISE),  # the causal convolution (placed as RoPE by position)
    ("activation", "aten::silu", None),
    ("gemm", "aten::mm", None),  # x_proj
    ("sampling", "aten::exp", None),
    ("elementwise", "aten::cumsum", None),
    ("gemm", "aten::bmm", None),  # the scan's batched matmul
    ("norm", "aten::rsqrt", None),  # the gated norm
    ("gemm", "aten::mm", None),  # out_proj
    ("residual_add", "aten::add", None),
    ("norm", "aten::rsqrt", None),  # the next layer's norm
]


def test_a_mixer_from_its_input_projection_to_its_output_projection() -> None:
    stage, why, n = _run(MAMBA_LAYER)
    assert stage == [
        "norm", "norm", "qkv_gemm", "linear_attention", "linear_attention", "linear_attention",
        "qkv_gemm", "linear_attention", "linear_attention", "linear_attention", "norm", "o_gemm",
        "residual_add", "norm",
    ]  # fmt: skip
    assert n > 0 and why[4] == MIXER_SPAN and why[12] == 0


def test_a_gate_projection_before_the_gated_norm_is_no_output_projection() -> None:
    # GIVEN Kimi's delta attention: after the core, the gate's projections, the gated norm, o_proj
    seq = [
        *MAMBA_LAYER[:10],
        ("gemm", "aten::mm", None),  # g_proj: a gate's projection, the gated norm right after it
        ("norm", "aten::rsqrt", None),
        ("gemm", "aten::mm", None),  # o_proj
        ("residual_add", "aten::add", None),
        ("norm", "aten::rsqrt", None),
    ]
    stage, _, _ = _run(seq)
    # THEN the gate's projection is an input projection and o_proj (before the residual) the output
    assert stage[10] == "qkv_gemm" and stage[12] == "o_gemm" and stage[11] == "norm"


@pytest.mark.parametrize(
    "change",
    [
        # a convolution with full filters (a vision front end's), not a depthwise one
        lambda s: s.__setitem__(4, ("rope", CONV, [[2, 64, 1, 16], [64, 64, 1, 4]])),
        # softmax attention inside the span: an attention layer, whatever shifted its cache
        lambda s: s.__setitem__(8, ("flash_attention", "aten::_flash_attention_forward", None)),
        # a router's top-k and experts' batched GEMM between the projection and the anchor
        lambda s: s.__setitem__(3, ("moe_topk", "aten::topk", None)),
    ],
)
def test_no_mixer_without_its_own_evidence(change) -> None:
    seq = list(MAMBA_LAYER)
    change(seq)
    before = [s for s, _, _ in seq]
    stage, _, n = _run(seq)
    assert n == 0 and stage == before


# RWKV's time mixing: a fused LayerNorm, the token shift, key / value / receptance projections, the
# WKV recurrence in ATen ops (a running maximum, the exp of the differences), the output projection
RWKV_LAYER = [
    ("norm", "aten::native_layer_norm", None),
    ("elementwise", "aten::copy_", None),  # the token shift
    ("elementwise", "aten::mul", None),
    ("residual_add", "aten::add", None),
    ("gemm", "aten::mm", None),  # key
    ("gemm", "aten::mm", None),  # value
    ("activation", "aten::sigmoid", None),
    ("elementwise", "aten::maximum", None),  # the stabilizer
    ("elementwise", "aten::sub", None),
    ("elementwise", "aten::exp", None),
    ("elementwise", "aten::div", None),
    ("gemm", "aten::mm", None),  # output
    ("residual_add", "aten::add", None),
    ("norm", "aten::native_layer_norm", None),
]


def test_an_exponentially_gated_recurrence_is_a_mixer() -> None:
    # GIVEN RWKV's time mixing, whose only mixer evidence is its log-space stabilizer
    seq = list(RWKV_LAYER)
    stage = [s for s, _, _ in seq]
    ops = [o for _, o, _ in seq]
    why = [0] * len(seq)
    # WHEN the span is marked with the fused norm known by name
    n = mark_mixers(np.arange(len(seq)), stage, ops, {}, why, TH, fused_norm=lambda r: r in (0, 13))
    # THEN the token shift after the fused norm and the recurrence are the core, the projections the
    # mixer's q / k / v and its output projection
    assert n > 0
    assert stage[1:4] == ["linear_attention"] * 3 and stage[7:11] == ["linear_attention"] * 4
    assert stage[4:6] == ["qkv_gemm"] * 2 and stage[11] == "o_gemm" and stage[12] == "residual_add"
    # AND without the fused norm's name the token shift is left to the walk
    stage = [s for s, _, _ in seq]
    mark_mixers(np.arange(len(seq)), stage, ops, {}, [0] * len(seq), TH)
    assert stage[1:4] == ["elementwise", "elementwise", "residual_add"]


def test_a_maximum_with_no_exp_after_it_is_no_recurrence() -> None:
    # GIVEN the same layer where the maximum is a clamp: no exp of its difference follows
    seq = [x if x[1] != "aten::exp" else ("elementwise", "aten::mul", None) for x in RWKV_LAYER]
    stage, _, n = _run(seq)
    # THEN nothing is a mixer
    assert n == 0 and stage == [s for s, _, _ in seq]


@pytest.mark.parametrize(("model_type", "floor"), [("mamba2", 0.99), ("zamba2", 0.98)])
def test_swept_ssm_mixers_agree_with_their_truth(model_type: str, floor: float, tmp_path: Path) -> None:
    from analyzer.cli.check_cmd import check_trace

    # GIVEN a swept SSM / hybrid trace with its truth WHEN checked
    path = tmp_path / "trace.json"
    with lzma.open(SWEEP / model_type / "trace.json.xz", "rb") as f, open(path, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    r = check_trace(str(path))
    regions = {x["region"]: x["stage_agreement"] for x in r["regions"]}
    # THEN the mixer's core, projections and the whole trace agree (they were at 1-3% before STR052)
    assert r["stage"]["agreement"] >= floor
    for region in ("mixer", "mixer_in_proj", "mixer_out_proj"):
        assert regions[region] >= 0.95, (region, regions[region])


# MiniMax's lightning attention in torch: projections, decays, batched products with no softmax, its
# own norm, then an output gate's projection before the output projection
LIGHTNING_LAYER = [
    ("norm", "aten::rsqrt", None),
    ("gemm", "aten::mm", None),  # qkv
    ("activation", "aten::silu", None),
    ("elementwise", "aten::exp", None),  # the decays
    ("gemm", "aten::bmm", [[16, 16, 128], [16, 128, 16]]),  # q k^T within a block
    ("elementwise", "aten::mul", None),
    ("gemm", "aten::bmm", [[16, 16, 16], [16, 16, 128]]),
    ("norm", "aten::rsqrt", None),  # the mixer's own norm
    ("elementwise", "aten::mul", None),
    ("gemm", "aten::mm", None),  # the output gate's projection
    ("activation", "aten::sigmoid", None),
    ("elementwise", "aten::mul", None),
    ("gemm", "aten::mm", None),  # out_proj
    ("residual_add", "aten::add", None),
    ("norm", "aten::rsqrt", None),
]


def test_batched_products_with_no_softmax_are_a_mixer() -> None:
    # GIVEN a lightning attention layer WHEN marked
    stage, _, n = _run(LIGHTNING_LAYER)
    # THEN its products and decays are the core, its norm ends at the gate's projection
    assert n > 0
    assert stage[3:7] == ["linear_attention"] * 4 and stage[7:9] == ["norm", "norm"]
    assert stage[9] == "qkv_gemm" and stage[10:12] == ["linear_attention"] * 2 and stage[12] == "o_gemm"


@pytest.mark.parametrize(
    "change",
    [
        # a softmax after the products: attention composed of ops that no pass placed
        lambda s: s.__setitem__(5, ("elementwise", "aten::amax", None)),
        # an outer product (a rotary table's inv_freq by the positions): it reduces over one
        lambda s: (
            s.__setitem__(4, ("gemm", "aten::bmm", [[1, 64, 1], [1, 1, 16]]))
            or s.__setitem__(6, ("gemm", "aten::bmm", [[1, 64, 1], [1, 1, 16]]))
        ),
    ],
)
def test_products_of_attention_or_a_rotary_table_are_no_mixer(change) -> None:
    seq = list(LIGHTNING_LAYER)
    change(seq)
    stage, _, n = _run(seq)
    assert n == 0 and stage == [s for s, _, _ in seq]


def test_a_convolutions_gemm_kernels_are_no_projection() -> None:
    from analyzer.analyses.convolutions import CONVOLUTION_GEMM, mark_convolution_gemms

    # GIVEN cuDNN's implicit-GEMM kernel under a convolution op (a GEMM by its name) and a linear's GEMM
    stage = ["gemm", "elementwise", "gemm"]
    ops = ["aten::cudnn_convolution", "aten::cudnn_convolution", "aten::mm"]
    why = [0, 0, 0]
    # WHEN marked THEN the convolution's GEMM is generic work, the linear's GEMM stays a GEMM
    assert mark_convolution_gemms(np.arange(3), stage, ops, why) == 1
    assert stage == ["elementwise", "elementwise", "gemm"] and why[0] == CONVOLUTION_GEMM


def test_a_short_convolution_after_a_projection_is_a_mixers_core() -> None:
    from analyzer.analyses.convolutions import SHORT_CONVOLUTION, mark_short_convolutions

    # GIVEN a key projection, then a short convolution (pad copy, depthwise conv, residual add) the
    # walk placed by position as RoPE (code 7: a region rule's), then the value projection
    placed = frozenset({7})
    stage = ["qkv_gemm", "rope", "rope", "rope", "qkv_gemm"]
    ops = ["aten::mm", "aten::copy_", "aten::_conv_depthwise2d", "aten::add", "aten::mm"]
    dims = {2: [[2, 64, 1, 16], [64, 1, 1, 4]]}
    why = [1, 7, 7, 7, 1]
    # WHEN marked after the walk THEN the convolution's kernels are linear_attention
    assert mark_short_convolutions(np.arange(5), stage, ops, dims, why, placed) == 3
    assert stage == ["qkv_gemm", *["linear_attention"] * 3, "qkv_gemm"] and why[2] == SHORT_CONVOLUTION
    # AND a full convolution (not depthwise) is left alone
    stage, why = ["qkv_gemm", "rope", "rope", "rope", "qkv_gemm"], [1, 7, 7, 7, 1]
    full = {2: [[2, 64, 1, 16], [64, 64, 1, 4]]}
    assert mark_short_convolutions(np.arange(5), stage, ops, full, why, placed) == 0


def test_a_residual_add_adds_two_activations() -> None:
    from analyzer.analyses.mixers import _activations

    # one shape, or one rank with batch and hidden equal (a broadcast over the positions): activations
    assert _activations([2, 16, 64], [2, 16, 64]) and _activations([2, 1, 64], [2, 2, 64])
    # a bias (its own rank) or another batch: not
    assert not _activations([64], [2, 16, 64]) and not _activations([3, 1, 64], [2, 2, 64])


def test_a_router_that_selects_by_row_maximum_is_routing_up_to_its_last_softmax() -> None:
    from analyzer.analyses.walk.regions import SELECTION_ROUTER, _label_selection_router

    # GIVEN a MoE region after its router GEMM: max, a mask, a softmax, a gather (twice), a
    # concatenation, then dispatch (an arange and an index)
    ops = ["aten::max", "aten::gt", "aten::masked_fill_", "aten::_softmax", "aten::gather",
           "aten::max", "aten::_softmax", "aten::gather", "aten::cat", "aten::arange", "aten::index"]  # fmt: skip
    stage = ["elementwise"] * len(ops)
    why = [0] * len(ops)
    left = _label_selection_router(list(range(len(ops))), list(range(len(ops))), 0, len(ops), stage, ops, why)
    # THEN the selection through its tail is routing, the rest is left for the dispatch default
    assert stage[:9] == ["moe_topk"] * 9 and why[0] == SELECTION_ROUTER and left == [9, 10]
    # AND with a top-k op in the region nothing changes (a top-k router is STR005's)
    ops2 = ["aten::topk", *ops[1:]]
    stage2 = ["elementwise"] * len(ops2)
    assert _label_selection_router(list(range(len(ops2))), [0, 1], 0, len(ops2), stage2, ops2, why) == [0, 1]
    assert stage2 == ["elementwise"] * len(ops2)


def test_scalar_multiplies_before_the_residual_add_scale_it() -> None:
    from analyzer.analyses.walk.moe import _residual_scaling

    # GIVEN the last expert GEMM at 0, the combine's copy at 1, two scalar multiplies, the residual add
    ops = ["aten::bmm", "aten::copy_", "aten::mul", "aten::mul", "aten::add"]
    dims = {2: [[2, 16, 64], []], 3: [[2, 16, 64], []], 1: [[32, 64], [32, 64]]}
    # THEN the two multiplies are the residual's scaling, the copy is not
    assert _residual_scaling(list(range(5)), 4, 0, ops, dims.get) == {2, 3}
    # AND a multiply by a tensor (the routing weights) is no scaling
    dims[3] = [[2, 16, 64], [2, 16, 1]]
    assert _residual_scaling(list(range(5)), 4, 0, ops, dims.get) == set()
