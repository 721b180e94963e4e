"""Pattern safety and speed for every rule file whose patterns a trace's names meet.

Contract: :func:`redos_problem` says why a pattern could backtrack catastrophically (or None): the
structural check on the parsed pattern that rules/README.md describes (no quantifier inside a
repeated group, no overlapping alternatives under a repeat, no repeated group that can match empty,
no backreferences, at most :data:`MAX_PATTERN_LENGTH` characters). :func:`required_literals` gives
literals of which at least one must occur in any text the pattern matches (None: no such set), a pure
prefilter for matching many names. Both parse the pattern once (``re._parser``).
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python >= 3.11 moved the regex parser to re._parser
    import re._constants as _sre_c
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

__all__ = [
    "MAX_PATTERN_LENGTH",
    "parse_pattern",
    "parsed_literals",
    "parsed_problem",
    "redos_problem",
    "required_literals",
]

MAX_PATTERN_LENGTH = 600

# --- ReDoS guard ----------------------------------------------------------------------------------------

_REPEATS = {_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT}
if hasattr(_sre_c, "POSSESSIVE_REPEAT"):
    _REPEATS.add(_sre_c.POSSESSIVE_REPEAT)
_ATOMIC = getattr(_sre_c, "ATOMIC_GROUP", None)
_ALL = None  # "any character" in first-character sets
_SMALL_RANGE = 512


def _items(sub: Any) -> list[tuple[Any, Any]]:
    return list(sub.data) if hasattr(sub, "data") else list(sub)


def _scoped_icase(op: Any, av: Any) -> bool:
    """Whether a group turns IGNORECASE on for its content, as in ``(?i:...)``."""
    return op is _sre_c.SUBPATTERN and bool(av[1] & re.IGNORECASE)


def _first_chars(sub: Any, icase: bool) -> tuple[frozenset[int] | None, bool]:
    """First-character set of a subpattern (None = any) and whether it can match the empty string."""
    acc: set[int] = set()
    for op, av in _items(sub):
        if op is _sre_c.AT or op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT):
            continue
        if op is _sre_c.LITERAL:
            acc.add(av)
            if icase:
                ch = chr(av)
                acc.update(ord(c) for c in (ch.lower(), ch.upper()) if len(c) == 1)
            return frozenset(acc), False
        if op is _sre_c.IN:
            chars: set[int] = set()
            for iop, iav in av:
                if iop is _sre_c.LITERAL:
                    chars.add(iav)
                elif iop is _sre_c.RANGE and iav[1] - iav[0] <= _SMALL_RANGE:
                    chars.update(range(iav[0], iav[1] + 1))
                else:  # NEGATE, CATEGORY, huge ranges: be conservative
                    return _ALL, False
            if icase:
                chars |= {
                    ord(c) for ch in list(chars) for c in (chr(ch).lower(), chr(ch).upper()) if len(c) == 1
                }
            return frozenset(acc | chars), False
        if op is _sre_c.SUBPATTERN or (_ATOMIC is not None and op is _ATOMIC):
            inner = av[-1] if op is _sre_c.SUBPATTERN else av
            f, nullable = _first_chars(inner, icase or _scoped_icase(op, av))
            if f is _ALL:
                return _ALL, False
            acc |= f
            if not nullable:
                return frozenset(acc), False
            continue
        if op is _sre_c.BRANCH:
            nullable_any = False
            for alt in av[1]:
                f, nullable = _first_chars(alt, icase)
                if f is _ALL:
                    return _ALL, False
                acc |= f
                nullable_any = nullable_any or nullable
            if not nullable_any:
                return frozenset(acc), False
            continue
        if op in _REPEATS:
            lo, _hi, inner = av
            f, nullable = _first_chars(inner, icase)
            if f is _ALL:
                return _ALL, False
            acc |= f
            if lo > 0 and not nullable:
                return frozenset(acc), False
            continue
        return _ALL, False  # ANY, NOT_LITERAL, CATEGORY, GROUPREF ...
    return frozenset(acc), True


_OVERLAP = "overlapping alternatives inside a repeated group"


def _repeat_body_problem(sub: Any, icase: bool, body_nullable: bool = False) -> str | None:
    """Inside a repeat that can iterate: no quantifiers at all, and alternatives with disjoint first chars.

    Python's parser factors a common prefix out of alternatives (``(a|aa)`` becomes ``a(?:|a)``), so an
    empty alternative is an overlap (one alternative a prefix of another) unless the repeated body as a
    whole (``body_nullable``) can match empty."""
    for op, av in _items(sub):
        if op in _REPEATS:
            return "nested quantifier (a quantified item inside a repeated group)"
        if op is _sre_c.SUBPATTERN or (_ATOMIC is not None and op is _ATOMIC):
            inner = av[-1] if op is _sre_c.SUBPATTERN else av
            if p := _repeat_body_problem(inner, icase or _scoped_icase(op, av), body_nullable):
                return p
        elif op is _sre_c.BRANCH:
            firsts = []
            for alt in av[1]:
                f, nullable = _first_chars(alt, icase)
                if nullable and body_nullable:
                    return "repeated group that can match empty (an alternative matches the empty string)"
                if nullable:
                    return f"{_OVERLAP} (one alternative is a prefix of another, as in (a|aa)+)"
                firsts.append(f)
                if p := _repeat_body_problem(alt, icase, body_nullable):
                    return p
            for i, a in enumerate(firsts):
                for b in firsts[i + 1 :]:
                    if a is _ALL or b is _ALL or a & b:
                        return _OVERLAP
        elif op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT):
            if p := _repeat_body_problem(av[1], icase):
                return p
    return None


def _walk_problem(sub: Any, icase: bool) -> str | None:
    for op, av in _items(sub):
        if op in (_sre_c.GROUPREF, _sre_c.GROUPREF_EXISTS):
            return "backreference"
        if op in _REPEATS:
            _lo, hi, inner = av
            if hi > 1:
                if p := _repeat_body_problem(inner, icase, _first_chars(inner, icase)[1]):
                    return p
            if p := _walk_problem(inner, icase):
                return p
        elif op is _sre_c.SUBPATTERN or (_ATOMIC is not None and op is _ATOMIC):
            inner = av[-1] if op is _sre_c.SUBPATTERN else av
            if p := _walk_problem(inner, icase or _scoped_icase(op, av)):
                return p
        elif op is _sre_c.BRANCH:
            for alt in av[1]:
                if p := _walk_problem(alt, icase):
                    return p
        elif op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT):
            if p := _walk_problem(av[1], icase):
                return p
    return None


def redos_problem(pattern: str, flags: int = 0) -> str | None:
    """Why ``pattern`` could backtrack catastrophically, or None when it passes the structural check.

    Conservative by design: rejects any quantifier inside a group that itself repeats (``(a+)+``,
    ``(.*)*``, ``(?:a?b)+``), alternatives under a repeat whose first characters overlap (``(x|x)*``,
    ``(a|ab)+``, ``(a|aa)+``), a repeated group that can match empty (``(a|)+``), backreferences, and
    patterns longer than ``MAX_PATTERN_LENGTH``.
    """
    parsed, problem = parse_pattern(pattern, flags)
    return problem if parsed is None else parsed_problem(parsed, flags)


def parse_pattern(pattern: str, flags: int) -> tuple[Any, str | None]:
    """The parsed pattern, or None and why it is rejected before any structural check."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        return None, f"pattern longer than {MAX_PATTERN_LENGTH} characters"
    try:
        return _sre_parse.parse(pattern, flags), None
    except re.error as e:
        return None, f"does not compile: {e}"


def parsed_problem(parsed: Any, flags: int) -> str | None:
    state_flags = getattr(getattr(parsed, "state", None), "flags", 0)
    return _walk_problem(parsed, bool((flags | state_flags) & re.IGNORECASE))


# --- literal prefilter -----------------------------------------------------------------------------------

_MIN_LITERAL = 3


def _necessary_literals(sub: Any) -> tuple[str, ...] | None:
    """A set of literals of which every match of ``sub`` contains at least one, or None.

    Candidates are runs of consecutive literal characters, mandatory groups, and alternations whose every
    branch has a candidate (their union); the candidate whose shortest literal is longest wins.
    """
    candidates: list[tuple[str, ...]] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            candidates.append(("".join(run),))
            run.clear()

    for op, av in _items(sub):
        if op is _sre_c.LITERAL:
            run.append(chr(av))
            continue
        flush()
        inner: tuple[str, ...] | None = None
        if op is _sre_c.SUBPATTERN:
            # literals under a scoped (?i:...) may match in any case: no prefilter from them
            inner = None if _scoped_icase(op, av) else _necessary_literals(av[-1])
        elif op is _sre_c.BRANCH:
            alts = [_necessary_literals(alt) for alt in av[1]]
            if all(alts):
                inner = tuple(dict.fromkeys(lit for alt in alts if alt for lit in alt))
        elif op in _REPEATS and av[0] >= 1:
            inner = _necessary_literals(av[2])
        if inner:
            candidates.append(inner)
    flush()
    best = max(candidates, key=lambda c: min(len(x) for x in c), default=None)
    if best is None or min(len(x) for x in best) < _MIN_LITERAL:
        return None
    return best


def required_literals(pattern: str, flags: int = 0) -> tuple[str, ...] | None:
    """Literals of which a match must contain at least one (None when no useful set exists).

    Used only to skip regex searches that cannot succeed, so it must never be wrong: with IGNORECASE, or
    when some way of matching needs no literal of at least three characters, there is no prefilter.
    """
    try:
        parsed = _sre_parse.parse(pattern, flags)
    except re.error:
        return None
    return parsed_literals(parsed, flags)


def parsed_literals(parsed: Any, flags: int) -> tuple[str, ...] | None:
    state_flags = getattr(getattr(parsed, "state", None), "flags", 0)
    if (flags | state_flags) & re.IGNORECASE:
        return None
    return _necessary_literals(parsed)
