"""rocprof v1 and rocprofv2 flavours: v1 ``results.csv`` / ``results.db`` / ``results.json``, the
rocprofv2 file-plugin CSV, and the kernel stats CSVs (v1 ``results.stats.csv``, v3 ``*kernel_stats.csv``).

Contract: each ``read_*`` takes the path of a file :mod:`analyzer.readers.rocprof` sniffed as its
flavour and returns an unvalidated :class:`Trace` (FORMATS §2, stated in that module). v1/v2 record
only grid and workgroup totals, so a grid is (groups, 1, 1) and a block (wgr, 1, 1). v1 GPU metadata
comes from ``results.sysinfo.txt`` (rocminfo) beside the file, or ``results.json``'s ``otherData``,
and is kept only when every GPU agent is the same model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson

from analyzer.errors import InputError
from analyzer.model import Trace
from analyzer.readers.common import (
    CsvTable,
    KernelRows,
    blocks,
    build_trace,
    connect_ro,
    dense_ids,
    read_bytes,
    read_text,
    table_columns,
    to_int,
)
from analyzer.readers.rocprof_common import (
    FORMAT,
    READER_VERSION,
    agent_info,
    agent_info_meta,
    span,
    unquote,
)


def read_v1_csv(path: Path) -> Trace:
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
            dur_ns=span(begin[i], end[i]),
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


def _v1_trace(path: Path, rows: KernelRows, agents: list[dict[str, Any]] | None = None) -> Trace:
    if agents is None:
        agents = _sysinfo_agents(path.parent / "results.sysinfo.txt")
    meta, warnings = _agents_meta(agents)
    return build_trace(path, FORMAT, rows, meta=meta, warnings=warnings, reader_version=READER_VERSION)


def read_v2_csv(path: Path) -> Trace:
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


def read_v1_db(path: Path) -> Trace:
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


def read_v1_json(path: Path) -> Trace:
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


def read_stats_csv(path: Path) -> Trace:
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
        meta = agent_info_meta(agent_info(path.with_name(prefix + "agent_info.csv")))
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
