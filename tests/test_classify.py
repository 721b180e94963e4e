"""Classification: names -> stage/provider, GEMM roles from position vs from shapes, layers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from analyzer.knowledge.architectures import from_meta_arch
from analyzer.knowledge.taxonomy import DENSE_GEMM_STAGES
from analyzer.model import HOST_OP_SCHEMA
from analyzer.pipeline import analyze_trace
from tests import shape_oracle
from tests.conftest import H200_DENSE, H200_MOE, H200_TP2, H200_TRACES, SHARED, shared_kineto_traces
from tests.runs import load_inputs

ALL_KINETO = [pytest.param(p, id=p.parent.name + "/" + p.name) for p in H200_TRACES] + [
    pytest.param(SHARED / rel, id=rel) for rel in shared_kineto_traces()
]


def _analyse(path: Path, host_ops: bool = True):
    trace = load_inputs([str(path)])
    if not host_ops:
        trace = dataclasses.replace(trace, host_ops=HOST_OP_SCHEMA.empty_table())
    return trace, analyze_trace(trace)


@pytest.mark.parametrize("path", ALL_KINETO)
def test_at_least_99_percent_of_kernel_time_has_a_stage(path: Path) -> None:
    trace = load_inputs([str(path)]) if path.exists() else None
    if trace is None:
        pytest.skip("trace absent")
    try:
        a = analyze_trace(trace)
    except Exception as e:  # pragma: no cover - surfaced as a failure below
        raise AssertionError(e) from e
    k = a.kernels.to_pandas()
    other = k.loc[k["stage"] == "other", "dur_ns"].sum()
    assert other / k["dur_ns"].sum() <= 0.01
    # per-stage times sum to the total: no kernel time is lost
    assert k.groupby("stage")["dur_ns"].sum().sum() == k["dur_ns"].sum() == a.trace.kernel_ns


def test_library_names_get_their_provider() -> None:
    # GIVEN kernels whose names identify their library in every real trace
    # (the library's namespace or prefix opens the kernel's own name)
    expect = {
        r"^nvjet_": "cublas",
        r"^cudnn": "cudnn",
        r"^ncclDevKernel": "nccl",
        r"^Cijk_\w*_UserArgs": "hipblaslt",
        r"^(?:void )?aiter::": "aiter",
        r"^(?:void )?ck_tile::": "ck",
        # aiter's copy of vLLM's ROCm paged attention: a leading int VERSION_ID and ck_tile's
        # ComposedAttention (ROCm/aiter csrc/kernels/attention_ragged.cu); vLLM's copy has neither
        r"^(?:void )?paged_attention_ll4mi\w*<\d.*ComposedAttention": "aiter",
    }
    seen = 0
    for param in ALL_KINETO:
        path = param.values[0]
        _, a = _analyse(path)
        k = a.kernels.to_pandas()
        for needle, provider in expect.items():
            hit = k[k["norm_name"].astype(str).str.contains(needle, regex=True)]
            if len(hit):
                seen += 1
                assert set(hit["provider"]) == {provider}, (path, needle, set(hit["provider"]))
    assert seen >= 4


def _meta(path: Path) -> tuple:
    meta = json.loads((path.parent / "meta.json").read_text())
    return from_meta_arch(meta["arch"]), meta.get("tensor_parallel", 1)


@pytest.mark.parametrize(
    "path", [H200_DENSE, H200_MOE, H200_TP2[0], H200_TP2[1]], ids=lambda p: p.parent.name + p.name
)
def test_position_roles_agree_with_shape_roles(path: Path) -> None:
    # GIVEN roles from shapes (host ops kept) and from position alone (host ops withheld)
    arch, tp = _meta(path)
    trace, full = _analyse(path)
    by_shape = shape_oracle.gemm_roles_from_shapes(full.kernels, trace.host_ops, arch, tp)
    _, bare = _analyse(path, host_ops=False)
    by_position = bare.kernels["stage"].to_pylist()
    kind = full.kernels["kind"].to_pylist()
    dur = full.kernels["dur_ns"].to_numpy()
    decided = np.array([r is not None and k == "kernel" for r, k in zip(by_shape, kind, strict=True)])
    agree = np.array([r == p for r, p in zip(by_shape, by_position, strict=True)])
    # THEN at least 99% of the decidable GEMM time agrees
    assert decided.sum() >= 30
    assert dur[decided & agree].sum() / dur[decided].sum() >= 0.99


def _role_sequence(k, mask) -> list[tuple[int, tuple[str, ...]]]:
    """Per (step, layer): the GEMM roles in order, one per GEMM op (split-K reduce folded in)."""
    out = []
    sub = k[mask & k["stage"].isin(DENSE_GEMM_STAGES) & k["layer"].notna()].sort_values("start_ns")
    for (_step, _layer), g in sub.groupby(["step", "layer"], sort=False):
        roles = []
        for s in g["stage"]:
            if not roles or roles[-1] != s:
                roles.append(s)
        out.append(tuple(roles))
    return out


@pytest.mark.parametrize("path", H200_TP2, ids=lambda p: p.name)
def test_graph_replayed_decode_gets_the_roles_of_eager_prefill(path: Path) -> None:
    arch, tp = _meta(path)
    trace, a = _analyse(path)
    k = a.kernels.to_pandas()
    k["shape_role"] = shape_oracle.gemm_roles_from_shapes(a.kernels, trace.host_ops, arch, tp)
    pre = k[(k["phase"] == "prefill") & k["shape_role"].notna() & (k["kind"] == "kernel")]
    # the eager prefill's layer pattern, from shapes
    layer0 = pre[pre["layer"] == 0].sort_values("start_ns")
    pattern = tuple(dict.fromkeys(layer0["shape_role"]))
    assert pattern == ("qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm")
    decode = k["phase"] == "decode"
    # decode GEMMs are replayed from the CUDA graph: no host op, no shapes
    dec_gemm = k[decode & k["stage"].isin(DENSE_GEMM_STAGES)]
    assert dec_gemm["graph_launch"].all() and dec_gemm["launch_op_id"].isna().all()
    seqs = _role_sequence(k, decode)
    assert len(seqs) == 32 * arch.num_hidden_layers
    assert all(s == pattern for s in seqs)
    # and the LM head once per decode step
    assert (k.loc[decode & (k["stage"] == "lm_head_gemm")].groupby("step").size() >= 1).all()


def test_layers_are_numbered_per_step() -> None:
    _, a = _analyse(H200_DENSE)
    k = a.kernels.to_pandas()
    for _, g in k[k["phase"] == "decode"].groupby("step"):
        layers = sorted(g["layer"].dropna().astype(int).unique())
        assert layers == list(range(8))  # 8 decoder layers in this trace


def test_generic_kernels_get_the_stage_of_their_layer_step() -> None:
    # an eager HF RMSNorm is pow/mean/add/rsqrt/mul kernels: they must be `norm`, not elementwise
    _, a = _analyse(H200_DENSE)
    k = a.kernels.to_pandas()
    names = k["norm_name"].astype(str)
    for needle, stage in (
        ("rsqrt_kernel", "norm"),
        ("MeanOps", "norm"),
        ("silu", "activation"),
        ("cos_kernel", "rope"),
    ):
        assert set(k.loc[names.str.contains(needle, regex=False), "stage"]) == {stage}, needle
    dec = k[k["phase"] == "decode"]
    share = dec.loc[dec["stage"] == "elementwise", "dur_ns"].sum() / dec["dur_ns"].sum()
    assert share < 0.02


def test_user_rules_take_precedence(tmp_path: Path) -> None:
    extra = tmp_path / "mine.toml"
    extra.write_text(
        "[[rule]]\nid = 'USR001'\npattern = '^nvjet_'\nstage = 'gemm'\nprovider = 'cutlass'\n"
        "examples = ['nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT']\nnote = 'test: pretend nvjet is CUTLASS'\n"
    )
    from analyzer.pipeline import Options

    trace = load_inputs([str(H200_DENSE)])
    a = analyze_trace(trace, Options(rules=[str(extra)]))
    k = a.kernels.to_pandas()
    nv = k[k["norm_name"].astype(str).str.startswith("nvjet_")]
    assert set(nv["provider"]) == {"cutlass"} and set(nv["rule_id"]) == {"USR001"}


def test_classification_shares_cover_the_kernel_time_and_structure_is_trusted() -> None:
    from analyzer.analyses.classify import SOURCES, classification_shares

    # GIVEN the H200 dense trace, analysed
    _, a = _analyse(H200_DENSE)
    # THEN every kernel says how its stage was decided, and the shares sum to the kernel time
    shares = classification_shares(a.kernels["stage_source"], a.kernels["dur_ns"])
    assert list(shares) == list(SOURCES) and abs(sum(shares.values()) - 1) < 1e-4
    # the GEMM roles come from shapes or the layer walk (shapes decide the LM head, gate/up, down)
    assert shares["by_structure"] + shares["by_shapes"] > 0.7 and shares["by_shapes"] > 0.3
    assert shares["role_free"] < 0.01
    # AND the layer structure was found with confidence: no self-check warning
    assert not [w for w in a.warnings if w.startswith("layer structure not found")]


def test_training_kernels_make_the_self_check_warn() -> None:
    import pyarrow as pa

    from analyzer.analyses.classify import TRAINING_WARNING, _check_warnings

    def table(names: list[str], stages: list[str]) -> pa.Table:
        return pa.table({"norm_name": names, "stage": stages})

    # GIVEN an optimizer kernel, or a backward kernel: training
    assert TRAINING_WARNING in _check_warnings(
        table(["multi_tensor_apply_kernel<FusedAdamMathFunctor>"], ["optimizer"]), []
    )
    assert TRAINING_WARNING in _check_warnings(table(["softmax_warp_backward<float>"], ["elementwise"]), [])
    # AND an inference trace does not warn
    assert _check_warnings(table(["flash_fwd_kernel"], ["flash_attention"]), []) == []


@pytest.mark.parametrize(
    ("codes", "labels"),
    [
        ([2, 0, 2, 1, 0], ["norm", "gemm", "rope"]),
        ([1, 3, 1, 0], ["a", "x", "b", "x"]),  # two codes share a label (stage -> category)
        ([], ["a"]),
    ],
)
def test_dict_from_codes_is_the_dictionary_of_the_labels(codes, labels) -> None:
    # GIVEN per-row codes into labels WHEN built from the codes THEN the same dictionary array
    # (values, dictionary order by first appearance, type) as encoding the strings row by row
    from analyzer.tables.dictionaries import dict_from_codes, dict_strings

    got = dict_from_codes(np.asarray(codes, np.int16), labels)
    want = dict_strings(pa.array([labels[c] for c in codes], pa.string()))
    assert got.type == want.type
    assert got.dictionary.to_pylist() == want.dictionary.to_pylist()
    assert got.indices.to_pylist() == want.indices.to_pylist()
