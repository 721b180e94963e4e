"""Step annotation patterns of the engines (``rules/annotations.toml``): read, validated, compiled once.

Contract (the file's header is the spec): an ordered list of ``[[annotation]]`` tables, first match
wins. Each has ``id``, ``note``, ``pattern`` and ``kind`` (``fixed``: ``phase`` says the phase;
``word``: the ``word`` group names it through ``words``; ``counts``: groups ``prefill`` and
``decode``; ``capture``: graph capture; ``outer``: an outer bound, never a step). Patterns must
compile and pass the ReDoS check of the kernel rules; phases come from ``rules/taxonomy.toml``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from analyzer.knowledge import loader
from analyzer.knowledge.patterns import redos_problem
from analyzer.knowledge.taxonomy import load_taxonomy
from analyzer.paths import RULES_DIR

__all__ = ["ANNOTATIONS_TOML", "KINDS", "load_annotation_patterns"]

ANNOTATIONS_TOML = RULES_DIR / "annotations.toml"
KINDS = ("fixed", "word", "counts", "capture", "outer")
_REQUIRED = ("id", "note", "pattern", "kind")
_KEYS = {*_REQUIRED, "phase", "words"}
# named groups a kind needs in its pattern
_GROUPS = {"word": ("word",), "counts": ("prefill", "decode")}


def load_annotation_patterns(path: str | Path = ANNOTATIONS_TOML) -> list[dict[str, Any]]:
    """One dict per ``[[annotation]]`` entry, in file order: its keys and ``regex`` (the compiled
    pattern). A fresh list per call; the dicts are shared, read them only."""
    return list(loader.load(path, _parse_annotations))


def _parse_annotations(doc: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    unknown = sorted(set(doc) - {"annotation"})
    if unknown:
        raise loader.fail(
            path, unknown[0], "unknown top-level key (annotations.toml has [[annotation]] tables)"
        )
    entries = doc.get("annotation")
    if not isinstance(entries, list) or not entries:
        raise loader.fail(path, "annotation", "needs a non-empty [[annotation]] list")
    phases = load_taxonomy().phases
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, a in enumerate(entries):
        out.append(_parse_one(a, i, path, phases, seen))
    return out


def _parse_one(a: Any, index: int, path: Path, phases: tuple[str, ...], seen: set[str]) -> dict[str, Any]:
    aid = a.get("id") if isinstance(a, dict) else None
    where = f"annotation {aid}" if isinstance(aid, str) else f"annotation #{index + 1}"

    def fail(msg: str) -> Exception:
        return loader.fail(path, where, msg)

    if not isinstance(a, dict):
        raise fail("must be a table")
    unknown = sorted(set(a) - _KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}")
    missing = [k for k in _REQUIRED if k not in a]
    if missing:
        raise fail(f"missing key(s) {', '.join(missing)}")
    for key in _REQUIRED:
        if not isinstance(a[key], str) or not a[key].strip():
            raise fail(f"{key} must be a non-empty string")
    if aid in seen:
        raise fail("id defined twice")
    seen.add(aid)
    kind = a["kind"]
    if kind not in KINDS:
        raise fail(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    if problem := redos_problem(a["pattern"]):
        raise fail(f"pattern rejected: {problem}")
    try:
        regex = re.compile(a["pattern"])
    except re.error as e:  # pragma: no cover - redos_problem parses first
        raise fail(f"pattern does not compile: {e}") from None
    for group in _GROUPS.get(kind, ()):
        if group not in regex.groupindex:
            raise fail(f"kind {kind!r} needs a (?P<{group}>...) group in its pattern")
    if kind == "fixed":
        if a.get("phase") not in phases:
            raise fail(f"kind 'fixed' needs phase, one of {', '.join(phases)} (rules/taxonomy.toml)")
    elif "phase" in a:
        raise fail(f"phase is only read for kind 'fixed', not {kind!r}")
    if kind == "word":
        words = a.get("words")
        if not isinstance(words, dict) or not words:
            raise fail("kind 'word' needs words = { <phase> = [<words>] }")
        for phase, ws in words.items():
            if phase not in phases:
                raise fail(f"words.{phase}: unknown phase (rules/taxonomy.toml: {', '.join(phases)})")
            if not isinstance(ws, list) or not all(isinstance(w, str) and w and w == w.lower() for w in ws):
                raise fail(f"words.{phase}: must be a list of lower-case words (matched lower-cased)")
    elif "words" in a:
        raise fail(f"words is only read for kind 'word', not {kind!r}")
    return {**a, "regex": regex}
