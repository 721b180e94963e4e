"""rocprofv3 JSON flavour: ``*_results.json[.gz]`` (the ``rocprofiler-sdk-tool`` document).

Contract: :func:`read_v3_json` takes the path of a file :mod:`analyzer.readers.rocprof` sniffed as
this flavour and returns an unvalidated :class:`Trace` (FORMATS §2, stated in that module). Kernel
names are ``formatted_kernel_name`` (the spelling rocprofv3 writes to its CSV), devices are the GPU
agents' order (an agent missing from the list takes the next free index), roctx markers become
annotations with their messages. Dispatch rows are built column by column: these traces get big.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from analyzer.errors import InputError
from analyzer.model import Trace
from analyzer.readers.common import KernelRows, blocks, build_trace, read_bytes, to_int
from analyzer.readers.rocprof_common import FORMAT, MARKER_DOMAINS, READER_VERSION


def read_v3_json(path: Path) -> Trace:
    doc = orjson.loads(read_bytes(path))
    tools = doc.get("rocprofiler-sdk-tool") if isinstance(doc, dict) else None
    if not isinstance(tools, list) or not tools:
        raise InputError(f"{path}: empty rocprofiler-sdk-tool list")
    rows = KernelRows()
    ann: dict[str, list[Any]] = {"name": [], "start_ns": [], "end_ns": []}
    gpus: list[dict[str, Any]] = []
    for tool in tools:
        gpus = gpus or _json_gpus(tool)
        _json_tool(tool, rows, ann)
    rows.densify("stream")
    return build_trace(
        path, FORMAT, rows, annotations=ann, meta=_json_meta(gpus), reader_version=READER_VERSION
    )


def _json_tool(tool: dict[str, Any], rows: KernelRows, ann: dict[str, list[Any]]) -> None:
    device = {a["id"]["handle"]: i for i, a in enumerate(_json_gpus(tool))}
    records = tool.get("buffer_records") or {}
    ops = _json_operations(tool)
    _json_dispatches(records.get("kernel_dispatch") or [], tool, device, rows)
    _json_copies(records.get("memory_copy") or [], ops.get("MEMORY_COPY", []), device, rows)
    _json_markers(records.get("marker_api") or [], tool, ops, ann)


def _json_gpus(tool: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in tool.get("agents") or [] if a.get("type") == 2]


def _json_operations(tool: dict[str, Any]) -> dict[str, list[str]]:
    kinds = (tool.get("strings") or {}).get("buffer_records") or []
    return {k.get("kind"): k.get("operations") or [] for k in kinds if isinstance(k, dict)}


def _json_kind_names(tool: dict[str, Any]) -> list[str]:
    kinds = (tool.get("strings") or {}).get("buffer_records") or []
    return [k.get("kind", "") if isinstance(k, dict) else "" for k in kinds]


def _json_dispatches(
    records: list[dict[str, Any]],
    tool: dict[str, Any],
    device: dict[int, int],
    rows: KernelRows,
) -> None:
    """Kernel rows from ``kernel_dispatch`` records, built column by column (traces get big)."""
    symbols = {s["kernel_id"]: s for s in tool.get("kernel_symbols") or []}
    pid = (tool.get("metadata") or {}).get("pid") or 0
    infos = [r["dispatch_info"] for r in records]
    syms = [symbols.get(i["kernel_id"], {}) for i in infos]
    wgs = [i.get("workgroup_size") or {} for i in infos]
    grids = [i.get("grid_size") or {} for i in infos]
    cols: dict[str, list[Any]] = {
        "name": [s.get("formatted_kernel_name") or s.get("kernel_name") or "" for s in syms],
        "start_ns": [r["start_timestamp"] for r in records],
        "dur_ns": [r["end_timestamp"] - r["start_timestamp"] for r in records],
        "device": [_json_device(device, i["agent_id"]["handle"]) for i in infos],
        "stream": [(pid, i["queue_id"]["handle"]) for i in infos],
        "correlation": [(r.get("correlation_id") or {}).get("internal") for r in records],
        "registers": [s.get("arch_vgpr_count") for s in syms],
        "shared_mem": [i.get("group_segment_size") for i in infos],
    }
    for a in "xyz":
        cols[f"grid_{a}"] = [blocks(g.get(a), w.get(a)) for g, w in zip(grids, wgs, strict=True)]
        cols[f"block_{a}"] = [w.get(a) for w in wgs]
    rows.extend(cols)


def _json_device(device: dict[int, int], handle: int) -> int:
    if handle not in device:
        device[handle] = len(device)  # an agent missing from the agents list: next free index
    return device[handle]


def _json_copies(
    records: list[dict[str, Any]],
    ops: list[str],
    device: dict[int, int],
    rows: KernelRows,
) -> None:
    for r in records:
        src, dst = r["src_agent_id"]["handle"], r["dst_agent_id"]["handle"]
        op = r.get("operation")
        name = ops[op] if isinstance(op, int) and 0 <= op < len(ops) else "MEMORY_COPY"
        gpu_end = dst if dst in device or src not in device else src
        rows.add(
            name=name,
            kind="memcpy",
            start_ns=r["start_timestamp"],
            dur_ns=r["end_timestamp"] - r["start_timestamp"],
            device=_json_device(device, gpu_end),
            correlation=(r.get("correlation_id") or {}).get("internal"),
            bytes_recorded=r.get("bytes"),
        )


def _json_markers(
    records: list[dict[str, Any]],
    tool: dict[str, Any],
    ops: dict[str, list[str]],
    ann: dict[str, list[Any]],
) -> None:
    kinds = _json_kind_names(tool)
    messages = _json_marker_messages(tool)
    for r in records:
        kind = r.get("kind")
        kind_name = kinds[kind] if isinstance(kind, int) and 0 <= kind < len(kinds) else ""
        if kind_name not in MARKER_DOMAINS:
            continue
        corr = (r.get("correlation_id") or {}).get("internal")
        op_names = ops.get(kind_name, [])
        op = r.get("operation")
        fallback = op_names[op] if isinstance(op, int) and 0 <= op < len(op_names) else kind_name
        ann["name"].append(messages.get(corr, fallback))
        ann["start_ns"].append(r["start_timestamp"])
        ann["end_ns"].append(r["end_timestamp"])


def _json_marker_messages(tool: dict[str, Any]) -> dict[Any, str]:
    """roctx messages by correlation id (``strings.marker_api`` as key/value pairs or a dict)."""
    raw = (tool.get("strings") or {}).get("marker_api") or []
    if isinstance(raw, dict):
        return {to_int(k): str(v) for k, v in raw.items()}
    out = {}
    for item in raw:
        if isinstance(item, dict) and "key" in item:
            out[to_int(item["key"])] = str(item.get("value", ""))
    return out


def _json_meta(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    if not gpus:
        return {}
    g = gpus[0]
    return {
        "gpu_name": g.get("product_name") or None,
        "arch": g.get("name") or None,
        "sm_count": g.get("cu_count"),
        "devices": [
            {
                "index": i,
                "name": a.get("product_name"),
                "arch": a.get("name"),
                "cu_count": a.get("cu_count"),
            }
            for i, a in enumerate(gpus)
        ],
    }
