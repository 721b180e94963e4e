"""``rules``: list, explain, check and try the kernel rule table (rules/kernels.toml); explain findings."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import click

from analyzer.errors import UsageError
from analyzer.knowledge import kernel_rules as rules_mod
from analyzer.knowledge.names import normalize_name


@click.group()
def rules() -> None:
    """Inspect the kernel classification rules (first match wins; spec in rules/README.md)."""


def _ruleset(extra: tuple[str, ...]) -> rules_mod.RuleSet:
    return rules_mod.load_rules(list(extra))


@rules.command("list")
@click.option(
    "--rules",
    "extra",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Extra rule file first.",
)
def list_rules(extra: tuple[str, ...]) -> int:
    """One line per rule, in matching order: id, stage, provider, pattern."""
    rs = _ruleset(extra)
    for r in rs.rules:
        click.echo(f"{r.id}  {r.stage:<16} {r.provider:<11} {r.pattern}")
    click.echo(
        f"{len(rs.rules)} rules; unmatched names -> stage {rs.taxonomy.unclassified_stage}, "
        f"provider {rs.taxonomy.unclassified_provider} ({rs.taxonomy.unclassified_rule_id})"
    )
    return 0


@rules.command("explain")
@click.argument("rule_id")
@click.option(
    "--rules",
    "extra",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Extra rule file first.",
)
def explain(rule_id: str, extra: tuple[str, ...]) -> int:
    """Everything about one rule (pattern, stage, provider, note, examples), or about one finding
    (F001 ... or its check name: what it looks for, its severity and its --set thresholds)."""
    finding = _finding_check(rule_id)
    if finding is not None:
        _explain_finding(*finding)
        return 0
    rs = _ruleset(extra)
    r = rs.rule(rule_id.upper())
    if r is None:
        raise UsageError(f"no rule {rule_id!r} (see `llm-kernel-map rules list`)")
    if r.id != rule_id.upper():
        click.echo(f"{rule_id} is retired; it is now {r.id}")
    click.echo(f"{r.id}: stage {r.stage} ({rs.taxonomy.stage_category[r.stage]}), provider {r.provider}")
    click.echo(f"  pattern: {r.pattern}" + (f"  flags: {r.flags}" if r.flags else ""))
    click.echo(f"  source: {r.source}")
    click.echo(f"  note: {r.note}")
    for e in r.examples:
        click.echo(f"  example: {e}")
    for e in r.not_examples:
        click.echo(f"  not: {e}")
    return 0


def _finding_check(ident: str) -> tuple[str, dict[str, Any]] | None:
    """(check name, settings) of a finding named by id (``F006``) or check name, else None."""
    from analyzer.knowledge.finding_settings import load_finding_settings

    settings = load_finding_settings()
    for check, cfg in settings.items():
        if ident.lower() == check or ident.upper() == str(cfg.get("id", "")).upper():
            return check, cfg
    if re.fullmatch(r"[Ff]\d{3}", ident):
        ids = ", ".join(str(c.get("id")) for c in settings.values())
        raise UsageError(f"no finding {ident!r} (findings: {ids}; rules/findings.toml)")
    return None


def _explain_finding(check: str, cfg: dict[str, Any]) -> None:
    from analyzer.analyses.findings import CHECKS  # pandas

    click.echo(f"{cfg['id']}: finding {check} (severity {cfg.get('severity', '?')})")
    fn = CHECKS.get(check)
    doc = inspect.cleandoc(fn.__doc__ or "") if fn is not None else ""
    for para in doc.split("\n\n") if doc else ["(no description)"]:
        click.echo(
            textwrap.fill(
                " ".join(para.split()).replace("``", ""),
                width=100,
                initial_indent="  ",
                subsequent_indent="  ",
            )
        )
    from analyzer.knowledge.finding_settings import finding_ranges

    keys = [k for k in cfg if k not in ("id", "severity")]
    bounds = finding_ranges().get(check, {})
    click.echo(f"  thresholds (rules/findings.toml; change with --set {check}.KEY=VALUE):")
    for k in keys:
        v = cfg[k]
        shown = ", ".join(map(str, v)) if isinstance(v, list) else v
        rng = f"  (range {bounds[k][0]:g} .. {bounds[k][1]:g})" if k in bounds else ""
        click.echo(f"    {check}.{k} = {shown}{rng}")
    if keys:
        k = keys[0]
        v = cfg[k]
        example = ",".join(map(str, v)) if isinstance(v, list) else v
        click.echo(f"  e.g. --set {check}.{k}={example}")


@rules.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
def check(file: str) -> int:
    """Validate a user rule FILE together with the built-in table (schema, ReDoS, examples, shadowing)."""
    rs = _ruleset((file,))  # schema, vocabularies and ReDoS safety are checked while loading
    mine = [r for r in rs.rules if r.source and Path(r.source).resolve() == Path(file).resolve()]
    problems = []
    for r in mine:
        for ex in r.examples:
            first = rs.first_rule(normalize_name(ex), ex)
            if first is None or first.id != r.id:
                who = "no rule" if first is None else f"earlier rule {first.id}"
                problems.append(f"{r.id}: example {ex[:80]!r} is classified by {who}")
        for ex in r.not_examples:
            if r.hits(normalize_name(ex), ex):
                problems.append(f"{r.id}: not_example {ex[:80]!r} matches the pattern")
    for p in problems:
        click.echo(p)
    if problems:
        raise UsageError(f"{file}: {len(problems)} problem(s) (listed above)")
    n = len(mine)
    click.echo(f"{file}: ok ({n} rules, taking precedence over {len(rs.rules) - n} built-in rules)")
    return 0


@rules.command("classify")
@click.argument("names", nargs=-1, required=True)
@click.option(
    "--rules",
    "extra",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Extra rule file first.",
)
def classify(names: tuple[str, ...], extra: tuple[str, ...]) -> int:
    """Classify kernel NAME... by name alone: normalized name, stage, provider, rule id, decoded fields."""
    from analyzer.knowledge.provider_ops import load_provider_facts

    rs = _ruleset(extra)
    facts = load_provider_facts()
    for r in rules_mod.classify_names(list(names), rs):
        # a name several libraries ship: by name alone its provider is unknown (rules/providers.toml)
        provider = facts.name_provider(r["rule_id"], r["norm_name"], r["provider"])
        shared = " (a name several libraries ship; in a trace, the launching op decides)"
        click.echo(r["name"])
        click.echo(f"  normalized: {r['norm_name']}")
        click.echo(
            f"  stage: {r['stage']} ({r['category']})  provider: {provider}  rule: {r['rule_id']}"
            + (shared if r["rule_id"] in facts.shared and provider == "unknown" else "")
        )
        tile = [r.get(f"tile_{a}") for a in "mnk"]
        if any(t is not None for t in tile):
            click.echo("  tile: " + "x".join("?" if t is None else str(t) for t in tile))
        if r.get("split_k") is not None:
            click.echo(f"  split_k: {r['split_k']}")
        click.echo(f"  group_key: {r['group_key']}")
    return 0
