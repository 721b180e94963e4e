"""The only code that knows processes, pools, threads, memfd, allocators, gc, the parsed-trace cache
and Dask. Readers get its policy as arguments; the analyses never see it.

Importing this package is light (``memory.configure`` must run before pyarrow loads):
:func:`analyze`, :class:`RunPolicy` and :func:`load_inputs` load :mod:`analyzer.runtime.driver` on use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"analyze", "RunPolicy", "load_inputs"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from analyzer.runtime import driver as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
