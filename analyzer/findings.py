"""Findings: checks over the analysed tables that turn numbers into advice, with evidence."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analyzer.pipeline import Analysis, Options


def run(analysis: Analysis, options: Options) -> None:
    analysis.findings = []
