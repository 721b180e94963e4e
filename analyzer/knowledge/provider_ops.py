"""Providers from context (``rules/providers.toml``): host op -> provider, and the rules whose kernel
names several libraries ship. Read, validated against the taxonomy and the rule ids, cached.

Contract (the file's header is the spec): ``[ops]`` maps a provider to host-op names, an entry ending
in ``::`` being a namespace prefix and any other an exact name, each listed once; ``[[shared]]``
tables name a built-in ``rule``, its candidate ``providers`` (at least two), optional ``named``
markers (provider -> a substring of the normalized name that says it), an optional ``origin`` (the
candidate whose own code it is, taken where the input's host ops are recorded and name none of the
candidates) and a ``note``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from analyzer.knowledge import loader
from analyzer.knowledge.kernel_rules import default_rules
from analyzer.knowledge.taxonomy import load_taxonomy
from analyzer.paths import RULES_DIR

__all__ = ["PROVIDERS_TOML", "ProviderFacts", "SharedRule", "load_provider_facts"]

PROVIDERS_TOML = RULES_DIR / "providers.toml"
_SHARED_KEYS = {"rule", "providers", "named", "origin", "note"}


@dataclasses.dataclass(frozen=True)
class SharedRule:
    """A rule whose kernel names several libraries ship: who may have, and what in a name says who."""

    rule: str
    providers: tuple[str, ...]
    named: tuple[tuple[str, str], ...]  # (provider, marker) in file order
    origin: str | None = None  # the library whose code the name is: where host ops name no candidate

    def named_provider(self, norm_name: str) -> str | None:
        """The provider a marker in ``norm_name`` names, or None."""
        for provider, marker in self.named:
            if marker in norm_name:
                return provider
        return None


@dataclasses.dataclass(frozen=True)
class ProviderFacts:
    """The validated file: exact op names, namespace prefixes (longest first), the shared rules."""

    exact: dict[str, str]
    prefixes: tuple[tuple[str, str], ...]
    shared: dict[str, SharedRule]

    def name_provider(self, rule_id: str, norm_name: str, provider: str) -> str:
        """The provider a kernel name alone gives, with no host op to ask: ``provider`` (the rule's)
        unless the rule is shared, then the provider a ``named`` marker says, else ``unknown``."""
        entry = self.shared.get(rule_id)
        if entry is None:
            return provider
        return entry.named_provider(norm_name) or "unknown"

    def op_provider(self, op: str | None) -> str | None:
        """The provider a host op's name says, or None."""
        if not op:
            return None
        hit = self.exact.get(op)
        if hit is not None:
            return hit
        for prefix, provider in self.prefixes:
            if op.startswith(prefix):
                return provider
        return None


def load_provider_facts(path: str | Path = PROVIDERS_TOML) -> ProviderFacts:
    """The validated facts of ``path`` (shared between callers: read them only)."""
    return loader.load(path, _parse)


def _parse(doc: dict[str, Any], path: Path) -> ProviderFacts:
    unknown = sorted(set(doc) - {"format_version", "ops", "shared"})
    if unknown:
        raise loader.fail(path, unknown[0], "unknown top-level key (providers.toml has [ops] and [[shared]])")
    if doc.get("format_version", 1) != 1:
        raise loader.fail(path, "format_version", "must be 1")
    valid = set(load_taxonomy().providers)
    ops = doc.get("ops", {})
    if not isinstance(ops, dict):
        raise loader.fail(path, "ops", "must be a table of provider = [host op names]")
    exact: dict[str, str] = {}
    prefixes: dict[str, str] = {}
    for provider, names in ops.items():
        if provider not in valid:
            raise loader.fail(path, f"ops.{provider}", f"unknown provider {provider!r} (rules/taxonomy.toml)")
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
            raise loader.fail(path, f"ops.{provider}", "must be a list of host op names")
        for n in names:
            table = prefixes if n.endswith("::") else exact
            if n in table:
                raise loader.fail(path, f"ops.{provider}", f"{n!r} is already listed under {table[n]!r}")
            table[n] = provider
    rule_ids = {r.id for r in default_rules().rules}
    shared: dict[str, SharedRule] = {}
    entries = doc.get("shared", [])
    if not isinstance(entries, list):
        raise loader.fail(path, "shared", "must be a list of [[shared]] tables")
    for i, e in enumerate(entries):
        where = (
            f"shared {e.get('rule')}"
            if isinstance(e, dict) and isinstance(e.get("rule"), str)
            else f"shared #{i + 1}"
        )
        if not isinstance(e, dict):
            raise loader.fail(path, where, "must be a table")
        bad = sorted(set(e) - _SHARED_KEYS)
        if bad:
            raise loader.fail(path, where, f"unknown key(s) {', '.join(bad)}")
        rule = e.get("rule")
        if not isinstance(rule, str) or rule not in rule_ids:
            raise loader.fail(path, where, f"rule {rule!r} is no rule id of rules/kernels.toml")
        if rule in shared:
            raise loader.fail(path, where, "rule listed twice")
        if not isinstance(e.get("note"), str) or not e["note"].strip():
            raise loader.fail(path, where, "note must be a non-empty string")
        provs = e.get("providers")
        if not isinstance(provs, list) or len(set(provs)) < 2 or len(set(provs)) != len(provs):
            raise loader.fail(path, where, "providers must list at least two distinct providers")
        for p in provs:
            if p not in valid:
                raise loader.fail(path, where, f"unknown provider {p!r} (rules/taxonomy.toml)")
        named = e.get("named", {})
        if not isinstance(named, dict):
            raise loader.fail(path, where, "named must be a table of provider = marker")
        for p, marker in named.items():
            if p not in provs:
                raise loader.fail(path, where, f"named provider {p!r} is not one of its providers")
            if not isinstance(marker, str) or not marker:
                raise loader.fail(path, where, f"named.{p} must be a non-empty string")
        origin = e.get("origin")
        if origin is not None and origin not in provs:
            raise loader.fail(path, where, f"origin {origin!r} is not one of its providers")
        shared[rule] = SharedRule(
            rule=rule, providers=tuple(provs), named=tuple(named.items()), origin=origin
        )
    ordered = tuple(sorted(prefixes.items(), key=lambda kv: -len(kv[0])))
    return ProviderFacts(exact=exact, prefixes=ordered, shared=shared)
