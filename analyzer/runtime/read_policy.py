"""The readers' policy as the runtime sets it: big Kineto files parsed by forked chunk workers
(:mod:`analyzer.runtime.chunked_kineto`), the file's sha256 deferred to a background thread while a
run defers work (:func:`analyzer.runtime.background.deferred`), and the events decoded with the
cyclic garbage collector paused."""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Iterator

from analyzer.readers.policy import ReadPolicy
from analyzer.runtime import background, chunked_kineto, memory


def read_policy() -> ReadPolicy:
    """The policy for a read starting now (deferring is decided by the caller's ``deferred`` block)."""
    deferring = background.deferring()
    # The chunk workers' hashing competes with them for the CPU: inside a deferred block it waits
    # for the analysis, which leaves a core idle (analyzer.runtime.background). Not where memory
    # comes first: the cache entry, written after the hash, holds the whole trace until written.
    hash_later = deferring and not memory.tight()
    return ReadPolicy(
        parallel_events=functools.partial(chunked_kineto.read_events, hash_now=not hash_later),
        defer_hash=background.run if deferring else None,
        scope=gc_paused,
    )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Decoding allocates millions of acyclic objects; the cyclic GC only slows it down."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
