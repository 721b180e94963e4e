"""The brief's ``--set brief.NAME=VALUE`` settings: names, defaults and ranges (README "Brief")."""

from __future__ import annotations

from collections.abc import Mapping

from analyzer.errors import UsageError, option

PREFIX = "brief."
# name -> (default, low, high): closed ranges, except that a roof target of 0 would divide by zero
SETTINGS: dict[str, tuple[float, float, float]] = {
    "roof_target": (0.8, 0.01, 1.0),  # the share of its roof every kernel is assumed to reach (headroom)
}


def parse(settings: Mapping[str, str]) -> dict[str, float]:
    """The brief's settings with ``--set brief.*`` overrides applied; bad ones raise :class:`UsageError`."""
    out = {name: d for name, (d, _, _) in SETTINGS.items()}
    for key, raw in settings.items():
        if not key.startswith(PREFIX):
            continue
        name = key.removeprefix(PREFIX)
        if name not in SETTINGS:
            known = ", ".join(PREFIX + n for n in SETTINGS)
            raise UsageError(f"{option('set', key)}: unknown setting (known: {known})")
        _, lo, hi = SETTINGS[name]
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{option('set', key)}: {raw!r} is not a number") from None
        if not lo <= value <= hi:
            raise UsageError(f"{option('set', key)}: {raw} is out of range [{lo:g}, {hi:g}]")
        out[name] = value
    return out
