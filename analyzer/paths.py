"""Where the data files live: ``rules/`` beside the package in a checkout, or the copy installed
with the wheel (``<prefix>/share/llm-kernel-map/rules``)."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path


def _find_rules_dir() -> Path:
    checkout = Path(__file__).resolve().parent.parent / "rules"
    if (checkout / "kernels.toml").exists():
        return checkout
    for base in (sysconfig.get_path("data"), sys.prefix, sys.base_prefix):
        candidate = Path(base) / "share" / "llm-kernel-map" / "rules"
        if (candidate / "kernels.toml").exists():
            return candidate
    return checkout  # reported as missing by whoever reads it


RULES_DIR = _find_rules_dir()
