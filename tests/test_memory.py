"""The CLI's memory policy: set before pyarrow loads, harmless to call again."""

from __future__ import annotations

import os
import subprocess
import sys

from analyzer import memory


def test_configure_sets_mimalloc_purge_delay_unless_set(monkeypatch) -> None:
    monkeypatch.delenv("MIMALLOC_PURGE_DELAY", raising=False)
    memory.configure()
    assert os.environ["MIMALLOC_PURGE_DELAY"] == "0"
    monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "250")
    memory.configure()  # a user's own setting wins
    assert os.environ["MIMALLOC_PURGE_DELAY"] == "250"


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
print(seen[0] if seen else "never")
"""


def test_cli_configures_before_pyarrow_is_imported() -> None:
    # mimalloc reads its options when pyarrow first loads it: the CLI must set them before that
    out = subprocess.run([sys.executable, "-c", HOOK], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"
