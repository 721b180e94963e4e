"""How much work a host op does from its recorded shapes (``rules/work_ops.toml``): read, validated, compiled once.

Contract (the file's header is the spec):

* ``[[gemm]]`` entries, tried in file order, match an op by exact name and the recorded ranks of its
  two operands; :meth:`WorkOps.gemm` reads a matching op's :class:`GemmDims` (batch, M, K, N and the
  weight groups of a grouped product). Dimension expressions (``a[0]``, ``b[-1]``, ``a[:-1]``, an
  integer, any of them ``*<int>``) are parsed here, at load time.
* A ``[[gemm]]`` entry's ``peak`` names the dtype whose compute peak bounds it where that is not the
  activation's (:attr:`GemmOp.peak`); ``[[kernel_dtype]]`` entries read that dtype from a GEMM kernel's
  name (:meth:`WorkOps.kernel_dtype`) for kernels counted without shapes.
* ``[[gather]]`` entries say which input is the table and how the selected elements are counted;
  ``[[reduce]]`` and ``[[unsized]]`` list ops by name (an ATen private spelling such as
  ``aten::_index_put_impl_`` is looked up as its public name, :func:`base_op`).
* Every entry has an id (``WRK###``), a note, a source and at least one case; :func:`case_errors`
  is what the test runs on them (the formulas themselves live in ``analyzer/analyses/roofline/formulas.py``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analyzer.knowledge import hardware, loader
from analyzer.knowledge.patterns import redos_problem
from analyzer.paths import RULES_DIR
from analyzer.tables.shapes import input_shape

__all__ = [
    "WORK_OPS_TOML",
    "GatherOp",
    "GemmDims",
    "GemmOp",
    "KernelDtype",
    "WorkOps",
    "base_op",
    "load_work_ops",
]

WORK_OPS_TOML = RULES_DIR / "work_ops.toml"
_ID = re.compile(r"^WRK\d{3}$")
_SECTIONS = ("gemm", "gather", "reduce", "unsized", "copy", "kernel_dtype")
_EXPR = re.compile(
    r"^(?:(?P<t>[ab])\[(?P<lo>-?\d+)?(?P<colon>:)?(?P<hi>-?\d+)?\]|(?P<int>\d+))(?:\*(?P<mul>\d+))?$"
)
_COMMON = {"id", "names", "note", "source", "cases"}
_KEYS = {
    "gemm": _COMMON | {"a", "b", "ranks", "batch", "m", "k", "n", "groups", "out_bytes", "grouped", "peak"},
    "gather": _COMMON | {"table", "select", "index"},
    "reduce": _COMMON,
    "unsized": _COMMON,
    "copy": (_COMMON - {"names"}) | {"pattern", "moved"},
    "kernel_dtype": (_COMMON - {"names"}) | {"pattern", "dtype"},
}
_CASE_KEYS = {"dims", "types", "flops", "bytes", "trace", "consumer", "op", "roof"}
_COPY_CASE_KEYS = {"name", "recorded", "bytes", "trace"}
_DTYPE_CASE_KEYS = {"name", "dtype", "trace"}
SELECTS = ("rows", "elements", "consumer")


def base_op(name: str) -> str:
    """An ATen op without its private spelling: ``aten::_index_put_impl_`` -> ``aten::index_put_``."""
    if not name.startswith("aten::_"):
        return name
    base = "aten::" + name[len("aten::") :].lstrip("_")
    return base.replace("_impl_", "_").removesuffix("_impl")


@dataclasses.dataclass(frozen=True)
class Dim:
    """One dimension expression: a literal, or the product of a slice (or one element) of an operand's
    shape, times ``mul``."""

    text: str
    tensor: str | None  # "a" | "b" | None (a literal)
    lo: int | None = None
    hi: int | None = None
    single: bool = True
    value: int = 1
    mul: int = 1

    def __call__(self, a: Sequence[int], b: Sequence[int]) -> int:
        if self.tensor is None:
            return self.value * self.mul
        shape = a if self.tensor == "a" else b
        if self.single:
            return int(shape[self.lo or 0]) * self.mul
        return int(math.prod(shape[self.lo : self.hi])) * self.mul


def _dim(text: Any) -> Dim | None:
    if not isinstance(text, str):
        return None
    m = _EXPR.match(text.replace(" ", ""))
    if m is None:
        return None
    mul = int(m["mul"]) if m["mul"] else 1
    if m["int"] is not None:
        return Dim(text, None, value=int(m["int"]), mul=mul)
    lo = int(m["lo"]) if m["lo"] else None
    hi = int(m["hi"]) if m["hi"] else None
    if not m["colon"] and (lo is None or hi is not None):
        return None  # "a[]" or "a[1-2]": one index, or a slice with a colon
    return Dim(text, m["t"], lo, hi, single=not m["colon"], mul=mul)


@dataclasses.dataclass(frozen=True)
class GemmDims:
    """The product ``batch`` x (M x K) @ (K x N); ``groups``: the weight matrices of a grouped product."""

    batch: int
    m: int
    k: int
    n: int
    groups: int | None = None

    @property
    def rows(self) -> int:
        """Rows of the activation (batch x M)."""
        return self.batch * self.m


@dataclasses.dataclass(frozen=True)
class GemmOp:
    id: str
    names: tuple[str, ...]
    a: int
    b: int
    ranks: tuple[tuple[int, int], ...]  # empty: any
    batch: Dim
    m: Dim
    k: Dim
    n: Dim
    groups: Dim | None
    out_bytes: float | None
    grouped: bool
    peak: str | None  # the dtype whose compute peak bounds it (None: the activation's)
    note: str
    source: str
    cases: tuple[dict[str, Any], ...]

    def read(self, dims: Sequence[Sequence[int] | None]) -> GemmDims | None:
        """The product's dimensions from an op's recorded shapes; None when they do not fit."""
        a, b = input_shape(dims, self.a), input_shape(dims, self.b)
        if not a or not b or (self.ranks and (len(a), len(b)) not in self.ranks):
            return None
        try:
            got = GemmDims(
                self.batch(a, b),
                self.m(a, b),
                self.k(a, b),
                self.n(a, b),
                self.groups(a, b) if self.groups is not None else None,
            )
        except (IndexError, TypeError):
            return None
        return got if min(got.batch, got.m, got.k, got.n) > 0 else None


@dataclasses.dataclass(frozen=True)
class GatherOp:
    id: str
    names: tuple[str, ...]
    table: int
    select: str  # one of SELECTS
    index: int | None
    note: str
    source: str
    cases: tuple[dict[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class ListedOps:
    """A ``[[reduce]]`` or ``[[unsized]]`` entry."""

    id: str
    kind: str
    names: tuple[str, ...]
    note: str
    source: str
    cases: tuple[dict[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class CopyRule:
    """A ``[[copy]]`` entry: memcpy / memset activities whose name matches ``pattern`` move ``moved``
    bytes of device memory per byte the trace records for them."""

    id: str
    pattern: re.Pattern[str]
    moved: float
    note: str
    source: str
    cases: tuple[dict[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class KernelDtype:
    """A ``[[kernel_dtype]]`` entry: GEMM kernels whose name matches ``pattern`` compute in ``dtype``."""

    id: str
    pattern: re.Pattern[str]
    dtype: str
    note: str
    source: str
    cases: tuple[dict[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class WorkOps:
    """The table: GEMMs by name (each name's entries in file order), gathers, reductions, unsized ops."""

    gemms: tuple[GemmOp, ...]
    gathers: tuple[GatherOp, ...]
    listed: tuple[ListedOps, ...]
    copies: tuple[CopyRule, ...]
    kernel_dtypes: tuple[KernelDtype, ...]
    _gemm_by_name: dict[str, tuple[GemmOp, ...]]
    _gather_by_name: dict[str, GatherOp]
    _kind_by_name: dict[str, str]

    def gemm(
        self, name: str | None, dims: Sequence[Sequence[int] | None] | None
    ) -> tuple[GemmOp, GemmDims] | None:
        """The first GEMM entry of ``name`` that reads ``dims``, with what it read; None otherwise."""
        if not name or not dims:
            return None
        for op in self._gemm_by_name.get(name, ()):
            got = op.read(dims)
            if got is not None:
                return op, got
        return None

    def is_gemm(self, name: str | None) -> bool:
        return bool(name) and name in self._gemm_by_name

    def dense_shape(
        self, name: str | None, dims: Sequence[Sequence[int] | None] | None
    ) -> tuple[int, int] | None:
        """(K, N) of a dense (not grouped) GEMM op: the weight shape that names its role."""
        got = self.gemm(name, dims)
        if got is None or got[0].grouped:
            return None
        return got[1].k, got[1].n

    def rows(self, name: str | None, dims: Sequence[Sequence[int] | None] | None) -> int:
        """Rows (batch x M) of a GEMM op's activation; -1 when the shapes do not say."""
        got = self.gemm(name, dims)
        return got[1].rows if got is not None else -1

    def gather(self, name: str | None) -> GatherOp | None:
        return self._gather_by_name.get(name or "")

    def kind(self, name: str) -> str | None:
        """``reduce`` or ``unsized`` for a listed op (its ATen private spelling included), else None."""
        hit = self._kind_by_name.get(name)
        return hit if hit is not None else self._kind_by_name.get(base_op(name))

    def moved(self, activity_name: str) -> float | None:
        """Device bytes a memcpy / memset moves per recorded byte (first matching ``[[copy]]``)."""
        return next((c.moved for c in self.copies if c.pattern.search(activity_name)), None)

    def kernel_dtype(self, kernel_name: str) -> str | None:
        """The dtype a GEMM kernel computes in, as its name says (first matching ``[[kernel_dtype]]``)."""
        return next((d.dtype for d in self.kernel_dtypes if d.pattern.search(kernel_name)), None)

    def entries(self) -> tuple[Any, ...]:
        """Every entry in file order of its section (gemm, gather, reduce, unsized, copy, kernel_dtype)."""
        return (*self.gemms, *self.gathers, *self.listed, *self.copies, *self.kernel_dtypes)


def load_work_ops(path: str | Path = WORK_OPS_TOML) -> WorkOps:
    """The validated table of ``path`` (shared between callers: read it only)."""
    return loader.load(path, _parse)


def _parse(doc: dict[str, Any], path: Path) -> WorkOps:
    unknown = sorted(set(doc) - {*_SECTIONS, "schema_version"})
    if unknown:
        raise loader.fail(
            path, unknown[0], f"unknown top-level key (work_ops.toml has {', '.join(_SECTIONS)})"
        )
    seen: set[str] = set()
    gemms: list[GemmOp] = []
    gathers: list[GatherOp] = []
    listed: list[ListedOps] = []
    copies: list[CopyRule] = []
    kernel_dtypes: list[KernelDtype] = []
    gemm_names: dict[str, list[GemmOp]] = {}
    owner: dict[str, str] = {}
    for section in _SECTIONS:
        entries = doc.get(section, [])
        if not isinstance(entries, list):
            raise loader.fail(path, section, f"must be [[{section}]] tables")
        for i, e in enumerate(entries):
            oid = e.get("id") if isinstance(e, dict) else None
            where = f"{section} {oid}" if isinstance(oid, str) else f"{section} #{i + 1}"

            def fail(msg: str, where: str = where) -> Exception:
                return loader.fail(path, where, msg)

            cases = _checked_entry(e, section, oid, seen, fail)
            if section == "copy":
                copies.append(_copy_entry(e, oid, cases, fail))
                continue
            if section == "kernel_dtype":
                kernel_dtypes.append(_kernel_dtype_entry(e, oid, cases, fail))
                continue
            names = e.get("names")
            if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
                raise fail("names must be a non-empty list of host-op names")
            common = {
                "id": oid,
                "names": tuple(names),
                "note": e["note"],
                "source": e["source"],
                "cases": tuple(cases),
            }
            if section == "gemm":
                op = _gemm_entry(e, common, fail)
                gemms.append(op)
                _claim(names, section, owner, fail)
                for n in names:
                    gemm_names.setdefault(n, []).append(op)
                continue
            _claim(names, section, owner, fail)
            if section == "gather":
                gathers.append(_gather_entry(e, common, fail))
            else:
                listed.append(ListedOps(kind=section, **common))
    return WorkOps(
        gemms=tuple(gemms),
        gathers=tuple(gathers),
        listed=tuple(listed),
        copies=tuple(copies),
        kernel_dtypes=tuple(kernel_dtypes),
        _gemm_by_name={n: tuple(v) for n, v in gemm_names.items()},
        _gather_by_name={n: g for g in gathers for n in g.names},
        _kind_by_name={n: x.kind for x in listed for n in x.names},
    )


def _checked_entry(e: Any, section: str, oid: Any, seen: set[str], fail: Any) -> list[Any]:
    """Check what every entry of ``section`` has (a table of its keys, a distinct ``WRK###`` id,
    ``seen`` gets it, a note, a source and cases of the section's keys); returns its cases."""
    if not isinstance(e, dict):
        raise fail("must be a table")
    bad = sorted(set(e) - _KEYS[section])
    if bad:
        raise fail(f"unknown key(s) {', '.join(bad)}")
    if not isinstance(oid, str) or not _ID.match(oid) or oid in seen:
        raise fail("id must be a distinct WRK###")
    seen.add(oid)
    for k in ("note", "source"):
        if not isinstance(e.get(k), str) or not e[k].strip():
            raise fail(f"{k} must be a non-empty string")
    cases = e.get("cases")
    if not isinstance(cases, list) or not cases:
        raise fail("needs at least one case")
    need, allowed = {
        "copy": ("name", _COPY_CASE_KEYS),
        "kernel_dtype": ("name", _DTYPE_CASE_KEYS),
    }.get(section, ("dims", _CASE_KEYS))
    for c in cases:
        if not isinstance(c, dict) or need not in c or "trace" not in c:
            raise fail(f"a case is a table with {need} and trace")
        if set(c) - allowed:
            raise fail(f"unknown case key(s) {', '.join(sorted(set(c) - allowed))}")
    return cases


def _claim(names: list[str], section: str, owner: dict[str, str], fail: Any) -> None:
    """Record ``section`` as the owner of host-op ``names`` (``owner``): a name may head several
    ``[[gemm]]`` entries, but belongs to one section, and outside ``gemm`` to one entry."""
    for n in names:
        if section == "gemm":
            if owner.get(n, "gemm") != "gemm":
                raise fail(f"{n!r} is already listed under {owner[n]!r}")
        elif n in owner:
            raise fail(f"{n!r} is already listed ({owner[n]})")
        owner[n] = section


def _index(e: dict[str, Any], key: str, fail: Any, required: bool = True) -> int | None:
    v = e.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise fail(f"{key} must be an input index (a non-negative integer)")
    return v


def _gemm_entry(e: dict[str, Any], common: dict[str, Any], fail: Any) -> GemmOp:
    a, b = _index(e, "a", fail), _index(e, "b", fail)
    ranks_raw = e.get("ranks", [])
    if not isinstance(ranks_raw, list) or not all(
        isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and x >= 1 for x in r)
        for r in ranks_raw
    ):
        raise fail("ranks must be a list of [rank of a, rank of b] pairs")
    dims: dict[str, Dim | None] = {}
    for key in ("batch", "m", "k", "n", "groups"):
        if key not in e:
            if key in ("m", "k", "n"):
                raise fail(f"missing key {key}")
            dims[key] = _dim("1") if key == "batch" else None
            continue
        d = _dim(e[key])
        if d is None:
            raise fail(f"{key} = {e[key]!r} is no dimension expression (a[0], b[-1], a[:-1], 8, b[0]*8)")
        dims[key] = d
    out_bytes = e.get("out_bytes")
    if out_bytes is not None and (
        not isinstance(out_bytes, int | float) or isinstance(out_bytes, bool) or out_bytes <= 0
    ):
        raise fail("out_bytes must be a positive number")
    grouped = e.get("grouped", False)
    if not isinstance(grouped, bool):
        raise fail("grouped must be true or false")
    peak = e.get("peak")
    if peak is not None and peak not in hardware.DTYPES:
        raise fail(f"peak must be one of {', '.join(hardware.DTYPES)}")
    for c in common["cases"]:
        if "roof" in c and c["roof"] not in hardware.DTYPES:
            raise fail(f"a case's roof must be one of {', '.join(hardware.DTYPES)}")
    assert (
        dims["batch"] is not None
        and dims["m"] is not None
        and dims["k"] is not None
        and dims["n"] is not None
    )
    return GemmOp(
        a=a,  # type: ignore[arg-type]
        b=b,  # type: ignore[arg-type]
        ranks=tuple((int(r[0]), int(r[1])) for r in ranks_raw),
        batch=dims["batch"],
        m=dims["m"],
        k=dims["k"],
        n=dims["n"],
        groups=dims["groups"],
        out_bytes=float(out_bytes) if out_bytes is not None else None,
        grouped=grouped,
        peak=peak,
        **common,
    )


def _gather_entry(e: dict[str, Any], common: dict[str, Any], fail: Any) -> GatherOp:
    table = _index(e, "table", fail)
    select = e.get("select")
    if select not in SELECTS:
        raise fail(f"select must be one of {', '.join(SELECTS)}")
    index = _index(e, "index", fail, required=select != "consumer")
    if select == "consumer" and index is not None:
        raise fail("select = 'consumer' takes no index (the row ids are not recorded)")
    return GatherOp(table=table, select=select, index=index, **common)  # type: ignore[arg-type]


def _copy_entry(e: dict[str, Any], oid: str, cases: list[Any], fail: Any) -> CopyRule:
    pat, moved = e.get("pattern"), e.get("moved")
    if not isinstance(pat, str) or not pat:
        raise fail("pattern must be a non-empty string")
    if problem := redos_problem(pat):
        raise fail(f"pattern rejected: {problem}")
    if not isinstance(moved, int | float) or isinstance(moved, bool) or moved <= 0:
        raise fail("moved must be a positive number")
    return CopyRule(oid, re.compile(pat), float(moved), e["note"], e["source"], tuple(cases))


def _kernel_dtype_entry(e: dict[str, Any], oid: str, cases: list[Any], fail: Any) -> KernelDtype:
    pat, dtype = e.get("pattern"), e.get("dtype")
    if not isinstance(pat, str) or not pat:
        raise fail("pattern must be a non-empty string")
    if problem := redos_problem(pat):
        raise fail(f"pattern rejected: {problem}")
    if dtype not in hardware.DTYPES:
        raise fail(f"dtype must be one of {', '.join(hardware.DTYPES)}")
    for c in cases:
        if "dtype" in c and c["dtype"] not in hardware.DTYPES:
            raise fail(f"a case's dtype must be one of {', '.join(hardware.DTYPES)}")
    return KernelDtype(oid, re.compile(pat), str(dtype), e["note"], e["source"], tuple(cases))
