"""Re-cut every case of tests/cases/manifest.toml (``make cases``); a case whose trace is absent stays.
A swept trace (``fixtures/sweep/<type>/trace.json.xz``) is decompressed into a temporary file first."""

from __future__ import annotations

import json
import lzma
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def main() -> int:
    manifest = tomllib.loads((HERE / "manifest.toml").read_text(encoding="utf-8"))
    only = set(sys.argv[1:])
    for case in manifest["case"]:
        if only and case["name"] not in only:
            continue
        trace = ROOT / case["trace"]
        if not trace.exists():
            print(f"skip {case['name']}: {case['trace']} is absent", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            _cut(case, _readable(trace, Path(tmp)))
    return 0


def _readable(trace: Path, tmp: Path) -> str:
    """The trace as the readers take it: a swept ``.json.xz`` decompressed into ``tmp``."""
    if trace.suffix != ".xz":
        return str(trace.relative_to(ROOT))
    out = tmp / trace.with_suffix("").name
    with lzma.open(trace, "rb") as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    return str(out)


def _cut(case: dict[str, Any], trace: str) -> None:
    cmd = [sys.executable, "-m", "analyzer", "cut", trace, "-o", f"tests/cases/{case['name']}.json.xz"]
    cmd += ["--name", case["name"], "--description", case["description"]]
    if "step" in case:
        cmd += ["--step", case["step"]]
    if case.get("keep_annotations"):
        cmd.append("--keep-annotations")
    subprocess.run(cmd, cwd=ROOT, check=True)
    if trace != case["trace"]:  # name the committed trace, not the temporary file (the digest is its JSON's)
        out = ROOT / "tests" / "cases" / f"{case['name']}.json.xz"
        text = lzma.decompress(out.read_bytes()).decode("utf-8")
        out.write_bytes(
            lzma.compress(text.replace(json.dumps(trace), json.dumps(case["trace"]), 1).encode("utf-8"))
        )


if __name__ == "__main__":
    raise SystemExit(main())
