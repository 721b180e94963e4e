"""The GPU of a run: ``--gpu`` if given, else detected from the first input's metadata.

Contract: detection matches the name, arch, SM/CU count and memory together
(:func:`analyzer.knowledge.hardware.detect_gpu`); an unknown GPU comes back as None with the reason,
which says what the trace lacked. :func:`gpu_summary` is the summary's account of the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.knowledge import hardware


def resolve_gpu(
    inputs: Sequence[Any],
    override: tuple[hardware.GpuSpec, str] | None = None,
    table: Mapping[str, hardware.GpuSpec] | None = None,
) -> tuple[hardware.GpuSpec | None, str]:
    """The GPU of the run and how it was found: the override, or detected from the first input."""
    if override is not None:
        spec, named = override
        return spec, f"--gpu {named}"
    m = inputs[0]
    spec, reason = hardware.detect_gpu(m.gpu_name, m.arch, m.sm_count, m.total_memory, table)
    if spec is None and not m.gpu_name:
        # say what the trace lacked rather than quoting an empty name
        missing = [w for w, v in (("name", m.gpu_name), ("arch", m.arch), ("SM count", m.sm_count)) if not v]
        had = [f"{w} {v}" for w, v in (("arch", m.arch), ("SM/CU count", m.sm_count)) if v]
        reason = (
            f"no GPU {', '.join(missing[:-1])} or {missing[-1]} in the trace"
            if len(missing) > 1
            else "no GPU name in the trace"
        ) + (f" ({', '.join(had)}: too little to match)" if had else "")
    return spec, reason


def gpu_summary(spec: hardware.GpuSpec | None, reason: str) -> dict[str, Any]:
    if spec is None:
        return {"name": None, "arch": None, "peaks": {}, "reason": reason}
    peaks = {f"{d}_tflops": v for d, v in spec.peaks.items()}
    peaks["hbm_tbps"] = spec.hbm_tbps
    return {
        "name": spec.name,
        "key": spec.key,
        "arch": spec.arch,
        "peaks": peaks,
        "measured": dict(spec.measured),
        "source": spec.source,
        "reason": reason,
    }
