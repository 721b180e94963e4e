"""``rules``: list and explain every rule of every kind (kernel, op, annotation, attention_op, structure,
phase, finding); check and try the kernel rule table (rules/kernels.toml)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import click

from analyzer.errors import UsageError
from analyzer.knowledge import kernel_rules as rules_mod
from analyzer.knowledge import rule_catalogue as catalogue
from analyzer.knowledge.names import normalize_name


@click.group()
def rules() -> None:
    """Inspect the rules: kernel rules (first match wins; spec in rules/README.md), op hints,
    annotation patterns, attention-op layouts, structure and phase rules, findings."""


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
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(catalogue.KINDS),
    help="Only rules of this kind (repeatable).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="A JSON list of every rule: id, kind, summary and its fields."
)
def list_rules(extra: tuple[str, ...], kinds: tuple[str, ...], as_json: bool) -> int:
    """Every rule that can decide an answer, one line each: id, kind, then for kernel rules (in
    matching order, the fallbacks last) stage, provider and pattern, for the others a summary.
    Kinds: kernel (rules/kernels.toml), op (rules/ops.toml), annotation (rules/annotations.toml),
    attention_op (rules/attention_ops.toml), structure and phase (rules/structure.toml), finding
    (rules/findings.toml)."""
    entries = [e for e in _catalogue(extra) if not kinds or e.kind in kinds]
    if as_json:
        click.echo(json.dumps([e.as_dict() for e in entries], indent=1))
        return 0
    for e in entries:
        if e.kind == "kernel" and not e.fields["fallback"]:
            rest = f"{e.fields['stage']:<16} {e.fields['provider']:<11} {e.fields['pattern']}"
        else:
            rest = e.summary
        click.echo(f"{e.id:<14} {e.kind:<12} {rest}")
    counts = Counter(e.kind for e in entries)
    click.echo(
        f"{len(entries)} rules: " + ", ".join(f"{counts[k]} {k}" for k in catalogue.KINDS if counts[k])
    )
    if not kinds or "kernel" in kinds:
        tx = rules_mod.load_taxonomy()
        click.echo(
            f"unmatched kernel names -> stage {tx.unclassified_stage}, provider {tx.unclassified_provider} "
            f"({tx.unclassified_rule_id}); `rules explain ID` tells more"
        )
    return 0


def _catalogue(extra: tuple[str, ...] = ()) -> list[catalogue.RuleEntry]:
    """The rule catalogue with each finding's summary taken from its check's docstring."""
    from analyzer.analyses.findings import CHECKS  # pandas

    out = []
    for e in catalogue.rule_catalogue(extra):
        fn = CHECKS.get(e.fields.get("check", "")) if e.kind == "finding" else None
        doc = inspect.cleandoc(fn.__doc__ or "") if fn is not None else ""
        if doc:
            first = " ".join(doc.split("\n\n")[0].split()).replace("``", "")
            first = first.split(". ")[0].rstrip(".")
            e = dataclasses.replace(e, summary=f"{e.fields['check']}: {first}"[:160])
        out.append(e)
    return out


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
    """Everything about one rule of any kind (`rules list` shows them): a kernel rule (pattern, stage,
    provider, note, examples) or fallback, an op hint, an annotation pattern, an attention-op layout,
    a structure or phase rule (contract, what it decides and needs, the vocabularies and thresholds it
    reads, its cases under tests/cases/), or a finding (F001 ... or its check name: what it looks
    for, its severity and its thresholds)."""
    finding = _finding_check(rule_id)
    if finding is not None:
        _explain_finding(*finding)
        return 0
    rs = _ruleset(extra)
    r = rs.rule(rule_id.upper())
    if r is not None:
        _explain_kernel_rule(rule_id, r, rs)
        return 0
    entry = catalogue.find_entry(catalogue.rule_catalogue(extra), rule_id)
    if entry is None:
        from analyzer.knowledge.structure_rules import load_structure

        retired = load_structure().retired.get(rule_id.upper())
        if retired is not None:
            click.echo(f"{rule_id.upper()} is retired (rules/structure.toml [retired]): {retired}")
            return 0
        raise UsageError(f"no rule {rule_id!r} (see `llm-kernel-map rules list`)")
    if entry.kind in ("structure", "phase"):
        _explain_structure(entry.id)
    else:
        _explain_entry(entry)
    return 0


def _explain_kernel_rule(asked: str, r: rules_mod.Rule, rs: rules_mod.RuleSet) -> None:
    if r.id != asked.upper():
        click.echo(f"{asked} is retired; it is now {r.id}")
    click.echo(
        f"{r.id}: kernel rule, stage {r.stage} ({rs.taxonomy.stage_category[r.stage]}), provider {r.provider}"
    )
    click.echo(f"  pattern: {r.pattern}" + (f"  flags: {r.flags}" if r.flags else ""))
    click.echo(f"  source: {r.source}")
    click.echo(f"  note: {r.note}")
    click.echo(
        f"  phases: {r.phases}"
        + (f" ({r.phases_source})" if r.phases_source else " (engines run it in either phase)")
    )
    if r.query_tile_axes:
        click.echo(
            f"  query tiles on grid axis {' or '.join(r.query_tile_axes)}: every one >= 2 is a query longer "
            f"than a tile, prefill evidence (PHS030; {r.grid_source})"
        )
    if r.sequences_axis:
        click.echo(
            f"  sequences on grid axis {r.sequences_axis}: a decode step's tokens (PHS031; {r.grid_source})"
        )
    if r.token_tile:
        click.echo(f"  token tile: {r.token_tile} (PHS032; {r.token_tile_source})")
    for e in r.examples:
        click.echo(f"  example: {e}")
    for e in r.not_examples:
        click.echo(f"  not: {e}")


def _shown(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(_shown(x) if isinstance(x, (list, tuple)) else str(x) for x in v)
    if isinstance(v, dict):
        return "; ".join(f"{k}: {_shown(x)}" for k, x in v.items())
    return str(v)


def _explain_entry(e: catalogue.RuleEntry) -> None:
    """A kernel fallback, an op hint, an annotation pattern or an attention-op layout: every field."""
    what = {
        "kernel": "kernel rule fallback",
        "op": "op hint",
        "annotation": "annotation pattern",
        "attention_op": "attention-op layout",
    }.get(e.kind, e.kind)
    click.echo(f"{e.id}: {what} ({e.file})")
    for k, v in e.fields.items():
        if k in ("fallback",) or v is None or v == "":
            continue
        click.echo(f"  {k}: {_shown(v)}")


def _explain_structure(rule_id: str) -> None:
    from analyzer.knowledge.structure_rules import load_structure

    know = load_structure()
    r = know.rule(rule_id)
    assert r is not None  # found in the catalogue, which lists the same file
    click.echo(f"{r.id}: {r.name} ({r.kind} rule, rules/structure.toml)")
    click.echo(f"  contract: {r.contract}")
    click.echo(f"  decides: {', '.join(r.decides)}")
    click.echo(f"  needs: {', '.join(r.needs)}")
    click.echo(f"  source: {r.source}")
    click.echo(f"  added: {r.added}")
    th = know.thresholds.as_dict()
    vocab = [k for k in r.reads if k in know.vocabulary]
    limits = [k for k in r.reads if k in th]
    if not r.reads:
        click.echo("  reads: nothing from rules/structure.toml")
    for k in vocab:
        click.echo(f"  vocabulary {k}: {_shown(know.vocabulary[k])}")
    for k in limits:
        lo, hi, note = know.ranges[k]
        click.echo(f"  threshold {k} = {th[k]} (range {lo}..{hi}; --set structure.{k}=VALUE): {note}")
    cases = catalogue.rule_cases(r.id)
    if not cases:
        click.echo("  cases: none yet")
    for c in cases:
        click.echo(f"  case ({c.role}): {c.name} (tests/cases/{c.path})")


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
