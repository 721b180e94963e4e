"""The typed kernel sequence the walk's rules read: one device's kernels in launch order (positions
``0 .. n-1``) with what each rule may look at (kernel rows, stages, normalised names, launching ops and
their ids) and what the rules' decisions change (the stage and the deciding rule's code per kernel
row, the counts of the rules whose decision the stage column does not show), written only by
:meth:`KernelSequence.apply`. Built once per device segment by
:func:`analyzer.analyses.walk.grammar.walk_sequence`; the per-position stage codes are refreshed
after a rule relabels kernels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from analyzer.analyses.walk.decisions import Decisions
from analyzer.knowledge.structure_rules import Thresholds


class CopyFacts(NamedTuple):
    """Per kernel row, what recorded types and shapes say of its copies (each None where unknown)."""

    widen: np.ndarray | None = None  # a copy from a 16-bit float into a wider float
    narrow: np.ndarray | None = None  # a copy from a wider float into a 16-bit one
    scalar: np.ndarray | None = None  # a cast of a tensor with no dimension
    module: np.ndarray | None = None  # launched inside a module's own copying op (Tensor.repeat)


NO_COPY_FACTS = CopyFacts()  # nothing known of the copies (no host ops or no recorded types)


@dataclass
class KernelSequence:
    """One device's kernels in launch order. Per kernel row (shared with the caller): ``stage`` (the
    decisions so far), ``why`` (the code of the rule that set each), ``names`` (the normalised kernel
    name), ``op_names`` (the launching host op; None without one), ``launch`` (that op's id).
    Per position: ``rows`` (the kernel row), ``st`` and ``code`` (the stage as it was at the last
    :meth:`refresh`), ``normish`` (a norm stage or a name with a norm's word)."""

    seq: np.ndarray
    rows: list[int]
    stage: list[str]
    why: Any
    names: Sequence[str]
    op_names: Sequence[str | None]
    launch: np.ndarray
    th: Thresholds
    fired: Counter | None = None
    st: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    normish: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    inputs: Any = None  # kernel row -> its launching op's input dims, on demand (None: unknown)
    copies: CopyFacts = NO_COPY_FACTS  # per kernel row: what its copy is (STR023, STR033, STR035 ...)

    @property
    def n(self) -> int:
        return len(self.rows)

    def refresh(self) -> None:
        """Read the stages again (after a rule relabelled kernels)."""
        self.st = list(map(self.stage.__getitem__, self.rows))
        self.kinds = {s: i for i, s in enumerate(dict.fromkeys(self.st))}
        self.code = np.fromiter(map(self.kinds.__getitem__, self.st), np.int32, len(self.rows))

    def decide(self) -> Decisions:
        """A fresh set of decisions for the next rule, read through to this sequence's stages."""
        return Decisions(self.stage, self.why)

    def apply(self, d: Decisions, refresh: bool = False) -> bool:
        """Apply one rule's decisions (the driver's step, in the registry's order); ``refresh``:
        read the stages again when it decided any. Returns whether it decided any."""
        decided = bool(d)
        d.apply(self.stage, self.why, self.fired)
        if decided and refresh:
            self.refresh()
        return decided

    def stages(self, *sets: Any) -> np.ndarray:
        """Per position: its stage (as of the last :meth:`refresh`) is in one of ``sets``."""
        return np.array([any(s in x for x in sets) for s in self.kinds], bool)[self.code]

    def count(self, rule: int, kernels: int) -> None:
        """Count ``kernels`` for ``rule`` where the caller keeps counts (``fired``)."""
        if self.fired is not None and kernels:
            self.fired[rule] += kernels
