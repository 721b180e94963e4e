"""llama.cpp traces (rocprof v1 prompt processing, rocpd token generation): its layer order and its own
kernel evidence give the GEMM roles, the forwards and their phases (issue 36, item 2; rules STR002,
STR047, STR048, PHS033, PHS034)."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from analyzer.pipeline import analyze_trace
from analyzer.runtime.driver import load_inputs
from tests.conftest import shared

PROMPT = "rocprofv1-llamacpp-r9700/results.json"  # Llama-2-7B Q4_0, prompt processing, 512-token ubatches
DECODE = "rocpd-llamacpp-r9700/32432_results.db"  # llama-bench -p 0 -n 8 -fa 1: a warm-up and 8 tokens


def _run(rel):
    a = analyze_trace(load_inputs([str(shared(rel))]))
    k = a.kernels
    names = k["name"].combine_chunks().cast(pa.string()).to_pylist()
    stages = k["stage"].combine_chunks().cast(pa.string()).to_pylist()
    return a, names, stages


def _count(names, stages, word):
    return collections.Counter(s for n, s in zip(names, stages, strict=True) if word in n)


@pytest.fixture(scope="module")
def prompt():
    return _run(PROMPT)


@pytest.fixture(scope="module")
def decode():
    return _run(DECODE)


def test_prompt_processing_is_prefill_by_its_own_keys(prompt):
    a, _, _ = prompt
    # the two 512-token forwards attend only their own keys (soft_max_f32<true, 512, ...>, 512 rows
    # in the first norm): no cached context, so prompt tokens
    assert a.steps["phase"].tolist() == ["prefill", "prefill"]
    assert a.steps["tokens"].tolist() == [512, 512]
    assert set(a.steps["phase_rule"]) == {"PHS033"}
    assert all("PHS034" in ev for ev in a.steps["phase_evidence"])


def test_prompt_roles_follow_the_layer_order(prompt):
    _, names, stages = prompt
    # Llama-2-7B: 32 layers of three QKV, one O, gate and up, down projections (MMQ kernels); the
    # last layer's FFN runs on the one output row (MMVQ, gate and up fused), then the LM head
    mmq = _count(names, stages, "mul_mat_q<")
    assert mmq == {"qkv_gemm": 2 * 32 * 3, "o_gemm": 2 * 32, "gate_up_gemm": 2 * 31 * 2, "down_gemm": 2 * 31}
    mmvq = _count(names, stages, "mul_mat_vec_q")
    assert mmvq == {"gate_up_gemm": 2, "down_gemm": 2, "lm_head_gemm": 2}
    # the KQ and KQV batched GEMMs and the softmax between them are the attention (STR002)
    assert _count(names, stages, "Cijk_") == {"flash_attention": 2 * 32 * 2}
    assert _count(names, stages, "soft_max") == {"flash_attention": 2 * 32}
    # the last layer's output-row gathers are no embedding lookup (STR047)
    assert "embedding" not in _count(names, stages, "get_rows")


def test_token_generation_forwards_end_at_the_host_copies(decode):
    a, names, stages = decode
    # nine forwards of one token each (a warm-up and eight), decode by the vec flash attention
    assert len(a.steps) == 9 and set(a.steps["phase"]) == {"decode"}
    assert a.steps["tokens"].tolist() == [1] * 9
    # the output GEMM before the host copies is the LM head, not the next layer's QKV (STR048; the
    # last forward's head ends the trace, no copies follow it)
    mmvq = _count(names, stages, "mul_mat_vec_q")
    assert mmvq["lm_head_gemm"] == 9 and mmvq["qkv_gemm"] == 9 * 32 * 3
    rules = collections.Counter(a.kernels["stage_rule"].combine_chunks().cast(pa.string()).to_pylist())
    assert rules["STR048"] == 8
