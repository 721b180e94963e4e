"""Findings: each check fires on a real (or minimally edited real) trace and stays quiet where it should."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from analyzer.errors import UsageError
from analyzer.knowledge.finding_settings import load_finding_settings
from analyzer.knowledge.taxonomy import ALL_GEMM_STAGES as GEMM_STAGES
from analyzer.knowledge.taxonomy import ATTENTION_STAGES, TAXONOMY
from analyzer.pipeline import Options
from tests.conftest import FIXTURES, H200_DENSE, H200_MOE, H200_TP2, shared
from tests.runs import analyze_paths


def _ids(paths: list[Path], **settings: str) -> dict[str, list[dict]]:
    a = analyze_paths([str(p) for p in paths], Options(settings=settings))
    out: dict[str, list[dict]] = {}
    for f in a.findings:
        out.setdefault(f["id"], []).append(f)
    return out


@pytest.fixture(scope="module")
def dense() -> dict[str, list[dict]]:
    return _ids([H200_DENSE])


@pytest.fixture(scope="module")
def tp2() -> dict[str, list[dict]]:
    return _ids([H200_TP2[0]])


@pytest.fixture(scope="module")
def sglang() -> dict[str, list[dict]]:
    return _ids(
        [
            shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz"),
            shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_decode.json.gz"),
        ]
    )


def _edited(tmp_path: Path, src: Path, rename: dict[str, str]) -> Path:
    obj = json.loads(gzip.decompress(src.read_bytes()))
    for e in obj["traceEvents"]:
        if e.get("cat") == "kernel":
            for old, new in rename.items():
                if e["name"].startswith(old):
                    e["name"] = new + e["name"][len(old) :]
    p = tmp_path / "edited.json.gz"
    p.write_bytes(gzip.compress(json.dumps(obj).encode()))
    return p


def test_same_kernel_both_phases_fires_on_sglang_pair_ranked_by_cost(sglang) -> None:
    f = sglang["F001"]
    stretched = [x for x in f if x["evidence"]["stretched"]]
    names = " ".join(x["title"] for x in stretched)
    for needle in ("add_rmsnorm_quant", "act_and_mul", "rotary_embedding", "store_kvcache"):
        assert needle in names, needle
    costs = [x["evidence"]["prefill"]["time_ns"] + x["evidence"]["decode"]["time_ns"] for x in stretched]
    assert costs == sorted(costs, reverse=True)
    ev = stretched[0]["evidence"]
    assert ev["prefill"]["tokens"] == 15360 and ev["decode"]["tokens"] == 32 and ev["token_ratio"] == 480


def test_same_kernel_quiet_on_nccl_protocols_and_generic_copies(tp2, dense) -> None:
    for found in (tp2, dense):
        for x in found.get("F001", []):
            assert "nccl" not in x["title"].lower()
            assert "elementwise_kernel" not in x["title"] and "Memcpy" not in x["title"]
    # the lm_head over the last token runs the same problem in both phases: benign
    lm = [x for x in dense["F001"] if "lm_head_gemm" in x["title"]]
    assert lm and all(x["severity"] == "info" for x in lm)


def test_large_tile_decode_gemm(tmp_path: Path, dense) -> None:
    assert "F002" not in dense
    edited = _edited(tmp_path, H200_DENSE, {"nvjet_sm90_tst_64x8_": "nvjet_sm90_tst_256x128_"})
    f = _ids([edited])["F002"]
    assert f and f[0]["phase"] == "decode" and f[0]["evidence"]["skinny_side"] == 128


def test_decode_below_memory_roof(dense, sglang) -> None:
    f = dense["F003"]
    assert any(x["evidence"]["stage"] == "flash_attention" for x in f)
    assert all(x["evidence"]["pct_of_roof"] < 0.30 for x in f)
    assert "F003" not in sglang  # graph-replayed decode without shapes or --model: no claim


def test_prefill_below_compute_roof(sglang, dense) -> None:
    f = sglang["F004"]
    assert f and all(x["phase"] == "prefill" and x["evidence"]["pct_of_roof"] < 0.40 for x in f)
    assert "F004" not in _ids([H200_DENSE], **{"prefill_below_compute_roof.max_pct": "0.05"})


def test_launch_overhead_chain(dense, sglang) -> None:
    f = dense["F005"]
    assert f[0]["phase"] == "decode" and f[0]["evidence"]["short_kernels_per_step"] > 100
    assert not any(x["phase"] == "prefill" for x in sglang.get("F005", []))


def test_decode_gpu_idle(dense, tp2) -> None:
    f = dense["F006"][0]
    assert f["severity"] == "critical" and f["evidence"]["idle_fraction"] > 0.5
    assert "F006" not in tp2  # CUDA-graph decode keeps the GPU busy


def test_moe_gate_sort_share(dense) -> None:
    f = _ids([H200_MOE])["F007"]
    # the prefill's routing and token sort is a real share; the decode's per-token gathers of expert
    # weights are expert work (STR050), so no decode "gate + sort" finding advises fusing top-k and sort
    assert any(x["phase"] == "prefill" and x["evidence"]["share_of_phase"] > 0.10 for x in f)
    assert not any(x["phase"] == "decode" for x in f)
    assert "F007" not in dense


def test_communication_not_overlapped(tp2, dense) -> None:
    f = tp2["F008"]
    assert any(x["phase"] == "prefill" for x in f)
    assert "F008" not in dense


def test_unclassified_time(tmp_path: Path, dense) -> None:
    assert "F009" not in dense
    edited = _edited(tmp_path, H200_DENSE, {"nvjet_": "zz_mystery_"})
    f = _ids([edited])["F009"]
    assert f[0]["evidence"]["share_of_run"] > 0.3


def test_findings_are_ordered_by_severity(dense) -> None:
    a = analyze_paths([str(H200_DENSE)])
    order = {"critical": 0, "warning": 1, "info": 2}
    sev = [order[f["severity"]] for f in a.findings]
    assert sev == sorted(sev)


def test_settings_overrides_and_errors() -> None:
    cfg = load_finding_settings({"decode_gpu_idle.max_idle": "0.9"})
    assert cfg["decode_gpu_idle"]["max_idle"] == 0.9
    with pytest.raises(UsageError):
        load_finding_settings({"decode_gpu_idle.nope": "1"})
    with pytest.raises(UsageError):
        load_finding_settings({"decode_gpu_idle.max_idle": "high"})
    assert "F006" not in _ids([H200_DENSE], **{"decode_gpu_idle.max_idle": "0.95"})


# ------------------------------------------------------------------ advice agrees with the evidence


@pytest.fixture(scope="module")
def sglang_graph_decode() -> dict[str, list[dict]]:
    return _ids([shared("mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_decode.json.gz")])


def test_idle_advice_on_graph_replayed_decode_does_not_ask_for_graphs(sglang_graph_decode) -> None:
    # GIVEN a decode trace whose kernels are ~99% replayed from HIP graphs, with the GPU idle
    f = sglang_graph_decode["F006"][0]
    # THEN the finding records the replay share and does not advise capturing graphs again
    assert f["evidence"]["graph_replayed"] > 0.95
    assert "graph" in f["suggestion"].lower()
    assert "capture decode in cuda/hip graphs" not in f["suggestion"].lower()
    for x in sglang_graph_decode.get("F005", []):
        assert x["evidence"]["graph_replayed"] > 0.95
        assert "capture the step in a cuda/hip graph" not in x["suggestion"].lower()


def test_idle_advice_on_eager_decode_asks_for_graphs(dense) -> None:
    f = dense["F006"][0]
    assert f["evidence"]["graph_replayed"] < 0.05
    assert "cuda/hip graphs" in f["suggestion"].lower()


def test_same_kernel_advice_fits_the_kernel_kind(sglang, dense) -> None:
    # GIVEN F001 findings on norm / activation / RoPE / KV-store kernels (and GEMMs where present)
    stretched = [x for found in (sglang, dense) for x in found.get("F001", []) if x["evidence"]["stretched"]]
    small = [x for x in stretched if x["evidence"]["stage"] not in GEMM_STAGES]
    assert {x["evidence"]["stage"] for x in small} >= {"norm", "activation", "rope"}
    # THEN the small kernels get launch / fusion advice, never GEMM tiling advice
    for x in small:
        s = x["suggestion"].lower()
        assert "split-k" not in s and "tile" not in s, x["title"]
        assert "fus" in s, x["title"]
        # ... and, since that advice calls one kernel for both phases normal, they are information
        assert x["severity"] == "info" and "normal" in x["title"], x["title"]
        article = "An" if x["evidence"]["stage"][0] in "aeiou" else "A"
        assert x["suggestion"].startswith(f"{article} {x['evidence']['stage']} kernel"), x["suggestion"]
    for x in stretched:
        if x["evidence"]["stage"] in GEMM_STAGES:
            assert "split-k" in x["suggestion"].lower()


@pytest.mark.parametrize(("stage", "article"), [("activation", "An"), ("norm", "A"), ("rope", "A")])
def test_same_kernel_advice_has_its_article(stage: str, article: str) -> None:
    from analyzer.analyses.findings import _same_kernel_advice

    assert _same_kernel_advice(stage, 0.0).startswith(f"{article} {stage} kernel sizes its grid")


# --------------------------------------------------------------------------- issue 34: the stages a finding names

_STAGES = sorted((s for s in TAXONOMY.stage_category if s != "other"), key=len, reverse=True)
_STAGE_WORD = re.compile(r"\b(" + "|".join(_STAGES) + r")\b")  # "other" is also an English word


@pytest.mark.parametrize("case", ["fp8-row-llama-bf16", "liger-fp8-row-llama-bf16", "int4-wo-llama-bf16"])
def test_findings_name_only_the_stages_the_rules_gave(case: str) -> None:
    # GIVEN a quantized capture whose activation quantization kernels are `quantize` (STR049)
    a = analyze_paths([str(FIXTURES / "libraries" / case / "trace.json.gz")])
    k = a.kernels.to_pandas()
    k["stage"] = k["stage"].astype(str)
    quantize_groups = set(k.loc[k["stage"] == "quantize", "group_key"])
    assert a.findings and (quantize_groups or case.startswith("int4"))
    for f in a.findings:
        mine = k[k["phase"] == f["phase"]] if f["phase"] in ("prefill", "decode") else k
        named = set(_STAGE_WORD.findall(f"{f['title']} {f['suggestion']}"))
        # THEN every stage a finding names is one the classification gave kernels of its phase
        assert named <= set(mine["stage"]), f"{f['id']}: {f['title']} names {named - set(mine['stage'])}"
        # AND the stage its evidence holds is that of the kernels it is about
        if "stage" in f["evidence"]:
            assert f["evidence"]["stage"] in set(k.loc[k["group_key"].isin(f["group_keys"]), "stage"])
        by_stage = f["evidence"].get("by_stage") or {}
        assert set(by_stage) <= set(mine["stage"])
        if by_stage:  # a finding over several stages names those its evidence counts, the largest first
            assert named <= set(by_stage), f"{f['id']}: {f['title']} names {named - set(by_stage)}"
            assert next(iter(by_stage)) in named, f"{f['id']}: {f['title']} leaves out {next(iter(by_stage))}"
        # AND no finding about quantize kernels calls them attention
        if quantize_groups & set(f["group_keys"]):
            assert not named & set(ATTENTION_STAGES), f"{f['id']}: {f['title']}"
