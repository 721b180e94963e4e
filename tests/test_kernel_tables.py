"""The rule table against kernel tables of public profiles (``tests/data/kernel_tables/*.csv``).

Each table was labelled from the kernel libraries' sources (its ``basis`` column), independently of the
rules; this test classifies each name with the rule table and compares, weighted by kernel time.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from analyzer.knowledge.kernel_rules import classify_names, default_rules
from analyzer.knowledge.taxonomy import TAXONOMY

TABLES = Path(__file__).parent / "data" / "kernel_tables"
COLUMNS = ("name", "launches", "total_ns", "stage", "provider", "basis")
MIN_STAGE = 0.98
MIN_PROVIDER = 0.97
MAX_OTHER = 0.005


def _tables() -> list[Path]:
    return sorted(TABLES.glob("*.csv"))


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ())[: len(COLUMNS)] == COLUMNS, (
            f"{path.name}: header must start {COLUMNS}"
        )
        return list(reader)


def _is_barrier(name: str) -> bool:
    return name.strip().startswith("<barrier packet")


@pytest.mark.parametrize("path", _tables(), ids=lambda p: p.stem)
def test_table_is_well_formed(path):
    rows = _read(path)
    assert rows, f"{path.name}: empty"
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)), f"{path.name}: a name is listed twice"
    for r in rows:
        for stage in r["stage"].split("|"):
            assert stage in TAXONOMY.stage_category, f"{path.name}: {r['name'][:80]}: unknown stage {stage!r}"
        assert int(r["launches"]) > 0 and float(r["total_ns"]) >= 0, f"{path.name}: {r['name'][:80]}: counts"
        assert r["basis"].strip(), f"{path.name}: {r['name'][:80]}: no basis for the label"


@pytest.mark.parametrize("path", _tables(), ids=lambda p: p.stem)
def test_rule_table_agrees_with_labels(path):
    rows = _read(path)
    got = {g["name"]: g for g in classify_names([r["name"] for r in rows], default_rules())}
    total = sum(float(r["total_ns"]) for r in rows)
    assert total > 0, f"{path.name}: no kernel time"
    stage_ok = provider_ok = other = 0.0
    wrong = []
    for r in rows:
        t = float(r["total_ns"])
        g = got[r["name"]]
        if g["stage"] in r["stage"].split("|"):
            stage_ok += t
        else:
            wrong.append((t, f"{r['name'][:90]} stage {g['stage']} (label {r['stage']})"))
        if g["provider"] == r["provider"]:
            provider_ok += t
        else:
            wrong.append((t, f"{r['name'][:90]} provider {g['provider']} (label {r['provider']})"))
        if g["rule_id"] == "UNCLASSIFIED" and "optimizer" not in r["stage"] and not _is_barrier(r["name"]):
            other += t
    worst = "; ".join(f"{100 * t / total:.2f}% {w}" for t, w in sorted(wrong, reverse=True)[:6])
    assert stage_ok / total >= MIN_STAGE, f"{path.name}: stage {100 * stage_ok / total:.2f}%: {worst}"
    assert provider_ok / total >= MIN_PROVIDER, (
        f"{path.name}: provider {100 * provider_ok / total:.2f}%: {worst}"
    )
    assert other / total < MAX_OTHER, f"{path.name}: unclassified {100 * other / total:.2f}%: {worst}"


def test_enough_public_profiles():
    outside = [p for p in _tables() if not p.stem.startswith("shared-")]
    assert len(outside) >= 5, (
        f"{len(outside)} public profiles beyond ../shared/traces have kernel tables (need 5)"
    )
