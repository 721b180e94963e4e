"""Every rule that can decide an answer, from every rules file, as one list (``rules list`` / ``explain``).

Contract:

* One :class:`RuleEntry` per rule: ``id``, ``kind`` (one of :data:`KINDS`), a one-line ``summary``,
  the ``file`` it comes from and the ``fields`` its kind has. Kinds, in listing order: ``kernel``
  (``rules/kernels.toml`` in matching order, user rule files first, then the fallbacks),
  ``op`` (``rules/ops.toml``), ``annotation`` (``rules/annotations.toml``), ``attention_op``
  (``rules/attention_ops.toml``), ``work_op`` (``rules/work_ops.toml``: what work a host op does
  from its shapes), ``structure`` and ``phase`` (``rules/structure.toml``), ``finding``
  (``rules/findings.toml``).
* The fallbacks are kernel rules no file lists, each an answer the ``rule_id`` / ``stage_rule``
  columns can carry: the taxonomy's unclassified rule id (no rule matched), :data:`MEM_KIND_RULE_ID`
  (a memcpy / memset classified by its activity kind) and
  :data:`~analyzer.knowledge.kernel_rules.TRUNCATED_RULE_ID` (a truncated name whose visible prefix
  does not decide the stage). Their ``fields`` carry ``fallback: true``.
* Ids are unique over the whole list; :func:`find_entry` looks one up exactly, then ignoring case.
* :func:`rule_cases` lists the case files (``tests/cases/**/*.json``: JSON objects with ``name``,
  ``fires`` and ``not_fires`` lists of rule ids) that name a rule; files that are not such objects
  are skipped.
* Files are read through :mod:`analyzer.knowledge.loader` (validated and memoised there).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analyzer.knowledge import attention_ops, loader
from analyzer.knowledge import kernel_rules as rules_mod
from analyzer.knowledge.annotations import ANNOTATIONS_TOML, load_annotation_patterns
from analyzer.knowledge.finding_settings import FINDINGS_TOML, load_finding_settings
from analyzer.knowledge.op_hints import OPS_TOML, load_op_hint_rules
from analyzer.knowledge.structure_rules import STRUCTURE_TOML, load_structure
from analyzer.knowledge.work_ops import WORK_OPS_TOML, load_work_ops
from analyzer.paths import RULES_DIR

__all__ = [
    "CASES_DIR",
    "KINDS",
    "MEM_KIND_RULE_ID",
    "RuleCase",
    "RuleEntry",
    "find_entry",
    "rule_cases",
    "rule_catalogue",
]

KINDS = ("kernel", "op", "annotation", "attention_op", "work_op", "structure", "phase", "finding")
#: the rule id of a memcpy / memset row classified by its activity kind (analyses/classify.py)
MEM_KIND_RULE_ID = "MEM_KIND"
#: the structure-rule cases (sqlfluff's ``std_rule_cases``): beside ``rules/`` in a checkout
CASES_DIR = RULES_DIR.parent / "tests" / "cases"
# where the fallbacks that no rules file lists are decided
_FALLBACK_FILES = {
    MEM_KIND_RULE_ID: "analyzer/analyses/classify.py",
    rules_mod.TRUNCATED_RULE_ID: "analyzer/knowledge/kernel_rules.py",
}


@dataclasses.dataclass(frozen=True)
class RuleEntry:
    """One rule of any kind."""

    id: str
    kind: str
    summary: str
    file: str
    fields: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``rules list --json``."""
        return {"id": self.id, "kind": self.kind, "summary": self.summary, "file": self.file, **self.fields}


@dataclasses.dataclass(frozen=True)
class RuleCase:
    """A case file that names a rule: ``role`` is ``fires`` or ``not_fires``."""

    path: str
    name: str
    role: str


def _line(text: str, width: int = 160) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _kernel_entries(extra: Sequence[str]) -> list[RuleEntry]:
    rs = rules_mod.load_rules(list(extra))
    tx = rs.taxonomy
    out = []
    for r in rs.rules:
        src = loader.display(r.source) if r.source else "rules/kernels.toml"
        out.append(
            RuleEntry(
                r.id,
                "kernel",
                _line(f"{r.stage} ({r.provider}): {r.note}"),
                src,
                {
                    "stage": r.stage,
                    "category": tx.stage_category[r.stage],
                    "provider": r.provider,
                    "pattern": r.pattern,
                    "flags": r.flags,
                    "note": r.note,
                    "examples": list(r.examples),
                    "not_examples": list(r.not_examples),
                    "phases": r.phases,
                    "phases_source": r.phases_source,
                    "query_tile_axes": list(r.query_tile_axes),
                    "sequences_axis": r.sequences_axis,
                    "grid_source": r.grid_source,
                    "token_tile": r.token_tile,
                    "token_tile_source": r.token_tile_source,
                    "fallback": False,
                },
            )
        )
    fallbacks = (
        (
            tx.unclassified_rule_id,
            tx.unclassified_stage,
            tx.unclassified_provider,
            "no kernel rule matched the name (an explicit result, not an error)",
        ),
        (
            MEM_KIND_RULE_ID,
            "memcpy|memset",
            "runtime",
            "a memcpy / memset activity, classified by its activity kind whatever its name says",
        ),
        (
            rules_mod.TRUNCATED_RULE_ID,
            tx.unclassified_stage,
            "unknown",
            "a truncated name (ends with …) whose visible prefix does not decide the stage: "
            "earlier rules could still claim the lost tail",
        ),
    )
    for rid, stage, provider, what in fallbacks:
        out.append(
            RuleEntry(
                rid,
                "kernel",
                _line(f"fallback: {what}"),
                _FALLBACK_FILES.get(rid, "rules/taxonomy.toml"),
                {"stage": stage, "provider": provider, "pattern": None, "note": what, "fallback": True},
            )
        )
    return out


def _attention_entries(doc: dict[str, Any], path: Path) -> tuple[dict[str, Any], ...]:
    """The ``[[op]]`` tables as written, after the table's own validation."""
    attention_ops.load_attention_ops(path)
    return tuple(dict(e) for e in doc["op"])


def _other_entries() -> list[RuleEntry]:
    out = []
    for h in load_op_hint_rules():
        out.append(
            RuleEntry(
                h.id,
                "op",
                _line(f"{h.stage}: {h.note}"),
                loader.display(OPS_TOML),
                {"stage": h.stage, "ops": list(h.ops), "note": h.note},
            )
        )
    for a in load_annotation_patterns():
        fields = {k: v for k, v in a.items() if k not in ("id", "regex", "kind")}
        fields["annotation_kind"] = a["kind"]
        out.append(
            RuleEntry(a["id"], "annotation", _line(a["note"]), loader.display(ANNOTATIONS_TOML), fields)
        )
    path = attention_ops.ATTENTION_OPS_TOML
    for e in loader.load(path, _attention_entries):
        fields = {k: v for k, v in e.items() if k != "id"}
        out.append(RuleEntry(e["id"], "attention_op", _line(e["note"]), loader.display(path), fields))
    for w in load_work_ops().entries():
        fields: dict[str, Any] = {
            "section": _work_section(w),
            "note": w.note,
            "source": w.source,
            "cases": list(w.cases),
        }
        if hasattr(w, "names"):
            fields["names"] = list(w.names)
        if hasattr(w, "pattern"):
            fields["pattern"] = w.pattern.pattern
        out.append(
            RuleEntry(
                w.id,
                "work_op",
                _line(f"{fields['section']}: {w.note}"),
                loader.display(WORK_OPS_TOML),
                fields,
            )
        )
    know = load_structure()
    for r in know.rules:
        out.append(
            RuleEntry(
                r.id,
                r.kind,
                _line(r.contract),
                loader.display(STRUCTURE_TOML),
                {
                    "name": r.name,
                    "contract": r.contract,
                    "decides": list(r.decides),
                    "needs": list(r.needs),
                    "source": r.source,
                    "added": r.added,
                    "reads": list(r.reads),
                },
            )
        )
    for check, cfg in load_finding_settings().items():
        thresholds = {k: v for k, v in cfg.items() if k not in ("id", "severity")}
        out.append(
            RuleEntry(
                str(cfg["id"]),
                "finding",
                _line(f"{check} (severity {cfg.get('severity', '?')})"),
                loader.display(FINDINGS_TOML),
                {"check": check, "severity": cfg.get("severity"), "thresholds": thresholds},
            )
        )
    return out


def _work_section(entry: Any) -> str:
    """The ``rules/work_ops.toml`` section an entry comes from."""
    kind = getattr(entry, "kind", None)
    if kind:
        return str(kind)
    return {"GemmOp": "gemm", "GatherOp": "gather", "CopyRule": "copy", "KernelDtype": "kernel_dtype"}[
        type(entry).__name__
    ]


def rule_catalogue(extra_kernel_rules: Sequence[str] = ()) -> tuple[RuleEntry, ...]:
    """Every rule of every kind (:data:`KINDS` order); ``extra_kernel_rules``: user rule files,
    listed first among the kernel rules as they are matched first."""
    return (*_kernel_entries(extra_kernel_rules), *_other_entries())


def find_entry(entries: Sequence[RuleEntry], ident: str) -> RuleEntry | None:
    """The entry with id ``ident`` (exactly, else ignoring case), or None."""
    for e in entries:
        if e.id == ident:
            return e
    low = ident.lower()
    return next((e for e in entries if e.id.lower() == low), None)


def _case(path: Path) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def rule_cases(rule_id: str, directory: str | Path | None = None) -> list[RuleCase]:
    """The case files under ``directory`` (default :data:`CASES_DIR`) whose ``fires`` or
    ``not_fires`` lists name ``rule_id``, in path order (empty when the directory does not exist)."""
    root = Path(directory if directory is not None else CASES_DIR)
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("*.json")):
        doc = _case(p)
        if doc is None:
            continue
        for role in ("fires", "not_fires"):
            ids = doc.get(role)
            if isinstance(ids, list) and rule_id in ids:
                out.append(RuleCase(p.relative_to(root).as_posix(), str(doc.get("name", p.stem)), role))
    return out
