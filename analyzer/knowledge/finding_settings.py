"""Finding thresholds (``rules/findings.toml``) with a run's ``--set CHECK.KEY=VALUE`` overrides.

The file is parsed and validated once per process (:mod:`analyzer.knowledge.loader`); every call gets
a fresh deep copy with its overrides applied, so no run sees another's ``--set``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from analyzer.errors import UsageError
from analyzer.knowledge import loader
from analyzer.knowledge.taxonomy import load_taxonomy
from analyzer.paths import RULES_DIR

__all__ = ["FINDINGS_TOML", "SEVERITIES", "load_finding_settings"]

FINDINGS_TOML = RULES_DIR / "findings.toml"
SEVERITIES = ("info", "warning", "critical")
# keys whose values are stage / provider lists (rules/taxonomy.toml)
_STAGE_LISTS = ("stages", "exclude_stages")
_PROVIDER_LISTS = ("exclude_providers",)


def load_finding_settings(overrides: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Default thresholds with ``--set`` overrides applied (values parsed as the default's type)."""
    cfg = copy.deepcopy(loader.load(FINDINGS_TOML, _parse_findings))
    for key, raw in (overrides or {}).items():
        check, _, name = key.partition(".")
        if check not in cfg or not name or name not in cfg[check]:
            known = ", ".join(f"{c}.{k}" for c in cfg for k in cfg[c] if k not in ("id",))
            raise UsageError(f"--set {key}: unknown setting (known: {known})")
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
            raise UsageError(f"--set {key}: {raw!r} is not a {type(default).__name__}") from None
        cfg[check][name] = value
    return cfg


def _parse_findings(doc: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    tx = load_taxonomy()
    ids: dict[str, str] = {}
    for check, c in doc.items():
        if not isinstance(c, dict):
            raise loader.fail(path, check, "must be a [<check>] table")
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
    return doc
