"""Reading the knowledge files (``rules/*.toml`` and user rule files): read, parse, validate, cache.

Contract:

* Every knowledge module reads its TOML file through :func:`load` (one file) or :func:`load_files`
  (several files that make one value, as the kernel rules with their taxonomy and user files). Nothing
  else in the package opens a ``rules/*.toml``.
* The result of a validator is memoised by the files' bytes (and the validator): the same bytes are
  parsed and checked once per process, a file changed since is read again. Every call still reads the
  bytes (the files are small), so the memo can never serve a stale value. Values are shared between
  callers: validators build immutable values, or callers copy what they change.
* One error style: :class:`analyzer.errors.InputError` with one line ``<file>: <key>: <message>``,
  ``<file>`` being ``rules/<name>`` for a built-in file and the path as given for a user's file
  (``rules/ops.toml: stages.foo: unknown stage 'foo'``); a file that cannot be read or is not TOML
  gives ``<file>: cannot read: ...``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from analyzer.errors import InputError
from analyzer.paths import RULES_DIR

__all__ = ["display", "fail", "load", "load_files", "parse_toml", "read_bytes"]

T = TypeVar("T")

# how many distinct (validator, contents) results are kept: a run loads a handful of files, tests a
# few more (user rule files in tmp_path)
_MEMO_SIZE = 32
_MEMO: dict[tuple[Any, ...], Any] = {}


def display(path: str | Path) -> str:
    """How errors name a file: ``rules/<name>`` for a built-in file, the path as given otherwise."""
    p = Path(path)
    try:
        if p.resolve().parent == RULES_DIR.resolve():
            return f"rules/{p.name}"
    except OSError:  # pragma: no cover - unresolvable path: name it as given
        pass
    return str(path)


def fail(path: str | Path, key: str, message: str) -> InputError:
    """The one-line error for a bad value at ``key`` (a dotted TOML key, ``rule ATT001`` ...) of ``path``."""
    return InputError(f"{display(path)}: {key}: {message}" if key else f"{display(path)}: {message}")


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes; InputError naming the file when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{display(path)}: cannot read: {e.strerror or e}") from None


def parse_toml(path: str | Path, raw: bytes) -> dict[str, Any]:
    """``raw`` (the bytes of ``path``) as a TOML document; InputError naming the file otherwise."""
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{display(path)}: cannot read: invalid TOML: {' '.join(str(e).split())}") from None


def _remember(key: tuple[Any, ...], build: Callable[[], T]) -> T:
    if key in _MEMO:
        return _MEMO[key]  # type: ignore[no-any-return]
    value = _MEMO[key] = build()
    while len(_MEMO) > _MEMO_SIZE:
        del _MEMO[next(iter(_MEMO))]
    return value


def load(path: str | Path, validate: Callable[[dict[str, Any], Path], T]) -> T:
    """``validate(document, path)`` of the TOML file ``path``, memoised by its bytes.

    ``validate`` raises :func:`fail` errors for bad content and returns the value callers use."""
    p = Path(path)
    raw = read_bytes(p)
    return _remember((validate, str(p), raw), lambda: validate(parse_toml(p, raw), p))


def load_files(paths: Sequence[str | Path], build: Callable[[list[tuple[Path, bytes]]], T]) -> T:
    """``build([(path, bytes), ...])`` of several files that make one value, memoised by all their bytes.

    ``build`` gets the bytes the memo is keyed by (so a file changed since cannot slip in under the old
    key) and parses them with :func:`parse_toml`."""
    contents = [(Path(p), read_bytes(p)) for p in paths]
    key = (build, *((str(p), raw) for p, raw in contents))
    return _remember(key, lambda: build(contents))
