"""The structure and phase rule registry (``rules/structure.toml``): read, validated, looked up.

Contract (the file's header is the spec):

* ``[[rule]]`` tables, in the order the pipeline applies them: ``id`` (``STR###`` structure, ``PHS###``
  steps and phases), ``name`` (what the code looks a rule up by: :meth:`StructureKnowledge.id_of`),
  ``kind``, ``decides``, ``needs``, ``contract``, ``source``, ``added`` and ``reads`` (the vocabulary
  and threshold keys it reads, each checked to exist).
* ``[vocabulary]``: named lists the rules read (host ops, words of kernel names, stages of
  ``rules/taxonomy.toml``, checked); ``[regions]``: a decoder layer's region -> the stage its generic
  kernels take; ``[thresholds]``: ``{value, min, max, note}`` each, overridable per run with
  ``--set structure.<name>=<value>`` (:func:`with_overrides`, range-checked).
* Everything here is immutable and built once per file content (:mod:`analyzer.knowledge.loader`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from analyzer.errors import UsageError, option
from analyzer.knowledge import loader
from analyzer.knowledge.taxonomy import load_taxonomy
from analyzer.paths import RULES_DIR

__all__ = [
    "STRUCTURE_TOML",
    "StructureKnowledge",
    "StructureRule",
    "Thresholds",
    "load_structure",
    "with_overrides",
]

STRUCTURE_TOML = RULES_DIR / "structure.toml"
ID_FORM = re.compile(r"^(STR|PHS)\d{3}$")
KINDS = {"STR": "structure", "PHS": "phase"}
DECIDES = frozenset({"stage", "layer", "step", "phase", "model", "tokens", "warning"})
NEEDS = frozenset({"nothing", "host_ops", "shapes", "graph_replays", "annotations", "grids"})
_RULE_KEYS = ("id", "name", "kind", "decides", "needs", "contract", "source", "added", "reads")
_STAGE_LISTS = frozenset(
    {
        "generic_stages",
        "sampling_like_stages",
        "moe_routing_stages",
        "composed_attention_parts",
        "routing_parts",
        "pre_layer_work",
        "prologue_stages",
        "front_end_parts",
    }
)
SETTING_PREFIX = "structure."


@dataclasses.dataclass(frozen=True)
class StructureRule:
    """One registered decision of the layer walk or the phase split."""

    id: str
    name: str
    kind: str
    decides: tuple[str, ...]
    needs: tuple[str, ...]
    contract: str
    source: str
    added: str
    reads: tuple[str, ...]


class Thresholds:
    """The tuned numbers the rules read, as attributes (``th.prefill_work_ratio``)."""

    def __init__(self, values: Mapping[str, float | int]) -> None:
        self.__dict__.update(values)
        self._values = MappingProxyType(dict(values))

    def as_dict(self) -> dict[str, float | int]:
        return dict(self._values)

    def __getattr__(self, name: str) -> Any:  # pragma: no cover - a typo in code, not in data
        raise AttributeError(f"no threshold {name!r} in rules/structure.toml")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Thresholds) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))


@dataclasses.dataclass(frozen=True)
class RuleGroup:
    """Structure rules that assume the same thing of a trace, run only where their precondition
    holds (``[[group]]`` in rules/structure.toml)."""

    name: str
    assumes: str
    precondition: str
    rules: tuple[str, ...]  # the rules' names


@dataclasses.dataclass(frozen=True)
class StructureKnowledge:
    """The registry, its vocabularies, regions and thresholds (with their allowed ranges)."""

    rules: tuple[StructureRule, ...]
    vocabulary: Mapping[str, tuple[Any, ...]]
    regions: Mapping[str, str]
    thresholds: Thresholds
    ranges: Mapping[str, tuple[float, float, str]]  # name -> (min, max, note)
    retired: Mapping[str, str] = dataclasses.field(default_factory=dict)  # id -> why, what replaced it
    groups: tuple[RuleGroup, ...] = ()  # the passes gated by a precondition (``[[group]]``)

    def rule(self, ident: str) -> StructureRule | None:
        """The rule with id ``ident`` (any case), or None."""
        return next((r for r in self.rules if r.id == ident.upper()), None)

    def id_of(self, name: str) -> str:
        """The id of the rule the code calls ``name``; KeyError for a name the registry lacks."""
        for r in self.rules:
            if r.name == name:
                return r.id
        raise KeyError(f"rules/structure.toml has no rule named {name!r}")

    def code_of(self, name: str) -> int:
        """The rule's position in the registry: the small integer the walk records per kernel (the
        ``stage_rule`` column's code before the kernel rules' ids are appended)."""
        for i, r in enumerate(self.rules):
            if r.name == name:
                return i
        raise KeyError(f"rules/structure.toml has no rule named {name!r}")

    def words(self, key: str) -> tuple[Any, ...]:
        return self.vocabulary[key]

    def set_of(self, key: str) -> frozenset[Any]:
        return frozenset(self.vocabulary[key])


def load_structure(path: str | Path = STRUCTURE_TOML) -> StructureKnowledge:
    """The registry of ``path`` (default ``rules/structure.toml``), validated."""
    return loader.load(path, _parse)


def with_overrides(k: StructureKnowledge, settings: Mapping[str, str]) -> StructureKnowledge:
    """``k`` with the ``structure.<name>=<value>`` pairs of ``settings`` applied (others ignored);
    UsageError for an unknown name, a value that is not a number or one outside its range."""
    mine = {key[len(SETTING_PREFIX) :]: v for key, v in settings.items() if key.startswith(SETTING_PREFIX)}
    if not mine:
        return k
    values = k.thresholds.as_dict()
    for name, raw in mine.items():
        if name not in values:
            known = ", ".join(sorted(values))
            raise UsageError(
                f"{option('set', SETTING_PREFIX + name)}: no such threshold (rules/structure.toml: {known})"
            )
        lo, hi, _ = k.ranges[name]
        try:
            v: float | int = int(raw) if isinstance(values[name], int) else float(raw)
        except ValueError:
            kind = "an integer" if isinstance(values[name], int) else "a number"
            raise UsageError(f"{option('set', SETTING_PREFIX + name)}={raw}: must be {kind}") from None
        if not lo <= v <= hi:
            raise UsageError(f"{option('set', SETTING_PREFIX + name)}={raw}: out of range [{lo}, {hi}]")
        values[name] = v
    return dataclasses.replace(k, thresholds=Thresholds(values))


def _strings(path: Path, key: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise loader.fail(path, key, "must be a list of non-empty strings")
    return tuple(v)


def _parse(doc: dict[str, Any], path: Path) -> StructureKnowledge:
    unknown = sorted(set(doc) - {"vocabulary", "regions", "thresholds", "rule", "retired", "group"})
    if unknown:
        raise loader.fail(path, unknown[0], "unknown top-level key")
    stages = load_taxonomy().stage_category
    vocab = _vocabulary(doc.get("vocabulary", {}), path, stages)
    regions = doc.get("regions", {})
    for reg, s in regions.items():
        if s not in stages:
            raise loader.fail(path, f"regions.{reg}", f"unknown stage {s!r} (rules/taxonomy.toml)")
    values, ranges = _thresholds(doc.get("thresholds", {}), path)
    seen_ids: set[str] = set()
    seen_names: set[str] = set()
    rules = [
        _rule(raw, f"rule {raw.get('id', i)}", path, vocab, values, seen_ids, seen_names)
        for i, raw in enumerate(doc.get("rule", []))
    ]
    retired = doc.get("retired", {})
    for rid, why in retired.items():
        if not ID_FORM.match(rid) or rid in seen_ids or not isinstance(why, str) or not why.strip():
            raise loader.fail(
                path, f"retired.{rid}", "a retired id is STR###/PHS###, no active rule's, with a reason"
            )
    groups = _groups(doc.get("group", []), path, {r.name for r in rules})
    return StructureKnowledge(
        groups=groups,
        rules=tuple(rules),
        retired=MappingProxyType(dict(retired)),
        vocabulary=MappingProxyType(vocab),
        regions=MappingProxyType(dict(regions)),
        thresholds=Thresholds(values),
        ranges=MappingProxyType(ranges),
    )


_GROUP_KEYS = {"name", "assumes", "precondition", "rules"}


def _groups(raw: list[Any], path: Path, rule_names: set[str]) -> tuple[RuleGroup, ...]:
    """The ``[[group]]`` tables: a name, what the group's rules assume, the precondition under which
    they run (checked by the code that runs them), and the names of its rules (registered ones,
    each in one group at most)."""
    out: list[RuleGroup] = []
    seen: set[str] = set()
    for i, g in enumerate(raw):
        where = f"group {g.get('name', i) if isinstance(g, dict) else i}"
        if not isinstance(g, dict) or set(g) != _GROUP_KEYS:
            raise loader.fail(path, where, f"a group has exactly the keys {sorted(_GROUP_KEYS)}")
        texts = (g["name"], g["assumes"], g["precondition"])
        if not all(isinstance(t, str) and t.strip() for t in texts):
            raise loader.fail(path, where, "name, assumes and precondition are non-empty strings")
        names = g["rules"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise loader.fail(path, f"{where}.rules", "a non-empty list of rule names")
        bad = [n for n in names if n not in rule_names or n in seen]
        if bad:
            raise loader.fail(path, f"{where}.rules", f"{bad[0]!r} is no registered rule, or in two groups")
        seen.update(names)
        out.append(RuleGroup(g["name"], g["assumes"], g["precondition"], tuple(names)))
    return tuple(out)


def _vocabulary(doc: dict[str, Any], path: Path, stages: Mapping[str, str]) -> dict[str, tuple[Any, ...]]:
    """The ``[vocabulary]`` lists: strings each, ``splitk_reduce_words`` lists of words, and the
    stage lists (:data:`_STAGE_LISTS`) only stages of ``rules/taxonomy.toml``."""
    vocab: dict[str, tuple[Any, ...]] = {}
    for key, v in doc.items():
        if key == "splitk_reduce_words":
            if not isinstance(v, list) or not v:
                raise loader.fail(path, f"vocabulary.{key}", "must be a list of lists of words")
            vocab[key] = tuple(_strings(path, f"vocabulary.{key}", x) for x in v)
            continue
        vocab[key] = _strings(path, f"vocabulary.{key}", v)
        if key in _STAGE_LISTS:
            for s in vocab[key]:
                if s not in stages:
                    raise loader.fail(path, f"vocabulary.{key}", f"unknown stage {s!r} (rules/taxonomy.toml)")
    return vocab


def _thresholds(
    doc: dict[str, Any], path: Path
) -> tuple[dict[str, float | int], dict[str, tuple[float, float, str]]]:
    """The ``[thresholds]``: each one's value, and its (min, max, note)."""
    values: dict[str, float | int] = {}
    ranges: dict[str, tuple[float, float, str]] = {}
    for name, spec in doc.items():
        key = f"thresholds.{name}"
        if not isinstance(spec, dict) or set(spec) != {"value", "min", "max", "note"}:
            raise loader.fail(path, key, "must be { value, min, max, note }")
        v, lo, hi = spec["value"], spec["min"], spec["max"]
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (v, lo, hi)):
            raise loader.fail(path, key, "value, min and max must be numbers")
        if not lo <= v <= hi:
            raise loader.fail(path, key, f"value {v} outside [{lo}, {hi}]")
        values[name] = v
        ranges[name] = (lo, hi, str(spec["note"]))
    return values, ranges


def _rule(
    raw: dict[str, Any],
    where: str,
    path: Path,
    vocab: Mapping[str, Any],
    values: Mapping[str, Any],
    seen_ids: set[str],
    seen_names: set[str],
) -> StructureRule:
    """One ``[[rule]]`` table, checked (its id and name not among ``seen_ids`` / ``seen_names``,
    which get them)."""
    missing = [k for k in _RULE_KEYS if k not in raw]
    extra = sorted(set(raw) - set(_RULE_KEYS))
    if missing or extra:
        what = f"missing {missing[0]!r}" if missing else f"unknown key {extra[0]!r}"
        raise loader.fail(path, where, what)
    rid = raw["id"]
    if not isinstance(rid, str) or not ID_FORM.match(rid):
        raise loader.fail(path, where, "id must be STR### or PHS###")
    if rid in seen_ids or raw["name"] in seen_names:
        raise loader.fail(path, where, "duplicate id or name")
    seen_ids.add(rid)
    seen_names.add(raw["name"])
    if raw["kind"] != KINDS[rid[:3]]:
        raise loader.fail(path, where, f"kind must be {KINDS[rid[:3]]!r} for a {rid[:3]} id")
    decides = _strings(path, f"{where}.decides", raw["decides"])
    needs = _strings(path, f"{where}.needs", raw["needs"])
    if not set(decides) <= DECIDES:
        raise loader.fail(path, f"{where}.decides", f"must be among {sorted(DECIDES)}")
    if not set(needs) <= NEEDS or ("nothing" in needs and len(needs) > 1):
        raise loader.fail(path, f"{where}.needs", f"must be among {sorted(NEEDS)} (`nothing` alone)")
    reads = tuple(raw["reads"]) if isinstance(raw["reads"], list) else None
    if reads is None or any(r not in vocab and r not in values for r in reads):
        bad = reads and next(r for r in reads if r not in vocab and r not in values)
        raise loader.fail(path, f"{where}.reads", f"unknown vocabulary or threshold {bad!r}")
    for k in ("name", "contract", "source", "added"):
        if not isinstance(raw[k], str) or not raw[k].strip():
            raise loader.fail(path, f"{where}.{k}", "must be a non-empty string")
    return StructureRule(
        id=rid,
        name=raw["name"],
        kind=raw["kind"],
        decides=decides,
        needs=needs,
        contract=raw["contract"],
        source=raw["source"],
        added=raw["added"],
        reads=reads,
    )
