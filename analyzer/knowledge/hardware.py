"""GPU peaks from rules/hardware.toml, and detection of the GPU a trace ran on (docs/hardware.md).

Contract: :func:`load_hardware` is the only function that reads a file (through
:mod:`analyzer.knowledge.loader`); everything else is a pure
function of its arguments. Detection uses the device name, arch, SM/CU count and total memory
together, because names alone can be empty ("" on some ROCm builds) or generic
("AMD Radeon Graphics"), and arch + SM count alone cannot tell an H100 SXM from an H200 (both
sm_90 with 132 SMs) or an MI300X from an MI325X (both gfx942 with 304 CUs): memory can.
An unknown GPU is a result (``None`` plus a reason), never an error.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

from analyzer.errors import InputError
from analyzer.knowledge import loader
from analyzer.paths import RULES_DIR

HARDWARE_TOML = RULES_DIR / "hardware.toml"

#: Normalized dtype names that carry peaks.
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")
VENDORS = ("nvidia", "amd")

# A reported total within this fraction of the datasheet size is the same memory: drivers reserve
# some (B300: 268 GiB of 288; R9700: 29.9 GiB of 32); neighbours differ far more (80 vs 94 vs 141).
MEMORY_LOW, MEMORY_HIGH = 0.88, 1.02
GIB = 2**30
MIB = 2**20

# fmt: off
_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32", "c10::float": "fp32",
    "tf32": "tf32", "xf32": "tf32", "tensorfloat32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16", "c10::bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16", "c10::half": "fp16",
    "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "bf8": "fp8",
    "fp4": "fp4", "float4": "fp4", "e2m1": "fp4", "mxfp4": "fp4", "nvfp4": "fp4",
    "int8": "int8", "i8": "int8", "signed char": "int8", "char": "int8", "qint8": "int8",
}
# fmt: on


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One device of rules/hardware.toml; peaks are dense TFLOP/s (TOP/s for int8)."""

    key: str
    name: str
    vendor: str
    arch: str
    sm_count: int
    memory_bytes: int
    l2_bytes: int | None
    hbm_tbps: float
    peaks: dict[str, float]
    measured: dict[str, float]
    source: str
    measured_source: str = ""
    mall_bytes: int | None = None
    aliases: tuple[str, ...] = ()
    match: tuple[str, ...] = ()

    @property
    def unit_name(self) -> str:
        """What the vendor calls its compute units."""
        return "CUs" if self.vendor == "amd" else "SMs"


def load_hardware(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """Read and check the hardware table (default: rules/hardware.toml), keyed by entry key."""
    return dict(loader.load(path if path is not None else HARDWARE_TOML, _parse_hardware))


def _parse_hardware(data: dict[str, Any], path: Path) -> dict[str, GpuSpec]:
    gpus = data.get("gpu")
    if not isinstance(gpus, dict) or not gpus:
        raise loader.fail(path, "gpu", "no [gpu.<key>] tables")
    return {key: _spec_from_toml(key, entry, path) for key, entry in gpus.items()}


@functools.cache
def default_table() -> dict[str, GpuSpec]:
    """rules/hardware.toml, read once per process (:func:`load_hardware` of the built-in file)."""
    return load_hardware()


def _spec_from_toml(key: str, e: dict[str, Any], path: Path) -> GpuSpec:
    def need(field: str, kind: Any) -> Any:
        value = e.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InputError(f"{loader.display(path)}: gpu.{key}.{field} missing or not {_kind_name(kind)}")
        return value

    vendor = need("vendor", str)
    if vendor not in VENDORS:
        raise InputError(f"{loader.display(path)}: gpu.{key}.vendor {vendor!r} not in {VENDORS}")
    arch = need("arch", str)
    if arch_key(arch) is None:
        raise InputError(f"{loader.display(path)}: gpu.{key}.arch {arch!r} is not sm_XY or gfxXYZ")
    peaks_raw = need("peaks", dict)
    peaks: dict[str, float] = {}
    for dtype, value in peaks_raw.items():
        if dtype not in DTYPES or not isinstance(value, int | float) or value <= 0:
            raise InputError(
                f"{loader.display(path)}: gpu.{key}.peaks.{dtype} must be a positive number, dtype in {DTYPES}"
            )
        peaks[dtype] = float(value)
    measured_raw = dict(e.get("measured") or {})
    measured_source = str(measured_raw.pop("source", ""))
    if measured_raw and not measured_source:
        raise InputError(f"{loader.display(path)}: gpu.{key}.measured needs a source")
    for k, v in measured_raw.items():
        if k not in (*DTYPES, "hbm_tbps") or not isinstance(v, int | float) or v <= 0:
            raise InputError(
                f"{loader.display(path)}: gpu.{key}.measured.{k} must be a dtype or hbm_tbps, > 0"
            )
    measured = {k: float(v) for k, v in measured_raw.items()}
    l2_mb, mall_mb = e.get("l2_mb"), e.get("mall_mb")
    return GpuSpec(
        key=key,
        name=need("name", str),
        vendor=vendor,
        arch=arch,
        sm_count=need("sm_count", int),
        memory_bytes=int(need("memory_gb", int | float) * GIB),
        l2_bytes=int(l2_mb * MIB) if l2_mb is not None else None,
        hbm_tbps=float(need("hbm_tbps", int | float)),
        peaks=peaks,
        measured=measured,
        source=need("source", str),
        measured_source=measured_source,
        mall_bytes=int(mall_mb * MIB) if mall_mb is not None else None,
        aliases=tuple(e.get("aliases", ())),
        match=tuple(e.get("match", ())),
    )


def _kind_name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind)


# ------------------------------------------------------------------------------------------ arch


def arch_from_compute(vendor_hint: str | None, major: int | None, minor: int | None) -> str | None:
    """Arch string from a reported compute capability: CUDA (9, 0) -> "sm_90".

    On ROCm, Kineto's ``computeMajor/computeMinor`` are the GFXIP version: (9, 4) -> "gfx942",
    (9, 5) -> "gfx950", (12, 0) -> "gfx1201", (9, 0) -> "gfx90a" (MI200; gfx906/gfx908 report 9.0
    too, but they are not inference targets). The stepping is a guess for other versions and
    detection compares only major.minor. ``vendor_hint`` is anything naming the vendor: "cuda",
    "rocm", "hip", "nvidia", "amd", or a device name. Returns None when the vendor is unknown.
    """
    if major is None or minor is None:
        return None
    vendor = vendor_of(vendor_hint)
    if vendor == "nvidia":
        return f"sm_{major}{minor}"
    if vendor == "amd":
        known = {
            (9, 0): "gfx90a",
            (9, 4): "gfx942",
            (9, 5): "gfx950",
            (11, 0): "gfx1100",
            (12, 0): "gfx1201",
        }
        return known.get((major, minor), f"gfx{major}{minor:x}0")
    return None


def vendor_of(hint: str | None) -> str | None:
    """ "nvidia", "amd" or None from a vendor, runtime, arch or device name."""
    tokens = set(_tokens(hint or ""))
    nvidia = bool(tokens & {"nvidia", "cuda", "geforce", "tesla", "quadro", "rtx", "sm"}) or any(
        re.fullmatch(r"sm\d+[a-z]?", t) for t in tokens
    )
    amd = bool(tokens & {"amd", "rocm", "hip", "radeon", "instinct"}) or any(
        t.startswith("gfx") for t in tokens
    )
    if nvidia != amd:
        return "nvidia" if nvidia else "amd"
    return None


_SM = re.compile(r"^(?:sm_?|compute_?)(\d+?)(\d)[a-z]?$")
_GFX = re.compile(r"^gfx(\d+)([0-9a-f])([0-9a-f])$")
_DOTTED = re.compile(r"^(\d+)\.(\d+)$")


def arch_key(arch: str | None) -> tuple[str | None, int, int] | None:
    """(vendor, major, minor) of an arch string, the part detection compares.

    "sm_90a" -> ("nvidia", 9, 0); "gfx942:sramecc+:xnack-" -> ("amd", 9, 4); a bare "9.0" ->
    (None, 9, 0), which matches either vendor. None when the string is not an arch.
    """
    if not arch:
        return None
    text = arch.strip().lower().split(":", 1)[0]
    if m := _SM.match(text):
        return ("nvidia", int(m.group(1)), int(m.group(2)))
    if m := _GFX.match(text):
        return ("amd", int(m.group(1)), int(m.group(2), 16))
    if m := _DOTTED.match(text):
        return (None, int(m.group(1)), int(m.group(2)))
    return None


def _arch_matches(reported: str | None, spec: GpuSpec) -> bool:
    got, want = arch_key(reported), arch_key(spec.arch)
    if got is None or want is None:
        return True  # nothing to compare
    return (got[0] is None or got[0] == want[0]) and got[1:] == want[1:]


# -------------------------------------------------------------------------------------- lookup


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _compact(text: str) -> str:
    return "".join(_tokens(text))


def find_gpu(name: str, table: dict[str, GpuSpec] | None = None) -> GpuSpec | None:
    """The entry for ``--gpu NAME``: a key, alias or display name, ignoring case and punctuation."""
    table = table if table is not None else default_table()
    wanted = _compact(name)
    if not wanted:
        return None
    for spec in table.values():
        if wanted == _compact(spec.key) or wanted == _compact(spec.name):
            return spec
    for spec in table.values():
        if any(wanted == _compact(a) for a in spec.aliases):
            return spec
    return None


def _name_score(name: str, spec: GpuSpec) -> int:
    """Length of the longest ``match`` token sequence found in the device name (0: none)."""
    tokens = _tokens(name)
    best = 0
    for pattern in spec.match:
        want = _tokens(pattern)
        n = len(want)
        if n and any(tokens[i : i + n] == want for i in range(len(tokens) - n + 1)):
            best = max(best, n)
    return best


def _hardware_fits(spec: GpuSpec, arch: str | None, sm_count: int | None, total_memory: int | None) -> bool:
    if not _arch_matches(arch, spec):
        return False
    if sm_count and sm_count != spec.sm_count:
        return False
    if total_memory:
        ratio = total_memory / spec.memory_bytes
        if not MEMORY_LOW <= ratio <= MEMORY_HIGH:
            return False
    return True


def _describe(name: str | None, arch: str | None, sm_count: int | None, total_memory: int | None) -> str:
    parts = [f"'{name or ''}'"]
    if arch:
        parts.append(arch)
    if sm_count:
        unit = "CUs" if vendor_of(f"{name} {arch}") == "amd" else "SMs"
        parts.append(f"{sm_count} {unit}")
    if total_memory:
        parts.append(f"{total_memory / GIB:.0f} GiB")
    return " ".join(parts)


def detect_gpu(
    name: str | None,
    arch: str | None,
    sm_count: int | None,
    total_memory: int | None,
    table: dict[str, GpuSpec] | None = None,
) -> tuple[GpuSpec | None, str]:
    """The table entry a trace's device metadata describes, and a one-line reason.

    A device name that contains an entry's ``match`` tokens picks the candidates; arch, SM/CU
    count and memory (each only when reported) must then agree, otherwise the name is not trusted
    (a MIG slice or a partitioned MI300X reports fewer SMs/CUs and less memory than the whole GPU,
    and the datasheet peaks would not apply). When no name matches, arch + SM/CU count + memory
    together identify the device. Among equal candidates the longest name match, then the first
    entry of the table, wins.
    """
    table = table if table is not None else default_table()
    seen = _describe(name, arch, sm_count, total_memory)
    scored = [(s, _name_score(name or "", s)) for s in table.values()]
    named = [(s, score) for s, score in scored if score]
    if named:
        fitting = [(s, score) for s, score in named if _hardware_fits(s, arch, sm_count, total_memory)]
        if not fitting:
            names = ", ".join(s.name for s, _ in named)
            return None, (
                f"unknown GPU {seen}: the name suggests {names} but arch/"
                f"{named[0][0].unit_name}/memory differ (another variant, a MIG slice or a "
                "partition?); pass --gpu NAME to choose peaks"
            )
        top = max(score for _, score in fitting)
        best = [s for s, score in fitting if score == top]
        return best[0], _matched(f"matched name '{name}'", best, seen)
    if not (sm_count and total_memory):
        return (
            None,
            f"unknown GPU {seen}: name not in rules/hardware.toml and too little metadata to match",
        )
    fitting_hw = [s for s in table.values() if _hardware_fits(s, arch, sm_count, total_memory)]
    if not fitting_hw:
        return None, f"unknown GPU {seen}"
    return fitting_hw[0], _matched("matched arch, SM/CU count and memory", fitting_hw, seen)


def _matched(how: str, candidates: list[GpuSpec], seen: str) -> str:
    chosen = candidates[0]
    reason = f"{how} -> {chosen.name} ({seen})"
    if len(candidates) > 1:
        others = ", ".join(s.name for s in candidates[1:])
        reason += f"; also fits {others} (first listed wins; --gpu NAME to choose)"
    return reason


# --------------------------------------------------------------------------------------- peaks


def normalize_dtype(dtype: str | None) -> str | None:
    """A DTYPES name for a spelling such as "c10::BFloat16" or "float"; None if unknown."""
    if not dtype:
        return None
    text = dtype.strip().lower().removeprefix("torch.")
    if text in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[text]
    bare = text.removeprefix("c10::")
    if bare in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[bare]
    # Families with many variants: float8_e4m3fn(uz), float8_e5m2(fnuz), float4_e2m1fn_x2, ...
    for prefix, norm in (
        ("float8", "fp8"),
        ("fp8", "fp8"),
        ("float4", "fp4"),
        ("fp4", "fp4"),
        ("mxfp4", "fp4"),
    ):
        if bare.startswith(prefix):
            return norm
    return None


def peak_tflops(spec: GpuSpec, dtype: str, measured: bool = False) -> float | None:
    """Dense datasheet peak TFLOP/s for a dtype (any spelling), or the measured ceiling when
    ``measured`` and one exists. None when the dtype is unknown or the GPU has no such path."""
    norm = normalize_dtype(dtype)
    if norm is None:
        return None
    if measured and norm in spec.measured:
        return spec.measured[norm]
    return spec.peaks.get(norm)


def peak_tbps(spec: GpuSpec, measured: bool = False) -> float:
    """DRAM bandwidth in TB/s: datasheet, or the measured ceiling when asked for and known."""
    if measured and "hbm_tbps" in spec.measured:
        return spec.measured["hbm_tbps"]
    return spec.hbm_tbps


def ridge_point(spec: GpuSpec, dtype: str, measured: bool = False) -> float | None:
    """Arithmetic intensity (FLOP/byte) where the compute and bandwidth roofs meet for a dtype."""
    peak = peak_tflops(spec, dtype, measured)
    if peak is None:
        return None
    return peak / peak_tbps(spec, measured)
