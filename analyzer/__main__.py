"""``python -m analyzer`` runs the CLI."""

from analyzer.cli import entry

entry()
