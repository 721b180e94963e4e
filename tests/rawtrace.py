"""Independent reading of Kineto JSON with the standard library, to check the reader's numbers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def load(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        magic = f.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        obj = json.load(f)
    return obj if isinstance(obj, dict) else {"traceEvents": obj}


def gpu_events(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in obj["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS]


def ns(us: float) -> int:
    return int(round(float(us) * 1000))


def stream_busy(events: list[dict[str, Any]]) -> dict[tuple[int, int], int]:
    """Busy ns per (pid, stream) by a plain sweep over sorted intervals."""
    by: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in events:
        a = e.get("args", {})
        key = (
            int(e["pid"]),
            int(a.get("stream", e.get("tid")))
            if str(a.get("stream", e.get("tid"))).lstrip("-").isdigit()
            else -1,
        )
        s = ns(e["ts"])
        by.setdefault(key, []).append((s, s + ns(e["dur"])))
    out = {}
    for key, iv in by.items():
        iv.sort()
        total, cur_s, cur_e = 0, None, None
        for s, e in iv:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            total += cur_e - cur_s
        out[key] = total
    return out


def sha256(path: Path) -> str:
    """sha256 of the file's bytes, with hashlib alone."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
