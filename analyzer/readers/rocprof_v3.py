"""rocprofv3 CSV flavours: a ``*_kernel_trace.csv`` with the copy, marker and agent files beside it,
and a ``*_memory_copy_trace.csv`` read alone.

Contract: each ``read_*`` takes the path of a file :mod:`analyzer.readers.rocprof` sniffed as its
flavour and returns an unvalidated :class:`Trace` (FORMATS §2, stated in that module). A kernel trace
reads ``<same prefix>_memory_copy_trace.csv`` (memcpy rows), ``_marker_api_trace.csv`` (annotations)
and ``_agent_info.csv`` (GPU metadata, agent -> device) when they exist. Grids recorded in
work-items become work-group counts per axis; ``stream`` is the HSA queue id, made dense.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analyzer.model import Trace
from analyzer.readers.common import CsvTable, KernelRows, blocks, build_trace, read_text
from analyzer.readers.rocprof_common import (
    FORMAT,
    MARKER_DOMAINS,
    READER_VERSION,
    agent_info,
    agent_info_meta,
    gpu_rows,
    parse_agent,
    span,
    unquote,
)


def read_v3_csv(path: Path) -> Trace:
    prefix = path.name[: -len("kernel_trace.csv")] if path.name.endswith("kernel_trace.csv") else None
    t = CsvTable(path, read_text(path))
    t.require("kernel_name", "agent_id", "start_timestamp", "end_timestamp")
    agents = agent_info(path.with_name(prefix + "agent_info.csv")) if prefix is not None else []
    copies = _sibling(path, prefix, "memory_copy_trace.csv")
    copy_table = CsvTable(copies, read_text(copies)) if copies else None
    kernel_agents = [parse_agent(v) for v in t.column("agent_id")]
    copy_agents = _copy_agents(copy_table) if copy_table else []
    devices = _device_map(kernel_agents + copy_agents, agents)
    rows = KernelRows()
    _v3_kernel_rows(rows, t, [devices[a] for a in kernel_agents])
    if copy_table:
        _v3_copy_rows(rows, copy_table, [devices[a] for a in copy_agents])
    rows.densify("stream")
    markers = _sibling(path, prefix, "marker_api_trace.csv")
    annotations = _v3_markers(CsvTable(markers, read_text(markers))) if markers else None
    meta = agent_info_meta(agents)
    return build_trace(path, FORMAT, rows, annotations=annotations, meta=meta, reader_version=READER_VERSION)


def _sibling(path: Path, prefix: str | None, suffix: str) -> Path | None:
    if prefix is None:
        return None
    p = path.with_name(prefix + suffix)
    return p if p.is_file() else None


def _v3_kernel_rows(rows: KernelRows, t: CsvTable, devices: list[int]) -> None:
    start, end = t.ints("start_timestamp"), t.ints("end_timestamp")
    wg = [t.ints(f"workgroup_size_{a}") for a in "xyz"]
    grid = [t.ints(f"grid_size_{a}") for a in "xyz"]
    queues = t.ints("queue_id")
    corr = t.ints("correlation_id")
    vgpr = t.ints("arch_vgpr_count", "vgpr_count")
    lds = t.ints("lds_block_size", "group_segment_size")
    for i, name in enumerate(t.column("kernel_name")):
        rows.add(
            name=unquote(name or ""),
            start_ns=start[i],
            dur_ns=span(start[i], end[i]),
            device=devices[i],
            stream=queues[i],
            correlation=corr[i],
            grid_x=blocks(grid[0][i], wg[0][i]),
            grid_y=blocks(grid[1][i], wg[1][i]),
            grid_z=blocks(grid[2][i], wg[2][i]),
            block_x=wg[0][i],
            block_y=wg[1][i],
            block_z=wg[2][i],
            registers=vgpr[i],
            shared_mem=lds[i],
        )


def _copy_agents(t: CsvTable) -> list[tuple[str, int]]:
    """The GPU end of each copy: the source for device-to-host, else the destination."""
    src = [parse_agent(v) for v in t.column("source_agent_id")]
    dst = [parse_agent(v) for v in t.column("destination_agent_id")]
    direction = t.column("direction")
    return [
        s if "DEVICE_TO_HOST" in (d_ or "").upper() else d
        for s, d, d_ in zip(src, dst, direction, strict=True)
    ]


def _v3_copy_rows(rows: KernelRows, t: CsvTable, devices: list[int]) -> None:
    t.require("start_timestamp", "end_timestamp")
    start, end = t.ints("start_timestamp"), t.ints("end_timestamp")
    size = t.ints("size", "bytes")
    streams = t.ints("queue_id")  # Stream_Id is a HIP stream: another id space
    corr = t.ints("correlation_id")
    for i, direction in enumerate(t.column("direction")):
        rows.add(
            name=direction or "MEMORY_COPY",
            kind="memcpy",
            start_ns=start[i],
            dur_ns=span(start[i], end[i]),
            device=devices[i],
            stream=streams[i],
            correlation=corr[i],
            bytes_recorded=size[i],
        )


def read_v3_copy_csv(path: Path) -> Trace:
    t = CsvTable(path, read_text(path))
    agents = _copy_agents(t)
    devices = _device_map(agents, [])
    rows = KernelRows()
    _v3_copy_rows(rows, t, [devices[a] for a in agents])
    rows.densify("stream")
    return build_trace(path, FORMAT, rows, reader_version=READER_VERSION)


def _v3_markers(t: CsvTable) -> dict[str, list[Any]]:
    t.require("function", "start_timestamp", "end_timestamp")
    out: dict[str, list[Any]] = {"name": [], "start_ns": [], "end_ns": []}
    domains = t.column("domain")
    for name, d, s, e in zip(
        t.column("function"),
        domains,
        t.ints("start_timestamp"),
        t.ints("end_timestamp"),
        strict=True,
    ):
        if (d is None or d in MARKER_DOMAINS) and s is not None and e is not None:
            out["name"].append(name)
            out["start_ns"].append(s)
            out["end_ns"].append(e)
    return out


def _device_map(agents: Sequence[tuple[str, int]], info: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """0-based device per agent id: type-relative ids as is, else via agent_info, else dense."""
    gpu_index = {a["logical"]: i for i, a in enumerate(gpu_rows(info))}
    unknown = sorted({a for a in agents if a[0] != "gpu" and a[1] not in gpu_index})
    out = {}
    for a in set(agents):
        if a[0] == "gpu":
            out[a] = a[1]
        elif a[1] in gpu_index:
            out[a] = gpu_index[a[1]]
        else:
            out[a] = unknown.index(a)
    return out
