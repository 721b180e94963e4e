"""STR050 expert-weight gathers (analyzer/analyses/weight_gathers.py): a per-token indexing of an
experts module's stacked weights is expert work, not routing, on real traces and on synthetic rows."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from analyzer.analyses.weight_gathers import EXPERT_WEIGHT_GATHER, mark_expert_weight_gathers

ROOT = Path(__file__).resolve().parents[1]
QWEN3_MOE = ROOT / "fixtures" / "h200-qwen3-30b-a3b-moe" / "trace.json.gz"
SWEEP = ROOT / "fixtures" / "sweep"
TH = SimpleNamespace(weight_gather_window=8, expert_gather_reach=64)


def _run(ops, dims, stage=None, topk_at=(0,)):
    n = len(ops)
    stage = stage or ["elementwise"] * n
    topk = np.zeros(n, bool)
    topk[list(topk_at)] = True
    why = [0] * n
    done = mark_expert_weight_gathers(np.arange(n), stage, ops, dict(enumerate(dims)), topk, why, TH)
    return stage, why, done


def test_a_gather_of_stacked_weights_feeding_a_bmm_is_expert_work() -> None:
    # GIVEN top-k, then w[expert_ids] of a [32, 1024, 2048] weight and a bmm reading [20, 1024, 2048]
    ops = ["aten::topk", "aten::index", "aten::bmm"]
    dims = [[[2, 32]], [[32, 1024, 2048], []], [[20, 1024, 2048], [20, 2048, 1]]]
    stage, why, done = _run(ops, dims, ["moe_topk", "elementwise", "moe_expert_gemm"])
    # THEN the gather is moe_expert_gemm, by STR050
    assert (stage[1], why[1], done) == ("moe_expert_gemm", EXPERT_WEIGHT_GATHER, 1)


def test_a_gather_of_stacked_expert_biases_is_expert_work() -> None:
    # GIVEN GPT-OSS's two paths: a bias[expert_ids] of [17, 2880] before a grouped GEMM over
    # [17, 1440, 2880] weights; and per token, a weight gather of [17, 1440, 2880] then its bias's
    ops = ["aten::topk", "aten::index", "aten::_grouped_mm", "aten::index", "aten::index", "aten::bmm"]
    dims = [
        [[2, 17]], [[17, 2880], []], [[128, 1440], [17, 1440, 2880], [17]],
        [[17, 1440, 2880], []], [[17, 2880], []], [[20, 1, 1440], [20, 1440, 2880]],
    ]  # fmt: skip
    stage, why, done = _run(
        ops, dims, ["moe_topk", "moe_sort", "moe_expert_gemm", "moe_sort", "moe_sort", "gemm"]
    )
    # THEN every gather is the experts' work
    assert done == 3 and stage[1] == stage[3] == stage[4] == "moe_expert_gemm"
    # AND a token gather of [tokens, hidden] before a GEMM over other experts stays routing
    stage, _, done = _run(ops[:3], [dims[0], [[20, 2048], []], dims[2]], ["moe_topk", "moe_sort", "gemm"])
    assert done == 0 and stage[1] == "moe_sort"


@pytest.mark.parametrize(
    ("ops", "dims", "topk_at"),
    [
        # a token gather: the source is [tokens, hidden], not stacked matrices
        (["aten::topk", "aten::index", "aten::bmm"], [[[2, 8]], [[20, 2048], []], [[20, 1024, 2048]]], (0,)),
        # stacked matrices, but no batched GEMM reads them (a cache reorder)
        (["aten::topk", "aten::index", "aten::mm"], [[[2, 8]], [[32, 1024, 2048], []], [[20, 2048]]], (0,)),
        # the bmm reads other matrices
        (
            ["aten::topk", "aten::index", "aten::bmm"],
            [[[2, 8]], [[32, 1024, 2048], []], [[20, 64, 16]]],
            (0,),
        ),
        # no router's top-k before it (a LoRA-style adapter gather)
        (["aten::index", "aten::bmm"], [[[32, 1024, 2048], []], [[20, 1024, 2048]]], ()),
        # without shapes nothing can be told
        (["aten::topk", "aten::index", "aten::bmm"], [None, None, None], (0,)),
    ],
)
def test_other_gathers_keep_their_stage(ops, dims, topk_at) -> None:
    stage, _, done = _run(ops, dims, topk_at=topk_at)
    assert done == 0 and stage[1] == "elementwise"


@pytest.mark.skipif(not QWEN3_MOE.is_file(), reason="fixtures/h200-qwen3-30b-a3b-moe absent")
def test_qwen3_moe_decode_weight_gathers_are_expert_work_and_f007_does_not_count_them(tmp_path) -> None:
    from click.testing import CliRunner

    from analyzer.cli import cli

    # GIVEN the Qwen3-30B-A3B H200 trace (transformers' default experts path in decode)
    out = tmp_path / "a.json"
    r = CliRunner().invoke(cli, ["analyze", str(QWEN3_MOE), "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    # THEN no decode MoE gate + sort finding: the gathers are the expert GEMMs' weight reads
    assert not [f for f in doc["findings"] if f["id"] == "F007" and "decode" in f["title"]]
    gathers = [k for k in doc["top_kernels"] if "vectorized_gather_kernel" in k["norm_name"]]
    assert gathers and gathers[0]["stage"] == "moe_expert_gemm"


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "olmoe"])
def test_swept_moe_types_expert_weight_region_is_all_expert_gemm(model_type: str, tmp_path: Path) -> None:
    from analyzer.cli.check_cmd import check_trace

    # GIVEN a swept MoE type whose decode gathers expert weights, with its truth
    path = tmp_path / "trace.json"
    with lzma.open(SWEEP / model_type / "trace.json.xz", "rb") as f, open(path, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    # WHEN checked THEN every kernel of the expert_weights region agrees (moe_expert_gemm)
    regions = {r["region"]: r for r in check_trace(str(path))["regions"]}
    assert regions["expert_weights"]["stage_agreement"] == 1.0
