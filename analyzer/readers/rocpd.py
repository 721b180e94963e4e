"""rocpd reader: the rocprofv3 SQLite database (``<pid>_results.db``) -> canonical :class:`Trace`.

Contract:

* The file is opened read-only. Tables carry a per-run GUID suffix, so the reader queries only
  the un-suffixed views: ``rocpd_kernel_dispatch`` (+ ``rocpd_info_kernel_symbol`` for names,
  ``rocpd_info_agent`` for the GPU, ``rocpd_event`` for correlation ids), ``rocpd_memory_copy``
  (memcpy rows) and ``rocpd_region`` (+ ``rocpd_event`` / ``rocpd_string``): ROCTx marker
  ranges become annotations (side ``cpu``), HIP runtime calls become host ops (category
  ``runtime``) whose correlation marks graph-replayed kernels (``hipGraphLaunch*``) and sets
  ``launch_api``. Joins include ``guid`` so merged multi-process databases stay apart.
* Sniffing needs the SQLite magic and a ``rocpd_kernel_dispatch`` object; that tells rocpd from
  the nsys export and from rocprof v1 ``results.db`` (table ``KERN``).
* ``name`` = the symbol's ``display_name`` (what rocpd's own ``kernels`` view shows; the raw
  ``.kd`` symbol when it is empty); ``norm_name`` = ``name``. Grids are work-items in rocpd and
  become work-group counts (ceil per axis). ``device`` = index of the agent among the GPU
  agents of its process; ``stream`` = queue id mapped to small ints; correlation 0 = none.
* Missing views or columns give an :class:`InputError` naming them; so does a database with no
  kernel dispatch and no memory copy ("no GPU activity recorded").
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from analyzer.errors import InputError
from analyzer.model import Trace
from analyzer.readers.common import (
    SQLITE_MAGIC,
    KernelRows,
    blocks,
    build_trace,
    connect_ro,
    sqlite_objects,
    table_columns,
)

FORMAT = "rocpd"
READER_VERSION = "1"

_REQUIRED = ("rocpd_kernel_dispatch", "rocpd_info_kernel_symbol", "rocpd_info_agent")
_DISPATCH_COLUMNS = ("start", "end", "agent_id", "kernel_id")
_MARKER_CATEGORIES = ("MARKER_CORE_API", "MARKER_CORE_RANGE_API")
_RUNTIME_CATEGORIES = ("HIP_RUNTIME_API", "HIP_RUNTIME_API_EXT")


def sniff(path: Path, head: bytes) -> bool:
    """SQLite with a ``rocpd_kernel_dispatch`` table or view."""
    try:
        return head.startswith(SQLITE_MAGIC) and _has_dispatch(sqlite_objects(Path(path)))
    except Exception:  # noqa: BLE001 - sniffing a foreign file must never fail
        return False


def _has_dispatch(names: set[str]) -> bool:
    return any(n.startswith("rocpd_kernel_dispatch") for n in names)


def read(path: Path) -> Trace:
    """Read a rocpd database into a validated :class:`Trace`."""
    path = Path(path)
    try:
        with closing(connect_ro(path)) as con:
            return _read(path, con)
    except sqlite3.Error as e:
        raise InputError(f"{path}: cannot read rocpd database ({e})") from None


def _read(path: Path, con: sqlite3.Connection) -> Trace:
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    missing = [n for n in _REQUIRED if n not in names]
    if missing:
        raise InputError(f"{path}: not a usable rocpd database (missing {', '.join(missing)})")
    _require_columns(path, con, "rocpd_kernel_dispatch", _DISPATCH_COLUMNS)
    q = _Query(con, names)
    agents = _agents(con)
    rows = KernelRows()
    _kernels(q, agents, rows)
    if "rocpd_memory_copy" in names:
        _copies(q, agents, rows)
    markers, host_ops = _regions(q) if "rocpd_region" in names else ({}, {})
    _mark_launches(rows, host_ops)
    rows.densify("stream")
    return build_trace(
        path,
        FORMAT,
        rows,
        annotations=markers,
        host_ops=host_ops,
        meta=_meta(agents, con),
        reader_version=READER_VERSION,
    )


def _require_columns(path: Path, con: sqlite3.Connection, table: str, cols: tuple[str, ...]):
    have = set(table_columns(con, table))
    missing = [c for c in cols if c not in have]
    if missing:
        raise InputError(f"{path}: view {table} lacks column(s) {', '.join(missing)}")


class _Query:
    """SELECT-list and JOIN builders that tolerate views and columns a rocpd version lacks.

    Build the FROM/JOIN part first: ``pick`` yields NULL for an alias that was not joined.
    """

    def __init__(self, con: sqlite3.Connection, names: set[str]) -> None:
        self.con = con
        self.names = names
        self.aliases: dict[str, str] = {}
        self._cols: dict[str, set[str]] = {}

    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            known = table in self.names
            self._cols[table] = set(table_columns(self.con, table)) if known else set()
        return self._cols[table]

    def source(self, table: str, alias: str) -> str:
        self.aliases = {alias: table}
        return f" FROM {table} {alias}"

    def join(self, table: str, alias: str, key: str, parent_alias: str) -> str:
        """LEFT JOIN ``table`` on id = ``parent.key`` (and equal guids when both have one)."""
        parent = self.aliases.get(parent_alias)
        if parent is None or table not in self.names or key not in self.cols(parent):
            return ""
        on = f'{alias}.id = {parent_alias}."{key}"'
        if "guid" in self.cols(table) and "guid" in self.cols(parent):
            on += f" AND {alias}.guid = {parent_alias}.guid"
        self.aliases[alias] = table
        return f" LEFT JOIN {table} {alias} ON {on}"

    def pick(self, alias: str, *cols: str) -> str:
        table = self.aliases.get(alias)
        have = self.cols(table) if table else set()
        return ", ".join(f'{alias}."{c}"' if c in have else "NULL" for c in cols)


def _agents(con: sqlite3.Connection) -> dict[tuple[Any, Any], dict[str, Any]]:
    """Agents by (guid, id); GPU agents get ``device`` = their rank among their process's GPUs."""
    have = set(table_columns(con, "rocpd_info_agent"))
    want = ["id", "guid", "type", "absolute_index", "name", "product_name", "extdata"]
    select = ", ".join(c if c in have else "NULL" for c in want)
    out: dict[tuple[Any, Any], dict[str, Any]] = {}
    for row in con.execute(f"SELECT {select} FROM rocpd_info_agent"):
        a = dict(zip(want, row, strict=True))
        out[(a["guid"], a["id"])] = a
    for guid in {k[0] for k in out}:
        gpus = [a for k, a in out.items() if k[0] == guid and str(a["type"]).upper() == "GPU"]
        for i, a in enumerate(sorted(gpus, key=lambda a: (a["absolute_index"] or 0, a["id"]))):
            a["device"] = i
    return out


def _device(agents: dict[tuple[Any, Any], dict[str, Any]], guid: Any, agent_id: Any) -> int:
    a = agents.get((guid, agent_id))
    return a.get("device", 0) if a else 0


def _kernels(q: _Query, agents: dict, rows: KernelRows) -> None:
    t = "rocpd_kernel_dispatch"
    tail = (
        q.source(t, "K")
        + q.join("rocpd_info_kernel_symbol", "S", "kernel_id", "K")
        + q.join("rocpd_event", "E", "event_id", "K")
        + " ORDER BY K.start"
    )
    select = [
        q.pick("K", "start", "end", "agent_id", "guid", "queue_id", "group_segment_size"),
        q.pick("K", *(f"grid_size_{a}" for a in "xyz")),
        q.pick("K", *(f"workgroup_size_{a}" for a in "xyz")),
        q.pick("S", "display_name", "kernel_name", "arch_vgpr_count"),
        q.pick("E", "correlation_id"),
    ]
    sql = "SELECT " + ", ".join(select) + tail
    for r in q.con.execute(sql):
        grid, wg = r[6:9], r[9:12]
        rows.add(
            name=r[12] or r[13] or "",
            start_ns=r[0],
            dur_ns=r[1] - r[0],
            device=_device(agents, r[3], r[2]),
            stream=(r[3] or "", r[4]) if r[4] is not None else None,
            correlation=r[15] or None,
            grid_x=blocks(grid[0], wg[0]),
            grid_y=blocks(grid[1], wg[1]),
            grid_z=blocks(grid[2], wg[2]),
            block_x=wg[0],
            block_y=wg[1],
            block_z=wg[2],
            registers=r[14],
            shared_mem=r[5],
        )


def _copies(q: _Query, agents: dict, rows: KernelRows) -> None:
    tail = (
        q.source("rocpd_memory_copy", "M")
        + q.join("rocpd_string", "N", "name_id", "M")
        + q.join("rocpd_event", "E", "event_id", "M")
        + " ORDER BY M.start"
    )
    select = [
        q.pick(
            "M",
            "start",
            "end",
            "guid",
            "src_agent_id",
            "dst_agent_id",
            "size",
            "queue_id",
        ),
        q.pick("N", "string"),
        q.pick("E", "correlation_id"),
    ]
    sql = "SELECT " + ", ".join(select) + tail
    for r in q.con.execute(sql):
        src, dst = agents.get((r[2], r[3]), {}), agents.get((r[2], r[4]), {})
        gpu = dst if "device" in dst else src
        rows.add(
            name=r[7] or "MEMORY_COPY",
            kind="memcpy",
            start_ns=r[0],
            dur_ns=r[1] - r[0],
            device=gpu.get("device", 0),
            stream=(r[2] or "", r[6]) if r[6] is not None else None,
            correlation=r[8] or None,
            bytes_recorded=r[5],
        )


def _regions(q: _Query) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """Marker ranges (annotations) and HIP runtime calls (host ops) from ``rocpd_region``."""
    tail = (
        q.source("rocpd_region", "R")
        + q.join("rocpd_string", "N", "name_id", "R")
        + q.join("rocpd_event", "E", "event_id", "R")
        + q.join("rocpd_info_thread", "T", "tid", "R")
        + q.join("rocpd_string", "C", "category_id", "E")
        + " ORDER BY R.start"
    )
    select = [
        q.pick("R", "start", "end"),
        q.pick("N", "string"),
        q.pick("C", "string"),
        q.pick("E", "correlation_id"),
        q.pick("T", "tid"),
    ]
    sql = "SELECT " + ", ".join(select) + tail
    markers: dict[str, list[Any]] = {"name": [], "start_ns": [], "end_ns": []}
    ops: dict[str, list[Any]] = {k: [] for k in ("name", "start_ns", "dur_ns", "tid")}
    ops.update(category=[], correlation=[])
    for start, end, name, category, corr, tid in q.con.execute(sql):
        if category in _MARKER_CATEGORIES:
            _append(markers, name=name or "", start_ns=start, end_ns=end)
        elif category in _RUNTIME_CATEGORIES:
            _append(ops, name=name or "", start_ns=start, dur_ns=end - start, tid=tid)
            _append(ops, category="runtime", correlation=corr or None)
    return markers, ops


def _append(cols: dict[str, list[Any]], **values: Any) -> None:
    for k, v in values.items():
        cols[k].append(v)


def _mark_launches(rows: KernelRows, host_ops: dict[str, list[Any]]) -> None:
    """Set ``launch_api`` (and ``graph_launch`` for hipGraphLaunch*) from correlated HIP calls."""
    api = dict(zip(host_ops.get("correlation", []), host_ops.get("name", []), strict=True))
    api.pop(None, None)
    if not api:
        return
    for i, corr in enumerate(rows.cols["correlation"]):
        name = api.get(corr)
        if name:
            rows.cols["launch_api"][i] = name
            rows.cols["graph_launch"][i] = name.startswith("hipGraphLaunch")


def _meta(agents: dict[tuple[Any, Any], dict[str, Any]], con: sqlite3.Connection) -> dict:
    gpus = sorted((a for a in agents.values() if "device" in a), key=lambda a: a["device"])
    versions = _versions(con)
    if not gpus:
        return {"versions": versions}
    g = gpus[0]
    return {
        "gpu_name": g["product_name"] or None,
        "arch": g["name"] or None,
        "sm_count": _extdata(g).get("cu_count"),
        "versions": versions,
        "devices": [
            {
                "index": a["device"],
                "name": a["product_name"],
                "arch": a["name"],
                "cu_count": _extdata(a).get("cu_count"),
            }
            for a in gpus
        ],
    }


def _extdata(agent: dict[str, Any]) -> dict[str, Any]:
    try:
        data = json.loads(agent.get("extdata") or "{}")
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _versions(con: sqlite3.Connection) -> dict[str, str]:
    try:
        row = con.execute("SELECT value FROM rocpd_metadata WHERE tag = 'schema_version'").fetchone()
    except sqlite3.Error:
        return {}
    return {"rocpd_schema": str(row[0])} if row else {}
