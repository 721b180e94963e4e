"""NVIDIA Nsight Systems reader: SQLite export, ``nsys stats`` CSV and ``.nsys-rep`` -> :class:`Trace`.

Contract:

* SQLite export (``nsys export --type sqlite``), opened read-only, columns selected defensively
  because they vary by nsys version: ``CUPTI_ACTIVITY_KIND_KERNEL`` (name = ``StringIds`` of
  ``demangledName``, else ``shortName``, else ``mangledName``), ``_MEMCPY`` / ``_MEMSET`` (rows of
  kind memcpy/memset named as ``nsys stats`` names them, ``[CUDA memcpy Host-to-Device]``;
  ``bytes`` -> ``bytes_recorded``), ``_RUNTIME`` (host ops, category ``runtime`` for ``cuda*``
  calls, ``driver`` for ``cu*`` calls, with their correlation; a kernel's ``launch_api`` is its
  launching call without the ``_v7000`` version suffix, and ``graph_launch`` is True when that
  call is ``cudaGraphLaunch*``/``cuGraphLaunch*`` or the kernel has a ``graphNodeId``),
  ``NVTX_EVENTS`` push/pop and start/end ranges (annotations, side ``cpu``, name =
  COALESCE(text, StringIds[textId])), ``TARGET_INFO_GPU`` (+ ``TARGET_INFO_CUDA_DEVICE``) for
  the GPU's name, SM count, memory and ``sm_<major><minor>``. Times are ns from session start
  made absolute with ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` when the export has it.
  Correlation ids are matched within a process (``globalTid >> 24`` = ``globalPid >> 24``).
* ``nsys stats --format csv`` reports, found by their header line after any preamble:
  ``cuda_gpu_trace`` / ``gputrace`` (one row per activity; start is session-relative) and
  ``cuda_gpu_kern_sum`` / ``gpukernsum`` (totals only: ``aggregate`` rows with ``count`` =
  Instances, ``dur_ns`` = Total Time, ``start_ns`` null). Their MB-rounded byte and
  shared-memory columns are not carried over.
* ``.nsys-rep``: exported with ``nsys export --type sqlite`` into a temporary directory when
  ``nsys`` is on PATH; otherwise an :class:`InputError` says how to export it.
* ``name`` is as nsys spells it (its own demangler style); ``norm_name`` = ``name``. CUDA grids
  are blocks already. Bad input raises :class:`InputError` with one line; ``sniff`` never raises.
"""

from __future__ import annotations

import csv
import re
import shutil
import sqlite3
import subprocess
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

from analyzer.errors import InputError
from analyzer.model import Trace
from analyzer.readers.common import (
    SQLITE_MAGIC,
    CsvTable,
    KernelRows,
    build_trace,
    connect_ro,
    read_text,
    sqlite_objects,
    table_columns,
    to_int,
)

FORMAT = "nsys"
READER_VERSION = "1"

_REP_SUFFIXES = (".nsys-rep", ".qdrep")
_GPU_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)
_NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange (ENUM_NSYS_EVENT_TYPE)
_GRAPH_LAUNCH = re.compile(r"^cu(da)?GraphLaunch")
_API_VERSION = re.compile(r"_v\d{4,}$")
# ENUM_CUDA_MEMCPY_OPER labels, for exports that lack the ENUM table.
_COPY_KINDS = {
    0: "Unknown",
    1: "Host-to-Device",
    2: "Device-to-Host",
    3: "Host-to-Array",
    4: "Array-to-Host",
    5: "Array-to-Array",
    6: "Array-to-Device",
    7: "Device-to-Array",
    8: "Device-to-Device",
    9: "Host-to-Host",
    10: "Peer-to-Peer",
    11: "Unified Host-to-Device",
    12: "Unified Device-to-Host",
    13: "Unified Device-to-Device",
}
# Header columns (lower-case, whitespace removed) of the two `nsys stats` reports read here.
_TRACE_KEYS = {"start(ns)", "duration(ns)", "grdx", "name"}
_SUM_KEYS = {"totaltime(ns)", "instances", "name"}


# ---------------------------------------------------------------------------------------------
# Protocol


def sniff(path: Path, head: bytes) -> bool:
    """An nsys SQLite export, an ``nsys stats`` GPU trace/kernel summary CSV or a report file."""
    try:
        return _flavour(Path(path), head) is not None
    except Exception:  # noqa: BLE001 - sniffing a foreign file must never fail
        return False


def read(path: Path) -> Trace:
    """Read an Nsight Systems output into a validated :class:`Trace`."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(64 * 1024)
    flavour = _flavour(path, head)
    if flavour is None:
        raise InputError(f"{path}: not an Nsight Systems export or nsys stats CSV")
    try:
        if flavour == "sqlite":
            return _read_sqlite(path, path)
        if flavour == "rep":
            return _read_report(path)
        return _read_csv(path, flavour)
    except InputError as e:
        if str(e).startswith(str(path)):
            raise
        raise InputError(f"{path}: {e}") from None
    except sqlite3.Error as e:
        raise InputError(f"{path}: cannot read Nsight Systems SQLite ({e})") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path}: cannot read {flavour} file ({e})") from None


def _flavour(path: Path, head: bytes) -> str | None:
    if head.startswith(SQLITE_MAGIC):
        return "sqlite" if _is_nsys_db(sqlite_objects(path)) else None
    if path.name.lower().endswith(_REP_SUFFIXES):
        return "rep"
    found = _stats_header(head.decode("utf-8", "replace"))
    return found[0] if found else None


def _is_nsys_db(names: set[str]) -> bool:
    markers = (
        "CUPTI_ACTIVITY_KIND_",
        "TARGET_INFO_",
        "NVTX_EVENTS",
        "META_DATA_EXPORT",
    )
    return "StringIds" in names and any(n.startswith(markers) for n in names)


# ---------------------------------------------------------------------------------------------
# nsys stats CSV


def _stats_header(text: str, max_lines: int = 20) -> tuple[str, int] | None:
    """(report kind, header line index) when a report header sits in the first lines.

    Whatever precedes the header (``nsys stats`` prints "Processing [...]" lines) is skipped;
    the header must be followed by a data row (numeric first field) or by nothing at all, so a
    document that merely quotes the header is not taken for a report.
    """
    lines = text.lstrip("\ufeff").splitlines()
    for i, line in enumerate(lines[:max_lines]):
        if "," not in line:
            continue
        cols = {c.strip().strip('"').replace(" ", "").lower() for c in line.split(",")}
        kind = "gpu_trace" if _TRACE_KEYS <= cols else "kern_sum" if _SUM_KEYS <= cols else None
        if kind and _data_follows(lines, i):
            return kind, i
    return None


def _data_follows(lines: list[str], header: int) -> bool:
    rest = [ln for ln in lines[header + 1 : header + 3] if ln.strip()]
    if not rest:
        return True
    first = next(csv.reader([rest[0]]), [""])[0].strip()
    try:
        float(first)
    except ValueError:
        return False
    return True


def _read_csv(path: Path, flavour: str) -> Trace:
    text = read_text(path)
    found = _stats_header(text)
    if found is None:
        raise InputError(f"{path}: no nsys stats header found")
    t = CsvTable(path, text, header_at=found[1], squash=True)
    if flavour == "kern_sum":
        return _kern_sum(path, t)
    return _gpu_trace(path, t)


def _kern_sum(path: Path, t: CsvTable) -> Trace:
    rows = KernelRows()
    for name, count, total in zip(
        t.column("name"), t.ints("instances"), t.ints("totaltime(ns)"), strict=True
    ):
        if count:
            rows.add(name=name or "", dur_ns=total, count=count, aggregate=True)
    return build_trace(path, FORMAT, rows, reader_version=READER_VERSION)


def _gpu_trace(path: Path, t: CsvTable) -> Trace:
    start, dur = t.ints("start(ns)"), t.ints("duration(ns)")
    grid = [t.ints(f"grd{a}") for a in "xyz"]
    block = [t.ints(f"blk{a}") for a in "xyz"]
    corr, regs, strm = t.ints("corrid"), t.ints("reg/trd"), t.ints("strm")
    devices = [_csv_device(d) for d in t.column("device")]
    rows = KernelRows()
    for i, name in enumerate(t.column("name")):
        rows.add(
            name=name or "",
            kind=_csv_kind(name or ""),
            start_ns=start[i],
            dur_ns=dur[i],
            device=devices[i][1],
            stream=strm[i],
            correlation=corr[i],
            grid_x=grid[0][i],
            grid_y=grid[1][i],
            grid_z=grid[2][i],
            block_x=block[0][i],
            block_y=block[1][i],
            block_z=block[2][i],
            registers=regs[i],
        )
    names = [d[0] for d in devices if d[0]]
    meta = {"gpu_name": names[0]} if names else {}
    return build_trace(path, FORMAT, rows, meta=meta, reader_version=READER_VERSION)


def _csv_kind(name: str) -> str:
    low = name.lower()
    if low.startswith("[cuda memcpy"):
        return "memcpy"
    if low.startswith("[cuda memset"):
        return "memset"
    return "kernel"


def _csv_device(value: str | None) -> tuple[str | None, int]:
    """("NVIDIA H200", 0) from "NVIDIA H200 (0)"; a bare "GPU0"/"0" gives (None, 0)."""
    s = (value or "").strip()
    m = re.fullmatch(r"(.*?)\s*\((\d+)\)", s)
    if m:
        return (m.group(1) or None), int(m.group(2))
    m = re.search(r"(\d+)$", s)
    return None, int(m.group(1)) if m else 0


# ---------------------------------------------------------------------------------------------
# .nsys-rep


def _read_report(path: Path) -> Trace:
    nsys = shutil.which("nsys")
    if nsys is None:
        raise InputError(
            f"{path} is an Nsight Systems report; export it with "
            f"`nsys export --type sqlite -o out.sqlite {path.name}` and pass out.sqlite"
        )
    with tempfile.TemporaryDirectory(prefix="lkm-nsys-") as tmp:
        out = Path(tmp) / "export.sqlite"
        cmd = [nsys, "export", "--type", "sqlite", "--output", str(out), str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            last = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
            raise InputError(f"{path}: nsys export failed ({last[0]})")
        return _read_sqlite(path, out)


# ---------------------------------------------------------------------------------------------
# SQLite export


def _read_sqlite(path: Path, db: Path) -> Trace:
    """Read export ``db``; ``path`` is the file the user gave (meta, messages, sha256)."""
    with closing(connect_ro(db)) as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        if "StringIds" not in names:
            raise InputError(f"{path}: not an Nsight Systems export (no StringIds table)")
        if not any(t in names for t in _GPU_TABLES):
            raise InputError(
                f"{path}: no GPU activity recorded (no CUPTI_ACTIVITY_KIND_KERNEL/MEMCPY/MEMSET "
                "table; was CUDA tracing on?)"
            )
        ctx = _Export(con, names, _session_start(con, names))
        rows = KernelRows()
        ops = _runtime(ctx) if "CUPTI_ACTIVITY_KIND_RUNTIME" in names else _empty_ops()
        launches = _launch_index(ops)
        _kernels(ctx, rows, launches)
        _copies(ctx, rows)
        _memsets(ctx, rows)
        ann = _nvtx(ctx) if "NVTX_EVENTS" in names else None
        meta = _meta(ctx, rows)
    del ops["pid"]
    return build_trace(
        path,
        FORMAT,
        rows,
        annotations=ann,
        host_ops=ops,
        meta=meta,
        reader_version=READER_VERSION,
        sha_path=path,
    )


class _Export:
    """An open export: its tables, columns and time origin."""

    def __init__(self, con: sqlite3.Connection, names: set[str], base: int) -> None:
        self.con, self.names, self.base = con, names, base
        self._cols: dict[str, set[str]] = {}

    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            have = table in self.names
            self._cols[table] = set(table_columns(self.con, table)) if have else set()
        return self._cols[table]

    def pick(self, table: str, *cols: str, alias: str = "A") -> str:
        have = self.cols(table)
        return ", ".join(f'{alias}."{c}"' if c in have else "NULL" for c in cols)

    def require(self, table: str, *cols: str) -> None:
        missing = [c for c in cols if c not in self.cols(table)]
        if missing:
            raise InputError(f"table {table} lacks column(s) {', '.join(missing)}")

    def string(self, table: str, column: str, alias: str) -> tuple[str, str]:
        """(select expression, join clause) resolving an id column through StringIds."""
        if column not in self.cols(table):
            return "NULL", ""
        return (
            f"{alias}.value",
            f' LEFT JOIN StringIds {alias} ON {alias}.id = A."{column}"',
        )


def _session_start(con: sqlite3.Connection, names: set[str]) -> int:
    if "TARGET_INFO_SESSION_START_TIME" not in names:
        return 0
    if "utcEpochNs" not in table_columns(con, "TARGET_INFO_SESSION_START_TIME"):
        return 0
    row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _pid(global_id: int | None) -> int | None:
    """Process id of a serialized globalPid/globalTid (nsys "Serialized process ids")."""
    return None if global_id is None else (global_id >> 24) & 0xFFFFFF


def _empty_ops() -> dict[str, list[Any]]:
    keys = ("name", "start_ns", "dur_ns", "category", "tid", "correlation", "pid")
    return {k: [] for k in keys}


def _runtime(ctx: _Export) -> dict[str, list[Any]]:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    ctx.require(t, "start", "end", "nameId")
    name, join = ctx.string(t, "nameId", "N")
    sql = (
        f"SELECT A.start, A.end, {ctx.pick(t, 'globalTid', 'correlationId')}, {name} "
        f"FROM {t} A{join} ORDER BY A.start"
    )
    ops = _empty_ops()
    for start, end, gtid, corr, api in ctx.con.execute(sql):
        api = api or ""
        ops["name"].append(api)
        ops["start_ns"].append(start + ctx.base)
        ops["dur_ns"].append(end - start)
        ops["category"].append("runtime" if api.startswith("cuda") else "driver")
        ops["tid"].append(None if gtid is None else gtid & 0xFFFFFF)
        ops["correlation"].append(corr)
        ops["pid"].append(_pid(gtid))
    return ops


def _launch_index(ops: dict[str, list[Any]]) -> dict[tuple[Any, Any], str]:
    """Launching call per (pid, correlation id)."""
    return {
        (pid, corr): name
        for pid, corr, name in zip(ops["pid"], ops["correlation"], ops["name"], strict=True)
        if corr is not None
    }


def _kernels(ctx: _Export, rows: KernelRows, launches: dict[tuple[Any, Any], str]) -> None:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if t not in ctx.names:
        return
    ctx.require(t, "start", "end")
    exprs, joins = [], ""
    for col, alias in (
        ("demangledName", "D"),
        ("shortName", "S"),
        ("mangledName", "M"),
    ):
        e, j = ctx.string(t, col, alias)
        exprs.append(e)
        joins += j
    if exprs == ["NULL"] * 3:
        raise InputError(f"table {t} has no kernel name column (demangledName/shortName)")
    cols = ctx.pick(
        t, "deviceId", "streamId", "correlationId", "globalPid", "gridX", "gridY", "gridZ",
        "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
        "dynamicSharedMemory", "graphNodeId",
    )  # fmt: skip
    sql = f"SELECT A.start, A.end, COALESCE({', '.join(exprs)}), {cols} FROM {t} A{joins} ORDER BY A.start"
    for r in ctx.con.execute(sql):
        api = launches.get((_pid(r[6]), r[5])) if r[5] is not None else None
        rows.add(
            name=r[2] or "",
            start_ns=r[0] + ctx.base,
            dur_ns=r[1] - r[0],
            device=r[3],
            stream=r[4],
            correlation=r[5],
            grid_x=r[7],
            grid_y=r[8],
            grid_z=r[9],
            block_x=r[10],
            block_y=r[11],
            block_z=r[12],
            registers=r[13],
            shared_mem=_add(r[14], r[15]),
            graph_launch=bool(api and _GRAPH_LAUNCH.match(api)) or r[16] is not None,
            launch_api=_API_VERSION.sub("", api) if api else None,
        )


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _copies(ctx: _Export, rows: KernelRows) -> None:
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if t not in ctx.names:
        return
    ctx.require(t, "start", "end")
    labels = _copy_labels(ctx)
    cols = ctx.pick(t, "deviceId", "streamId", "correlationId", "bytes", "copyKind")
    for start, end, dev, stream, corr, size, kind in ctx.con.execute(
        f"SELECT A.start, A.end, {cols} FROM {t} A ORDER BY A.start"
    ):
        rows.add(
            name=f"[CUDA memcpy {labels.get(kind, 'Unknown')}]",
            kind="memcpy",
            start_ns=start + ctx.base,
            dur_ns=end - start,
            device=dev,
            stream=stream,
            correlation=corr,
            bytes_recorded=size,
        )


def _copy_labels(ctx: _Export) -> dict[int, str]:
    if "ENUM_CUDA_MEMCPY_OPER" not in ctx.names:
        return _COPY_KINDS
    try:
        return dict(ctx.con.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER"))
    except sqlite3.Error:
        return _COPY_KINDS


def _memsets(ctx: _Export, rows: KernelRows) -> None:
    t = "CUPTI_ACTIVITY_KIND_MEMSET"
    if t not in ctx.names:
        return
    ctx.require(t, "start", "end")
    cols = ctx.pick(t, "deviceId", "streamId", "correlationId", "bytes")
    for start, end, dev, stream, corr, size in ctx.con.execute(
        f"SELECT A.start, A.end, {cols} FROM {t} A ORDER BY A.start"
    ):
        rows.add(
            name="[CUDA memset]",
            kind="memset",
            start_ns=start + ctx.base,
            dur_ns=end - start,
            device=dev,
            stream=stream,
            correlation=corr,
            bytes_recorded=size,
        )


def _nvtx(ctx: _Export) -> dict[str, list[Any]]:
    t = "NVTX_EVENTS"
    ctx.require(t, "start", "end", "eventType")
    text = 'A."text"' if "text" in ctx.cols(t) else "NULL"
    registered, join = ctx.string(t, "textId", "S")
    kinds = ", ".join(str(k) for k in _NVTX_RANGES)
    sql = (
        f"SELECT A.start, A.end, COALESCE({text}, {registered}) FROM {t} A{join} "
        f"WHERE A.eventType IN ({kinds}) AND A.end IS NOT NULL ORDER BY A.start"
    )
    out: dict[str, list[Any]] = {"name": [], "start_ns": [], "end_ns": []}
    for start, end, name in ctx.con.execute(sql):
        if name is None or end < start:
            continue
        out["name"].append(name)
        out["start_ns"].append(start + ctx.base)
        out["end_ns"].append(end + ctx.base)
    return out


def _meta(ctx: _Export, rows: KernelRows) -> dict[str, Any]:
    gpus = _target_gpus(ctx)
    versions = _export_version(ctx)
    if not gpus:
        return {"versions": versions}
    used = next((d for d in rows.cols["device"] if d is not None), 0)
    g = next((g for g in gpus if g["cuda_id"] == used), gpus[0])
    return {
        "gpu_name": g["name"],
        "arch": g["arch"],
        "sm_count": g["sm_count"],
        "total_memory": g["total_memory"],
        "versions": versions,
        "devices": [dict(g, index=g["cuda_id"]) for g in gpus],
    }


def _target_gpus(ctx: _Export) -> list[dict[str, Any]]:
    t = "TARGET_INFO_GPU"
    if t not in ctx.names:
        return []
    cols = (
        "id",
        "name",
        "smCount",
        "totalMemory",
        "computeMajor",
        "computeMinor",
        "cuDevice",
    )
    cuda_ids = _cuda_ids(ctx)
    gpus = []
    for gid, name, sms, mem, major, minor, cu in ctx.con.execute(
        f"SELECT {ctx.pick(t, *cols)} FROM {t} A ORDER BY A.rowid"
    ):
        arch = f"sm_{major}{minor}" if major is not None and minor is not None else None
        cuda_id = cuda_ids.get(gid, cu if cu is not None else gid)
        gpus.append(
            {
                "cuda_id": cuda_id,
                "name": name,
                "arch": arch,
                "sm_count": sms,
                "total_memory": mem,
            }
        )
    return gpus


def _cuda_ids(ctx: _Export) -> dict[Any, int]:
    """GPU id -> CUDA device ordinal from TARGET_INFO_CUDA_DEVICE when the export has it."""
    t = "TARGET_INFO_CUDA_DEVICE"
    if t not in ctx.names or not {"gpuId", "cudaId"} <= ctx.cols(t):
        return {}
    return {g: to_int(c) for g, c in ctx.con.execute(f"SELECT gpuId, cudaId FROM {t}")}


def _export_version(ctx: _Export) -> dict[str, str]:
    if "META_DATA_EXPORT" not in ctx.names:
        return {}
    row = ctx.con.execute(
        "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'"
    ).fetchone()
    return {"nsys": str(row[0])} if row else {}
