"""What a user can set for one analysis (README.md, "Commands": shared options): plain values, no heavy imports."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Options:
    """``--rules`` files (matched first), ``--gpu`` name, ``--model`` config or name, ``--set`` pairs."""

    rules: Sequence[str] = ()
    gpu: str | None = None
    model: str | None = None
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
