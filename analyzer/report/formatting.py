"""Formatting shared by the reporters: durations, percentages, ratios, kernel names, text tables.

Only helpers whose output is identical in every reporter that uses them live under one name here;
where two reporters format differently (a signed duration in the gate, an end-cut and a middle-cut
kernel name), each variant has its own name. Pure functions of their arguments; no imports of the
package beyond this module's standard library.
"""

from __future__ import annotations

from typing import Any, TextIO

PHASE_ORDER = ("prefill", "decode", "mixed", "unknown")  # display order of the phases in every report


def fmt_ns(ns: float | int | None) -> str:
    """Human duration: 812 ns, 12.3 us, 4.56 ms, 1.23 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_signed_ns(ns: float | int | None) -> str:
    """Human duration with the unit chosen by magnitude, so a decrease reads -4.56 ms (not -4560000 ns)."""
    if ns is None:
        return "-"
    ns = float(ns)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1e3:
        return f"{sign}{ns:.0f} ns"
    if ns < 1e6:
        return f"{sign}{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{sign}{ns / 1e6:.2f} ms"
    return f"{sign}{ns / 1e9:.2f} s"


def fmt_pct(x: float | None) -> str:
    """A fraction 0..1 as a percentage with one decimal: 0.1234 -> 12.3%."""
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt_ratio(x: float | None) -> str:
    """A ratio over the reference input: 1.9 -> 1.90x."""
    return "-" if x is None else f"{x:.2f}x"


def one_line(name: Any) -> str:
    """``name`` as text with every run of whitespace (newlines included) turned into one space."""
    return " ".join(str(name).split())


def shorten(name: Any, width: int) -> str:
    """One line cut at the end to at most ``width`` characters (``...`` marks the cut)."""
    s = one_line(name)
    return s if len(s) <= width else s[: width - 3] + "..."


def shorten_middle(name: Any, width: int) -> str:
    """One line of at most ``width`` characters cut in the middle: a kernel's tile and split-K sit
    at the end of its name, so the last third (at most 30 characters) is kept. ``None`` is empty."""
    s = one_line(name or "")
    if len(s) <= width:
        return s
    tail = min(30, width // 3)
    return s[: width - tail - 3] + "..." + s[-tail:]


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] == "-" and len(cell) > 1)


def write_table(out: TextIO, headers: list[str], rows: list[list[str]], indent: str = "  ") -> None:
    """A plain-text table: columns as wide as their widest cell, numbers (after the first column)
    right-aligned, trailing spaces stripped."""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    line = indent + "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers))
    out.write(line.rstrip() + "\n")
    for r in rows:
        cells = [c.rjust(widths[i]) if i and _numeric(c) else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.write((indent + "  ".join(cells)).rstrip() + "\n")
