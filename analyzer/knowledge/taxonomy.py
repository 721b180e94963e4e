"""The closed vocabularies (``rules/taxonomy.toml``) and the named stage/phase sets code uses, derived from it.

Contract: the taxonomy file defines the stages, their categories and labels, the providers, the
phases and the unclassified result once (spec: rules/README.md, "Vocabularies"). :func:`load_taxonomy` reads and validates it
(through :mod:`analyzer.knowledge.loader`). The module constants below are derived from the
built-in file at import (it is a few KB), never re-typed: a set code tests membership in is named
here, with what it means, and a stage the derivation names must exist (a renamed stage fails the
import, not a silent empty set). Tuples keep the taxonomy's order.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from analyzer.knowledge import loader
from analyzer.paths import RULES_DIR

__all__ = [
    "ALL_GEMM_STAGES",
    "ATTENTION_KERNEL_STAGES",
    "ATTENTION_STAGES",
    "DENSE_GEMM_STAGES",
    "LABELLED_PHASES",
    "MEMORY_STAGES",
    "PHASES",
    "ROLE_GEMM_STAGES",
    "TAXONOMY",
    "TAXONOMY_TOML",
    "UNKNOWN_PHASE",
    "Taxonomy",
    "load_taxonomy",
]

TAXONOMY_TOML = RULES_DIR / "taxonomy.toml"
UNKNOWN_PHASE = "unknown"  # the phase of a step nothing decides (the file must list it)
_KEYS = {"format_version", "category", "providers", "unclassified", "phases"}


@dataclasses.dataclass(frozen=True)
class Taxonomy:
    """The closed vocabularies: stage -> category, category -> label, providers, phases, the unclassified result."""

    stage_category: dict[str, str]
    category_labels: dict[str, str]
    providers: tuple[str, ...]
    unclassified_stage: str
    unclassified_provider: str
    unclassified_rule_id: str
    phases: tuple[str, ...] = ()

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(self.stage_category)

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(self.category_labels)

    def category_stages(self, category: str) -> tuple[str, ...]:
        """The stages of ``category`` in file order; KeyError for an unknown category."""
        if category not in self.category_labels:
            raise KeyError(category)
        return tuple(s for s, c in self.stage_category.items() if c == category)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


def parse_taxonomy(doc: dict[str, Any], path: Path) -> Taxonomy:
    """Validate a parsed taxonomy document (errors name the file and the key)."""
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise loader.fail(path, unknown[0], "unknown top-level key")
    if doc.get("format_version", 1) != 1:
        raise loader.fail(path, "format_version", f"unsupported format_version {doc.get('format_version')!r}")
    cats = doc.get("category")
    if not isinstance(cats, list) or not cats:
        raise loader.fail(path, "category", "needs a non-empty [[category]] list")
    stage_category: dict[str, str] = {}
    labels: dict[str, str] = {}
    for i, c in enumerate(cats):
        if not isinstance(c, dict) or not {"id", "label", "stages"} <= c.keys():
            raise loader.fail(path, f"category[{i}]", "every [[category]] needs id, label and stages")
        cid, label, stages = c["id"], c["label"], c["stages"]
        if not isinstance(cid, str) or not isinstance(label, str) or not _str_list(stages):
            raise loader.fail(
                path, f"category.{cid}", "id and label must be strings, stages a non-empty list"
            )
        if cid in labels:
            raise loader.fail(path, f"category.{cid}", "category defined twice")
        labels[cid] = label
        for s in stages:
            if s in stage_category:
                raise loader.fail(path, f"category.{cid}.stages", f"stage {s!r} belongs to two categories")
            stage_category[s] = cid
    providers = doc.get("providers")
    if not _str_list(providers):
        raise loader.fail(path, "providers", "must be a non-empty list of strings")
    if len(set(providers)) != len(providers):
        raise loader.fail(path, "providers", "lists a name twice")
    unc = doc.get("unclassified")
    if not isinstance(unc, dict) or not {"stage", "provider", "rule_id"} <= unc.keys():
        raise loader.fail(path, "unclassified", "needs [unclassified] with stage, provider and rule_id")
    if unc["stage"] not in stage_category or unc["provider"] not in providers:
        raise loader.fail(path, "unclassified", "stage / provider must be in the vocabularies")
    phases = doc.get("phases")
    if not _str_list(phases) or len(set(phases)) != len(phases):
        raise loader.fail(path, "phases", "must be a non-empty list of distinct strings")
    if UNKNOWN_PHASE not in phases:
        raise loader.fail(path, "phases", f"must list {UNKNOWN_PHASE!r} (the explicit unlabelled result)")
    return Taxonomy(
        stage_category=stage_category,
        category_labels=labels,
        providers=tuple(providers),
        unclassified_stage=unc["stage"],
        unclassified_provider=unc["provider"],
        unclassified_rule_id=str(unc["rule_id"]),
        phases=tuple(phases),
    )


def load_taxonomy(path: str | Path = TAXONOMY_TOML) -> Taxonomy:
    """Read and validate rules/taxonomy.toml (memoised by its bytes)."""
    return loader.load(path, parse_taxonomy)


# --------------------------------------------------------------------------- the derived sets

TAXONOMY = load_taxonomy()


def _stage(name: str) -> str:
    """A stage the derivations name; it must be in the taxonomy."""
    if name not in TAXONOMY.stage_category:
        raise ImportError(f"rules/taxonomy.toml: no stage {name!r} (analyzer/knowledge/taxonomy.py names it)")
    return name


#: Every phase label, in display order: prefill, decode, mixed, unknown.
PHASES: tuple[str, ...] = TAXONOMY.phases
#: The phases a step can be decided to be (all but ``unknown``).
LABELLED_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p != UNKNOWN_PHASE)

#: The ``dense_gemm`` category: the role-naming dense GEMMs (qkv, o, gate_up, down, lm_head,
#: moe_gate) and the generic ``gemm`` the per-layer structure has not (yet) given a role. What the
#: structure walk treats as "a GEMM" and re-labels with a role.
DENSE_GEMM_STAGES: tuple[str, ...] = TAXONOMY.category_stages("dense_gemm")
#: GEMM stages that name a role of the model, as the baseline records them (``gemm_roles``) and the
#: gate compares them: ``dense_gemm`` minus the generic ``gemm`` (it names no role, so it says nothing
#: about the model's shape and may come and go with framework code) plus ``moe_expert_gemm``.
ROLE_GEMM_STAGES: tuple[str, ...] = (
    *(s for s in DENSE_GEMM_STAGES if s != _stage("gemm")),
    *TAXONOMY.category_stages("moe_expert_gemm"),
)
#: Every GEMM stage (the weight-heavy work of a step): ``dense_gemm`` then ``moe_expert_gemm``.
ALL_GEMM_STAGES: tuple[str, ...] = (*DENSE_GEMM_STAGES, *TAXONOMY.category_stages("moe_expert_gemm"))
#: The ``attention`` category: attention kernels and the split-KV combine (``attention_reduce``).
ATTENTION_STAGES: tuple[str, ...] = TAXONOMY.category_stages("attention")
#: The kernels that compute attention itself (flash, paged, MLA): the anchor of a decoder layer's
#: sequence; the ``attention`` category without ``attention_reduce``, which only combines their parts.
ATTENTION_KERNEL_STAGES: tuple[str, ...] = tuple(
    s for s in ATTENTION_STAGES if s != _stage("attention_reduce")
)
#: The ``memory`` category (memcpy, memset): named as the activity kinds, so a copy or fill is
#: classified by its kind whatever its name says.
MEMORY_STAGES: tuple[str, ...] = TAXONOMY.category_stages("memory")
