"""Re-cut every case of tests/cases/manifest.toml (``make cases``); a case whose trace is absent stays."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

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
        cmd = [
            sys.executable,
            "-m",
            "analyzer",
            "cut",
            case["trace"],
            "-o",
            f"tests/cases/{case['name']}.json",
        ]
        cmd += ["--name", case["name"], "--description", case["description"]]
        if "step" in case:
            cmd += ["--step", case["step"]]
        if case.get("keep_annotations"):
            cmd.append("--keep-annotations")
        subprocess.run(cmd, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
