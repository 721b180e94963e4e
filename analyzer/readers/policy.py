"""How the runtime wants a trace read, handed to the readers as a value.

Readers know nothing of processes, threads, the garbage collector or memory settings:
:mod:`analyzer.runtime` builds a :class:`ReadPolicy` (:func:`analyzer.runtime.read_policy.read_policy`)
and passes it in. Without one (``None``, or ``ReadPolicy()``) a reader takes its plain path:
sequential, in the calling thread, the file hashed there, nothing started and no environment read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

# parallel_events(path, gzipped, add_tables, progress) -> (prefix, tail, sha256 or "") or None (read
# it sequentially instead): the events of a big Kineto file parsed elsewhere, their tables handed to
# ``add_tables(kernels, host, annotations)`` in file order; ``prefix``/``tail`` are the text of the
# top-level object before and after the ``traceEvents`` array
ParallelEvents = Callable[
    [Path, bool, Callable[[Any, Any, Any], None], Callable[[int], None] | None],
    tuple[bytes | None, bytes, str] | None,
]


@dataclasses.dataclass(frozen=True)
class ReadPolicy:
    """What the runtime lends a read.

    Attributes:
        parallel_events: parse a big Kineto file's events in worker processes (None: here).
        defer_hash: ``defer_hash(fn, path)`` runs the file's sha256 later, beside the analysis
            (None: hash it now, in the reader).
        scope: the context the events are decoded in (the runtime's pauses the cyclic garbage
            collector; None: no context).
    """

    parallel_events: ParallelEvents | None = None
    defer_hash: Callable[[Callable[[Path], None], Path], None] | None = None
    scope: Callable[[], AbstractContextManager[Any]] | None = None
