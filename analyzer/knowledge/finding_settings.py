"""Finding thresholds (``rules/findings.toml``) with a run's ``--set CHECK.KEY=VALUE`` overrides.

The file is parsed and validated once per process (:mod:`analyzer.knowledge.loader`); every call gets
a fresh deep copy with its overrides applied, so no run sees another's ``--set``. Every numeric
threshold states its closed range in its check's ``range`` table (``max_idle = [0, 1]``); a default or
an override outside it is an error naming the key, the value and the range.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from analyzer.errors import UsageError, option
from analyzer.knowledge import loader
from analyzer.knowledge.taxonomy import load_taxonomy
from analyzer.paths import RULES_DIR

__all__ = ["FINDINGS_TOML", "SEVERITIES", "finding_ranges", "load_finding_settings"]

FINDINGS_TOML = RULES_DIR / "findings.toml"
SEVERITIES = ("info", "warning", "critical")
# keys whose values are stage / provider lists (rules/taxonomy.toml)
_STAGE_LISTS = ("stages", "exclude_stages")
_PROVIDER_LISTS = ("exclude_providers",)


def load_finding_settings(overrides: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Default thresholds with ``--set`` overrides applied (values parsed as the default's type)."""
    checks, ranges = loader.load(FINDINGS_TOML, _parse_findings)
    cfg = copy.deepcopy(checks)
    for key, raw in (overrides or {}).items():
        check, _, name = key.partition(".")
        if check not in cfg or not name or name not in cfg[check]:
            known = ", ".join(f"{c}.{k}" for c in cfg for k in cfg[c] if k not in ("id",))
            raise UsageError(f"{option('set', key)}: unknown setting (known: {known})")
        default = cfg[check][name]
        try:
            if isinstance(default, bool):
                value: Any = raw.lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int | float):
                value = type(default)(float(raw)) if isinstance(default, int) else float(raw)
            elif isinstance(default, list):
                value = [v.strip() for v in raw.split(",") if v.strip()]
            else:
                value = raw
        except ValueError:
            raise UsageError(f"{option('set', key)}: {raw!r} is not a {type(default).__name__}") from None
        bounds = ranges.get(check, {}).get(name)
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            msg = f"{raw} is out of range {_show(bounds)} (rules/findings.toml)"
            raise UsageError(f"{option('set', key)}: {msg}")
        cfg[check][name] = value
    return cfg


def finding_ranges() -> dict[str, dict[str, tuple[float, float]]]:
    """Check -> threshold -> its closed range (low, high) as ``rules/findings.toml`` states it."""
    return copy.deepcopy(loader.load(FINDINGS_TOML, _parse_findings)[1])


def _show(bounds: tuple[float, float]) -> str:
    return "[" + ", ".join(f"{b:g}" for b in bounds) + "]"


def _parse_findings(
    doc: dict[str, Any], path: Path
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, tuple[float, float]]]]:
    tx = load_taxonomy()
    ids: dict[str, str] = {}
    ranges: dict[str, dict[str, tuple[float, float]]] = {}
    for check, c in doc.items():
        if not isinstance(c, dict):
            raise loader.fail(path, check, "must be a [<check>] table")
        ranges[check] = _parse_ranges(c, check, path)
        cid = c.get("id")
        if not isinstance(cid, str) or not cid:
            raise loader.fail(path, f"{check}.id", "every check needs an id (F001 ...)")
        if cid in ids:
            raise loader.fail(path, f"{check}.id", f"{cid} is already the id of {ids[cid]}")
        ids[cid] = check
        if c.get("severity") not in SEVERITIES:
            raise loader.fail(path, f"{check}.severity", f"must be one of {', '.join(SEVERITIES)}")
        for key, vocab, what in (
            *((k, tx.stage_category, "stage") for k in _STAGE_LISTS),
            *((k, tx.providers, "provider") for k in _PROVIDER_LISTS),
        ):
            if key not in c:
                continue
            value = c[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise loader.fail(path, f"{check}.{key}", f"must be a list of {what}s")
            bad = [v for v in value if v not in vocab]
            if bad:
                raise loader.fail(path, f"{check}.{key}", f"unknown {what} {bad[0]!r} (rules/taxonomy.toml)")
    return doc, ranges


def _parse_ranges(c: dict[str, Any], check: str, path: Path) -> dict[str, tuple[float, float]]:
    """Pop the check's ``range`` table: every numeric threshold has one, and its default lies in it."""
    raw = c.pop("range", {})
    if not isinstance(raw, dict):
        raise loader.fail(path, f"{check}.range", "must be a table of KEY = [low, high]")
    out: dict[str, tuple[float, float]] = {}
    for key, bounds in raw.items():
        ok = isinstance(bounds, list) and len(bounds) == 2
        ok = ok and all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
        if not ok or bounds[0] > bounds[1]:
            raise loader.fail(path, f"{check}.range.{key}", "must be [low, high] with low <= high")
        if key not in c:
            raise loader.fail(path, f"{check}.range.{key}", "no such threshold")
        out[key] = (float(bounds[0]), float(bounds[1]))
    for key, value in c.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if key not in out:
            raise loader.fail(path, f"{check}.{key}", "numeric threshold without a range (add it to range)")
        low, high = out[key]
        if not low <= value <= high:
            raise loader.fail(path, f"{check}.{key}", f"default {value} is out of range {_show(out[key])}")
    return out
