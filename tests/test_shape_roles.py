"""GEMM roles from recorded shapes: the model's sizes found in the trace, roles where shapes decide,
and the report when shapes and the layer walk disagree."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.analyses import classify, shape_roles
from analyzer.pipeline import analyze_trace
from analyzer.tables.dictionaries import pylist
from tests.conftest import FIXTURES, H200_DENSE
from tests.runs import load_inputs

ZOO = FIXTURES / "zoo"


def _analysed(path):
    trace = load_inputs([str(path)])
    return trace, analyze_trace(trace)


def test_sizes_come_from_the_trace_and_match_the_config() -> None:
    # GIVEN the Llama-3-8B-shaped H200 trace and the config it was made from
    arch = json.loads((H200_DENSE.parent / "meta.json").read_text())["arch"]
    trace, a = _analysed(H200_DENSE)
    # WHEN the sizes are found from the trace alone (no --model)
    dims = shape_roles.model_dims(a.kernels, trace.host_ops, pylist(a.kernels["stage"]))
    # THEN they are the config's
    assert dims is not None
    assert (dims.hidden, dims.vocab, dims.intermediate) == (
        arch["hidden_size"],
        arch["vocab_size"],
        arch["intermediate_size"],
    )
    assert dims.fused_mlp is False  # separate gate and up projections


def test_shapes_decide_roles_and_agree_with_the_structure() -> None:
    trace, a = _analysed(H200_DENSE)
    k = a.kernels
    src = np.asarray(pylist(k["stage_source"]), object)
    stage = np.asarray(pylist(k["stage"]), object)
    # lm_head, gate/up and down are decided by shapes; q and o share one H x H shape, so never
    assert set(stage[src == "by_shapes"]) == {"lm_head_gemm", "gate_up_gemm", "down_gemm"}
    assert not any("disagree" in w for w in a.warnings)
    # an independent check: every shape-decided role is the one the layer walk gives without shapes
    assert (stage[src == "by_shapes"] != "gemm").all()


def test_counts_that_fit_no_role_leave_shapes_undecided() -> None:
    # GIVEN GPT-2 with a vocabulary as wide as its MLP (512 = 4 x 128): H -> 512 runs once per layer
    # and once per forward, so it is neither only the LM head nor only the MLP's up projection
    trace, a = _analysed(ZOO / "gpt2-sdpa-fp16" / "trace.json.gz")
    dims = shape_roles.model_dims(a.kernels, trace.host_ops, pylist(a.kernels["stage"]))
    assert dims is not None and dims.hidden == 128
    assert dims.vocab is None and dims.intermediate is None
    src = set(pylist(a.kernels["stage_source"]))
    assert "by_shapes" not in src


@pytest.mark.parametrize("case", ["llama-sdpa-bf16", "qwen2-sampling-bf16", "mixtral-loop-bf16"])
def test_zoo_shape_roles_are_right(case: str) -> None:
    trace, a = _analysed(ZOO / case / "trace.json.gz")
    meta = json.loads((ZOO / case / "meta.json").read_text())["config"]
    dims = shape_roles.model_dims(a.kernels, trace.host_ops, pylist(a.kernels["stage"]))
    assert dims is not None and (dims.hidden, dims.vocab) == (meta["hidden_size"], meta["vocab_size"])
    assert not any("disagree" in w for w in a.warnings)


def test_a_disagreement_keeps_the_structure_and_is_reported() -> None:
    # GIVEN the walk's roles with every down GEMM mislabelled gate_up (as a broken walk would)
    trace, a = _analysed(H200_DENSE)
    stage = pylist(a.kernels["stage"])
    wrong = ["gate_up_gemm" if s == "down_gemm" else s for s in stage]
    # WHEN shapes are applied
    shaped, why = classify._apply_shape_roles(a.kernels, trace.host_ops, wrong, None)
    # THEN the structure's (wrong) roles stay, and the summary is told why they cannot be trusted
    assert why is not None and "disagree" in why and "gate_up_gemm by structure, down_gemm by shape" in why
    assert "down_gemm" not in wrong
