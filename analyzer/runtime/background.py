"""Work this process may run in a thread beside the analysis: hashing a plain trace file and
writing its parsed-trace cache entry.

The analysis after parsing is single-threaded Python; hashlib and the Parquet writer work outside the
GIL, so inside :func:`deferred` they run on the otherwise idle core instead of competing with the
reader's worker processes or coming before the analysis (each costs about a second per GB of trace:
docs/performance.md). Every thread started is joined when the block ends, and before a reader forks
worker processes (:func:`wait`): a fork must not copy a thread in the middle of its work.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_threads: list[_Worker] = []
_deferred = 0  # depth of the open deferred() blocks


class _Worker(threading.Thread):
    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        super().__init__(name="lkm-background", daemon=False)
        self.fn, self.args = fn, args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as e:  # raised again by wait(), in the thread that waits
            self.error = e
        finally:
            del self.fn, self.args  # the trace it wrote is freed with the thread's work done


def run(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` now, or in a thread when a :func:`deferred` block is open."""
    if deferring():
        worker = _Worker(fn, args)
        _threads.append(worker)
        worker.start()
    else:
        fn(*args)


def deferring() -> bool:
    """Whether :func:`run` would start a thread now (a :func:`deferred` block is open here)."""
    return bool(_deferred) and threading.current_thread() is threading.main_thread()


def wait() -> None:
    """Join every thread started by :func:`run`; raise the first error one of them met."""
    error = None
    while _threads:
        worker = _threads.pop(0)
        worker.join()
        error = error or worker.error
    if error is not None:
        raise error


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, :func:`run` may return before its work is done; all of it is done by the
    block's end."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
        wait()
