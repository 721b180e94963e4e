"""``--compare`` (README.md, "Commands"): summaries of separately analysed inputs set side by side.

Contract: a pure function of summary dicts (``analyzer.results.summary.build_summary``); it reads no trace
and recomputes nothing from kernels. Times stay in integer ns, shares are fractions 0..1, and every
ratio is an input's time over the first input's time (None where the first has none), so "B is
1.9x A" reads ``ratio[1] == 1.9``. A stage an input never ran has time and ratio None there (not 0:
"absent" is not "took no time").

``roles`` matches the inputs' kernels by phase and layer role (each summary's ``brief.roles``:
:mod:`analyzer.analyses.brief.roles`), deterministically: per (phase, role) each input's time, the
stages that played it, its share of its own GPU's roof, and the time ratio; ``paired`` where every
input ran the role.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from analyzer.knowledge.taxonomy import PHASES

FORMAT_VERSION = 1
PHASE_ORDER = PHASES  # display order of the phases
#: top kernel groups kept per compared input
TOP_KERNELS = 5


def compare_summaries(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Set the summaries of N inputs side by side; the first is the reference of every ratio."""
    if not summaries:
        raise ValueError("compare_summaries needs at least one summary")
    labels = input_labels(summaries)
    phases = [p for p in PHASE_ORDER if any(p in (s.get("phases") or {}) for s in summaries)]
    return {
        "format_version": FORMAT_VERSION,
        "kind": "compare",
        "reference": "A",
        "inputs": [
            _input(key, label, s)
            for key, label, s in zip(_keys(len(summaries)), labels, summaries, strict=True)
        ],
        "phases": [_phase_row(p, summaries) for p in phases],
        "categories": _category_rows(phases, summaries),
        "stages": _stage_rows(phases, summaries),
        "roles": _role_rows(summaries),
    }


def _keys(n: int) -> list[str]:
    letters = string.ascii_uppercase
    return [letters[i] if i < len(letters) else f"I{i}" for i in range(n)]


def input_labels(summaries: list[dict[str, Any]]) -> list[str]:
    """Short distinct names: the GPU when that tells the inputs apart, else the first file's name."""
    gpus = [(s.get("gpu") or {}).get("name") or "unknown GPU" for s in summaries]
    if len(set(gpus)) == len(gpus):
        return gpus
    files = [Path(s["inputs"][0]["path"]).name if s.get("inputs") else "?" for s in summaries]
    if len(set(files)) == len(files):
        return [f"{g}, {f}" for g, f in zip(gpus, files, strict=True)]
    return [f"{g}, input {i}" for i, g in enumerate(gpus)]


def _input(key: str, label: str, s: dict[str, Any]) -> dict[str, Any]:
    gpu = s.get("gpu") or {}
    phases = {}
    for p, ph in (s.get("phases") or {}).items():
        phases[p] = {
            "steps": ph.get("steps", 0),
            "kernel_ns": ph.get("kernel_ns", 0),
            "step_p50_ns": (ph.get("step_ns") or {}).get("p50", 0),
            "tokens": ph.get("tokens"),
            "idle_fraction": ph.get("idle_fraction"),
            "shares": {r["category"]: r["share"] for r in ph.get("profile", [])},
        }
    return {
        "key": key,
        "label": label,
        "paths": [i["path"] for i in s.get("inputs", [])],
        "formats": sorted({i["format"] for i in s.get("inputs", [])}),
        "sha256": [i.get("sha256") for i in s.get("inputs", [])],
        "gpu": {
            "name": gpu.get("name"),
            "arch": gpu.get("arch"),
            "peaks": gpu.get("peaks") or {},
            "reason": gpu.get("reason"),
        },  # fmt: skip
        "model": s.get("model"),
        "totals": s.get("totals", {}),
        "phases": phases,
        # what the HTML comparison shows for each input, so the text and the JSON carry it too
        "top_kernels": [_top_row(r) for r in (s.get("top_kernels") or [])[:TOP_KERNELS]],
        "findings": [
            {k: f.get(k) for k in ("id", "severity", "phase", "title", "suggestion")}
            for f in s.get("findings") or []
        ],
    }


def _top_row(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("group_key", "norm_name", "stage", "provider", "phase", "count", "time_ns", "share")
    return {k: r.get(k) for k in keys}


def _ratios(values: list[int | None]) -> list[float | None]:
    """Each value over the first; None where either is missing (a stage one input never ran)."""
    ref = values[0]
    return [v / ref if ref and v is not None else None for v in values]


def _phase_row(phase: str, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    ph = [(s.get("phases") or {}).get(phase) or {} for s in summaries]
    kernel = [int(p.get("kernel_ns", 0)) for p in ph]
    p50 = [int((p.get("step_ns") or {}).get("p50", 0)) for p in ph]
    return {
        "phase": phase,
        "steps": [int(p.get("steps", 0)) for p in ph],
        "kernel_ns": kernel,
        "kernel_ratio": _ratios(kernel),
        "step_p50_ns": p50,
        "step_p50_ratio": _ratios(p50),
    }


def _category_rows(phases: list[str], summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for phase in phases:
        times: dict[str, list[int]] = {}
        labels: dict[str, str] = {}
        for i, s in enumerate(summaries):
            for r in ((s.get("phases") or {}).get(phase) or {}).get("profile", []):
                times.setdefault(r["category"], [0] * len(summaries))[i] += int(r["time_ns"])
                labels[r["category"]] = r.get("label", r["category"])
        totals = [int(((s.get("phases") or {}).get(phase) or {}).get("kernel_ns", 0)) for s in summaries]
        for cat in sorted(times, key=lambda c: (-max(times[c]), c)):
            t = times[cat]
            rows.append({"phase": phase, "category": cat, "label": labels[cat], "time_ns": t,
                         "share": [v / tot if tot else 0.0 for v, tot in zip(t, totals, strict=True)],
                         "ratio": _ratios(t)})  # fmt: skip
    return rows


def _stage_rows(phases: list[str], summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stage time per input with the providers that ran it (they differ across vendors)."""
    n = len(summaries)
    rows = []
    for phase in phases:
        times: dict[str, list[int]] = {}
        provs: dict[str, list[set[str]]] = {}
        cats: dict[str, str] = {}
        for i, s in enumerate(summaries):
            for r in s.get("stages", []):
                if r["phase"] != phase:
                    continue
                t = times.setdefault(r["stage"], [None] * n)
                t[i] = (t[i] or 0) + int(r["time_ns"])
                provs.setdefault(r["stage"], [set() for _ in range(n)])[i].add(r["provider"])
                cats[r["stage"]] = r.get("category", "")
        for stage in sorted(times, key=lambda st: (-max(v or 0 for v in times[st]), st)):
            rows.append({"phase": phase, "stage": stage, "category": cats[stage], "time_ns": times[stage],
                         "ratio": _ratios(times[stage]), "providers": [sorted(p) for p in provs[stage]]})  # fmt: skip
    return rows


def _role_rows(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (phase, layer role) of any input: each input's time (None: it never ran the role),
    kernels, stages and share of its roof; the ratios over the first; whether every input ran it."""
    n = len(summaries)
    got: dict[tuple[str, str], list[dict[str, Any] | None]] = {}
    missing = []
    for i, s in enumerate(summaries):
        item = (s.get("brief") or {}).get("roles") or {}
        if item.get("value") is None:
            missing.append(f"input {_keys(n)[i]}: {item.get('unknown') or 'no roles in its summary'}")
            continue
        for r in item["value"]["rows"]:
            got.setdefault((r["phase"], r["role"]), [None] * n)[i] = r
    order = {p: k for k, p in enumerate(PHASE_ORDER)}
    rows = []
    for (phase, role), per in sorted(
        got.items(),
        key=lambda kv: (
            order.get(kv[0][0], len(order)),
            -max(r["time_ns"] if r else 0 for r in kv[1]),
            kv[0][1],
        ),
    ):
        time = [r["time_ns"] if r else None for r in per]
        rows.append(
            {
                "phase": phase,
                "role": role,
                "time_ns": time,
                "ratio": _ratios(time),
                "kernels": [r["kernels"] if r else None for r in per],
                "stages": [r["stages"] if r else None for r in per],
                "pct_of_peak": [r["pct_of_peak"] if r else None for r in per],
                "paired": all(r is not None for r in per),
            }
        )
    out: dict[str, Any] = {"rows": rows}
    if missing:
        out["unknown"] = "; ".join(missing)
    return out
