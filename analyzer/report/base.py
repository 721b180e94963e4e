"""The reporter protocol, and the registry that picks a reporter by name or by output-file extension.

Contract every reporter keeps: it is built with its options (``top``, ``cdn``, the kernels table a
figure draws ...), ``render(data, stream)`` writes one whole document for ``data`` to ``stream`` and
returns nothing. A reporter never opens, names or removes a file, never reads a trace and computes no
analysis numbers: the caller opens the destination (``analyzer.output.write_report`` removes a
half-written file on error) and hands over a text stream, or a binary one where ``binary`` is true.

A :class:`Registry` lists the reporters of one kind of document (a summary, a comparison, a gate
result, the kernels table) by name, in a fixed order, and names each reporter's class as a string,
so that looking a reporter up imports nothing heavy until it is created.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, overload, runtime_checkable

from analyzer.errors import UsageError


@runtime_checkable
class Reporter(Protocol):
    """Writes one output format. ``extensions`` are the file endings that ask for it (lower case)."""

    name: ClassVar[str]
    extensions: ClassVar[tuple[str, ...]]
    binary: ClassVar[bool]

    def render(self, data: Any, stream: Any) -> None:
        """Write the whole document for ``data`` to ``stream``: a text stream (``TextIO``), or a
        binary one (``IO[bytes]``) where ``binary`` is true."""
        ...


@dataclass(frozen=True)
class ReporterSpec:
    """A registry entry: what a reporter answers to, and where its class lives (``module:Class``)."""

    name: str
    extensions: tuple[str, ...]
    binary: bool
    target: str

    def load(self) -> type[Reporter]:
        """Import the reporter's module and return its class."""
        module, _, attr = self.target.partition(":")
        cls: type[Reporter] = getattr(importlib.import_module(module), attr)
        return cls

    def create(self, **options: Any) -> Reporter:
        """A reporter built with ``options``."""
        return self.load()(**options)


class Registry:
    """The reporters of one kind of document, in order: looked up by name or by a path's extension."""

    def __init__(self, subject: str, *specs: ReporterSpec) -> None:
        self.subject = subject
        self._specs = {s.name: s for s in specs}

    def __iter__(self) -> Iterator[ReporterSpec]:
        return iter(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._specs)

    @property
    def extensions(self) -> tuple[str, ...]:
        return tuple(e for s in self for e in s.extensions)

    def get(self, name: str) -> ReporterSpec:
        """The reporter called ``name``; a :class:`UsageError` naming the choices when there is none."""
        try:
            return self._specs[name]
        except KeyError:
            raise UsageError(f"no {self.subject} format {name!r} (one of {', '.join(self.names)})") from None

    @overload
    def for_path(self, path: str, default: None = None) -> ReporterSpec | None: ...
    @overload
    def for_path(self, path: str, default: str) -> ReporterSpec: ...

    def for_path(self, path: str, default: str | None = None) -> ReporterSpec | None:
        """The reporter whose extension ``path`` ends in (case-insensitive, first in order), else the
        one called ``default`` (None when ``default`` is None)."""
        low = str(path).lower()
        for s in self:
            if low.endswith(s.extensions):
                return s
        return None if default is None else self.get(default)

    def create(self, name: str, **options: Any) -> Reporter:
        """The reporter called ``name``, built with ``options``."""
        return self.get(name).create(**options)
