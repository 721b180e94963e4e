"""Host-op name -> stage for generic framework kernels (``rules/ops.toml``), validated against the taxonomy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analyzer.knowledge import loader
from analyzer.knowledge.taxonomy import load_taxonomy
from analyzer.paths import RULES_DIR

__all__ = ["OPS_TOML", "load_op_hints"]

OPS_TOML = RULES_DIR / "ops.toml"


def load_op_hints(path: str | Path = OPS_TOML) -> dict[str, str]:
    """``{host op name: stage}``, every stage one of ``rules/taxonomy.toml`` (a fresh dict per call)."""
    return dict(loader.load(path, _parse_op_hints))


def _parse_op_hints(doc: dict[str, Any], path: Path) -> dict[str, str]:
    unknown = sorted(set(doc) - {"stages"})
    if unknown:
        raise loader.fail(path, unknown[0], "unknown top-level key (ops.toml has one [stages] table)")
    stages = doc.get("stages", {})
    if not isinstance(stages, dict):
        raise loader.fail(path, "stages", "must be a table of stage = [host op names]")
    valid = load_taxonomy().stage_category
    out: dict[str, str] = {}
    for stage, names in stages.items():
        if stage not in valid:
            raise loader.fail(path, f"stages.{stage}", f"unknown stage {stage!r} (rules/taxonomy.toml)")
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise loader.fail(path, f"stages.{stage}", "must be a list of host op names")
        for n in names:
            if n in out:
                raise loader.fail(path, f"stages.{stage}", f"{n!r} is already listed under {out[n]!r}")
            out[n] = stage
    return out
