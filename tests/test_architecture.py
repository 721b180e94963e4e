"""The architecture's promises (docs/architecture.md): import layering, a light package root,
analyses that open no file and mutate nothing, and one analysis path for the CLI and the tests."""

from __future__ import annotations

import builtins
import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer import pipeline
from analyzer.cli import cli
from analyzer.options import Options
from analyzer.runtime import driver
from tests.conftest import H200_DENSE, H200_MOE
from tests.runs import load_inputs

ROOT = Path(__file__).resolve().parents[1]


def test_import_layering_holds() -> None:
    # GIVEN the contracts in pyproject.toml [tool.importlinter]
    # WHEN import-linter checks the package
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.exists(), "import-linter is a test dependency (pip install -e '.[test]')"
    p = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    # THEN every contract is kept: no arrow up, no cycle
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_the_package_root_and_the_cli_module_import_nothing_heavy() -> None:
    # the memory settings must be applied before pyarrow loads (mimalloc reads them then)
    code = (
        "import sys, analyzer, analyzer.cli; "
        "print(sorted(m for m in ('pyarrow', 'pandas', 'numpy', 'plotly') if m in sys.modules))"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"


def test_public_names_load_on_use() -> None:
    code = "import analyzer; a = analyzer.analyze; print(a.__module__, analyzer.InputError.exit_code)"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert p.stdout.split() == ["analyzer.api", "2"]


@pytest.mark.parametrize("path", [H200_DENSE, H200_MOE], ids=lambda p: p.parent.name)
def test_analyses_open_no_file_and_mutate_nothing(path: Path, monkeypatch) -> None:
    # GIVEN a loaded trace and its resolved context (the knowledge is read here, once)
    trace = load_inputs([str(path)])
    context = pipeline.resolve_context(Options(model="qwen3-30b-a3b" if path == H200_MOE else None))
    analysis = pipeline.start(trace)

    def no_open(*args, **kwargs):
        raise AssertionError(f"an analysis opened a file: {args[:1]}")

    # WHEN every step runs with open() failing
    monkeypatch.setattr(builtins, "open", no_open)
    monkeypatch.setattr(io, "open", no_open)
    for step in (*pipeline.INPUT_STEPS, *pipeline.RUN_STEPS):
        fields = [f.name for f in dataclasses.fields(analysis) if f.init]
        objects = {f: getattr(analysis, f) for f in fields}
        lists = {f: list(v) for f, v in objects.items() if isinstance(v, list)}
        after = step(analysis, context)
        # THEN it hands back a new analysis and leaves the one it was given as it was
        assert after is not analysis, step.__name__
        assert all(getattr(analysis, f) is objects[f] for f in fields), step.__name__
        assert all(getattr(analysis, f) == v for f, v in lists.items()), step.__name__
        analysis = after
    monkeypatch.undo()
    assert analysis.findings == driver.analyze([str(path)], context).findings


def test_the_cli_takes_the_one_analysis_path(monkeypatch) -> None:
    # GIVEN a spy on runtime.driver.analyze
    seen = []
    real = driver.analyze

    def spy(paths, options=None, policy=None):
        seen.append(list(paths))
        return real(paths, options, policy)

    monkeypatch.setattr(driver, "analyze", spy)
    # WHEN the CLI analyses a trace
    result = CliRunner().invoke(cli, ["analyze", str(H200_DENSE)])
    # THEN it went through it
    assert result.exit_code == 0, result.output
    assert seen == [[str(H200_DENSE)]]
