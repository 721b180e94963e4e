"""AMD rocprof family reader: rocprof v1, rocprofv2 and rocprofv3 outputs -> canonical :class:`Trace`.

Contract (FORMATS §2):

* Accepted inputs, each told apart by content (CSV header names, JSON keys, SQLite tables):
  rocprof v1 ``results.csv`` / ``results.json`` / ``results.db`` (table ``KERN``) /
  ``results.stats.csv``; rocprofv2 file-plugin CSV; rocprofv3 ``*_kernel_trace.csv``,
  ``*_memory_copy_trace.csv``, ``*_kernel_stats.csv`` and ``*_results.json[.gz]``.
  Stats files share their header with the HIP/HSA/copy API stats, so for them (only) the file
  name decides: ``*.stats.csv`` or ``*kernel_stats.csv``.
* A ``*_kernel_trace.csv`` also reads the ``<same prefix>_memory_copy_trace.csv`` (memcpy rows),
  ``_marker_api_trace.csv`` (annotations, side ``cpu``) and ``_agent_info.csv`` (GPU metadata and
  agent -> device mapping) that sit beside it. A rocprof v1 file reads ``results.sysinfo.txt``
  (rocminfo) beside it, or the ``otherData`` of ``results.json``, for the GPU's name, gfx, CUs.
* Times are integer ns as recorded (v1 JSON: ``args.BeginNs/EndNs``, never the truncated µs
  ``ts``/``dur``). Grids recorded in work-items become work-group counts, ceil(grid / workgroup)
  per axis; v1/v2 record only totals, so their grid is (groups, 1, 1) and block (wgr, 1, 1).
* ``device`` is 0-based: the GPU's index among GPU agents when the trace says which agent is which
  (``GPU n`` agent ids, agent tables), else the rank of the recorded id among the distinct ids.
  ``stream`` is the HSA queue id, mapped to small ints in sorted order (DESIGN §2).
* ``name`` is the kernel name as the trace spells it (only CSV-artifact wrapping quotes are removed,
  as in v1 ``results.db``); rocprofv3 JSON gives several spellings and the reader takes
  ``formatted_kernel_name``, the one rocprofv3 itself writes to its CSV and rocpd ``display_name``.
  ``norm_name`` equals ``name``: normalisation happens later (analyzer/names.py).
* Summary-only inputs (stats CSV) give ``aggregate`` rows: ``count`` = calls, ``dur_ns`` = total,
  ``start_ns`` null.
* Bad input raises :class:`InputError` with one line; ``sniff`` never raises.

The helpers it shares with the rocpd and nsys readers (CSV tables, row accumulation, trace assembly,
read-only SQLite) live in :mod:`analyzer.readers.common`.
"""

from __future__ import annotations

import csv
import re
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson

from analyzer.errors import InputError
from analyzer.model import Trace
from analyzer.readers import gz, read_head
from analyzer.readers.common import (
    SQLITE_MAGIC,
    CsvTable,
    KernelRows,
    blocks,
    build_trace,
    connect_ro,
    dense_ids,
    read_bytes,
    read_text,
    sqlite_objects,
    table_columns,
    to_int,
)

FORMAT = "rocprof"
READER_VERSION = "1"

# Header columns that identify each CSV flavour (lower-case).
_V1_KEYS = {"kernelname", "gpu-id", "grd", "wgr"}
_V2_KEYS = {"dispatch_id", "gpu_id", "kernel_name", "grid_size", "workgroup_size"}
_V3_KERNEL_KEYS = {
    "kind",
    "agent_id",
    "kernel_name",
    "start_timestamp",
    "end_timestamp",
}
_V3_COPY_KEYS = {"kind", "direction", "source_agent_id", "destination_agent_id"}
_STATS_KEYS = {"name", "calls", "totaldurationns"}
_MARKER_DOMAINS = {"MARKER_CORE_API", "MARKER_CORE_RANGE_API"}


# ---------------------------------------------------------------------------------------------
# Protocol


def sniff(path: Path, head: bytes) -> bool:
    """True when ``head`` (first bytes, gzip undone) is one of the rocprof family's files."""
    try:
        return _flavour(Path(path), head) is not None
    except Exception:  # noqa: BLE001 - sniffing a foreign file must never fail
        return False


def read(path: Path) -> Trace:
    """Read one rocprof-family file into a validated :class:`Trace`."""
    path = Path(path)
    flavour = "rocprof"
    try:
        flavour = _flavour(path, read_head(path)) or ""
        if not flavour:
            raise InputError(f"{path}: not a rocprof output (unrecognised header)")
        return _READERS[flavour](path)
    except InputError:
        raise
    except (sqlite3.Error, *gz.ERRORS, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: cannot read {flavour} file ({e})") from None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{path}: malformed {flavour} file ({type(e).__name__}: {e})") from None


# ---------------------------------------------------------------------------------------------
# Sniffing


def _flavour(path: Path, head: bytes) -> str | None:
    if head.startswith(SQLITE_MAGIC):
        return "v1_db" if "KERN" in sqlite_objects(path) else None
    text = head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if text.startswith("{"):
        if '"rocprofiler-sdk-tool"' in text[:4096]:
            return "v3_json"
        if '"traceEvents"' in text and '"BeginNs"' in text:
            return "v1_json"
        return None
    return _csv_flavour(path, text)


def _csv_flavour(path: Path, text: str) -> str | None:
    cols = set(header_columns(text.split("\n", 1)[0]))
    if _V1_KEYS <= cols:
        return "v1_csv"
    if _V2_KEYS <= cols:
        return "v2_csv"
    if _V3_KERNEL_KEYS <= cols:
        return "v3_csv"
    if _V3_COPY_KEYS <= cols:
        return "v3_copy_csv"
    if _STATS_KEYS <= cols and _is_kernel_stats_name(path.name):
        return "stats_csv"
    return None


def _is_kernel_stats_name(name: str) -> bool:
    """rocprof writes kernel, HIP, HSA and copy stats with one header; only the name differs."""
    low = name.lower()
    return low.endswith(("kernel_stats.csv", ".stats.csv"))


def header_columns(line: str) -> list[str]:
    """Column names of a CSV header line, lower-cased, quotes and spaces trimmed."""
    row = next(csv.reader([line.strip()]), [])
    return [c.strip().strip('"').strip().lower() for c in row]


def unquote(name: str) -> str:
    """Remove one pair of wrapping double quotes (a CSV artifact some rocprof files keep)."""
    if len(name) >= 2 and name[0] == '"' and name[-1] == '"':
        return name[1:-1]
    return name


# ---------------------------------------------------------------------------------------------
# rocprof v1 / rocprofv2 CSV, v1 SQLite, v1 JSON


def _read_v1_csv(path: Path) -> Trace:
    t = CsvTable(path, read_text(path))
    t.require("kernelname", "gpu-id")
    if not t.has("beginns") or not t.has("endns"):
        raise InputError(
            f"{path}: missing column(s) BeginNs/EndNs (a counter-collection run without "
            "--timestamp on has no timeline)"
        )
    rows = _v1_rows(
        names=t.column("kernelname"),
        gpu=t.ints("gpu-id"),
        queue=t.ints("queue-id"),
        begin=t.ints("beginns"),
        end=t.ints("endns"),
        grd=t.ints("grd"),
        wgr=t.ints("wgr"),
        lds=t.ints("lds"),
        vgpr=t.ints("arch_vgpr", "vgpr"),
    )
    return _v1_trace(path, rows)


def _v1_rows(
    names: Sequence[str | None],
    gpu: Sequence[int | None],
    queue: Sequence[int | None],
    begin: Sequence[int | None],
    end: Sequence[int | None],
    grd: Sequence[int | None],
    wgr: Sequence[int | None],
    lds: Sequence[int | None],
    vgpr: Sequence[int | None],
    kinds: Sequence[str] | None = None,
    correlation: Sequence[int | None] | None = None,
) -> KernelRows:
    rows = KernelRows()
    devices, streams = dense_ids(gpu), dense_ids(queue)
    for i, raw in enumerate(names):
        rows.add(
            name=unquote(raw or ""),
            kind=kinds[i] if kinds else "kernel",
            start_ns=begin[i],
            dur_ns=_span(begin[i], end[i]),
            device=devices[i] or 0,
            stream=streams[i],
            correlation=correlation[i] if correlation else None,
            grid_x=blocks(grd[i], wgr[i]),
            grid_y=1 if grd[i] is not None and wgr[i] else None,
            grid_z=1 if grd[i] is not None and wgr[i] else None,
            block_x=wgr[i],
            block_y=1 if wgr[i] is not None else None,
            block_z=1 if wgr[i] is not None else None,
            registers=vgpr[i],
            shared_mem=lds[i],
        )
    return rows


def _span(begin: int | None, end: int | None) -> int | None:
    if begin is None or end is None:
        return None
    return end - begin


def _v1_trace(path: Path, rows: KernelRows, agents: list[dict[str, Any]] | None = None) -> Trace:
    if agents is None:
        agents = _sysinfo_agents(path.parent / "results.sysinfo.txt")
    meta, warnings = _agents_meta(agents)
    return build_trace(path, FORMAT, rows, meta=meta, warnings=warnings, reader_version=READER_VERSION)


def _read_v2_csv(path: Path) -> Trace:
    t = CsvTable(path, read_text(path))
    t.require("kernel_name", "gpu_id", "start_timestamp", "end_timestamp")
    rows = _v1_rows(
        names=t.column("kernel_name"),
        gpu=t.ints("gpu_id"),
        queue=t.ints("queue_id"),
        begin=t.ints("start_timestamp"),
        end=t.ints("end_timestamp"),
        grd=t.ints("grid_size"),
        wgr=t.ints("workgroup_size"),
        lds=t.ints("lds_per_workgroup"),
        vgpr=t.ints("arch_vgpr"),
        correlation=t.ints("correlation_id"),
    )
    return build_trace(path, FORMAT, rows, reader_version=READER_VERSION)


def _read_v1_db(path: Path) -> Trace:
    with closing(connect_ro(path)) as con:
        cols = {c.lower(): c for c in table_columns(con, "KERN")}
        need = ["kernelname", "gpu-id", "beginns", "endns"]
        missing = [n for n in need if n not in cols]
        if missing:
            raise InputError(f"{path}: table KERN lacks column(s) {', '.join(missing)}")
        want = [*need[:2], "queue-id", *need[2:], "grd", "wgr", "lds", "arch_vgpr"]
        select = ", ".join(f'"{cols[w]}"' if w in cols else "NULL" for w in want)
        data = con.execute(f"SELECT {select} FROM KERN ORDER BY rowid").fetchall()
    cols_ = list(zip(*data, strict=True)) if data else [()] * len(want)
    ints = [[to_int(v, path) for v in c] for c in cols_[1:]]
    rows = _v1_rows(cols_[0], *ints)
    return _v1_trace(path, rows)


def _read_v1_json(path: Path) -> Trace:
    doc = orjson.loads(read_bytes(path))
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise InputError(f"{path}: no traceEvents list")
    procs = _process_names(events)
    timed = [e for e in events if _is_timed_v1(e)]
    args = [e["args"] for e in timed]
    rows = _v1_rows(
        names=[a.get("KernelName") or e.get("name") for a, e in zip(args, timed, strict=True)],
        gpu=[to_int(a.get("gpu-id"), path) for a in args],
        queue=[to_int(a.get("queue-id"), path) for a in args],
        begin=[to_int(a.get("BeginNs"), path) for a in args],
        end=[to_int(a.get("EndNs"), path) for a in args],
        grd=[to_int(a.get("grd"), path) for a in args],
        wgr=[to_int(a.get("wgr"), path) for a in args],
        lds=[to_int(a.get("lds"), path) for a in args],
        vgpr=[to_int(a.get("arch_vgpr"), path) for a in args],
        kinds=[_v1_json_kind(procs.get(e.get("pid"), "")) for e in timed],
    )
    agents = _sysinfo_agents(path.parent / "results.sysinfo.txt")
    if not agents:
        agents = _other_data_agents(doc.get("otherData"))
    return _v1_trace(path, rows, agents)


def _is_timed_v1(e: Any) -> bool:
    args = e.get("args") if isinstance(e, dict) else None
    return isinstance(args, dict) and e.get("ph") == "X" and "BeginNs" in args and "EndNs" in args


def _process_names(events: list[Any]) -> dict[Any, str]:
    out = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
            out[e.get("pid")] = str((e.get("args") or {}).get("name", ""))
    return out


def _v1_json_kind(process: str) -> str:
    return "memcpy" if process.upper().startswith("COPY") else "kernel"


def _read_stats_csv(path: Path) -> Trace:
    t = CsvTable(path, read_text(path))
    rows = KernelRows()
    for name, calls, total in zip(t.column("name"), t.ints("calls"), t.ints("totaldurationns"), strict=True):
        if not calls:
            continue
        rows.add(
            name=unquote(name or ""),
            dur_ns=total,
            device=0,
            count=calls,
            aggregate=True,
        )
    if path.name.lower().endswith("kernel_stats.csv"):
        prefix = path.name[: -len("kernel_stats.csv")]
        meta = _agent_info_meta(_agent_info(path.with_name(prefix + "agent_info.csv")))
        return build_trace(path, FORMAT, rows, meta=meta, reader_version=READER_VERSION)
    return _v1_trace(path, rows)


# ---------------------------------------------------------------------------------------------
# GPU metadata from rocminfo (results.sysinfo.txt) or results.json otherData

_ROCMINFO_KEYS = {
    "Name": "name",
    "Marketing Name": "marketing",
    "Device Type": "type",
    "Compute Unit": "cus",
}


def _sysinfo_agents(path: Path) -> list[dict[str, Any]]:
    """HSA agents from a rocminfo dump: name (gfx), marketing name, type, CUs, memory."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    agents: list[dict[str, Any]] = []
    for line in text.splitlines():
        s = line.strip()
        if re.fullmatch(r"Agent \d+", s):
            agents.append({})
        elif agents and ":" in s:
            _rocminfo_field(agents[-1], s)
    return agents


def _rocminfo_field(agent: dict[str, Any], line: str) -> None:
    key, _, value = line.partition(":")
    key, value = key.strip(), value.strip()
    field = _ROCMINFO_KEYS.get(key)
    if field and field not in agent:
        agent[field] = value
    if key == "Segment" and "COARSE GRAINED" in value and "GLOBAL" in value:
        agent.setdefault("_pool", True)
    elif key == "Size" and agent.get("_pool") is True:
        agent["_pool"] = False
        agent["memory"] = _kb(value)


def _kb(value: str) -> int | None:
    m = re.match(r"(\d+)", value.replace(" ", ""))
    return int(m.group(1)) * 1024 if m and value.replace(" ", "").endswith("KB") else None


def _other_data_agents(other: Any) -> list[dict[str, Any]]:
    """The rocminfo agents that rocprof v1 flattens into results.json ``otherData``."""
    if not isinstance(other, dict):
        return []
    keys = {
        "Name": "name",
        "MarketingName": "marketing",
        "DeviceType": "type",
        "ComputeUnit": "cus",
    }
    agents: dict[str, dict[str, Any]] = {}
    for k, v in other.items():
        prefix, _, field = str(k).partition(".")
        if prefix.startswith("Agent") and field in keys:
            agents.setdefault(prefix, {})[keys[field]] = str(v)
    return [agents[k] for k in sorted(agents, key=lambda p: to_int(p[5:]) or 0)]


def _agents_meta(agents: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """GPU metadata when every GPU agent is the same model (v1 ids do not say which one ran)."""
    gpus = [a for a in agents if str(a.get("type", "")).upper() == "GPU"]
    models = {(a.get("marketing"), a.get("name"), a.get("cus")) for a in gpus}
    if len(models) != 1:
        warn = ["rocminfo lists several GPU models; the GPU was not identified"] if gpus else []
        return {}, warn
    g = gpus[0]
    meta = {
        "gpu_name": g.get("marketing") or None,
        "arch": g.get("name") or None,
        "sm_count": to_int(g.get("cus")),
        "total_memory": g.get("memory"),
        "devices": [
            {"index": i, "name": a.get("marketing"), "arch": a.get("name")} for i, a in enumerate(gpus)
        ],
    }
    return meta, []


# ---------------------------------------------------------------------------------------------
# rocprofv3 CSV


def _read_v3_csv(path: Path) -> Trace:
    prefix = path.name[: -len("kernel_trace.csv")] if path.name.endswith("kernel_trace.csv") else None
    t = CsvTable(path, read_text(path))
    t.require("kernel_name", "agent_id", "start_timestamp", "end_timestamp")
    agents = _agent_info(path.with_name(prefix + "agent_info.csv")) if prefix is not None else []
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
    meta = _agent_info_meta(agents)
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
            dur_ns=_span(start[i], end[i]),
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
            dur_ns=_span(start[i], end[i]),
            device=devices[i],
            stream=streams[i],
            correlation=corr[i],
            bytes_recorded=size[i],
        )


def _read_v3_copy_csv(path: Path) -> Trace:
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
        if (d is None or d in _MARKER_DOMAINS) and s is not None and e is not None:
            out["name"].append(name)
            out["start_ns"].append(s)
            out["end_ns"].append(e)
    return out


def parse_agent(value: Any) -> tuple[str, int]:
    """("gpu", n) for "GPU n"; ("agent", n) for "Agent n" or a bare number."""
    s = str(value if value is not None else "").strip().strip('"')
    m = re.fullmatch(r"(?i)(gpu|agent|cpu)?[\s\-_]*(\d+)", s)
    if not m:
        raise InputError(f"unrecognised agent id {s[:40]!r}")
    return ((m.group(1) or "agent").lower(), int(m.group(2)))


def _device_map(agents: Sequence[tuple[str, int]], info: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """0-based device per agent id: type-relative ids as is, else via agent_info, else dense."""
    gpu_index = {a["logical"]: i for i, a in enumerate(_gpu_rows(info))}
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


def _agent_info(path: Path) -> list[dict[str, Any]]:
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


def _gpu_rows(info: list[dict[str, Any]]) -> list[dict[str, Any]]:
    gpus = [a for a in info if str(a.get("type", "")).upper() == "GPU"]
    return sorted(gpus, key=lambda a: a["logical"] if a["logical"] is not None else -1)


def _agent_info_meta(info: list[dict[str, Any]]) -> dict[str, Any]:
    gpus = _gpu_rows(info)
    if not gpus:
        return {}
    g = gpus[0]
    return {
        "gpu_name": g.get("product") or None,
        "arch": g.get("name") or None,
        "sm_count": g.get("cus"),
        "devices": [{"index": i, "name": a["product"], "arch": a["name"]} for i, a in enumerate(gpus)],
    }


# ---------------------------------------------------------------------------------------------
# rocprofv3 JSON


def _read_v3_json(path: Path) -> Trace:
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
        if kind_name not in _MARKER_DOMAINS:
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


_READERS = {
    "v1_csv": _read_v1_csv,
    "v2_csv": _read_v2_csv,
    "v1_db": _read_v1_db,
    "v1_json": _read_v1_json,
    "stats_csv": _read_stats_csv,
    "v3_csv": _read_v3_csv,
    "v3_copy_csv": _read_v3_copy_csv,
    "v3_json": _read_v3_json,
}
