"""Give freed memory back to the operating system promptly (called once by the CLI at start-up).

A big trace passes through ~1 GB of short-lived buffers per 10 GB of JSON (the workers' Arrow IPC
results, per-column copies). With default settings both allocators keep much of it: glibc's
``malloc`` raises its mmap threshold after the first big ``free`` and then serves big blocks from a
heap it rarely shrinks, and Arrow's mimalloc pool purges freed pages only after a delay. A 10 GB
trace then held ~1 GB more than it used. Here:

* ``MIMALLOC_PURGE_DELAY=0`` (unless set): read by mimalloc when pyarrow first loads it, so this
  must run before pyarrow is imported;
* glibc only: ``mallopt(M_MMAP_THRESHOLD, 1 MiB)`` fixes the threshold, so every block of 1 MiB or
  more is its own mapping, unmapped when freed. Forked reader workers inherit it.

Both only change when memory returns to the system, never what is computed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD = 1 << 20


def configure() -> None:
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries: keep their defaults
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
