"""The CLI's memory policy: set before pyarrow loads, harmless to call again."""

from __future__ import annotations

import os
import subprocess
import sys

from analyzer.runtime import memory
from tests.conftest import H200_DENSE


def test_purge_delay_follows_the_size_of_the_inputs_unless_set(monkeypatch, tmp_path) -> None:
    import gzip

    # GIVEN a plain trace, and a gzip one that holds more text than the threshold
    plain = tmp_path / "small.json"
    plain.write_bytes(b"x" * 100)
    packed = tmp_path / "big.json.gz"
    packed.write_bytes(gzip.compress(b"x" * 100_000))
    monkeypatch.setattr(memory, "BIG_INPUT_BYTES", packed.stat().st_size * memory.GZIP_RATIO)
    assert memory.BIG_INPUT_BYTES > 100
    # THEN small inputs (or none) keep freed pages a second; big ones purge at once
    for argv, delay in (([], "1000"), (["analyze", str(plain)], "1000"), (["analyze", str(packed)], "0")):
        monkeypatch.delenv("MIMALLOC_PURGE_DELAY", raising=False)
        memory.configure(argv)
        assert os.environ["MIMALLOC_PURGE_DELAY"] == delay, argv
    # a folder counts the files inside; gzip counts inflated; options and missing paths count nothing
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(b"x" * 150)
    (folder / "rank1.json").write_bytes(b"x" * 150)
    assert memory.input_bytes(["--json", "out.json", str(folder)]) == 300
    assert memory.input_bytes([str(packed)]) == packed.stat().st_size * memory.GZIP_RATIO
    monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "250")
    memory.configure(["analyze", str(packed)])  # a user's own setting wins
    assert os.environ["MIMALLOC_PURGE_DELAY"] == "250"


def test_big_blocks_are_mapped_apart_only_where_memory_comes_first(monkeypatch) -> None:
    # GIVEN the policy set for small and for big inputs
    calls = []
    monkeypatch.setattr(memory, "_map_big_blocks", lambda: calls.append(1))
    for delay, want in (("1000", []), ("0", [1])):
        calls.clear()
        monkeypatch.setenv("MIMALLOC_PURGE_DELAY", delay)
        memory.configure([])
        # THEN glibc's threshold is fixed only where freed memory goes back at once
        assert calls == want


def test_mapping_big_blocks_apart_is_harmless() -> None:
    # (a no-op off glibc; on glibc the allocator keeps working) in a process of its own
    code = "from analyzer.runtime import memory; memory._map_big_blocks(); print(len(bytearray(8 << 20)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(8 << 20)


HOOK = """
import os, sys
os.environ.pop("MIMALLOC_PURGE_DELAY", None)
seen = []
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" and not seen:
            seen.append(os.environ.get("MIMALLOC_PURGE_DELAY"))
        return None
sys.meta_path.insert(0, Hook())
import analyzer.cli
imported = seen[0] if seen else "never"
with open(os.devnull, "w") as sink:
    sys.stdout, out = sink, sys.stdout
    analyzer.cli.main(["analyze", sys.argv[1]])
    sys.stdout = out
print(imported, seen[0] if seen else "never")
"""


def test_cli_configures_before_pyarrow_is_imported() -> None:
    # mimalloc reads its options when pyarrow first loads it: the CLI's main() must set them before
    # that, and importing the CLI must not load pyarrow at all
    fixture = str(H200_DENSE)
    out = subprocess.run([sys.executable, "-c", HOOK, fixture], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["never", "1000"]  # a small input: purge after a second
