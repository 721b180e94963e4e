"""The package version (imports nothing: the CLI's ``--version`` and the package root read it)."""

__version__ = "0.1.0"
