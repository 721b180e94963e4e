"""Shared test helpers: where the real traces live, and skips when they are absent."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
SHARED = ROOT.parent / "shared" / "traces"

H200_DENSE = FIXTURES / "h200-llama3-8b-dense" / "trace.json.gz"
H200_MOE = FIXTURES / "h200-qwen3-30b-a3b-moe" / "trace.json.gz"
H200_TP2 = [FIXTURES / "h200-tp2-llama3-8b-graph" / f"rank{r}.json.gz" for r in (0, 1)]
H200_TRACES = [H200_DENSE, H200_MOE, *H200_TP2]


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never read or fill the user's parsed-trace cache."""
    import os

    os.environ["LKM_CACHE_DIR"] = str(tmp_path_factory.mktemp("lkm-cache"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files")


def shared(rel: str) -> Path:
    """A public trace under ../shared/traces; skip the test when that folder is absent."""
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"public trace {rel} not available (../shared/traces is absent on this machine)")
    return p


def shared_kineto_traces() -> list[str]:
    """Relative paths of every public Kineto trace (empty when ../shared is absent)."""
    if not SHARED.exists():
        return []
    out = []
    for p in sorted(SHARED.rglob("*.json.gz")):
        with open(p, "rb") as f:
            head = f.read(2)
        import gzip

        if head == b"\x1f\x8b":
            with gzip.open(p, "rb") as g:
                h = g.read(4096)
        else:
            h = head
        if b"traceEvents" in h or b'"schemaVersion"' in h:
            out.append(str(p.relative_to(SHARED)))
    return out


try:  # transformers' generate shows tqdm bars; tqdm's monitor thread would outlive the capture tests
    import tqdm  # and make this process look threaded to the tests of the fork policy

    tqdm.tqdm.monitor_interval = 0
except ImportError:  # pragma: no cover - tqdm comes with transformers
    pass
