"""What the rocprof family's flavour readers share: the format's name and version, field spellings
(CSV headers, quoted names, agent ids), spans, and the GPU metadata of a rocprofv3 ``agent_info.csv``.

Contract: pure helpers, no file is read except by :func:`agent_info` (which returns ``[]`` when the
file is absent). The flavour readers (:mod:`analyzer.readers.rocprof_v1`, ``rocprof_v3``,
``rocprof_v3_json``) and the protocol module :mod:`analyzer.readers.rocprof` import from here, never
from each other's protocol, so no import goes in a circle.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from analyzer.errors import InputError
from analyzer.readers.common import CsvTable, read_text, to_int

FORMAT = "rocprof"
READER_VERSION = "1"

#: roctx marker domains, the ones whose records are annotations (rocprofv3 CSV and JSON)
MARKER_DOMAINS = {"MARKER_CORE_API", "MARKER_CORE_RANGE_API"}


def header_columns(line: str) -> list[str]:
    """Column names of a CSV header line, lower-cased, quotes and spaces trimmed."""
    row = next(csv.reader([line.strip()]), [])
    return [c.strip().strip('"').strip().lower() for c in row]


def unquote(name: str) -> str:
    """Remove one pair of wrapping double quotes (a CSV artifact some rocprof files keep)."""
    if len(name) >= 2 and name[0] == '"' and name[-1] == '"':
        return name[1:-1]
    return name


def span(begin: int | None, end: int | None) -> int | None:
    """``end - begin``, or None when either is unknown."""
    if begin is None or end is None:
        return None
    return end - begin


def parse_agent(value: Any) -> tuple[str, int]:
    """("gpu", n) for "GPU n"; ("agent", n) for "Agent n" or a bare number."""
    s = str(value if value is not None else "").strip().strip('"')
    m = re.fullmatch(r"(?i)(gpu|agent|cpu)?[\s\-_]*(\d+)", s)
    if not m:
        raise InputError(f"unrecognised agent id {s[:40]!r}")
    return ((m.group(1) or "agent").lower(), int(m.group(2)))


def agent_info(path: Path) -> list[dict[str, Any]]:
    """The agents of a rocprofv3 ``*_agent_info.csv`` (type, node, name, product, CUs); [] without it."""
    if not path.is_file():
        return []
    t = CsvTable(path, read_text(path))
    logical = t.ints("logical_node_id", "node_id")
    return [
        {"type": ty, "logical": lg, "name": n, "product": p, "cus": to_int(c)}
        for ty, lg, n, p, c in zip(
            t.column("agent_type"),
            logical,
            t.column("name"),
            t.column("product_name"),
            t.column("cu_count"),
            strict=True,
        )
    ]


def gpu_rows(info: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPU agents of :func:`agent_info`, in logical-node order (the 0-based device order)."""
    gpus = [a for a in info if str(a.get("type", "")).upper() == "GPU"]
    return sorted(gpus, key=lambda a: a["logical"] if a["logical"] is not None else -1)


def agent_info_meta(info: list[dict[str, Any]]) -> dict[str, Any]:
    """Trace metadata (GPU name, arch, CUs, devices) from :func:`agent_info`; {} without a GPU agent."""
    gpus = gpu_rows(info)
    if not gpus:
        return {}
    g = gpus[0]
    return {
        "gpu_name": g.get("product") or None,
        "arch": g.get("name") or None,
        "sm_count": g.get("cus"),
        "devices": [{"index": i, "name": a["product"], "arch": a["name"]} for i, a in enumerate(gpus)],
    }
