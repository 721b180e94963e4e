"""Tests for analyzer/readers/rocpd.py: the real rocpd sample first, then synthetic databases."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from analyzer.errors import InputError
from analyzer.readers import read_head, rocpd, sniff

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
DB = SHARED / "rocpd-llamacpp-r9700" / "32432_results.db"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"public sample traces not found at {SHARED} (../shared absent)"
)


def _query(sql: str):
    con = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# --------------------------------------------------------------------------- real sample


@needs_shared
def test_sample_matches_independent_count_and_time():
    # GIVEN the dispatch view queried directly
    ((n, total),) = _query("SELECT COUNT(*), SUM(end - start) FROM rocpd_kernel_dispatch")
    # WHEN the reader reads the database
    trace = rocpd.read(DB)
    trace.validate()
    # THEN every dispatch is there with the same total time
    assert trace.kernels.num_rows == n == 5687
    assert trace.kernel_ns == total == 82_887_453
    k = trace.kernels.to_pydict()
    assert set(k["kind"]) == {"kernel"} and set(k["device"]) == {0}
    assert k["norm_name"] == k["name"]
    assert trace.annotations.num_rows == 0 and trace.host_ops.num_rows == 0


@needs_shared
def test_sample_names_grid_and_gpu():
    ((start, name, gx, wx),) = _query(
        "SELECT K.start, S.display_name, K.grid_size_x, K.workgroup_size_x "
        "FROM rocpd_kernel_dispatch K JOIN rocpd_info_kernel_symbol S ON S.id = K.kernel_id "
        "WHERE K.grid_size_x > K.workgroup_size_x AND K.workgroup_size_x > 1 "
        "ORDER BY K.start LIMIT 1"
    )
    trace = rocpd.read(DB)
    k = trace.kernels.to_pydict()
    i = k["start_ns"].index(start)
    assert k["name"][i] == name
    assert k["grid_x"][i] == math.ceil(gx / wx) and k["block_x"][i] == wx
    meta = trace.inputs[0]
    assert (meta.format, meta.gpu_name, meta.arch, meta.sm_count) == (
        "rocpd",
        "AMD Radeon AI PRO R9700",
        "gfx1201",
        64,
    )


@needs_shared
def test_registry_sniffs_rocpd_and_rocpd_rejects_other_formats():
    assert sniff(DB).FORMAT == "rocpd"
    for rel in (
        "rocprofv1-llamacpp-r9700/results.db",
        "rocprofv1-llamacpp-r9700/results.csv",
        "nsys-sqlite-nvfuser-h200/report1.sqlite",
        "rocprofv3-json-mi350x-training/908_results.json.gz",
        "h200-llama3-8b-dense/trace.json.gz",
        "rocpd-llamacpp-r9700/PROVENANCE.md",
    ):
        p = SHARED / rel
        if p.exists():
            assert rocpd.sniff(p, read_head(p)) is False, rel


# --------------------------------------------------------------------------- synthetic databases


def _make_db(path: Path, with_regions: bool = True) -> None:
    """A tiny rocpd-shaped database (plain tables under the un-suffixed view names)."""
    g = "g1"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE rocpd_string (id INTEGER, guid TEXT, string TEXT);
        CREATE TABLE rocpd_info_agent (id INTEGER, guid TEXT, type TEXT, absolute_index INTEGER,
            name TEXT, product_name TEXT, extdata TEXT);
        CREATE TABLE rocpd_info_kernel_symbol (id INTEGER, guid TEXT, kernel_name TEXT,
            display_name TEXT, arch_vgpr_count INTEGER);
        CREATE TABLE rocpd_event (id INTEGER, guid TEXT, category_id INTEGER,
            correlation_id INTEGER);
        CREATE TABLE rocpd_kernel_dispatch (id INTEGER, guid TEXT, agent_id INTEGER,
            kernel_id INTEGER, queue_id INTEGER, start INTEGER, end INTEGER,
            group_segment_size INTEGER, workgroup_size_x INTEGER, workgroup_size_y INTEGER,
            workgroup_size_z INTEGER, grid_size_x INTEGER, grid_size_y INTEGER,
            grid_size_z INTEGER, event_id INTEGER);
        CREATE TABLE rocpd_memory_copy (id INTEGER, guid TEXT, start INTEGER, end INTEGER,
            name_id INTEGER, dst_agent_id INTEGER, src_agent_id INTEGER, size INTEGER,
            queue_id INTEGER, event_id INTEGER);
        """
    )
    strings = [(1, "KERNEL_DISPATCH"), (2, "HIP_RUNTIME_API_EXT"), (3, "MARKER_CORE_API"),
               (4, "hipGraphLaunch"), (5, "decode step"), (6, "MEMORY_COPY_HOST_TO_DEVICE"),
               (7, "hipLaunchKernel")]  # fmt: skip
    con.executemany("INSERT INTO rocpd_string VALUES (?, ?, ?)", [(i, g, s) for i, s in strings])
    con.executemany(
        "INSERT INTO rocpd_info_agent VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(0, g, "CPU", 0, "EPYC", "EPYC", "{}"),
         (1, g, "GPU", 1, "gfx942", "AMD Instinct MI300X", '{"cu_count": 304}'),
         (2, g, "GPU", 2, "gfx942", "AMD Instinct MI300X", '{"cu_count": 304}')],
    )  # fmt: skip
    con.executemany(
        "INSERT INTO rocpd_info_kernel_symbol VALUES (?, ?, ?, ?, ?)",
        [(1, g, "_Z4gemmv.kd", "gemm()", 64), (2, g, "k2.kd", "", 8)],
    )
    con.executemany(
        "INSERT INTO rocpd_event VALUES (?, ?, ?, ?)",
        [(1, g, 1, 11), (2, g, 1, 12), (3, g, 2, 11), (4, g, 3, 0), (5, g, 1, 0), (6, g, 2, 12)],
    )
    con.executemany(
        "INSERT INTO rocpd_kernel_dispatch VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [(1, g, 2, 1, 7, 1000, 1600, 0, 256, 1, 1, 491520, 1, 1, 1),
         (2, g, 2, 2, 9, 2000, 2100, 64, 64, 2, 1, 100, 4, 1, 2)],
    )  # fmt: skip
    con.execute("INSERT INTO rocpd_memory_copy VALUES (1, ?, 500, 900, 6, 2, 0, 4096, 7, 5)", (g,))
    if with_regions:
        con.executescript(
            """
            CREATE TABLE rocpd_region (id INTEGER, guid TEXT, tid INTEGER, start INTEGER,
                end INTEGER, name_id INTEGER, event_id INTEGER);
            """
        )
        con.executemany(
            "INSERT INTO rocpd_region VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(1, g, 1, 950, 990, 4, 3), (2, g, 1, 900, 3000, 5, 4), (3, g, 1, 1950, 1990, 7, 6)],
        )
    con.commit()
    con.close()


def test_synthetic_markers_runtime_calls_graph_launch_and_copies(tmp_path):
    # GIVEN a database with two dispatches, a copy, a marker and two HIP calls
    p = tmp_path / "1_results.db"
    _make_db(p)
    assert rocpd.sniff(p, read_head(p))
    # WHEN read
    trace = rocpd.read(p)
    trace.validate()
    k = trace.kernels.to_pydict()
    # THEN kernels then copies, all on the second GPU agent's device index
    assert k["kind"] == ["kernel", "kernel", "memcpy"]
    assert k["device"] == [1, 1, 1]
    assert k["name"] == ["gemm()", "k2.kd", "MEMORY_COPY_HOST_TO_DEVICE"]
    assert (k["grid_x"][0], k["block_x"][0], k["registers"][0]) == (1920, 256, 64)
    assert (k["grid_x"][1], k["grid_y"][1]) == (2, 2)
    assert k["stream"] == [0, 1, 0]  # queues 7, 9, 7 -> one numbering for kernels and copies
    # the HIP call with the kernel's correlation id names its launch; hipGraphLaunch marks a replay
    assert k["launch_api"][:2] == ["hipGraphLaunch", "hipLaunchKernel"]
    assert k["graph_launch"] == [True, False, False]
    assert k["bytes_recorded"][2] == 4096 and k["correlation"][2] is None
    ann = trace.annotations.to_pydict()
    assert ann["name"] == ["decode step"] and ann["side"] == ["cpu"]
    ops = trace.host_ops.to_pydict()
    assert ops["name"] == ["hipGraphLaunch", "hipLaunchKernel"]
    assert set(ops["category"]) == {"runtime"}
    meta = trace.inputs[0]
    assert (meta.gpu_name, meta.arch, meta.sm_count) == ("AMD Instinct MI300X", "gfx942", 304)


def test_synthetic_without_regions_still_reads(tmp_path):
    p = tmp_path / "2_results.db"
    _make_db(p, with_regions=False)
    trace = rocpd.read(p)
    assert trace.kernels.num_rows == 3 and trace.annotations.num_rows == 0


def test_sqlite_without_rocpd_tables(tmp_path):
    p = tmp_path / "x.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE KERN (x INTEGER)")
    con.commit()
    con.close()
    assert rocpd.sniff(p, read_head(p)) is False
    with pytest.raises(InputError, match="rocpd_kernel_dispatch") as e:
        rocpd.read(p)
    assert "\n" not in str(e.value)


def test_missing_symbol_and_agent_views_are_named(tmp_path):
    p = tmp_path / "3_results.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE rocpd_kernel_dispatch (id INTEGER, start INTEGER, end INTEGER)")
    con.commit()
    con.close()
    assert rocpd.sniff(p, read_head(p))
    with pytest.raises(InputError, match="rocpd_info_kernel_symbol, rocpd_info_agent"):
        rocpd.read(p)


def test_missing_dispatch_columns_are_named(tmp_path):
    p = tmp_path / "4_results.db"
    con = sqlite3.connect(p)
    con.executescript(
        "CREATE TABLE rocpd_kernel_dispatch (id INTEGER, start INTEGER);"
        "CREATE TABLE rocpd_info_kernel_symbol (id INTEGER);"
        "CREATE TABLE rocpd_info_agent (id INTEGER);"
    )
    con.close()
    with pytest.raises(InputError, match="end, agent_id, kernel_id"):
        rocpd.read(p)


def test_empty_dispatch_table_has_no_gpu_activity(tmp_path):
    p = tmp_path / "5_results.db"
    _make_db(p)
    con = sqlite3.connect(p)
    con.executescript("DELETE FROM rocpd_kernel_dispatch; DELETE FROM rocpd_memory_copy;")
    con.close()
    with pytest.raises(InputError, match="no GPU activity recorded"):
        rocpd.read(p)


def test_sniff_never_raises(tmp_path):
    p = tmp_path / "bad.db"
    p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 50)
    assert rocpd.sniff(p, p.read_bytes()) is False
    assert rocpd.sniff(tmp_path / "absent.db", b"SQLite format 3\x00") is False
