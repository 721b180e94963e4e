"""When freed memory goes back to the operating system (called once by the CLI at start-up).

Arrow's mimalloc pool purges freed pages after a delay (``MIMALLOC_PURGE_DELAY``, ms). Two costs
pull against each other:

* a short delay keeps the process small: the short-lived buffers of a big analysis (per-column
  copies) would otherwise pile up, and a 10 GB trace must stay within its memory target (docs/performance.md);
* every purged page is faulted in again by the next buffer, and a page fault is dear on a virtual
  machine: with purging at once, a 1 GB trace spends more system time (docs/performance.md).

So the delay follows the size of the inputs named on the command line: 0 (purge at once) from
:data:`BIG_INPUT_BYTES` of trace text up, a second below that, where the analysis's own peak is far
under its limit. A value the user set wins. mimalloc reads its options when pyarrow first loads it,
so this must run before pyarrow is imported. It changes when memory returns to the system, never
what is computed. (The reader's worker processes use jemalloc: see
``runtime.pools.worker_memory_pool``.)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

BIG_INPUT_BYTES = 2 << 30
GZIP_RATIO = 10  # a gzip trace holds about ten times its size in JSON text
_MAX_ENTRIES = 10_000  # a folder is looked into this far, no further


def configure(argv: Sequence[str] = ()) -> None:
    if "MIMALLOC_PURGE_DELAY" not in os.environ:
        os.environ["MIMALLOC_PURGE_DELAY"] = "0" if input_bytes(argv) >= BIG_INPUT_BYTES else "1000"
    if tight():
        _map_big_blocks()


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_BLOCK = 1 << 20


def _map_big_blocks() -> None:
    """numpy and pandas allocate from glibc's malloc, whose threshold for giving a block its own
    mapping grows with the blocks freed (up to 32 MB): the temporaries of a big analysis then come
    from the heap and stay in the process once freed. A fixed threshold maps every block of 1 MB
    or more apart, and unmaps it when freed (the 10 GB trace's peak: docs/performance.md). glibc
    only; a no-op elsewhere."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_BLOCK)
    except (OSError, AttributeError):
        pass  # not glibc (musl has no mallopt)


def tight() -> bool:
    """Whether memory comes first in this run (freed pages go back at once): then work that holds
    memory longer to save time, like hashing a trace beside the analysis, is not done."""
    return os.environ.get("MIMALLOC_PURGE_DELAY") == "0"


def input_bytes(argv: Sequence[str]) -> int:
    """Trace text the command-line arguments name, roughly: files (gzip counted inflated) and the
    files of folders; arguments that are not paths count nothing."""
    total = 0
    seen = 0
    todo = list(argv)
    while todo and seen < _MAX_ENTRIES:
        arg = todo.pop()
        seen += 1
        try:
            st = os.stat(arg)
        except (OSError, ValueError):
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                todo += [e.path for e in os.scandir(arg)]
            except OSError:
                continue
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size * (GZIP_RATIO if _is_gzip(arg) else 1)
    return total


def _is_gzip(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x1f\x8b"
    except OSError:
        return False
