"""Give freed memory back to the operating system promptly (called once by the CLI at start-up).

Arrow's mimalloc pool purges freed pages only after a delay, so the short-lived buffers of a big
analysis (per-column copies, a few hundred MB at a time for a 10 GB trace) pile up in the process.
``MIMALLOC_PURGE_DELAY=0`` (unless the user set it) makes it purge at once. mimalloc reads its options
when pyarrow first loads it, so this must run before pyarrow is imported. It changes when memory
returns to the system, never what is computed. (The other big source, the ``bytes`` of the reader's
worker results, is handled where they arrive: see ``readers.kineto_parallel._from_ipc``.)
"""

from __future__ import annotations

import os


def configure() -> None:
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
