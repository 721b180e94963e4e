"""``capture``: a real CPU capture of a tiny decoder, the annotations it writes, the reference decoder,
the one-line errors, and the bundled H200 capture's phase split (with and without its annotations).

Tests that run torch skip when it is not importable (``pip install 'llm-kernel-map[capture]'``).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from analyzer.analyses.phases import parse_annotation
from analyzer.cli import main
from analyzer.errors import InputError, UsageError
from analyzer.knowledge.annotations import load_annotation_patterns

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}
TINY_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200-capture-llama3-8b"


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("model") / "config.json"
    p.write_text(json.dumps(TINY))
    return p


@pytest.fixture(scope="module")
def cpu_capture(torch, tiny_config: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """GIVEN a tiny config WHEN captured on the CPU (batch 2, prompt 8, 3 new tokens)."""
    out = tmp_path_factory.mktemp("capture")
    trace, meta = out / "trace.json.gz", out / "meta.json"
    rc = main(
        [
            "capture",
            "--model",
            str(tiny_config),
            "--batch",
            "2",
            "--prompt",
            "8",
            "--new-tokens",
            "3",
            "--device",
            "cpu",
            "--dtype",
            "fp32",
            "-o",
            str(trace),
            "--meta",
            str(meta),
        ]
    )
    assert rc == 0
    return trace, json.loads(meta.read_text())


def _events(trace: Path) -> list[dict]:
    with gzip.open(trace, "rt") as f:
        return json.load(f)["traceEvents"]


# ------------------------------------------------------------------------------- the CPU capture


def test_capture_writes_gzip_kineto_trace_with_shapes(cpu_capture) -> None:
    trace, meta = cpu_capture
    assert trace.read_bytes()[:2] == b"\x1f\x8b"
    ops = [e for e in _events(trace) if e.get("cat") == "cpu_op"]
    with_dims = [e for e in ops if e.get("args", {}).get("Input Dims")]
    assert len(with_dims) > 0.5 * len(ops)
    names = {e["name"] for e in with_dims}
    assert {"aten::mm", "aten::scaled_dot_product_attention"} <= names or "aten::linear" in names
    assert meta["layers"] == 2 and meta["batch"] == 2 and meta["prompt"] == 8 and meta["new_tokens"] == 3


def test_capture_annotates_one_prefill_and_two_decode_steps(cpu_capture) -> None:
    trace, meta = cpu_capture
    anns = sorted(
        (e for e in _events(trace) if str(e.get("name", "")).startswith("lkm::step")), key=lambda e: e["ts"]
    )
    assert [e["name"] for e in anns] == [
        "lkm::step phase=prefill q=8 bs=2 kv=8",
        "lkm::step phase=decode q=1 bs=2 kv=9",
        "lkm::step phase=decode q=1 bs=2 kv=10",
    ]
    assert meta["steps"] == [e["name"] for e in anns]
    parsed = [parse_annotation(e["name"], load_annotation_patterns()) for e in anns]
    assert [(a.engine, a.phase, a.tokens) for a in parsed] == [
        ("lkm", "prefill", 16),
        ("lkm", "decode", 2),
        ("lkm", "decode", 2),
    ]
    # every step holds its forward: the step ranges do not overlap and each contains GEMM ops
    ops = [e for e in _events(trace) if e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::addmm")]
    for a, b in zip(anns, anns[1:], strict=False):
        assert a["ts"] + a["dur"] <= b["ts"]
    for a in anns:
        assert any(a["ts"] <= o["ts"] < a["ts"] + a["dur"] for o in ops), a["name"]


def test_cpu_trace_has_no_gpu_activity(cpu_capture) -> None:
    from analyzer.readers import read_trace

    with pytest.raises(InputError, match="no GPU activity recorded"):
        read_trace(cpu_capture[0])


def test_analyze_cpu_trace_exits_2_with_one_line(cpu_capture, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["analyze", str(cpu_capture[0])])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "no GPU activity recorded" in err[0]


def test_capture_analyze_flag_reports_the_same_error(
    torch, tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "capture",
            "--model",
            str(tiny_config),
            "--batch",
            "1",
            "--prompt",
            "4",
            "--new-tokens",
            "2",
            "--device",
            "cpu",
            "--dtype",
            "fp32",
            "--backend",
            "reference",
            "-o",
            str(tmp_path / "t.json.gz"),
            "--analyze",
        ]
    )
    assert rc == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("no GPU activity recorded (no kernel, memcpy or memset events)")
    )


# ------------------------------------------------------------------------------- errors


def test_without_torch_capture_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    rc = main(["capture", "--model", "llama-3-8b", "-o", str(tmp_path / "t.json.gz")])
    assert rc == 2
    assert (
        capsys.readouterr().err.strip() == "error: capture needs torch: pip install 'llm-kernel-map[capture]'"
    )


def test_capture_rejects_bad_output_name_and_unknown_model(
    torch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["capture", "--model", "llama-3-8b", "-o", str(tmp_path / "t.txt")]) == 2
    # (--device cpu: on a machine without a GPU, the missing GPU would be reported first)
    assert (
        main(["capture", "--model", "no-such-model", "--device", "cpu", "-o", str(tmp_path / "t.json")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "must end in .json" in err[0] and "unknown model 'no-such-model'" in err[1]


# ------------------------------------------------------------------------------- Python API


def test_annotation_names_parse_back(torch) -> None:
    from analyzer.capture.profile import annotation_name, describe_batch

    assert annotation_name("mixed", 5, 4, 900) == "lkm::step phase=mixed q=5 bs=4 kv=900"
    assert annotation_name("decode", bs=8) == "lkm::step phase=decode bs=8"
    got = parse_annotation(annotation_name("mixed", 5, 4, 900), load_annotation_patterns())
    assert (got.engine, got.phase, got.tokens) == ("lkm", "mixed", 20)
    with pytest.raises(UsageError):
        annotation_name("warmup")
    assert describe_batch([1, 1, 1], [10, 20, 30]) == ("decode", 1, 3, 30)
    assert describe_batch([512, 128], [512, 128]) == ("prefill", 320, 2, 512)
    assert describe_batch([1, 1, 62], [40, 41, 62]) == ("mixed", 21, 3, 62)


def test_annotate_step_wraps_each_call(torch) -> None:
    from analyzer.capture.profile import annotate_step, profile_steps

    @annotate_step(lambda n: ("prefill", n, 1, n) if n > 1 else ("decode", 1, 1, None))
    def forward(n: int) -> int:
        return int(torch.ones(n).sum())

    with profile_steps(None, cuda=False) as prof:
        assert [forward(4), forward(1)] == [4, 1]
    names = [e.name for e in prof.events() if e.name.startswith("lkm::")]
    assert names == ["lkm::step phase=prefill q=4 bs=1 kv=4", "lkm::step phase=decode q=1 bs=1"]


# ------------------------------------------------------------------------------- reference decoder


@pytest.mark.parametrize("config", [TINY, TINY_MOE], ids=["dense", "moe"])
def test_reference_decoder_cache_matches_full_recompute(torch, tmp_path: Path, config: dict) -> None:
    """Decoding with the KV cache gives the logits of recomputing the whole sequence."""
    from analyzer.capture.model import build_model, greedy_generate, random_prompt

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    lm = build_model(str(path), device="cpu", dtype="fp32", backend="reference")
    assert lm.backend == "reference"
    ids = random_prompt(lm, 2, 6)
    out = greedy_generate(lm, ids, 4)
    assert out.shape == (2, 4)
    full = torch.cat([ids, out[:, :-1]], dim=1)
    lm.reset(2, full.shape[1])
    logits = lm.step(full)
    assert torch.equal(logits.argmax(-1), out[:, -1])
    assert torch.isfinite(logits).all()


def test_reference_decoder_truncates_builtin_layers(torch) -> None:
    from analyzer.capture.model import resolve_model

    ms = resolve_model("llama-3-8b", layers=2)
    assert ms.arch.num_hidden_layers == 2 and ms.arch.hidden_size == 4096
    assert ms.config is not None and ms.config["num_hidden_layers"] == 2
    assert ms.config["model_type"] == "llama"


# ------------------------------------------------------------------------------- the H200 capture
# `llm-kernel-map capture --model llama-3-8b --layers 8 --batch 4 --prompt 512 --new-tokens 16
#  --device cuda --dtype bf16` on an H200 (transformers 5.17, torch 2.11): docs/capture.md

needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "trace.json.gz").exists(), reason="H200 capture fixture absent"
)


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _truth(data: dict) -> dict[int, str]:
    """Correlation id -> phase of the GPU-side lkm::step range each GPU activity starts in, read
    straight from the JSON (no analyzer code): what the capture itself says."""
    events = data["traceEvents"]
    ranges = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"].split()[1].removeprefix("phase="))
        for e in events
        if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("lkm::step")
    )
    out = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            hit = [p for lo, hi, p in ranges if lo <= e["ts"] < hi]
            out[e["args"]["correlation"]] = hit[0] if hit else "unknown"
    return out


def _phase_by_correlation(a) -> dict[int, str]:
    k = a.kernels.select(["correlation", "phase"]).to_pydict()
    return dict(zip(k["correlation"], k["phase"], strict=True))


@needs_fixture
def test_h200_capture_phases_follow_its_annotations() -> None:
    """Every kernel gets the phase of the step annotation it ran in; steps carry q x bs tokens."""
    from tests.runs import analyze_paths

    meta = json.loads((FIXTURE / "meta.json").read_text())
    a = analyze_paths([str(FIXTURE / "trace.json.gz")])
    assert a.annotations_found == ["lkm"]
    steps = a.steps.sort_values("start_ns")
    decode_steps = meta["new_tokens"] - 1
    assert steps["phase"].tolist() == ["prefill"] + ["decode"] * decode_steps
    assert steps["tokens"].tolist() == [meta["batch"] * meta["prompt"]] + [meta["batch"]] * decode_steps
    truth = _truth(_raw(FIXTURE / "trace.json.gz"))
    got = _phase_by_correlation(a)
    wrong = {c: (got[c], p) for c, p in truth.items() if got[c] != p}
    assert not wrong, (
        f"{len(wrong)} of {len(truth)} GPU activities off their annotated phase: {list(wrong.items())[:5]}"
    )


@needs_fixture
def test_h200_capture_unannotated_split_agrees(tmp_path: Path) -> None:
    """Without its lkm annotations the analyzer finds the same 16 steps, phases and token counts on
    its own; only the one kernel launched after the last step (the torch.cat of the generated ids)
    joins that step."""
    from tests.runs import analyze_paths

    data = _raw(FIXTURE / "trace.json.gz")
    truth = _truth(data)
    data["traceEvents"] = [e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("lkm::")]
    stripped = tmp_path / "stripped.json.gz"
    with gzip.open(stripped, "wt") as f:
        json.dump(data, f)
    own = analyze_paths([str(stripped)])
    assert own.annotations_found == []
    meta = json.loads((FIXTURE / "meta.json").read_text())
    steps = own.steps.sort_values("start_ns")
    assert steps["phase"].tolist() == ["prefill"] + ["decode"] * (meta["new_tokens"] - 1)
    assert steps["tokens"].tolist() == [meta["batch"] * meta["prompt"]] + [meta["batch"]] * (
        meta["new_tokens"] - 1
    )
    got = _phase_by_correlation(own)
    wrong = {c: (got[c], p) for c, p in truth.items() if got[c] != p}
    assert len(wrong) <= 1 and all(p == "unknown" for _, p in wrong.values()), list(wrong.items())[:5]


@needs_fixture
def test_h200_capture_classification_and_roofline_match_the_annotations() -> None:
    """Every kernel is classified; shape-derived GEMM and attention FLOPs per step equal what the
    step annotation's q, bs and kv imply for the architecture in meta.json."""
    from analyzer.knowledge.architectures import load_model
    from tests.runs import analyze_paths

    meta = json.loads((FIXTURE / "meta.json").read_text())
    arch, layers, bs = load_model("llama-3-8b"), meta["layers"], meta["batch"]
    a = analyze_paths([str(FIXTURE / "trace.json.gz")])
    k = a.kernels.to_pandas()
    assert (k["stage"] == "other").sum() == 0
    weights = sum(kk * n for r, (kk, n) in arch.gemm_shapes().items() if r != "lm_head_gemm")
    lm_head = arch.hidden_size * arch.vocab_size
    heads, kv_heads, d = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    gemms = k[k["stage"].isin(["qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm", "lm_head_gemm"])]
    attention = k[k["stage"] == "flash_attention"]
    for step, name in enumerate(meta["steps"]):
        q, kv = (int(re.search(rf"\b{key}=(\d+)", name).group(1)) for key in ("q", "kv"))
        # the LM head runs on the last position only (logits_to_keep=1)
        want = 2 * q * bs * layers * weights + 2 * bs * lm_head
        assert gemms.loc[gemms["step"] == step, "flops"].sum() == pytest.approx(want, rel=1e-9), name
        # the causal convention: a prompt counts the q (q + 1) / 2 pairs its mask keeps, decode every key
        pairs = q * (q + 1) / 2 if q == kv and q > 1 else q * kv
        want_attn = layers * 2 * bs * heads * pairs * 2 * d
        assert attention.loc[attention["step"] == step, "flops"].sum() == pytest.approx(
            want_attn, rel=1e-9
        ), name
        want_bytes = layers * 2 * (bs * heads * q * d * 2 + 2 * bs * kv_heads * kv * d)
        assert attention.loc[attention["step"] == step, "bytes"].sum() == pytest.approx(
            want_bytes, rel=1e-9
        ), name


def test_fixture_meta_describes_its_capture() -> None:
    if not (FIXTURE / "meta.json").exists():
        pytest.skip("H200 capture fixture absent")
    meta = json.loads((FIXTURE / "meta.json").read_text())
    assert all(re.match(r"^lkm::step phase=(prefill|decode) q=\d+ bs=\d+ kv=\d+$", s) for s in meta["steps"])
    assert len(meta["steps"]) == meta["new_tokens"]


def test_capture_without_a_gpu_stops_unless_the_cpu_is_asked_for(
    torch, tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    # GIVEN a machine whose torch sees no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "t.json.gz"
    args = ["capture", "--model", str(tiny_config), "--new-tokens", "2", "--prompt", "4", "-o", str(out)]
    # WHEN capture runs without --device THEN it stops with one line and writes nothing
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "no GPU" in err[0] and "--device cpu" in err[0]
    assert not out.exists()
    # AND --device cuda says the same
    assert main([*args, "--device", "cuda"]) == 2
    assert "no GPU" in capsys.readouterr().err
