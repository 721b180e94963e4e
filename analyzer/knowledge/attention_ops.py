"""Input layouts of the attention host ops (``rules/attention_ops.toml``): read, validated, compiled once.

Contract (the file's header is the spec): an ordered list of ``[[op]]`` tables, first match wins.
Each has ``id``, ``note``, ``names`` (exact host-op names) and/or ``pattern`` (an unanchored regex,
ReDoS-checked), ``query`` and ``rank`` (which input is the query tensor and how many dimensions it
has), ``q_dim`` (its query-length dimension) and optionally ``batch_dim``, ``head_dim``, ``key`` and
``kv_dim`` (the key tensor and its length dimension). Dimensions are 0-based and below ``rank``.
``composed = true`` marks an op that does other work too (a plain matmul): it counts only where the
kernels it launched are attention (the score product of an attention composed of matmuls).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from analyzer.knowledge import loader
from analyzer.knowledge.patterns import redos_problem
from analyzer.paths import RULES_DIR

__all__ = ["ATTENTION_OPS_TOML", "AttentionLayout", "AttentionOps", "load_attention_ops"]

ATTENTION_OPS_TOML = RULES_DIR / "attention_ops.toml"
_REQUIRED = ("id", "note", "query", "rank", "q_dim")
_OPTIONAL_DIMS = ("batch_dim", "head_dim", "kv_dim")
_KEYS = {*_REQUIRED, "names", "pattern", "key", "composed", *_OPTIONAL_DIMS}


@dataclasses.dataclass(frozen=True)
class AttentionLayout:
    """Where one attention op's inputs hold the query length, batch, head size and key length."""

    id: str
    query: int
    rank: int
    q_dim: int
    batch_dim: int | None = None
    head_dim: int | None = None
    key: int | None = None
    kv_dim: int | None = None
    composed: bool = False


@dataclasses.dataclass(frozen=True)
class AttentionOps:
    """The table: exact names first, then the patterns in file order."""

    by_name: dict[str, AttentionLayout]
    patterns: tuple[tuple[re.Pattern[str], AttentionLayout], ...]

    def layout(self, name: str) -> AttentionLayout | None:
        """The layout of host op ``name``, or None when it is no attention op of the table."""
        hit = self.by_name.get(name)
        if hit is not None:
            return hit
        for regex, lay in self.patterns:
            if regex.search(name):
                return lay
        return None


def load_attention_ops(path: str | Path = ATTENTION_OPS_TOML) -> AttentionOps:
    """The validated table of ``path`` (shared between callers: read it only)."""
    return loader.load(path, _parse)


def _parse(doc: dict[str, Any], path: Path) -> AttentionOps:
    unknown = sorted(set(doc) - {"op"})
    if unknown:
        raise loader.fail(path, unknown[0], "unknown top-level key (attention_ops.toml has [[op]] tables)")
    entries = doc.get("op")
    if not isinstance(entries, list) or not entries:
        raise loader.fail(path, "op", "needs a non-empty [[op]] list")
    by_name: dict[str, AttentionLayout] = {}
    patterns: list[tuple[re.Pattern[str], AttentionLayout]] = []
    seen: set[str] = set()
    for i, e in enumerate(entries):
        oid = e.get("id") if isinstance(e, dict) else None
        where = f"op {oid}" if isinstance(oid, str) else f"op #{i + 1}"

        def fail(msg: str, where: str = where) -> Exception:
            return loader.fail(path, where, msg)

        if not isinstance(e, dict):
            raise fail("must be a table")
        bad = sorted(set(e) - _KEYS)
        if bad:
            raise fail(f"unknown key(s) {', '.join(bad)}")
        missing = [k for k in _REQUIRED if k not in e]
        if missing:
            raise fail(f"missing key(s) {', '.join(missing)}")
        for k in ("id", "note"):
            if not isinstance(e[k], str) or not e[k].strip():
                raise fail(f"{k} must be a non-empty string")
        if oid in seen:
            raise fail("id defined twice")
        seen.add(oid)
        ints = {k: e[k] for k in ("query", "rank", "q_dim", "key", *_OPTIONAL_DIMS) if k in e}
        for k, v in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise fail(f"{k} must be a non-negative integer")
        if e["rank"] < 1:
            raise fail("rank must be at least 1")
        for k in ("q_dim", *_OPTIONAL_DIMS):
            if k in e and e[k] >= e["rank"]:
                raise fail(f"{k} = {e[k]} is not a dimension of a rank-{e['rank']} input")
        if ("key" in e) != ("kv_dim" in e):
            raise fail("key and kv_dim go together")
        composed = e.get("composed", False)
        if not isinstance(composed, bool):
            raise fail("composed must be true or false")
        lay = AttentionLayout(id=oid, composed=composed, **{k: v for k, v in ints.items()})
        names = e.get("names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise fail("names must be a list of host-op names")
        if not names and "pattern" not in e:
            raise fail("needs names or pattern")
        for n in names:
            if n in by_name:
                raise fail(f"{n!r} is already listed under {by_name[n].id!r}")
            by_name[n] = lay
        if "pattern" in e:
            pat = e["pattern"]
            if not isinstance(pat, str) or not pat:
                raise fail("pattern must be a non-empty string")
            if problem := redos_problem(pat):
                raise fail(f"pattern rejected: {problem}")
            try:
                patterns.append((re.compile(pat), lay))
            except re.error as err:  # pragma: no cover - redos_problem parses first
                raise fail(f"pattern does not compile: {err}") from None
    return AttentionOps(by_name=by_name, patterns=tuple(patterns))
