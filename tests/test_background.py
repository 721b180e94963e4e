"""Cache writes beside the analysis: deferred only inside a block, always complete at its end."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from analyzer.results.summary import build_summary
from analyzer.runtime import background, cache
from analyzer.runtime.read_policy import read_policy
from tests.conftest import H200_DENSE, H200_TP2
from tests.runs import analyze_run


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
    from analyzer.readers import read_trace
    from analyzer.runtime import chunked_kineto

    calls = []
    monkeypatch.setattr(background, "wait", lambda: calls.append("wait"))
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "2")
    monkeypatch.setattr(chunked_kineto, "CHUNK_BYTES", 1 << 20)
    read_trace(H200_DENSE, policy=read_policy())
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
    from analyzer.runtime import chunked_kineto

    # GIVEN a plain trace the parallel reader parses (small chunks, two workers)
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(H200_DENSE.read_bytes()))
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "2")
    monkeypatch.setattr(chunked_kineto, "CHUNK_BYTES", 1 << 20)
    threads = []  # the thread of each sha256 computed

    class Spy:
        @staticmethod
        def sha256():
            threads.append(threading.current_thread().name)
            return hashlib.sha256()

    monkeypatch.setattr(analyzer.readers, "hashlib", Spy)
    analyzer.readers._SHA_MEMO.clear()
    # (big inputs: memory first, see analyzer.runtime.memory)
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


def test_a_file_asked_for_by_two_threads_is_hashed_once(monkeypatch, tmp_path: Path) -> None:
    import hashlib

    import analyzer.readers

    # GIVEN a hash that is slow to start, and two threads asking for the same file's digest
    p = tmp_path / "t.bin"
    p.write_bytes(b"x" * 100_000)
    started, release, made = threading.Event(), threading.Event(), []

    class Slow:
        @staticmethod
        def sha256():
            made.append(1)
            started.set()
            release.wait(10)
            return hashlib.sha256()

    monkeypatch.setattr(analyzer.readers, "hashlib", Slow)
    got = []
    first = threading.Thread(target=lambda: got.append(analyzer.readers.file_sha256(p)))
    first.start()
    started.wait(10)
    second = threading.Thread(target=lambda: got.append(analyzer.readers.file_sha256(p)))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    # THEN it was hashed once and both got the true digest
    assert made == [1]
    assert got == [hashlib.sha256(p.read_bytes()).hexdigest()] * 2


def test_the_deferred_hash_starts_before_the_post_processing(monkeypatch, tmp_path: Path) -> None:
    import gzip

    from analyzer.readers import kineto, read_trace
    from analyzer.runtime import chunked_kineto

    # GIVEN a plain trace the parallel reader parses inside a deferred block
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(H200_DENSE.read_bytes()))
    monkeypatch.setenv(chunked_kineto.ENV_JOBS, "2")
    monkeypatch.setattr(chunked_kineto, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "1000")
    seen = []
    real = kineto._post_process

    def post(*args):
        seen.append(len(background._threads))
        return real(*args)

    monkeypatch.setattr(kineto, "_post_process", post)
    with background.deferred():
        trace = read_trace(plain, policy=read_policy())
    # THEN a background thread was hashing while the tables were post-processed
    assert seen == [1]
    assert trace.inputs[0].sha256 == ""  # filled by whoever needs it (the cache, the summary)
