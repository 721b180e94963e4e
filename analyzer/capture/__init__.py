"""Capture: profile an LLM's inference steps the way the analyzer reads them (needs torch).

``profile`` holds the Python API for your own engine (:func:`profile_steps`, :func:`step_annotation`,
:func:`annotate_step`); ``model`` builds a decoder with random weights for ``llm-kernel-map capture``.
torch is an optional extra (``pip install 'llm-kernel-map[capture]'``): importing this package
works without it, and the first use of a name below raises one clear :class:`UsageError`.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from analyzer.errors import UsageError

TORCH_MISSING = "capture needs torch: pip install 'llm-kernel-map[capture]'"

_API = {
    "profile_steps": "profile",
    "step_annotation": "profile",
    "annotate_step": "profile",
    "annotation_name": "profile",
    "describe_batch": "profile",
    "export_trace": "profile",
    "capture_generate": "profile",
    "build_model": "model",
    "greedy_generate": "model",
    "resolve_model": "model",
    "CausalLM": "model",
}


def require_torch() -> None:
    """Raise the one-line UsageError (exit 2) when torch cannot be imported."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError(TORCH_MISSING)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'analyzer.capture' has no attribute {name!r}")
    require_torch()
    return getattr(importlib.import_module(f"analyzer.capture.{module}"), name)


__all__ = ["TORCH_MISSING", "require_torch", *_API]
