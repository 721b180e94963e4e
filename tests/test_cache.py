"""Parsed-trace cache and parallel reading: hits skip the reader, keys never go stale, results never change."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from analyzer.cli import main
from analyzer.model import Trace
from analyzer.readers import kineto
from analyzer.runtime import cache
from tests import rawtrace
from tests.conftest import H200_TP2
from tests.runs import load_inputs


def same(a: Trace, b: Trace) -> None:
    for name in ("kernels", "host_ops", "annotations"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert ta.schema == tb.schema, name
        assert ta.equals(tb), name
    assert [m.to_dict() for m in a.inputs] == [m.to_dict() for m in b.inputs]
    assert a.warnings == b.warnings


def _entries(folder: Path) -> list[Path]:
    """The cache's entries (its stat index aside)."""
    return sorted(p for p in folder.iterdir() if p.name != cache.STAT_DIR)


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Count calls of the Kineto reader (the parse a cache hit must skip)."""
    calls: list[str] = []
    real = kineto.read

    def counting(path, *args, **kwargs):
        calls.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(kineto, "read", counting)
    return calls


@pytest.fixture(scope="module")
def reference() -> Trace:
    return load_inputs([str(p) for p in H200_TP2], jobs=1, cache=False)


def test_hit_skips_the_reader_and_gives_the_same_trace(tmp_path: Path, reads: list[str]) -> None:
    path = str(H200_TP2[0])
    first = cache.load_trace(path, tmp_path)
    assert len(reads) == 1
    again = cache.load_trace(path, tmp_path)
    assert len(reads) == 1  # no second parse
    same(first, again)
    same(first, load_inputs([path], cache=False))
    # one entry: Parquet tables and JSON metadata, nothing else (no pickle), no temporary folder left
    entries = _entries(tmp_path)
    assert len(entries) == 1
    assert sorted(p.name for p in entries[0].iterdir()) == [
        "annotations.parquet",
        "host_ops.parquet",
        "kernels.parquet",
        "meta.json",
    ]


def test_identical_with_and_without_cache_and_jobs(tmp_path: Path, reference: Trace) -> None:
    paths = [str(p) for p in H200_TP2]
    same(reference, load_inputs(paths, jobs=2, cache=False))  # two worker processes, scratch folder
    same(reference, load_inputs(paths, jobs=2, cache=tmp_path))  # workers fill the cache
    entries = _entries(tmp_path)
    assert len(entries) == 2
    mtimes = [(e / "meta.json").stat().st_mtime_ns for e in entries]
    same(reference, load_inputs(paths, jobs=2, cache=tmp_path))  # workers find it
    same(reference, load_inputs(paths, jobs=1, cache=tmp_path))  # so does this process
    assert [(e / "meta.json").stat().st_mtime_ns for e in entries] == mtimes  # never rewritten
    assert _entries(tmp_path) == entries


def test_cache_hit_in_this_process_after_workers_filled_it(tmp_path: Path, reads: list[str]) -> None:
    paths = [str(p) for p in H200_TP2]
    load_inputs(paths, jobs=2, cache=tmp_path)  # parsed in workers (the counter here sees nothing)
    load_inputs(paths, jobs=1, cache=tmp_path)
    assert reads == []


def test_edited_trace_gets_a_new_key_and_is_parsed_again(tmp_path: Path, reads: list[str]) -> None:
    # GIVEN a copy of a trace, parsed into the cache
    work = tmp_path / "run"
    work.mkdir()
    copy = work / "rank0.json.gz"
    shutil.copyfile(H200_TP2[0], copy)
    store = tmp_path / "cache"
    before = cache.load_trace(copy, store)
    key_before = cache.cache_key(copy)
    # WHEN one kernel's duration is edited in the file
    obj = json.loads(gzip.decompress(copy.read_bytes()))
    k = next(e for e in obj["traceEvents"] if e.get("cat") == "kernel")
    k["dur"] = float(k["dur"]) + 1.0  # one microsecond longer
    copy.write_bytes(gzip.compress(json.dumps(obj).encode()))
    # THEN the key changes, the reader runs again and the new duration is what comes back
    key_after = cache.cache_key(copy)
    assert key_after.sha256 != key_before.sha256 and key_after.entry_name != key_before.entry_name
    after = cache.load_trace(copy, store)
    assert len(reads) == 2
    assert after.kernel_ns == before.kernel_ns + 1000
    assert len(_entries(store)) == 2


def test_reader_version_and_code_are_part_of_the_key(tmp_path: Path, monkeypatch, reads: list[str]) -> None:
    path = H200_TP2[0]
    k1 = cache.cache_key(path)
    cache.load_trace(path, tmp_path)
    monkeypatch.setattr(kineto, "READER_VERSION", "999")
    k2 = cache.cache_key(path)
    assert k2.reader_version == "999" and k2.entry_name != k1.entry_name
    cache.load_trace(path, tmp_path)
    assert len(reads) == 2  # the old entry is not used
    assert len(k1.code) == 64 and k1.name == "rank0.json.gz"
    renamed = tmp_path / "other-name.json.gz"
    shutil.copyfile(path, renamed)
    assert cache.cache_key(renamed).entry_name != k1.entry_name  # readers may take the rank from the name


def test_stored_key_is_checked_on_load(tmp_path: Path, reads: list[str]) -> None:
    path = H200_TP2[0]
    cache.load_trace(path, tmp_path)
    key = cache.cache_key(path)
    entry = cache.entry_dir(tmp_path, key)
    meta = json.loads((entry / "meta.json").read_text())
    meta["key"]["sha256"] = "0" * 64  # an entry that claims another file
    (entry / "meta.json").write_text(json.dumps(meta))
    assert cache.read_entry(entry, key, path) is None
    again = cache.load_trace(path, tmp_path)
    assert len(reads) == 2  # parsed again, and the entry replaced
    assert json.loads((entry / "meta.json").read_text())["key"] == key.to_dict()
    same(again, cache.load_trace(path, tmp_path))
    assert len(reads) == 2


def test_damaged_entry_is_a_miss(tmp_path: Path, reads: list[str]) -> None:
    path = H200_TP2[0]
    good = cache.load_trace(path, tmp_path)
    entry = cache.entry_dir(tmp_path, cache.cache_key(path))
    (entry / "kernels.parquet").write_bytes(b"PAR1 not really")
    same(good, cache.load_trace(path, tmp_path))
    assert len(reads) == 2
    same(good, cache.load_trace(path, tmp_path))
    assert len(reads) == 2


def test_path_is_the_one_given(tmp_path: Path) -> None:
    store = tmp_path / "cache"
    a = tmp_path / "a"
    a.mkdir()
    shutil.copyfile(H200_TP2[0], a / "rank0.json.gz")
    cache.load_trace(H200_TP2[0], store)
    t = cache.load_trace(a / "rank0.json.gz", store)  # same name and bytes: a hit
    assert len(_entries(store)) == 1
    assert t.inputs[0].path == str(a / "rank0.json.gz")


def test_default_dir_from_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LKM_CACHE_DIR", str(tmp_path / "c"))
    assert cache.default_dir() == tmp_path / "c"
    assert cache.resolve_dir(True) == tmp_path / "c"
    assert cache.resolve_dir(False) is None
    monkeypatch.delenv("LKM_CACHE_DIR")
    assert cache.default_dir() == Path.home() / ".cache" / "llm-kernel-map"


def test_bad_input_in_a_worker_is_one_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [], "schemaVersion": 1}')
    from analyzer.errors import InputError

    with pytest.raises(InputError, match="bad.json"):
        load_inputs([str(H200_TP2[0]), str(bad)], jobs=2, cache=False)


def test_cli_fills_the_cache_unless_no_cache(capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LKM_CACHE_DIR", str(tmp_path / "c"))
    args = ["analyze", *[str(p) for p in H200_TP2]]
    assert main([*args, "--no-cache"]) == 0
    plain = capsys.readouterr().out
    assert not (tmp_path / "c").exists()
    assert main([*args, "--jobs", "2"]) == 0
    assert capsys.readouterr().out == plain
    assert len(_entries(tmp_path / "c")) == 2
    assert main(args) == 0  # the hit
    assert capsys.readouterr().out == plain
    assert main([*args, "--executor", "local", "--scheduler", "tcp://nowhere:8786"]) == 2
    assert "--scheduler needs --executor dask" in capsys.readouterr().err
    assert main([*args, "--jobs", "0"]) == 2


def test_stat_index_skips_hashing_and_never_goes_stale(tmp_path: Path, monkeypatch, reads: list[str]) -> None:
    import os

    from analyzer import readers

    # GIVEN a trace that has settled (its mtime a minute old), parsed once into the cache
    path = tmp_path / "rank0.json.gz"
    shutil.copyfile(H200_TP2[0], path)
    old = path.stat().st_mtime_ns - 60 * 10**9
    os.utime(path, ns=(old, old))
    monkeypatch.setattr(cache, "_SETTLED_NS", 0)  # ctime is now: accept it for this test
    store = tmp_path / "cache"
    first = cache.load_trace(path, store)
    assert len(reads) == 1 and first.inputs[0].sha256 == rawtrace.sha256(path)
    assert cache.known_sha256(store, path) == first.inputs[0].sha256
    # WHEN it is analysed again, nothing hashes the file
    monkeypatch.setattr(readers, "_SHA_MEMO", {})
    hashed: list[str] = []
    real = readers.file_sha256
    monkeypatch.setattr(readers, "file_sha256", lambda p: hashed.append(str(p)) or real(p))
    same(first, cache.load_trace(path, store))
    assert reads == [str(path)] and hashed == []
    # WHEN the file is rewritten with other bytes and its old mtime put back
    obj = json.loads(gzip.decompress(path.read_bytes()))
    k = next(e for e in obj["traceEvents"] if e.get("cat") == "kernel")
    k["dur"] = float(k["dur"]) + 1.0
    path.write_bytes(gzip.compress(json.dumps(obj).encode()))
    os.utime(path, ns=(old, old))
    # THEN the index does not match (ctime moved), and the new bytes are parsed
    assert cache.known_sha256(store, path) is None
    after = cache.load_trace(path, store)
    assert len(reads) == 2 and after.kernel_ns == first.kernel_ns + 1000
