"""The ``rules`` command on finding ids, and the ``--set`` examples printed by ``--help``."""

from __future__ import annotations

import re

import pytest

from analyzer.analyses.findings import CHECKS
from analyzer.cli import cli, main
from analyzer.knowledge.finding_settings import load_finding_settings
from tests.conftest import H200_DENSE


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_rules_explain_a_finding_id(capsys) -> None:
    # WHEN a finding id is explained
    code, out, err = run(capsys, "rules", "explain", "F006")
    # THEN it names the check, its severity, what it looks at and its thresholds with --set keys
    assert code == 0, err
    assert out.startswith("F006: finding decode_gpu_idle (severity critical)")
    assert "idle" in out and "decode_gpu_idle.max_idle = 0.2" in out
    assert "--set decode_gpu_idle.max_idle=" in out


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_every_finding_is_explained_by_id_and_by_name(capsys, check) -> None:
    fid = load_finding_settings()[check]["id"]
    code, by_id, _ = run(capsys, "rules", "explain", fid.lower())
    assert code == 0 and check in by_id
    assert len(by_id.splitlines()) >= 3  # the check's docstring is part of it
    code, by_name, _ = run(capsys, "rules", "explain", check)
    assert code == 0 and by_name == by_id


def test_rules_explain_unknown_id_is_a_usage_error(capsys) -> None:
    code, _, err = run(capsys, "rules", "explain", "F999")
    assert code == 2 and "F999" in err


def _help_texts() -> list[str]:
    """The --help text of every command and subcommand."""
    import click

    out = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        ctx = click.Context(cmd, info_name=" ".join(path))
        out.append(cmd.get_help(ctx))
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(cli, ["llm-kernel-map"])
    return out


def test_every_set_example_in_the_help_works(capsys) -> None:
    # GIVEN every `--set KEY=VALUE` example printed by any --help
    examples = {
        m.group(1)
        for text in _help_texts()
        for m in re.finditer(r"--set\s+([a-z_][a-z0-9_.]*=[^\s,;)]+)", " ".join(text.split()))
    }
    examples = {e.rstrip(".") for e in examples}
    assert examples, "no --set example in the help"
    for ex in sorted(examples):
        # THEN each parses as a known setting and a run with it succeeds
        key, value = ex.split("=", 1)
        load_finding_settings({key: value})
        code, _, err = run(capsys, "analyze", H200_DENSE, "--set", ex)
        assert code == 0, f"--set {ex}: {err}"
