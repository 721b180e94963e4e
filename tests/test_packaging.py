"""What a user gets from an install: the entry points, ``python -m analyzer``, shell completion."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from analyzer.version import __version__

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_python_dash_m_shows_the_help() -> None:
    p = subprocess.run([sys.executable, "-m", "analyzer", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "Usage:" in p.stdout and "analyze" in p.stdout and "gate" in p.stdout


@pytest.mark.parametrize("script", ["lkm", "llm-kernel-map"])
def test_console_scripts_print_the_version(script: str) -> None:
    exe = BIN / script
    if not exe.exists():
        exe = Path(shutil.which(script) or "")
    if not exe.is_file():
        pytest.skip(f"{script} not installed in this environment (pip install -e .)")
    p = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"llm-kernel-map, version {__version__}"


def test_the_version_is_the_project_version() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["version"] == __version__
    assert meta["project"]["license"] == "Apache-2.0"  # SPDX string, not the deprecated table


def test_click_shell_completion_is_generated() -> None:
    # click's own mechanism: _LKM_COMPLETE=bash_source lkm prints the completion script
    env = {**os.environ, "_LKM_COMPLETE": "bash_source"}
    exe = BIN / "lkm"
    if not exe.exists():
        pytest.skip("lkm not installed in this environment (pip install -e .)")
    p = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "_lkm_completion" in p.stdout and "complete " in p.stdout
