"""The truth table (``rules/truth.toml``): accepted stages per (region, GEMM host op, activity kind).

Read and validated here (docs/accuracy.md states the convention); :mod:`analyzer.results.accuracy`
scores an analysis against it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from analyzer.errors import InputError
from analyzer.knowledge import kernel_rules, loader
from analyzer.paths import RULES_DIR

TRUTH_TOML = RULES_DIR / "truth.toml"
PLACES = ("outside_forward",)


@dataclasses.dataclass(frozen=True)
class TruthTable:
    """``rules/truth.toml``: accepted stages per (region, GEMM host op, activity kind)."""

    gemm_ops: frozenset[str]
    lookup_ops: frozenset[str]  # an embedding's lookups; its other kernels are the place embedding_arithmetic
    accepted: Mapping[tuple[str, bool, str], tuple[str, ...]]
    category_of: Mapping[str, str]  # stage -> category (rules/taxonomy.toml)

    @property
    def regions(self) -> list[str]:
        return sorted({r for r, _, _ in self.accepted})

    def stages(self, region: str, gemm: bool, kind: str) -> tuple[str, ...]:
        return self.accepted.get((region, gemm, kind), ())

    def categories(self, stages: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({self.category_of[s] for s in stages if s in self.category_of}))


def load_taxonomy() -> dict[str, str]:
    """stage -> category id (``rules/taxonomy.toml``)."""
    return dict(kernel_rules.load_taxonomy().stage_category)


def load_truth_table(path: str | Path | None = None, taxonomy: Mapping[str, str] | None = None) -> TruthTable:
    """Read and check the truth table: known keys, known stages, every region once."""
    path = Path(path) if path is not None else TRUTH_TOML
    category_of = dict(taxonomy) if taxonomy is not None else load_taxonomy()
    return loader.load(path, lambda doc, p: truth_table_from(doc, category_of, loader.display(p)))


def truth_table_from(
    doc: Mapping[str, Any], category_of: dict[str, str], where: str = "truth.toml"
) -> TruthTable:
    """Validate a parsed truth table (the schema of ``rules/truth.toml``)."""
    defaults = doc.get("defaults") or {}
    bad = set(defaults) - {"gemm_ops", "lookup_ops", "memcpy", "memset"}
    if bad:
        raise InputError(f"{where}: unknown [defaults] keys {sorted(bad)}")
    gemm_ops = defaults.get("gemm_ops") or []
    if not gemm_ops or not all(isinstance(x, str) for x in gemm_ops):
        raise InputError(f"{where}: [defaults] gemm_ops must be a list of op names")
    lookup_ops = defaults.get("lookup_ops", [])
    if not isinstance(lookup_ops, list) or not all(isinstance(x, str) for x in lookup_ops):
        raise InputError(f"{where}: [defaults] lookup_ops must be a list of op names")

    def stages(v: Any, what: str) -> tuple[str, ...]:
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise InputError(f"{where}: {what} must be a list of stage names")
        unknown = [s for s in v if s not in category_of]
        if unknown:
            raise InputError(f"{where}: {what} names unknown stage(s) {unknown} (rules/taxonomy.toml)")
        return tuple(v)

    d_memcpy = stages(defaults.get("memcpy", ["memcpy"]), "[defaults] memcpy")
    d_memset = stages(defaults.get("memset", ["memset"]), "[defaults] memset")
    accepted: dict[tuple[str, bool, str], tuple[str, ...]] = {}
    seen: set[str] = set()
    for i, row in enumerate(doc.get("region") or []):
        extra = set(row) - {"region", "gemm", "other", "memcpy", "memset", "note"}
        name = row.get("region")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z_]+", name):
            raise InputError(f"{where}: region #{i + 1} needs a snake_case `region`")
        if extra:
            raise InputError(f"{where}: region {name}: unknown keys {sorted(extra)}")
        if name in seen:
            raise InputError(f"{where}: region {name} appears twice")
        seen.add(name)
        other = stages(row.get("other", []), f"region {name} other")
        if not other:
            raise InputError(f"{where}: region {name} needs `other`")
        gemm = stages(row.get("gemm", []), f"region {name} gemm") or other
        memcpy = stages(row.get("memcpy", list(d_memcpy)), f"region {name} memcpy")
        memset = stages(row.get("memset", list(d_memset)), f"region {name} memset")
        for g in (False, True):
            accepted[(name, g, "kernel")] = gemm if g else other
            accepted[(name, g, "memcpy")] = memcpy
            accepted[(name, g, "memset")] = memset
    # an embedding's kernels other than its lookups are a place of their own where lookups are named
    missing = [p for p in (*PLACES, *(("embedding_arithmetic",) if lookup_ops else ())) if p not in seen]
    if missing:
        raise InputError(f"{where}: needs the region(s) {missing}")
    return TruthTable(frozenset(gemm_ops), frozenset(lookup_ops), accepted, category_of)
