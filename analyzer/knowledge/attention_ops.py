"""Input layouts of the attention host ops (``rules/attention_ops.toml``): read, validated, compiled once.

Contract (the file's header is the spec): an ordered list of ``[[op]]`` tables, first match wins.
Each has ``id``, ``note``, ``names`` (exact host-op names) and/or ``pattern`` (an unanchored regex,
ReDoS-checked), ``query`` and ``rank`` (which input is the query tensor and how many dimensions it
has), ``q_dim`` (its query-length dimension) and optionally ``batch_dim``, ``heads_dim``,
``head_dim``, ``key`` with ``kv_dim`` and ``kv_heads_dim`` (the key tensor, its length and heads
dimensions), ``value`` (the value tensor: its head size sits at ``head_dim`` too), ``cu_seqlens``
(packed layouts: the input of the cumulative query lengths, one more than the sequences; an entry
with it reads an op only where that input was recorded) and ``kv_tokens`` (packed layouts over a
paged cache: the input whose length is the keys of the whole batch). Dimensions are 0-based and
below ``rank``. A name may head several entries (one per recorded rank / packing): the entry read
is the first whose layout fits the recorded shapes (:meth:`AttentionOps.layout` with the shapes).
``composed = true`` marks an op that does other work too (a plain matmul): it counts only where the
kernels it launched are attention (the score product of an attention composed of matmuls).
:meth:`AttentionLayout.read` is the one reading of a layout: the step labels (phases) and the
roofline (FLOPs and bytes) both take it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.knowledge import loader
from analyzer.knowledge.patterns import redos_problem
from analyzer.paths import RULES_DIR
from analyzer.tables.shapes import input_shape

__all__ = ["ATTENTION_OPS_TOML", "AttentionLayout", "AttentionOps", "AttentionShape", "load_attention_ops"]

ATTENTION_OPS_TOML = RULES_DIR / "attention_ops.toml"
_REQUIRED = ("id", "note", "query", "rank", "q_dim")
_OPTIONAL_DIMS = ("batch_dim", "head_dim", "heads_dim")  # dimensions of the query tensor
_INPUTS = ("key", "value", "cu_seqlens", "kv_tokens")  # input indices
_RANKS = ("key_rank",)
_FLAGS = ("composed", "step_shapes")
_KEY_DIMS = ("kv_dim", "kv_heads_dim")  # dimensions of the key tensor
_KEYS = {*_REQUIRED, "names", "pattern", *_FLAGS, *_OPTIONAL_DIMS, *_INPUTS, *_KEY_DIMS, *_RANKS, "cases"}
_CASE_KEYS = {"dims", "types", "op", "flops", "bytes", "trace"}


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """What one attention op's recorded shapes say (-1: not given). ``packed``: several sequences in
    one call (``q`` and ``kv`` are the totals over them; ``sequences`` their count, -1: unknown);
    otherwise ``q`` and ``kv`` are per sequence and ``batch`` the sequences."""

    batch: int
    q: int
    kv: int
    head: int
    heads: int = -1
    kv_heads: int = -1
    value_head: int = -1
    packed: bool = False
    sequences: int = -1


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
    heads_dim: int | None = None
    kv_heads_dim: int | None = None
    value: int | None = None
    cu_seqlens: int | None = None
    kv_tokens: int | None = None
    key_rank: int | None = None
    step_shapes: bool = (
        True  # read for the steps' phases and tokens (analyses/phases/); false: the roofline only
    )
    cases: tuple[dict[str, Any], ...] = dataclasses.field(default=(), compare=False)

    @property
    def packed(self) -> bool:
        """Several sequences packed into one tensor (no batch dimension)."""
        return self.batch_dim is None

    def fits(self, dims: Any) -> bool:
        """Whether an op's recorded shapes fit this layout: the query's rank, and for an entry with
        ``cu_seqlens`` that input recorded (a 1-D tensor)."""
        qd = input_shape(dims, self.query)
        if qd is None or len(qd) != self.rank:
            return False
        if self.key_rank is not None:
            kd = input_shape(dims, self.key)
            if kd is None or len(kd) != self.key_rank:
                return False
        if self.cu_seqlens is not None:
            cu = input_shape(dims, self.cu_seqlens)
            return bool(cu) and len(cu) == 1
        return True

    def read(self, dims: Any) -> AttentionShape | None:
        """The :class:`AttentionShape` of an op's recorded shapes, or None when they do not fit."""
        if not self.fits(dims):
            return None
        qd = dims[self.query]

        def at(inp: int | None, dim: int | None) -> int:
            t = input_shape(dims, inp)
            return int(t[dim]) if t is not None and dim is not None and len(t) > dim else -1

        kv = at(self.key, self.kv_dim)
        if self.kv_tokens is not None:
            kv = at(self.kv_tokens, 0)
        seqs = at(self.cu_seqlens, 0) - 1 if self.cu_seqlens is not None else -1
        return AttentionShape(
            batch=int(qd[self.batch_dim]) if self.batch_dim is not None else -1,
            q=int(qd[self.q_dim]),
            kv=kv,
            head=int(qd[self.head_dim]) if self.head_dim is not None else -1,
            heads=int(qd[self.heads_dim]) if self.heads_dim is not None else -1,
            kv_heads=at(self.key, self.kv_heads_dim),
            value_head=at(self.value, self.head_dim),
            packed=self.packed,
            sequences=seqs if seqs > 0 else -1,
        )


@dataclasses.dataclass(frozen=True)
class AttentionOps:
    """The table: exact names first, then the patterns in file order."""

    by_name: dict[str, tuple[AttentionLayout, ...]]
    patterns: tuple[tuple[re.Pattern[str], AttentionLayout], ...]

    def layout(self, name: str, dims: Any = None) -> AttentionLayout | None:
        """The layout of host op ``name``, or None when it is no attention op of the table. With the
        op's recorded shapes ``dims``, the first of its entries that fits them (None: none fits);
        without, its first entry."""
        hits = self.by_name.get(name)
        if hits is None:
            hits = tuple(lay for regex, lay in self.patterns if regex.search(name))
        if not hits:
            return None
        if dims is None:
            return hits[0]
        return next((lay for lay in hits if lay.fits(dims)), None)

    def for_steps(self) -> AttentionOps:
        """The table without the entries marked ``step_shapes = false`` (what the step labels read)."""
        if all(lay.step_shapes for lays in self.by_name.values() for lay in lays) and all(
            lay.step_shapes for _, lay in self.patterns
        ):
            return self
        by_name = {
            n: kept for n, lays in self.by_name.items() if (kept := tuple(x for x in lays if x.step_shapes))
        }
        return AttentionOps(by_name=by_name, patterns=tuple(p for p in self.patterns if p[1].step_shapes))


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
    by_name: dict[str, list[AttentionLayout]] = {}
    patterns: list[tuple[re.Pattern[str], AttentionLayout]] = []
    seen: set[str] = set()
    for i, e in enumerate(entries):
        oid = e.get("id") if isinstance(e, dict) else None
        where = f"op {oid}" if isinstance(oid, str) else f"op #{i + 1}"

        def fail(msg: str, where: str = where) -> Exception:
            return loader.fail(path, where, msg)

        lay = _layout(e, oid, seen, fail)
        names = e.get("names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise fail("names must be a list of host-op names")
        if not names and "pattern" not in e:
            raise fail("needs names or pattern")
        for n in names:
            same = [
                x.id
                for x in by_name.get(n, [])
                if (x.rank, x.cu_seqlens is None) == (lay.rank, lay.cu_seqlens is None)
            ]
            if same:
                raise fail(f"{n!r} is already listed under {same[0]!r} for the same rank and packing")
            by_name.setdefault(n, []).append(lay)
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
    return AttentionOps(by_name={n: tuple(v) for n, v in by_name.items()}, patterns=tuple(patterns))


def _layout(e: Any, oid: Any, seen: set[str], fail: Callable[[str], Exception]) -> AttentionLayout:
    """The layout of one ``[[op]]`` table, checked (its id not among ``seen``, which gets it): its
    keys, input indices and dimensions, flags and cases."""
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
    ints = {
        k: e[k] for k in ("query", "rank", "q_dim", *_OPTIONAL_DIMS, *_INPUTS, *_KEY_DIMS, *_RANKS) if k in e
    }
    for k, v in ints.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise fail(f"{k} must be a non-negative integer")
    if e["rank"] < 1:
        raise fail("rank must be at least 1")
    for k in ("q_dim", *_OPTIONAL_DIMS):
        if k in e and e[k] >= e["rank"]:
            raise fail(f"{k} = {e[k]} is not a dimension of a rank-{e['rank']} input")
    if ("key" in e) != ("kv_dim" in e or "kv_tokens" in e):
        raise fail("key and kv_dim (or kv_tokens) go together")
    if ("kv_heads_dim" in e or "key_rank" in e) and "key" not in e:
        raise fail("kv_heads_dim and key_rank need key")
    flags = {k: e.get(k, k == "step_shapes") for k in _FLAGS}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise fail(f"{k} must be true or false")
    cases = e.get("cases", [])
    if not isinstance(cases, list) or (not cases and not flags["composed"]):
        raise fail("needs cases (the roofline's numbers of one recorded call), unless composed")
    for c in cases:
        if not isinstance(c, dict) or not {"dims", "op", "trace"} <= set(c) or set(c) - _CASE_KEYS:
            raise fail("a case is a table with dims, op and trace (and types, flops, bytes)")
    return AttentionLayout(id=oid, **flags, cases=tuple(cases), **{k: v for k, v in ints.items()})
