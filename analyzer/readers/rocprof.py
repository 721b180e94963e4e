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
  ``stream`` is the HSA queue id, mapped to small ints in sorted order (README.md 'Output columns').
* ``name`` is the kernel name as the trace spells it (only CSV-artifact wrapping quotes are removed,
  as in v1 ``results.db``); rocprofv3 JSON gives several spellings and the reader takes
  ``formatted_kernel_name``, the one rocprofv3 itself writes to its CSV and rocpd ``display_name``.
  ``norm_name`` equals ``name``: normalisation happens later (analyzer/names.py).
* Summary-only inputs (stats CSV) give ``aggregate`` rows: ``count`` = calls, ``dur_ns`` = total,
  ``start_ns`` null.
* Bad input raises :class:`InputError` with one line; ``sniff`` never raises.

This module keeps the protocol and the sniffing; each flavour is read by its own module:
:mod:`analyzer.readers.rocprof_v1` (v1 CSV / SQLite / JSON, rocprofv2 CSV, stats CSVs),
:mod:`analyzer.readers.rocprof_v3` (rocprofv3 CSVs), :mod:`analyzer.readers.rocprof_v3_json`, with
what they share in :mod:`analyzer.readers.rocprof_common`. The helpers the family shares with the
rocpd and nsys readers (CSV tables, row accumulation, trace assembly, read-only SQLite) live in
:mod:`analyzer.readers.common`.
"""

from __future__ import annotations

import csv
import sqlite3
from pathlib import Path

import orjson

from analyzer.errors import InputError
from analyzer.model import Trace
from analyzer.readers import gz, read_head
from analyzer.readers.common import SQLITE_MAGIC, sqlite_objects
from analyzer.readers.rocprof_common import FORMAT, READER_VERSION, header_columns, parse_agent, unquote
from analyzer.readers.rocprof_v1 import read_stats_csv, read_v1_csv, read_v1_db, read_v1_json, read_v2_csv
from analyzer.readers.rocprof_v3 import read_v3_copy_csv, read_v3_csv
from analyzer.readers.rocprof_v3_json import read_v3_json

__all__ = ["FORMAT", "READER_VERSION", "header_columns", "parse_agent", "read", "sniff", "unquote"]

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


# flavour -> the function of its module that reads it
_READERS = {
    "v1_csv": read_v1_csv,
    "v2_csv": read_v2_csv,
    "v1_db": read_v1_db,
    "v1_json": read_v1_json,
    "stats_csv": read_stats_csv,
    "v3_csv": read_v3_csv,
    "v3_copy_csv": read_v3_copy_csv,
    "v3_json": read_v3_json,
}
