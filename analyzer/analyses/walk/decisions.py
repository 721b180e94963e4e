"""What one structure rule decided, as a value the rule returns and one driver applies.

Contract: a rule (a pass of the structure run, a step of the layer walk) reads the kernels and
returns a :class:`Decisions`; it never writes the shared stage list or rule codes. While it works it
reads the stages through its own decisions so far (:attr:`Decisions.stage`, :attr:`Decisions.why`:
a kernel row's stage is the rule's own decision where it made one, the sequence's otherwise) and
records a decision by writing through them, or a run of rows given one stage by one rule at once
(:meth:`Decisions.label`). The driver (:mod:`analyzer.analyses.classify` for the passes,
:func:`analyzer.analyses.walk.grammar.walk_sequence` for the walk's steps) applies each rule's
decisions in the registry's order (:meth:`Decisions.apply`), so a later rule sees an earlier one's.
"""

from __future__ import annotations

import array
from collections import Counter
from collections.abc import MutableSequence, Sequence
from typing import Any

import numpy as np


def codes_at(why: Any, rows: np.ndarray) -> np.ndarray:
    """The rule codes of kernel rows ``rows``: read from a view of a typed code array where the run
    keeps one, else row by row (a list or a mapping, as in the tests)."""
    if isinstance(why, array.array):
        return np.frombuffer(why, np.int16)[rows] if len(why) else np.zeros(len(rows), np.int16)
    return np.fromiter((int(why[r]) for r in np.asarray(rows).tolist()), np.int64, len(rows))


class _Overlay:
    """Per kernel row: a rule's own decision where it made one, the value underneath otherwise.
    Reads and writes by row index, as the rules read a stage list or a code array."""

    __slots__ = ("base", "mine")

    def __init__(self, base: Any) -> None:
        self.base = base
        self.mine: dict[int, Any] = {}

    def __getitem__(self, r: int) -> Any:
        mine = self.mine
        return mine[r] if r in mine else self.base[r]

    def __setitem__(self, r: int, value: Any) -> None:
        self.mine[r] = value

    def __len__(self) -> int:
        return len(self.base)


class Decisions:
    """One rule's decisions over a stage list and its rule codes (``why``: per kernel row the code
    of the rule that set the stage). ``stage`` / ``why``: read the kernel's value as this rule sees
    it, write a decision. :meth:`label`: many rows, one stage, one rule code. :meth:`count`: kernels
    a rule decided whose stage column will not show it (a layer number, a stage a later rule
    replaces)."""

    __slots__ = ("stage", "why", "runs", "run_rows", "tables", "counts")

    def __init__(self, stage: MutableSequence[str], why: Any) -> None:
        self.stage = _Overlay(stage)
        self.why = _Overlay(why)
        self.runs: list[tuple[Sequence[int], str | None, int]] = []
        self.run_rows = 0  # the rows of the runs, together
        self.tables: list[tuple[np.ndarray, np.ndarray, Sequence[str], np.ndarray]] = []
        self.counts: Counter = Counter()

    def label(self, rows: Sequence[int], stage: str | None, rule: int) -> None:
        """Rows ``rows`` take ``stage`` (None: keep theirs), decided by ``rule``; applied after the
        single decisions (the caller labels rows it made no single decision for)."""
        if len(rows):
            self.runs.append((rows, stage, rule))
            self.run_rows += len(rows)

    def label_table(
        self, rows: np.ndarray, which: np.ndarray, stages: Sequence[str], rules: np.ndarray
    ) -> None:
        """Per kernel row of ``rows``: stage ``stages[which]`` decided by rule ``rules`` (``which`` -1:
        no decision). A decision per kernel kept as two small integers, not a Python object: the
        walk's GEMM roles on a 10 GB trace. Applied after the runs; not read through ``stage``."""
        self.tables.append((rows, which, stages, rules))

    def size(self) -> int:
        """How many decisions this set holds (single ones, and the rows of its runs)."""
        return len(self.stage.mine) + len(self.why.mine) + self.run_rows

    def count(self, rule: int, kernels: int) -> None:
        if kernels:
            self.counts[rule] += kernels

    def __bool__(self) -> bool:
        return bool(
            self.stage.mine or self.why.mine or self.runs or any((w >= 0).any() for _, w, _, _ in self.tables)
        )

    def apply(self, stage: MutableSequence[str], why: Any, counts: Counter | None = None) -> None:
        """Write these decisions into ``stage`` and ``why`` (a typed array of codes is written at
        once) and add the counts to ``counts`` (when the caller keeps them)."""
        for r, s in self.stage.mine.items():
            stage[r] = s
        for rows, s, _ in self.runs:
            if s is not None:
                for r in rows.tolist() if isinstance(rows, np.ndarray) else rows:
                    stage[r] = s
        _write_codes(why, self.why.mine, self.runs)
        for rows, which, stages, rules in self.tables:
            _write_table(stage, why, rows, which, stages, rules)
        if counts is not None:
            counts.update(self.counts)


def _write_codes(why: Any, single: dict[int, int], runs: list[tuple[Sequence[int], str | None, int]]) -> None:
    if isinstance(why, array.array):
        codes = np.frombuffer(why, np.int16) if len(why) else None
        if codes is not None:
            if single:
                n = len(single)
                codes[np.fromiter(single, np.int64, n)] = np.fromiter(single.values(), np.int16, n)
            for rows, _, rule in runs:
                codes[np.asarray(rows, np.int64)] = rule
        return
    for r, c in single.items():
        why[r] = c
    for rows, _, rule in runs:
        for r in rows:
            why[r] = rule


_BLOCK = 1 << 16


def _write_table(
    stage: MutableSequence[str],
    why: Any,
    rows: np.ndarray,
    which: np.ndarray,
    stages: Sequence[str],
    rules: np.ndarray,
) -> None:
    """A positional table's decisions, a block of kernels at a time (no Python int per kernel at
    once)."""
    at = np.flatnonzero(which >= 0)
    names = list(stages)
    codes = np.frombuffer(why, np.int16) if isinstance(why, array.array) and len(why) else None
    for s in range(0, len(at), _BLOCK):
        block = at[s : s + _BLOCK]
        r = rows[block]
        for row, k in zip(r.tolist(), which[block].tolist(), strict=True):
            stage[row] = names[k]
        if codes is not None:
            codes[r] = rules[block]
        else:
            for row, c in zip(r.tolist(), rules[block].tolist(), strict=True):
                why[row] = c
