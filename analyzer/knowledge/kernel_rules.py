"""Load and validate the kernel rule table (rules/kernels.toml) against the closed vocabularies, and classify names.

Contract (spec: rules/README.md):

* The taxonomy defines the stages, their categories and labels, and the providers, once. Every rule and
  every user rule file may only use those words.
* Rules are an ordered list; the first rule whose pattern is found (``re.search``, unanchored) in the
  normalized name or in the raw name wins. No rule matching is an explicit result, not an error: stage
  ``other``, provider ``unknown``, rule_id ``UNCLASSIFIED``.
* User rule files (``--rules extra.toml``) are loaded in the order given and go before the built-in table.
* The taxonomy (:mod:`analyzer.knowledge.taxonomy`) is re-exported here (``Taxonomy``, ``load_taxonomy``);
  files are read and memoised by their bytes in :mod:`analyzer.knowledge.loader`.
* Loading validates everything and raises :class:`analyzer.errors.InputError` listing every problem of
  every file, one line each naming the file and the rule id (then one summary line): unknown keys, bad ids, duplicate ids, unknown stage/provider, patterns that do not
  compile, are too long or may backtrack catastrophically (nested quantifiers, ambiguous alternation under
  a repeat, backreferences), examples that miss their own rule and not_examples that hit it.
* A truncated name (:func:`analyzer.knowledge.names.is_truncated`: it ends with ``…``) is matched the
  same way, but the answer only keeps what the visible prefix decides. A *rival* is an earlier rule
  that the lost tail could still have completed: one of its own examples, grafted onto the prefix at
  the cut, makes it match from inside the visible text, or makes it match at all when the example
  repeats the visible text through what made the matching rule match (a kernel of the same family
  whose deciding words the cut took;
  :meth:`RuleSet.tail_rivals`). Rivals that
  disagree on the provider make it ``unknown``; rivals that disagree on the stage make the result the
  unclassified stage with rule id :data:`TRUNCATED_RULE_ID`, unless the rule that matched is the
  generic ``elementwise`` fallback (which claims no role anyway).
* :data:`BARRIER_RULE_ID` (``MEM600``) is rocprof's ``<barrier packet>`` pseudo-dispatch: not a
  kernel, the one rule of stage ``other``; the roofline, the findings and the unclassified share skip it.

Classification is pure: :func:`classify_names` maps unique names to their classification; callers map the
result back onto the (much longer) kernel table.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from analyzer.errors import InputError
from analyzer.knowledge import loader
from analyzer.knowledge.names import ELLIPSIS, decode_name, group_key, is_truncated, normalize_name
from analyzer.knowledge.patterns import (
    parse_pattern,
    parsed_literals,
    parsed_problem,
    redos_problem,
)
from analyzer.knowledge.taxonomy import TAXONOMY, TAXONOMY_TOML, Taxonomy, load_taxonomy, parse_taxonomy

__all__ = [
    "BARRIER_RULE_ID",
    "TRUNCATED_RULE_ID",
    "GRID_AXES",
    "TOKEN_TILES",
    "Match",
    "PhaseEvidence",
    "Rule",
    "RuleSet",
    "Taxonomy",
    "category_labels",
    "classify_names",
    "default_rules",
    "load_rules",
    "load_taxonomy",
]

from analyzer.paths import RULES_DIR  # noqa: E402

KERNELS_TOML = RULES_DIR / "kernels.toml"

#: rocprof's ``<barrier packet>`` pseudo-dispatches (a queue wait, not a kernel): their own rule
BARRIER_RULE_ID = "MEM600"
#: a truncated name whose visible prefix does not decide the stage
TRUNCATED_RULE_ID = "TRUNCATED"
# the stage a truncated name may keep although an earlier rule could still have claimed its tail
_GENERIC_FALLBACK = "elementwise"
_ID_RE = re.compile(r"^[A-Z]{3}\d{3}$")
_RULE_KEYS = {
    "id",
    "pattern",
    "flags",
    "stage",
    "provider",
    "examples",
    "not_examples",
    "note",
    "phases",
    "phases_source",
    "query_tile_axes",
    "sequences_axis",
    "grid_source",
    "token_tile",
    "token_tile_source",
    "rows_axis",
    "key_length_pattern",
    "key_length_source",
}
#: In which phases engines run a rule's family: prefill only, decode only, or either (the default).
RULE_PHASES = ("prefill", "decode", "either")
#: launch-grid axes a rule's grid facts may name
GRID_AXES = ("x", "y", "z")
#: which decoded tile dimension runs along the tokens: ``m`` / ``n``, or ``min`` (the library's tile
#: order follows the call's transposition; a GEMM with a skinny tile has it along the tokens)
TOKEN_TILES = ("m", "n", "min")
_REQUIRED_KEYS = ("id", "pattern", "stage", "provider", "examples", "note")
_FLAG_LETTERS = {"i": re.IGNORECASE}


# --- data types -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rule:
    """One row of the rule table."""

    id: str
    pattern: str
    regex: re.Pattern[str]
    stage: str
    provider: str
    examples: tuple[str, ...]
    not_examples: tuple[str, ...]
    note: str
    flags: str = ""
    source: str = ""
    # in which phases engines run the family (RULE_PHASES), and where the library shows it
    phases: str = "either"
    phases_source: str = ""
    # launch-grid facts (PhaseEvidence): the axes one of which counts query tiles (a decode launch has 1
    # on one of them), the axis that counts the launch's sequences, and where the library shows them
    query_tile_axes: tuple[str, ...] = ()
    sequences_axis: str = ""
    grid_source: str = ""
    # which decoded tile dimension runs along the tokens (TOKEN_TILES), and where that is shown
    token_tile: str = ""
    token_tile_source: str = ""
    # the grid axis that counts a hidden-state norm's token rows (its source: grid_source), and the
    # pattern whose one group reads the attention's key length from a launch's name, with its source
    rows_axis: str = ""
    key_length_pattern: str = ""
    key_length_source: str = ""
    # literals of which at least one must occur in a name the pattern can match (a pure speed-up)
    literals: tuple[str, ...] | None = None

    def _found(self, text: str) -> bool:
        if self.literals is not None and not any(lit in text for lit in self.literals):
            return False
        return self.regex.search(text) is not None

    def hits(self, norm_name: str, raw_name: str = "") -> bool:
        """Whether the pattern is found in the normalized name or (when it differs) the raw name."""
        if self._found(norm_name):
            return True
        return bool(raw_name) and raw_name != norm_name and self._found(raw_name)


@dataclasses.dataclass(frozen=True)
class Match:
    """The classification of one kernel name."""

    stage: str
    category: str
    provider: str
    rule_id: str


@dataclasses.dataclass(frozen=True)
class PhaseEvidence:
    """The phase facts of the kernel rules, by rule id (rules/README.md, "Phase evidence").

    ``families``: ``prefill`` / ``decode`` for a family engines run in that phase only.
    ``query_tile_axes``: the grid axes one of which counts the launch's query tiles, the others
    heads or sequences, so a launch with one query token per sequence (a decode) has 1 on one of
    them; a launch with every one of them >= 2 held a query longer than a tile (prefill evidence).
    ``sequences_axis``: the grid axis that counts the launch's sequences (one query token each in a
    decode family). ``token_tile``: which decoded tile dimension runs along the tokens (TOKEN_TILES).
    ``rows_axis``: the grid axis that counts a hidden-state norm's token rows. ``key_length``: the
    compiled pattern whose one group is the key length (the keys every query row attends) that a
    launch's name carries (0 or no match: none).
    """

    families: dict[str, str] = dataclasses.field(default_factory=dict)
    query_tile_axes: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    sequences_axis: dict[str, str] = dataclasses.field(default_factory=dict)
    token_tile: dict[str, str] = dataclasses.field(default_factory=dict)
    rows_axis: dict[str, str] = dataclasses.field(default_factory=dict)
    key_length: dict[str, re.Pattern[str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RuleSet:
    """An ordered, validated rule list with its taxonomy. ``match`` is total and deterministic."""

    rules: tuple[Rule, ...]
    taxonomy: Taxonomy
    aliases: dict[str, str]
    sha256: str
    sources: tuple[str, ...]

    def match(self, norm_name: str, raw_name: str = "") -> Match:
        """First rule that hits ``norm_name`` (or ``raw_name``) wins; none -> the unclassified result.
        A truncated name keeps only what its visible prefix decides (module docstring)."""
        rule = self.first_rule(norm_name, raw_name)
        if rule is not None and is_truncated(norm_name):
            return self._match_truncated(rule, norm_name)
        if rule is not None:
            return Match(rule.stage, self.taxonomy.stage_category[rule.stage], rule.provider, rule.id)
        return self._unclassified()

    def _match_truncated(self, rule: Rule, norm_name: str) -> Match:
        rivals = self.tail_rivals(rule, norm_name)
        tx = self.taxonomy
        same_provider = all(r.provider == rule.provider for r in rivals)
        provider = rule.provider if same_provider else tx.unclassified_provider
        if all(r.stage == rule.stage for r in rivals) or rule.stage == _GENERIC_FALLBACK:
            return Match(rule.stage, tx.stage_category[rule.stage], provider, rule.id)
        return Match(
            tx.unclassified_stage, tx.stage_category[tx.unclassified_stage], provider, TRUNCATED_RULE_ID
        )

    def tail_rivals(self, rule: Rule, norm_name: str) -> list[Rule]:
        """The rules before ``rule`` that the cut tail of the truncated ``norm_name`` could still have
        made match: grafting one of their examples onto the visible prefix (the example's text from
        the cut on) gives a match that starts inside the prefix (the visible text began it), or any
        match when the example begins as the prefix does (the same family: the same text through the
        end of ``rule``'s own match, and at least :data:`_FAMILY_PREFIX` characters). Other rules whose
        words would lie wholly in the lost tail are no rivals: the prefix decides."""
        prefix = norm_name.removesuffix(ELLIPSIS)
        cut = len(prefix)
        own = rule.regex.search(norm_name)
        # same family: the example repeats the visible text at least through what made ``rule`` match
        family = max(own.end() if own is not None else cut, min(cut, _FAMILY_PREFIX))
        out = []
        for r in self.rules:
            if r is rule:
                break
            for e in _example_texts(r.examples):
                if len(e) > cut and _completes(r, e, prefix, family):
                    out.append(r)
                    break
        return out

    def _unclassified(self) -> Match:
        tx = self.taxonomy
        return Match(
            tx.unclassified_stage,
            tx.stage_category[tx.unclassified_stage],
            tx.unclassified_provider,
            tx.unclassified_rule_id,
        )

    def first_rule(self, norm_name: str, raw_name: str = "") -> Rule | None:
        """The first rule that hits, or None. Same result as ``Rule.hits`` in order, inlined for speed."""
        texts = (norm_name, raw_name) if raw_name and raw_name != norm_name else (norm_name,)
        for rule in self.rules:
            lits = rule.literals
            for text in texts:
                if lits is not None:
                    for lit in lits:
                        if lit in text:
                            break
                    else:
                        continue
                if rule.regex.search(text) is not None:
                    return rule
        return None

    def phase_evidence(self) -> PhaseEvidence:
        """What the rules say about phases: the families engines run in one phase only, and the
        launch-grid and tile facts of the others (:class:`PhaseEvidence`)."""
        return PhaseEvidence(
            families={r.id: r.phases for r in self.rules if r.phases != "either"},
            query_tile_axes={r.id: r.query_tile_axes for r in self.rules if r.query_tile_axes},
            sequences_axis={r.id: r.sequences_axis for r in self.rules if r.sequences_axis},
            token_tile={r.id: r.token_tile for r in self.rules if r.token_tile},
            rows_axis={r.id: r.rows_axis for r in self.rules if r.rows_axis},
            key_length={r.id: re.compile(r.key_length_pattern) for r in self.rules if r.key_length_pattern},
        )

    def rule(self, rule_id: str) -> Rule | None:
        """The rule with this id, following aliases of retired ids; None when unknown."""
        seen: set[str] = set()
        while rule_id in self.aliases and rule_id not in seen:
            seen.add(rule_id)
            rule_id = self.aliases[rule_id]
        for r in self.rules:
            if r.id == rule_id:
                return r
        return None


# an example "of the same family" as a truncated name repeats at least this much of its visible text
_FAMILY_PREFIX = 24
# characters on each side of where a grafted match starts that the example must share with the visible
# text: the graft is the example's own text there, not a coincidence of the cut's position
_GRAFT_CONTEXT = 8


def _completes(r: Rule, example: str, prefix: str, family: int) -> bool:
    """Whether ``example`` of rule ``r``, grafted onto the visible ``prefix`` at the cut, shows that the
    lost tail could have made ``r`` match (:meth:`RuleSet.tail_rivals`).

    The graft is positional, so it only stands for the example where the example reads as the visible
    text does: a match begun inside the prefix counts when the example has the prefix's text around
    that start (not one character of the prefix meeting an unrelated example's tail by chance, nor a
    ``\\w*?`` bridge from a visible anchor into words the visible text contradicts); a match of the
    same family counts when the visible part of the rule's own match in the example is the visible text
    (an example whose deciding words the visible text already contradicts is no rival)."""
    cut = len(prefix)
    m = r.regex.search(prefix + example[cut:])
    if m is None:
        return False
    if m.start() < cut:
        lo, hi = max(0, m.start() - _GRAFT_CONTEXT), min(cut, m.start() + _GRAFT_CONTEXT)
        if example[lo:hi] == prefix[lo:hi]:
            return True
    if example[:family] != prefix[:family]:
        return False
    own = r.regex.search(example)
    if own is None or own.start() >= cut:
        return True  # its words lie in the lost tail, the visible text is all the example's
    return example[own.start() : min(cut, own.end())] == prefix[own.start() : min(cut, own.end())]


@functools.lru_cache(maxsize=4096)
def _example_texts(examples: tuple[str, ...]) -> tuple[str, ...]:
    """A rule's examples as written and normalized (each text once)."""
    return tuple(dict.fromkeys(t for ex in examples for t in (normalize_name(ex), ex)))


# --- loading --------------------------------------------------------------------------------------------


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _parse_rule(entry: Any, index: int, path: Path, taxonomy: Taxonomy) -> tuple[Rule | None, list[str]]:
    """The rule of one ``[[rule]]`` table, or None, and every problem found in it (one line each)."""
    rid = entry.get("id") if isinstance(entry, dict) else None
    label = f"rule {rid}" if isinstance(rid, str) else f"rule #{index + 1}"
    problems: list[str] = []

    def fail(msg: str) -> None:
        problems.append(str(loader.fail(path, label, msg)))

    if not isinstance(entry, dict):
        fail("must be a table")
        return None, problems
    _check_words(entry, rid, taxonomy, fail)
    phases = entry.get("phases", "either")
    if phases not in RULE_PHASES:
        fail(f"phases must be one of {', '.join(RULE_PHASES)}")
    phases_source = entry.get("phases_source", "")
    if not isinstance(phases_source, str) or (phases != "either" and not phases_source.strip()):
        fail(
            "phases_source must name the library code or docs that show the phase (required unless phases = 'either')"
        )
    _check_grid_keys(entry, phases, fail)
    examples = entry.get("examples")
    if "examples" in entry and (not _str_list(examples) or not examples):
        fail("examples must be a non-empty list of kernel names")
    not_examples = entry.get("not_examples", [])
    if not _str_list(not_examples):
        fail("not_examples must be a list of kernel names")
    flag_text = entry.get("flags", "")
    flags = 0
    if not isinstance(flag_text, str) or set(flag_text) - set(_FLAG_LETTERS):
        fail(f"flags may only contain {''.join(sorted(_FLAG_LETTERS))}")
    else:
        for letter in flag_text:
            flags |= _FLAG_LETTERS[letter]
    pattern = entry.get("pattern")
    regex, parsed = _compiled(pattern, flags, examples, not_examples, fail)
    if problems or regex is None:
        return None, problems
    rule = Rule(
        id=rid,  # type: ignore[arg-type]  # checked above
        pattern=pattern,  # type: ignore[arg-type]
        regex=regex,
        stage=entry["stage"],
        provider=entry["provider"],
        examples=tuple(examples),  # type: ignore[arg-type]
        not_examples=tuple(not_examples),
        note=" ".join(entry["note"].split()),
        flags=flag_text,
        source=str(path),
        phases=phases,
        phases_source=" ".join(str(phases_source).split()),
        query_tile_axes=tuple(entry.get("query_tile_axes", ())),
        sequences_axis=entry.get("sequences_axis", ""),
        grid_source=" ".join(str(entry.get("grid_source", "")).split()),
        token_tile=entry.get("token_tile", ""),
        token_tile_source=" ".join(str(entry.get("token_tile_source", "")).split()),
        rows_axis=entry.get("rows_axis", ""),
        key_length_pattern=entry.get("key_length_pattern", ""),
        key_length_source=" ".join(str(entry.get("key_length_source", "")).split()),
        literals=parsed_literals(parsed, flags),
    )
    return rule, problems


def _check_words(entry: dict[str, Any], rid: Any, taxonomy: Taxonomy, fail: Callable[[str], None]) -> None:
    """Check one rule's keys, its id and its words (pattern, stage, provider, note), the stage and
    provider against the taxonomy, reporting every problem through ``fail``."""
    unknown = sorted(set(entry) - _RULE_KEYS)
    if unknown:
        fail(f"unknown key(s) {', '.join(unknown)}")
    missing = [k for k in _REQUIRED_KEYS if k not in entry]
    if missing:
        fail(f"missing key(s) {', '.join(missing)}")
    if "id" in entry and (not isinstance(rid, str) or not _ID_RE.match(rid)):
        fail("id must be three capital letters and three digits, e.g. ATT001")
    for key in ("pattern", "stage", "provider", "note"):
        if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
            fail(f"{key} must be a non-empty string")
    if isinstance(entry.get("stage"), str) and entry["stage"].strip():
        if entry["stage"] not in taxonomy.stage_category:
            fail(f"unknown stage {entry['stage']!r} (rules/taxonomy.toml)")
    if isinstance(entry.get("provider"), str) and entry["provider"].strip():
        if entry["provider"] not in taxonomy.providers:
            fail(f"unknown provider {entry['provider']!r} (rules/taxonomy.toml)")


def _compiled(
    pattern: Any, flags: int, examples: Any, not_examples: Any, fail: Callable[[str], None]
) -> tuple[re.Pattern[str] | None, Any]:
    """The compiled pattern of one rule and its parse (None, None for no usable pattern): rejected
    when it may backtrack catastrophically; its examples must hit it and its not_examples miss it.
    Every problem is reported through ``fail``."""
    regex = parsed = None
    if isinstance(pattern, str) and pattern.strip():
        # parsed once for both checks (the parse is most of a rule's load time)
        parsed, problem = parse_pattern(pattern, flags)
        if problem := problem or parsed_problem(parsed, flags):
            fail(f"pattern rejected: {problem}")
        else:
            regex = re.compile(pattern, flags)
    if regex is not None:
        for ex in examples if _str_list(examples) else []:
            if not _hits(regex, ex):
                fail(f"example does not match its own pattern: {ex[:120]!r}")
        for ex in not_examples if _str_list(not_examples) else []:
            if _hits(regex, ex):
                fail(f"not_example matches the pattern: {ex[:120]!r}")
    return regex, parsed


def _check_grid_keys(entry: dict[str, Any], phases: Any, fail: Callable[[str], None]) -> None:
    """Check the launch-grid and token-tile keys of one rule (each fact needs its source), reporting
    every problem through ``fail``."""
    axes = entry.get("query_tile_axes", [])
    if not (_str_list(axes) and all(a in GRID_AXES for a in axes) and len(set(axes)) == len(axes)):
        fail(f"query_tile_axes must be a list of distinct grid axes ({', '.join(GRID_AXES)})")
    seq = entry.get("sequences_axis", "")
    if seq not in ("", *GRID_AXES):
        fail(f"sequences_axis must be one of {', '.join(GRID_AXES)}")
    elif seq and phases != "decode":
        fail("sequences_axis counts decode tokens, so it needs phases = 'decode'")
    if axes and phases != "either":
        fail(
            "query_tile_axes tells the phase of a family engines run in either phase: it needs phases = 'either'"
        )
    rows = entry.get("rows_axis", "")
    if rows not in ("", *GRID_AXES):
        fail(f"rows_axis must be one of {', '.join(GRID_AXES)}")
    grid_source = entry.get("grid_source", "")
    if not isinstance(grid_source, str) or ((axes or seq or rows) and not grid_source.strip()):
        fail(
            "grid_source must name the library code that launches the grid "
            "(required with query_tile_axes, sequences_axis or rows_axis)"
        )
    keys = entry.get("key_length_pattern", "")
    if not isinstance(keys, str):
        fail("key_length_pattern must be a pattern string")
    elif keys:
        problem = redos_problem(keys)
        if problem is None and re.compile(keys).groups != 1:
            problem = "it must have exactly one group (the key length)"
        if problem:
            fail(f"key_length_pattern rejected: {problem}")
        source = entry.get("key_length_source", "")
        if not isinstance(source, str) or not source.strip():
            fail(
                "key_length_source must name the library code that names the key length "
                "(required with key_length_pattern)"
            )
    tile = entry.get("token_tile", "")
    if tile not in ("", *TOKEN_TILES):
        fail(f"token_tile must be one of {', '.join(TOKEN_TILES)}")
    tile_source = entry.get("token_tile_source", "")
    if not isinstance(tile_source, str) or (tile and not tile_source.strip()):
        fail("token_tile_source must say where the tile order is shown (required with token_tile)")


def _hits(regex: re.Pattern[str], name: str) -> bool:
    """Whether ``regex`` is found in the normalized or the raw name (as :meth:`Rule.hits`)."""
    norm = normalize_name(name)
    return regex.search(norm) is not None or (name != norm and regex.search(name) is not None)


def _parse_rule_file(
    path: Path, doc: dict[str, Any], taxonomy: Taxonomy
) -> tuple[list[Rule], dict[str, str], list[str]]:
    """The file's rules and aliases, and every problem found in it (one line each)."""
    problems: list[str] = []
    allowed = {"format_version", "rule", "aliases"}
    unknown = sorted(set(doc) - allowed)
    if unknown:
        problems.append(str(loader.fail(path, "", f"unknown top-level key(s) {', '.join(unknown)}")))
    version = doc.get("format_version", 1)
    if version != 1:
        msg = f"unsupported format_version {version!r} (this analyzer reads 1)"
        problems.append(str(loader.fail(path, "format_version", msg)))
    entries = doc.get("rule", [])
    rules: list[Rule] = []
    if not isinstance(entries, list):
        problems.append(str(loader.fail(path, "rule", "rules must be an array of tables ([[rule]])")))
        entries = []
    for i, e in enumerate(entries):
        rule, found = _parse_rule(e, i, path, taxonomy)
        problems.extend(found)
        if rule is not None:
            rules.append(rule)
    aliases = doc.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        msg = "[aliases] maps retired ids to current ids (strings)"
        problems.append(str(loader.fail(path, "aliases", msg)))
        aliases = {}
    for old in aliases:
        if not _ID_RE.match(old):
            problems.append(str(loader.fail(path, f"aliases.{old}", "retired id must look like ATT001")))
    return rules, dict(aliases), problems


def load_rules(
    extra_files: Iterable[str | Path] = (),
    *,
    kernels_file: str | Path = KERNELS_TOML,
    taxonomy_file: str | Path = TAXONOMY_TOML,
) -> RuleSet:
    """Load the built-in rule table, with ``extra_files`` (user rules) first, in the order given.

    Files already loaded with the same bytes give the same RuleSet without parsing again (checking
    every pattern is the slow part; a run loads the rules once here and once per worker process):
    :func:`analyzer.knowledge.loader.load_files` keys the memo by every file's bytes."""
    files = [Path(taxonomy_file), *(Path(p) for p in extra_files), Path(kernels_file)]
    return loader.load_files(files, _load_rules)


def _load_rules(contents: list[tuple[Path, bytes]]) -> RuleSet:
    """The RuleSet of (taxonomy, rule files...) given as (path, bytes): parsed from the bytes the
    memo is keyed by, so a file changed since cannot slip in under the old key."""
    (tax_path, tax_bytes), *rule_files = contents
    paths = [p for p, _ in rule_files]
    taxonomy = parse_taxonomy(loader.parse_toml(tax_path, tax_bytes), tax_path)
    digest = hashlib.sha256()
    digest.update(tax_bytes)
    rules: list[Rule] = []
    aliases: dict[str, str] = {}
    seen: dict[str, str] = {}
    problems: list[str] = []
    for path, raw in rule_files:
        doc = loader.parse_toml(path, raw)
        digest.update(b"\0" + raw)
        file_rules, file_aliases, found = _parse_rule_file(path, doc, taxonomy)
        problems.extend(found)
        for r in file_rules:
            if r.id in seen:
                problems.append(str(loader.fail(path, f"rule {r.id}", f"id already used in {seen[r.id]}")))
                continue
            seen[r.id] = str(path)
            rules.append(r)
        aliases.update(file_aliases)
    for old, new in aliases.items():
        if old in seen:
            msg = "id is retired (listed in [aliases]); use a new id"
            problems.append(str(loader.fail(seen[old], f"rule {old}", msg)))
        if new not in seen and new not in aliases:
            problems.append(str(loader.fail(paths[-1], f"aliases.{old}", f"points to unknown rule {new}")))
    if problems:
        raise _rule_file_errors(problems)
    return RuleSet(
        rules=tuple(rules),
        taxonomy=taxonomy,
        aliases=aliases,
        sha256=digest.hexdigest(),
        sources=tuple(str(p) for p in paths),
    )


def _rule_file_errors(problems: list[str]) -> InputError:
    """Every problem of the rule files, one line each, as one error whose message is the summary."""
    if len(problems) == 1:
        return InputError(problems[0])
    files = sorted({p.split(": ", 1)[0] for p in problems})
    where = files[0] if len(files) == 1 else f"{len(files)} rule files"
    return InputError(f"{where}: {len(problems)} problems in the rules (listed above)", details=problems)


@functools.lru_cache(maxsize=1)
def default_rules() -> RuleSet:
    """The built-in rule table (cached)."""
    return load_rules()


def category_labels() -> dict[str, str]:
    """Category id -> display label, in display order."""
    return dict(TAXONOMY.category_labels)


# --- classification -------------------------------------------------------------------------------------


def classify_names(names: Sequence[str], ruleset: RuleSet | None = None) -> list[dict[str, Any]]:
    """Classify each unique name once (first-seen order).

    Returns one dict per unique input name with keys ``name``, ``norm_name``, ``stage``, ``category``,
    ``provider``, ``rule_id``, ``tile_m``, ``tile_n``, ``tile_k``, ``split_k`` and ``group_key``.
    """
    rs = ruleset if ruleset is not None else default_rules()
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        norm = normalize_name(name)
        m = rs.match(norm, name)
        dec = decode_name(norm)
        out.append(
            {
                "name": name,
                "norm_name": norm,
                "stage": m.stage,
                "category": m.category,
                "provider": m.provider,
                "rule_id": m.rule_id,
                "tile_m": dec["tile_m"],
                "tile_n": dec["tile_n"],
                "tile_k": dec["tile_k"],
                "split_k": dec["split_k"],
                "group_key": group_key(norm, dec),
            }
        )
    return out
