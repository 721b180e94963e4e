"""The brief's values: each one ``known`` with its evidence or ``unknown`` with the reason, and the
bytes per element of the dtypes the brief names."""

from __future__ import annotations

from typing import Any

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def known(value: Any, evidence: str) -> dict[str, Any]:
    return {"value": value, "evidence": evidence}


def unknown(reason: str) -> dict[str, Any]:
    return {"value": None, "unknown": reason}
