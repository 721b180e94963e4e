"""Host-op name -> stage for generic framework kernels (``rules/ops.toml``), validated against the taxonomy.

The file is an ordered list of ``[[hint]]`` tables: ``id`` (``OPH###``), ``stage`` (one of
``rules/taxonomy.toml``), ``ops`` (host-op names, each listed once in the file) and ``note``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from analyzer.knowledge import loader
from analyzer.knowledge.taxonomy import load_taxonomy
from analyzer.paths import RULES_DIR

__all__ = ["OPS_TOML", "OpHint", "load_op_hint_rules", "load_op_hints", "op_hint_ids"]

OPS_TOML = RULES_DIR / "ops.toml"
_ID = re.compile(r"^OPH\d{3}$")


@dataclasses.dataclass(frozen=True)
class OpHint:
    """One hint: the host ops whose generic kernels take ``stage``."""

    id: str
    stage: str
    ops: tuple[str, ...]
    note: str


def load_op_hint_rules(path: str | Path = OPS_TOML) -> tuple[OpHint, ...]:
    """The hints of ``path`` in file order."""
    return loader.load(path, _parse_op_hints)


def load_op_hints(path: str | Path = OPS_TOML) -> dict[str, str]:
    """``{host op name: stage}``, every stage one of ``rules/taxonomy.toml`` (a fresh dict per call)."""
    return {op: h.stage for h in load_op_hint_rules(path) for op in h.ops}


def op_hint_ids(path: str | Path = OPS_TOML) -> dict[str, str]:
    """``{host op name: the id of the hint that lists it}``."""
    return {op: h.id for h in load_op_hint_rules(path) for op in h.ops}


def _parse_op_hints(doc: dict[str, Any], path: Path) -> tuple[OpHint, ...]:
    unknown = sorted(set(doc) - {"hint"})
    if unknown:
        raise loader.fail(path, unknown[0], "unknown top-level key (ops.toml has [[hint]] tables)")
    hints = doc.get("hint", [])
    if not isinstance(hints, list):
        raise loader.fail(path, "hint", "must be [[hint]] tables")
    valid = load_taxonomy().stage_category
    out: list[OpHint] = []
    owner: dict[str, str] = {}
    for i, h in enumerate(hints):
        where = f"hint {h.get('id', i) if isinstance(h, dict) else i}"
        if not isinstance(h, dict) or set(h) != {"id", "stage", "ops", "note"}:
            raise loader.fail(path, where, "must have exactly id, stage, ops and note")
        if not isinstance(h["id"], str) or not _ID.match(h["id"]) or any(x.id == h["id"] for x in out):
            raise loader.fail(path, where, "id must be a distinct OPH###")
        stage = h["stage"]
        if stage not in valid:
            raise loader.fail(path, f"{where}.stage", f"unknown stage {stage!r} (rules/taxonomy.toml)")
        names = h["ops"]
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise loader.fail(path, f"{where}.ops", "must be a list of host op names")
        for n in names:
            if n in owner:
                raise loader.fail(path, f"{where}.ops", f"{n!r} is already listed under {owner[n]!r}")
            owner[n] = stage
        if not isinstance(h["note"], str) or not h["note"].strip():
            raise loader.fail(path, f"{where}.note", "must be a non-empty string")
        out.append(OpHint(h["id"], stage, tuple(names), h["note"]))
    return tuple(out)
