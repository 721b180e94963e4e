"""Tests for analyzer/hardware.py and rules/hardware.toml: the table's schema and detection."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from analyzer.errors import InputError
from analyzer.knowledge.hardware import (
    DTYPES,
    arch_from_compute,
    arch_key,
    detect_gpu,
    find_gpu,
    load_hardware,
    normalize_dtype,
    peak_tbps,
    peak_tflops,
    ridge_point,
    vendor_of,
)

TABLE = load_hardware()
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


# ------------------------------------------------------------------------------- the table


@pytest.mark.parametrize("key", sorted(TABLE))
def test_every_entry_is_complete_and_sourced(key):
    spec = TABLE[key]
    assert spec.name and spec.vendor in ("nvidia", "amd")
    assert arch_key(spec.arch) is not None and arch_key(spec.arch)[0] == spec.vendor
    assert spec.sm_count > 0 and spec.memory_bytes > 0 and spec.hbm_tbps > 0
    assert spec.l2_bytes is None or spec.l2_bytes > 0
    assert len(spec.source) > 40, "source must name the datasheet and say what was halved"
    assert {"fp32", "bf16", "fp16"} <= set(spec.peaks), "every GPU has fp32/bf16/fp16 peaks"
    assert set(spec.peaks) <= set(DTYPES)
    assert spec.match or spec.aliases


@pytest.mark.parametrize("key", sorted(TABLE))
def test_peaks_are_dense_and_ordered(key):
    p = TABLE[key].peaks
    # Lower precision is never slower; a sparse number copied by mistake usually breaks bf16 < fp8.
    assert p["fp32"] <= p["bf16"]
    if "tf32" in p:
        assert p["tf32"] <= p["bf16"]
    if "fp8" in p:
        assert p["bf16"] < p["fp8"]
    if "fp4" in p:
        assert p.get("fp8", p["bf16"]) <= p["fp4"]
    assert p["fp16"] == pytest.approx(p["bf16"])


@pytest.mark.parametrize("key", sorted(TABLE))
def test_ridge_point_positive(key):
    spec = TABLE[key]
    for dtype in spec.peaks:
        ridge = ridge_point(spec, dtype)
        assert ridge is not None and ridge > 0
    # Inference GPUs: the bf16 ridge sits between 50 and 1,000 FLOP/byte.
    assert 50 < ridge_point(spec, "bf16") < 1000


def test_known_dense_values():
    # Datasheets print these with sparsity: 1,979* (H200 BF16), 5,229.8 (MI300X FP8 sparse).
    assert TABLE["h200"].peaks["bf16"] == pytest.approx(989.4, rel=1e-3)
    assert TABLE["h100-sxm"].peaks["fp8"] == pytest.approx(1978.9, rel=1e-3)
    assert TABLE["mi300x"].peaks["fp8"] == pytest.approx(2614.9, rel=1e-3)
    assert TABLE["b200"].peaks["fp4"] == pytest.approx(9000)
    # MI250: per-GCD numbers, half of the 362.1 TFLOP/s package figure.
    assert TABLE["mi250-gcd"].peaks["bf16"] == pytest.approx(362.1 / 2)
    assert TABLE["mi250-gcd"].sm_count == 104 and TABLE["mi250x-gcd"].sm_count == 110


def test_h200_measured_ceilings():
    h200 = TABLE["h200"]
    assert "calibration" in h200.measured_source
    assert peak_tflops(h200, "bf16", measured=True) == pytest.approx(789.7, abs=0.1)
    assert peak_tbps(h200, measured=True) == pytest.approx(4.28, abs=0.01)
    # No measured fp8: falls back to the datasheet.
    assert peak_tflops(h200, "fp8", measured=True) == h200.peaks["fp8"]
    assert ridge_point(h200, "bf16", measured=True) == pytest.approx(789.7 / 4.28, rel=1e-3)


def test_load_hardware_rejects_bad_tables(tmp_path):
    bad = tmp_path / "hw.toml"
    bad.write_text('[gpu.x]\nname = "X"\nvendor = "intel"\n')
    with pytest.raises(InputError, match="vendor"):
        load_hardware(bad)
    bad.write_text("[gpu.x\n")
    with pytest.raises(InputError, match="cannot read"):
        load_hardware(bad)
    with pytest.raises(InputError):
        load_hardware(tmp_path / "missing.toml")


# ------------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("name", "arch", "sms", "mem", "key"),
    [
        # real trace metadata (shared/traces) first
        ("NVIDIA H200", "sm_90", 132, 150109880320, "h200"),
        ("NVIDIA B300 SXM6 AC", "sm_103", 148, 287416123392, "b300"),
        ("AMD Instinct MI300X", "gfx942", 304, 206141652992, "mi300x"),
        ("", "gfx942", 304, 206141652992, "mi300x"),
        ("AMD Radeon Graphics", "gfx90a", 104, 68702699520, "mi250-gcd"),
        ("AMD Radeon AI PRO R9700", "gfx1201", 64, 32061259776, "r9700"),
        # same arch and SM count, memory decides
        ("NVIDIA H100 80GB HBM3", "sm_90", 132, 85031714816, "h100-sxm"),
        ("", "sm_90", 132, 85031714816, "h100-sxm"),
        ("", "sm_90", 132, 150109880320, "h200"),
        ("", "gfx942", 304, 256 * 2**30, "mi325x"),
        ("AMD Instinct MI325X", "gfx942", 304, 256 * 2**30, "mi325x"),
        # a more specific name wins; SM count separates variants
        ("NVIDIA H100 PCIe", "sm_90", 114, 85031714816, "h100-pcie"),
        ("NVIDIA A100-SXM4-40GB", "sm_80", 108, 42505273344, "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "sm_80", 108, 85198045184, "a100-80gb"),
        ("AMD Instinct MI250X / MI250", "gfx90a", 110, 68702699520, "mi250x-gcd"),
        ("AMD Instinct MI250X / MI250", "gfx90a", 104, 68702699520, "mi250-gcd"),
        ("NVIDIA GeForce RTX 5090", "sm_120", 170, 33666170880, "rtx-5090"),
        # dotted compute capability and arch suffixes
        ("NVIDIA H200", "9.0", 132, 150109880320, "h200"),
        ("", "gfx942:sramecc+:xnack-", 304, 206141652992, "mi300x"),
        # name only (nsys CSV exports carry nothing else)
        ("NVIDIA H200", None, None, None, "h200"),
    ],
)
def test_detect(name, arch, sms, mem, key):
    spec, reason = detect_gpu(name, arch, sms, mem)
    assert spec is not None, reason
    assert spec.key == key, reason
    assert "\n" not in reason and spec.name in reason


def test_detect_reasons_name_what_was_matched():
    _, reason = detect_gpu("NVIDIA H200", "sm_90", 132, 150109880320)
    assert "matched name 'NVIDIA H200'" in reason and "132 SMs" in reason
    _, reason = detect_gpu("AMD Radeon Graphics", "gfx90a", 104, 68702699520)
    assert "arch, SM/CU count and memory" in reason and "104 CUs" in reason
    assert "MI210" in reason, "ties with identical per-device figures are reported"


def test_detect_ambiguous_gfx950_prefers_first_listed():
    spec, reason = detect_gpu("", "gfx950", 256, 288 * 2**30)
    assert spec.key == "mi355x" and "MI350X" in reason
    spec, _ = detect_gpu("AMD Instinct MI350X", "gfx950", 256, 288 * 2**30)
    assert spec.key == "mi350x"


@pytest.mark.parametrize(
    ("name", "arch", "sms", "mem"),
    [
        ("NVIDIA GeForce RTX 4090", "sm_89", 128, 25757220864),
        ("AMD Radeon Graphics", "gfx90a", 120, 34342961152),  # MI100-like: not in the table
        ("NVIDIA H100 NVL", "sm_90", 132, 100485038080),  # name says H100, memory does not
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "sm_90", 60, 42949672960),  # a MIG slice
        ("AMD Instinct MI300X", "gfx942", 38, 25769803776),  # CPX partition
        ("", "gfx942", None, None),  # too little to go on
        ("", None, None, None),
    ],
)
def test_detect_unknown(name, arch, sms, mem):
    spec, reason = detect_gpu(name, arch, sms, mem)
    assert spec is None
    assert reason.startswith("unknown GPU") and "\n" not in reason


def test_detect_unknown_reason_lists_what_the_trace_said():
    _, reason = detect_gpu("AMD Radeon Graphics", "gfx90a", 120, 34342961152)
    assert reason == "unknown GPU 'AMD Radeon Graphics' gfx90a 120 CUs 32 GiB"


def _device_properties(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f).get("deviceProperties", [])


@pytest.mark.parametrize(
    ("relpath", "vendor", "key"),
    [
        ("h200-llama3-8b-dense/trace.json.gz", "cuda", "h200"),
        ("mi250-hta-minitoy/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "rocm", "mi250-gcd"),
        ("mi300x-vllm-gptoss-decode-fullgraph/graph_execution.json.gz", "rocm", "mi300x"),
        (
            "sglang-deepseek-llama8b-decode-mi300x-vs-b300/B300/1782843274.7730265-TP-0-DECODE.trace.json.gz",
            "cuda",
            "b300",
        ),
    ],
)
def test_detect_from_real_trace_metadata(relpath, vendor, key):
    path = SHARED / relpath
    if not path.exists():
        pytest.skip(f"{path} absent (../shared not beside the checkout)")
    props = _device_properties(path)[0]
    arch = arch_from_compute(vendor, props["computeMajor"], props["computeMinor"])
    spec, reason = detect_gpu(props["name"], arch, props["numSms"], props["totalGlobalMem"])
    assert spec is not None and spec.key == key, reason


# --------------------------------------------------------------------------- --gpu lookup


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("h200", "h200"),
        ("H200", "h200"),
        ("NVIDIA H200", "h200"),
        ("mi300x", "mi300x"),
        ("MI300X", "mi300x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("h100", "h100-sxm"),
        ("H100 PCIe", "h100-pcie"),
        ("b300", "b300"),
        ("mi250", "mi250-gcd"),
        ("mi355x", "mi355x"),
        ("a100", "a100-80gb"),
        ("rtx_5090", "rtx-5090"),
        ("r9700", "r9700"),
    ],
)
def test_find_gpu(query, key):
    spec = find_gpu(query)
    assert spec is not None and spec.key == key


def test_find_gpu_unknown():
    assert find_gpu("tpu-v5e") is None
    assert find_gpu("") is None


def test_aliases_are_unique():
    seen: dict[str, str] = {}
    for spec in TABLE.values():
        for alias in (spec.key, spec.name, *spec.aliases):
            compact = "".join(ch for ch in alias.lower() if ch.isalnum())
            assert seen.setdefault(compact, spec.key) == spec.key, f"{alias!r} names two GPUs"


# ------------------------------------------------------------------------------ arch, dtype


@pytest.mark.parametrize(
    ("hint", "major", "minor", "arch"),
    [
        ("cuda", 9, 0, "sm_90"),
        ("NVIDIA B300 SXM6 AC", 10, 3, "sm_103"),
        ("nvidia", 10, 0, "sm_100"),
        ("nvidia", 12, 0, "sm_120"),
        ("rocm", 9, 4, "gfx942"),
        ("rocm", 9, 0, "gfx90a"),
        ("hip", 9, 5, "gfx950"),
        ("AMD Radeon AI PRO R9700", 12, 0, "gfx1201"),
        ("amd", 10, 3, "gfx1030"),
        (None, 9, 0, None),
        ("", 9, 4, None),
        ("cuda", None, 0, None),
    ],
)
def test_arch_from_compute(hint, major, minor, arch):
    assert arch_from_compute(hint, major, minor) == arch


def test_arch_key_and_vendor():
    assert arch_key("sm_90a") == ("nvidia", 9, 0)
    assert arch_key("gfx90a") == ("amd", 9, 0)
    assert arch_key("gfx1201") == ("amd", 12, 0)
    assert arch_key("9.4") == (None, 9, 4)
    assert arch_key("hopper") is None
    assert vendor_of("AMD Radeon Graphics") == "amd"
    assert vendor_of("NVIDIA H200") == "nvidia"
    assert vendor_of("sm_90") == "nvidia"
    assert vendor_of("") is None


@pytest.mark.parametrize(
    ("spelling", "norm"),
    [
        ("c10::BFloat16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("float", "fp32"),
        ("c10::Half", "fp16"),
        ("half", "fp16"),
        ("c10::Float8_e4m3fn", "fp8"),
        ("c10::Float8_e5m2fnuz", "fp8"),
        ("float8_e4m3fnuz", "fp8"),
        ("c10::Float4_e2m1fn_x2", "fp4"),
        ("mxfp4", "fp4"),
        ("signed char", "int8"),
        ("xf32", "tf32"),
        ("double", None),
        ("long int", None),
        ("", None),
        (None, None),
    ],
)
def test_normalize_dtype(spelling, norm):
    assert normalize_dtype(spelling) == norm


def test_peak_tflops_by_any_spelling():
    h200 = TABLE["h200"]
    assert peak_tflops(h200, "c10::BFloat16") == h200.peaks["bf16"]
    assert peak_tflops(h200, "fp4") is None, "Hopper has no FP4 path"
    assert peak_tflops(TABLE["a100-80gb"], "c10::Float8_e4m3fn") is None
    assert peak_tflops(h200, "double") is None
    assert ridge_point(TABLE["mi250-gcd"], "fp8") is None
