"""Cache writes beside the analysis: deferred only inside a block, always complete at its end."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from analyzer import background, cache
from analyzer.pipeline import analyze_run
from analyzer.summary import build_summary
from tests.conftest import H200_DENSE, H200_TP2


def test_outside_a_block_work_is_done_at_once() -> None:
    done = []
    background.run(done.append, 1)
    assert done == [1]


def test_inside_a_block_work_runs_beside_and_is_joined_at_the_end() -> None:
    release = threading.Event()
    done = []

    def slow(x: int) -> None:
        release.wait(10)
        done.append(x)

    with background.deferred():
        background.run(slow, 1)
        assert done == []  # it did not block this thread
        release.set()
    assert done == [1]


def test_an_error_in_the_thread_is_raised_where_the_block_ends() -> None:
    def broken() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"), background.deferred():
        background.run(broken)


def test_a_deferred_cache_entry_is_complete_when_the_analysis_returns(tmp_path: Path) -> None:
    # GIVEN a first analysis through an empty cache
    first = analyze_run([str(H200_DENSE)], cache=tmp_path)
    # THEN its entry is there and loads (no write still running), and a second analysis uses it
    key = cache.cache_key(H200_DENSE)
    assert cache.read_entry(cache.entry_dir(tmp_path, key), key, H200_DENSE) is not None
    assert not [t for t in threading.enumerate() if t.name == "lkm-background"]
    again = analyze_run([str(H200_DENSE)], cache=tmp_path)
    assert build_summary(again) == build_summary(first)


def test_reading_the_next_input_waits_for_the_write_before(tmp_path: Path, monkeypatch) -> None:
    order = []
    real = cache._store

    def store(*args):
        real(*args)
        order.append("stored " + Path(args[3]).name)

    monkeypatch.setattr(cache, "_store", store)
    real_read = cache.read_entry

    def read_entry(*args, **kwargs):
        order.append("lookup")
        return real_read(*args, **kwargs)

    monkeypatch.setattr(cache, "read_entry", read_entry)
    with background.deferred():
        for p in H200_TP2:
            cache.load_trace(p, tmp_path)
            order.append("loaded " + p.name)
    # the first entry was stored before the second input was read
    assert order.index("stored rank0.json.gz") < order.index("loaded rank1.json.gz")
    assert order[-1] == "stored rank1.json.gz"


def test_forking_reader_waits_for_background_work(monkeypatch, tmp_path: Path) -> None:
    from analyzer.readers import kineto_parallel, read_trace

    calls = []
    monkeypatch.setattr(background, "wait", lambda: calls.append("wait"))
    monkeypatch.setenv(kineto_parallel.ENV_JOBS, "2")
    monkeypatch.setattr(kineto_parallel, "CHUNK_BYTES", 1 << 20)
    read_trace(H200_DENSE)
    assert calls == ["wait"]


@pytest.mark.parametrize(
    ("cached", "tight"),
    [(True, False), (False, False), (True, True)],
    ids=["cache", "no-cache", "memory-first"],
)
def test_a_plain_trace_is_hashed_beside_the_analysis(
    monkeypatch, tmp_path: Path, cached: bool, tight: bool
) -> None:
    import gzip
    import hashlib

    import analyzer.readers
    from analyzer.readers import kineto_parallel

    # GIVEN a plain trace the parallel reader parses (small chunks, two workers)
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(H200_DENSE.read_bytes()))
    monkeypatch.setenv(kineto_parallel.ENV_JOBS, "2")
    monkeypatch.setattr(kineto_parallel, "CHUNK_BYTES", 1 << 20)
    threads = []
    real = analyzer.readers.file_sha256

    def spy(path):
        threads.append(threading.current_thread().name)
        return real(path)

    monkeypatch.setattr(analyzer.readers, "file_sha256", spy)
    # (big inputs: memory first, see analyzer.memory)
    monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "0" if tight else "1000")
    # WHEN the CLI's analysis runs
    analysis = analyze_run([str(plain)], cache=tmp_path / "cache" if cached else False)
    # THEN the file was hashed once, in the background thread, not beside the parsing workers
    # (where memory comes first: beside the workers, so the cache entry is written at once),
    # and the summary carries its true sha256
    assert len(threads) == 1 and (threads[0] == "lkm-background") != tight
    digest = hashlib.sha256(plain.read_bytes()).hexdigest()
    assert build_summary(analysis)["inputs"][0]["sha256"] == digest
    if cached:
        key = cache.cache_key(plain)
        assert key.sha256 == digest
        assert cache.read_entry(cache.entry_dir(tmp_path / "cache", key), key, plain) is not None
