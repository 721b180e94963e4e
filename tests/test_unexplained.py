"""STR051 (analyzer/analyses/unexplained.py): kernels placed by position only under host ops foreign to
that place make the analysis warn, naming layers and ops; kernels doing that place's work do not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from analyzer.analyses.unexplained import foreign_ops_warning
from analyzer.analyses.walk.registry import KNOWLEDGE

ROOT = Path(__file__).resolve().parents[1]
TH = SimpleNamespace(foreign_share=0.005)
ATTN_IN = KNOWLEDGE.code_of("region-attn-in")
TAIL = KNOWLEDGE.code_of("region-tail")
ROPE = KNOWLEDGE.code_of("rotary-module")


def _warn(why, ops, dur, layer=None):
    layer = np.zeros(len(ops), np.int64) if layer is None else np.asarray(layer)
    return foreign_ops_warning(why, ops, layer, np.asarray(dur, float), TH)


def test_ropes_own_ops_placed_by_position_are_no_warning() -> None:
    assert (
        _warn([ATTN_IN] * 4, ["aten::mul", "aten::neg", "aten::cat", "aten::add"], [10, 10, 10, 10]) is None
    )


def test_a_convolution_where_rope_should_be_is_named_with_its_layer() -> None:
    # GIVEN a causal convolution and a scan's exp placed as RoPE in layer 3, a third of the time
    why = [ATTN_IN, ATTN_IN, ATTN_IN, ROPE]
    ops = ["aten::_conv_depthwise2d", "aten::exp", "aten::mul", "aten::mul"]
    w = _warn(why, ops, [20, 10, 30, 30], layer=[3, 3, 3, 3])
    # THEN the warning names the share, the ops and the layer
    assert w is not None and "33.3%" in w and "aten::_conv_depthwise2d" in w and "layer 3" in w


@pytest.mark.parametrize(
    ("why", "ops", "dur"),
    [
        ([TAIL, TAIL], ["aten::sum", "aten::argmax"], [1, 999]),  # under the share
        ([ROPE, ROPE], ["aten::exp", "aten::exp"], [10, 10]),  # decided by a rule, not by position
        ([ATTN_IN], [None], [10]),  # no launching op: cannot be judged
    ],
)
def test_no_warning_below_the_share_for_rules_or_without_host_ops(why, ops, dur) -> None:
    assert _warn(why, ops, dur) is None


@pytest.mark.parametrize(
    "trace",
    [
        "fixtures/zoo/llama-sdpa-bf16/trace.json.gz",
        "fixtures/zoo/qwen3-moe-grouped-bf16/trace.json.gz",
        "fixtures/h200-qwen3-30b-a3b-moe/trace.json.gz",
        # int4 weight-only linears' padding: the quantized linear's work (STR053), not unknown work
        "fixtures/libraries/int4-wo-llama-bf16/trace.json.gz",
        # a Gated DeltaNet hybrid: its mixers are told by STR052, nothing is left placed by position
        "fixtures/libraries/fla-qwen3-next-bf16/trace.json.gz",
    ],
)
def test_real_traces_whose_work_the_rules_know_get_no_warning(trace: str) -> None:
    from analyzer.cli.check_cmd import analyze_stripped

    # GIVEN a real capture with its annotations stripped WHEN analysed THEN no such warning
    warnings = analyze_stripped(str(ROOT / trace), False, (), None, None).warnings
    assert not [w for w in warnings if "placed by its position" in w]


def test_gates_where_rope_and_norms_sit_are_announced_with_their_layers() -> None:
    from analyzer.options import Options
    from analyzer.pipeline import analyze_trace
    from analyzer.readers.case import read_case

    # GIVEN the Llama case with its multiplies launched as a recurrence's softplus gates
    trace, _ = read_case(ROOT / "tests" / "cases" / "derived-foreign-gates.json.xz")
    # WHEN analysed THEN the warning names the op and the layers
    said = [w for w in analyze_trace(trace, Options()).warnings if "placed by its position" in w]
    assert said and "aten::softplus" in said[0] and "layers 0, 1" in said[0]


# ------------------------------------------------------------------ STR060 attention outside layers


def test_attention_outside_the_layers_is_warned_with_its_kernels() -> None:
    from analyzer.analyses.unexplained import attention_outside_layers_warning

    # GIVEN two attention kernels in no layer (-1) among layers the walk found, a fifth of the time
    outside = np.array([True, True, False, False])
    names = ["flash_fwd_kernel", "flash_fwd_kernel", "nvjet_gemm", "flash_fwd_kernel"]
    w = attention_outside_layers_warning(
        outside, names, np.array([-1, -1, 0, 0]), np.array([10.0, 10.0, 40.0, 40.0]),
        SimpleNamespace(attention_outside_layers_share=0.001),
    )  # fmt: skip
    # THEN the warning gives the share and names the kernels
    assert w is not None and "20.0%" in w and "flash_fwd_kernel" in w and "outside the layers" in w
    # AND none without such kernels
    assert (
        attention_outside_layers_warning(
            np.zeros(4, bool),
            names,
            np.zeros(4),
            np.ones(4),
            SimpleNamespace(attention_outside_layers_share=0.001),
        )
        is None
    )


@pytest.mark.parametrize(
    ("trace", "warned"),
    [
        # an indexer that sorts its scores (derived from HunYuan-V4): read as an LM head and a
        # sampler, the layers before it are lost
        ("tests/cases/derived-indexer-by-sort.json.xz", True),
        # HunYuan-V4 itself: its indexer's top-k is the composed attention's key selection (STR057)
        ("tests/cases/hy-v4-composed-sparse-attention.json.xz", False),
        # every attention kernel of a dense model and of a MoE model is a layer's
        ("tests/cases/gemma4-unified-qk-norms-before-update.json.xz", False),
        ("tests/cases/longcat-mla-rope-last-repeat.json.xz", False),
    ],
)
def test_attention_outside_layers_on_real_cuts(trace: str, warned: bool) -> None:
    from analyzer.options import Options
    from analyzer.pipeline import analyze_trace
    from analyzer.readers.case import read_case

    # GIVEN a cut of a swept capture WHEN analysed THEN STR060 warns exactly where layers were lost
    cut, _ = read_case(ROOT / trace)
    said = [w for w in analyze_trace(cut, Options()).warnings if "attention outside every layer" in w]
    assert bool(said) == warned
