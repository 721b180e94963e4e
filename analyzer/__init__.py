"""llm-kernel-map: where the GPU time of LLM inference goes, kernel by kernel.

Importing the package is light: the public names below load their modules on first use
(module ``__getattr__``), so the memory settings of :mod:`analyzer.runtime.memory` can still be
applied before pyarrow loads.
"""

from __future__ import annotations

from typing import Any

from analyzer.version import __version__

# public name -> module that defines it
_EXPORTS = {
    "analyze": "analyzer.api",
    "compare": "analyzer.api",
    "gate": "analyzer.api",
    "Result": "analyzer.api",
    "Options": "analyzer.options",
    "AnalyzerError": "analyzer.errors",
    "InputError": "analyzer.errors",
    "UsageError": "analyzer.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
