"""Baseline vs candidate -> pass / regressions (docs/gate.md): pure functions over two baseline objects.

Contract: :func:`compare` takes two objects built by :func:`analyzer.results.baseline.build_baseline` (the
saved baseline and the candidate run) and :class:`Thresholds`, and returns a JSON-ready result
dict; it never reads or writes anything. Runs that cannot be compared (another GPU, another model
shape, other tokens or batch per step, too few steps) raise :class:`NotComparableError`: one line
naming every reason, exit status 2.

What is compared, per phase that has enough steps in both runs: the phase's step time (the p50
and p90 of its steps' wall durations: what users feel, host gaps included), the phase's kernel time
per step, each stage of the phase (``rules/taxonomy.toml``) and each kernel group (``group_key``) in the
baseline's top groups or above the floor in the candidate. Kernel values are per-step medians (or
per-step means for work that runs in fewer than half of the steps, on either side). A row
*regresses* when

    candidate > baseline * (1 + threshold)   and   candidate - baseline > min_delta

with ``step_threshold`` in place of ``threshold`` for the step-time rows (a baseline written
before step times were kept gates kernel time only, with a note)

and *improves* in the mirror case. A stage or kernel group present in only one run is ``new`` or
``vanished``; a new stage above the floor fails the gate, a new kernel group is listed (its time
already counts toward its stage, which decides). Regressed phases, step times, stages and kernel
groups fail.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from analyzer.errors import InputError, UsageError
from analyzer.knowledge.taxonomy import PHASES
from analyzer.results.baseline import group_hash

RESULT_FORMAT_VERSION = 1
RESULT_KIND = "llm-kernel-map/gate-result"
DEFAULT_THRESHOLD = 0.10
# step wall time carries host jitter that kernel time does not: its own, looser default
DEFAULT_STEP_THRESHOLD = 0.20
STEP_STATS = ("p50", "p90")
DEFAULT_MIN_DELTA_NS = 5_000
DEFAULT_MIN_STEPS = 3
# tokens (and batch) per step may differ this much before two runs stop being comparable
SHAPE_TOLERANCE = 0.10
# kernel groups named per stage row ("the kernels responsible")
KERNELS_PER_STAGE = 5
CONFIG_KEYS = (
    "threshold",
    "step_threshold",
    "min_delta_us",
    "min_steps",
    "allow_few_steps",
    "stage_thresholds",
)
LEVELS = ("phase", "step", "stage", "kernel")


class NotComparableError(InputError):
    """The two runs measure different things; comparing their times would mean nothing."""


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When a change counts; ``overrides`` are (pattern, relative threshold), first match wins.

    A pattern names a phase (``decode``), a stage (``decode.paged_attention``) or a kernel group
    (``decode.paged_attention/<group_key glob>``); ``*`` and ``?`` are wildcards. The most specific
    level that matches a row decides: kernel group, then stage, then phase, then ``threshold``.
    ``step_threshold`` is the step-time rows' (p50 and p90 of a phase's step durations).
    """

    threshold: float = DEFAULT_THRESHOLD
    step_threshold: float = DEFAULT_STEP_THRESHOLD
    min_delta_ns: int = DEFAULT_MIN_DELTA_NS
    min_steps: int = DEFAULT_MIN_STEPS
    allow_few_steps: bool = False
    overrides: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise UsageError(f"threshold must be >= 0, got {self.threshold}")
        if self.step_threshold < 0:
            raise UsageError(f"step threshold must be >= 0, got {self.step_threshold}")
        if self.min_delta_ns < 0:
            raise UsageError(f"min delta must be >= 0, got {self.min_delta_ns} ns")
        if self.min_steps < 1:
            raise UsageError(f"min steps must be >= 1, got {self.min_steps}")
        for key, value in self.overrides:
            _check_pattern(key)
            if value < 0:
                raise UsageError(f"stage threshold {key}={value}: must be >= 0")

    def for_row(
        self, phase: str, stage: str | None = None, group_key: str | None = None
    ) -> tuple[float, str | None]:
        """The relative threshold of a row and the override pattern that set it (None: default)."""
        levels: list[tuple[str, str | None]] = []
        if group_key is not None and stage is not None:
            levels.append(("group", f"{phase}.{stage}/{group_key}"))
        if stage is not None:
            levels.append(("stage", f"{phase}.{stage}"))
        levels.append(("phase", phase))
        for level, subject in levels:
            hits = [
                (k, v) for k, v in self.overrides if _level(k) == level and fnmatch.fnmatchcase(subject, k)
            ]
            if hits:
                exact = [h for h in hits if h[0] == subject]
                key, value = (exact or hits)[0]
                return value, key
        return self.threshold, None


def _level(pattern: str) -> str:
    if "/" in pattern:
        return "group"
    return "stage" if "." in pattern else "phase"


def _check_pattern(key: str) -> None:
    head = key.split("/", 1)[0]
    phase = head.split(".", 1)[0]
    if not key or not phase or (not any(c in phase for c in "*?[") and phase not in PHASES):
        raise UsageError(
            f"stage threshold {key!r}: expected PHASE[.STAGE[/KERNEL]] with PHASE one of "
            f"{', '.join(PHASES)} (wildcards * ? allowed)"
        )
    if "/" in key and "." not in head:
        raise UsageError(f"stage threshold {key!r}: a kernel pattern needs PHASE.STAGE/ before it")


def parse_fraction(text: str | float, what: str) -> float:
    """0.05, '0.05' or '5%' -> 0.05; UsageError otherwise."""
    if isinstance(text, bool):
        raise UsageError(f"{what}: expected a number, got {text!r}")
    if isinstance(text, int | float):
        return float(text)
    s = str(text).strip()
    try:
        return float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise UsageError(f"{what}: expected a fraction such as 0.05 or 5%, got {text!r}") from None


def parse_override(text: str) -> tuple[str, float]:
    """``decode.paged_attention=0.05`` -> ('decode.paged_attention', 0.05)."""
    if "=" not in text:
        raise UsageError(f"--stage-threshold expects PHASE.STAGE=REL, got {text!r}")
    key, value = text.rsplit("=", 1)
    key = key.strip()
    return key, parse_fraction(value, f"--stage-threshold {key}")


def make_thresholds(
    config: Mapping[str, Any] | None = None,
    *,
    threshold: float | None = None,
    step_threshold: float | None = None,
    min_delta_us: float | None = None,
    min_steps: int | None = None,
    allow_few_steps: bool | None = None,
    stage_thresholds: Iterable[str] = (),
    source: str = "[tool.llm-kernel-map.gate]",
) -> Thresholds:
    """Thresholds from a config table (pyproject) overlaid with command-line values (they win)."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise UsageError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(CONFIG_KEYS)})")
    cli_over = [parse_override(s) for s in stage_thresholds]
    conf_over = config.get("stage_thresholds", {})
    if not isinstance(conf_over, Mapping):
        raise UsageError(
            f'{source}: stage_thresholds must be a table such as {{"decode.paged_attention" = 0.05}}'
        )
    given = {k for k, _ in cli_over}
    overrides = cli_over + [
        (str(k), parse_fraction(v, f"{source} stage_thresholds {k}"))
        for k, v in conf_over.items()
        if k not in given
    ]

    def pick(cli: Any, key: str, default: Any) -> Any:
        return cli if cli is not None else config.get(key, default)

    rel = parse_fraction(pick(threshold, "threshold", DEFAULT_THRESHOLD), f"{source} threshold")
    step_rel = parse_fraction(
        pick(step_threshold, "step_threshold", DEFAULT_STEP_THRESHOLD), f"{source} step_threshold"
    )
    floor_us = pick(min_delta_us, "min_delta_us", DEFAULT_MIN_DELTA_NS / 1e3)
    steps = pick(min_steps, "min_steps", DEFAULT_MIN_STEPS)
    few = pick(allow_few_steps, "allow_few_steps", False)
    if not isinstance(floor_us, int | float) or isinstance(floor_us, bool):
        raise UsageError(f"{source}: min_delta_us must be a number, got {floor_us!r}")
    if not isinstance(steps, int) or isinstance(steps, bool):
        raise UsageError(f"{source}: min_steps must be an integer, got {steps!r}")
    if not isinstance(few, bool):
        raise UsageError(f"{source}: allow_few_steps must be true or false, got {few!r}")
    return Thresholds(
        threshold=rel,
        step_threshold=step_rel,
        min_delta_ns=int(round(floor_us * 1e3)),
        min_steps=steps,
        allow_few_steps=few,
        overrides=tuple(overrides),
    )


# --------------------------------------------------------------------------------- comparability


def comparability_problems(baseline: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """Why the two runs measure different things (empty when they are comparable)."""
    b, c = baseline["comparability"], candidate["comparability"]
    problems = []
    bg, cg = b.get("gpu") or {}, c.get("gpu") or {}
    if bg.get("key") and cg.get("key"):
        same_gpu = bg["key"] == cg["key"]
    else:
        same_gpu = (bg.get("arch"), bg.get("device_name")) == (cg.get("arch"), cg.get("device_name"))
    if not same_gpu:
        problems.append(f"other GPU: baseline {_gpu_text(bg)}, candidate {_gpu_text(cg)}")
    if b.get("world_size") != c.get("world_size") or len(b.get("ranks", [])) != len(c.get("ranks", [])):
        problems.append(
            f"other ranks: baseline {len(b.get('ranks', []))} of world size {b.get('world_size')}, "
            f"candidate {len(c.get('ranks', []))} of world size {c.get('world_size')}"
        )
    bm, cm = b.get("model") or {}, c.get("model") or {}
    if (
        bm.get("layers_seen") is not None
        and cm.get("layers_seen") is not None
        and bm["layers_seen"] != cm["layers_seen"]
    ):
        problems.append(
            f"other model shape: {bm['layers_seen']} layers seen in the baseline, "
            f"{cm['layers_seen']} in the candidate"
        )
    for key in ("hidden_size",):
        if bm.get(key) is not None and cm.get(key) is not None and bm[key] != cm[key]:
            problems.append(f"other model shape: {key} {bm[key]} vs {cm[key]}")
    br, cr = set(bm.get("gemm_roles") or []), set(cm.get("gemm_roles") or [])
    if br != cr:
        parts = []
        if br - cr:
            parts.append(f"only the baseline has {', '.join(sorted(br - cr))}")
        if cr - br:
            parts.append(f"only the candidate has {', '.join(sorted(cr - br))}")
        problems.append(f"other model shape: GEMM roles differ ({'; '.join(parts)})")
    bp, cp = b.get("phases") or {}, c.get("phases") or {}
    for phase in PHASES:
        if phase not in bp or phase not in cp:
            continue
        for key, label in (("tokens_per_step", "tokens per step"), ("batch", "batch")):
            tb, tc = bp[phase].get(key), cp[phase].get(key)
            if tb and tc and abs(tc - tb) > SHAPE_TOLERANCE * tb:
                problems.append(
                    f"other {label} in {phase}: baseline {tb}, candidate {tc} "
                    f"(more than {SHAPE_TOLERANCE:.0%} apart)"
                )
                break
    return problems


def _gpu_text(g: Mapping[str, Any]) -> str:
    name = g.get("name") or g.get("device_name") or "unknown GPU"
    return f"{name} ({g['arch']})" if g.get("arch") else str(name)


def phase_plan(
    baseline: dict[str, Any], candidate: dict[str, Any], t: Thresholds
) -> tuple[dict[str, str | None], list[str]]:
    """Per phase: None when it is gated, else why not; and the step-count problems."""
    bp, cp = baseline["phases"], candidate["phases"]
    plan: dict[str, str | None] = {}
    problems: list[str] = []
    if not bp and not cp:
        return plan, ["no steps in either run (summary-only input?): the gate compares per-step times"]
    for phase in PHASES:
        nb = bp[phase]["steps"] if phase in bp else 0
        nc = cp[phase]["steps"] if phase in cp else 0
        if not nb and not nc:
            continue
        if not nb or not nc:
            problems.append(f"{phase} steps in only one run: baseline {nb}, candidate {nc}")
            continue
        if min(nb, nc) >= t.min_steps or t.allow_few_steps:
            plan[phase] = None
        elif max(nb, nc) < t.min_steps:
            plan[phase] = (
                f"{_steps(nb)} in the baseline and {_steps(nc)} in the candidate, fewer than "
                f"--min-steps {t.min_steps}: not gated (--allow-few-steps gates it)"
            )
        else:
            problems.append(
                f"too few {phase} steps: baseline {nb}, candidate {nc}, fewer than --min-steps "
                f"{t.min_steps} (--allow-few-steps compares anyway)"
            )
    if not problems and plan and all(v is not None for v in plan.values()):
        counts = ", ".join(f"{p} {bp[p]['steps']}/{cp[p]['steps']}" for p in plan)
        problems.append(
            f"too few steps: no phase has --min-steps {t.min_steps} steps in both runs "
            f"(baseline/candidate: {counts}; --allow-few-steps compares anyway)"
        )
    return plan, problems


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


# ------------------------------------------------------------------------------------ comparison


def compare(
    baseline: dict[str, Any], candidate: dict[str, Any], thresholds: Thresholds | None = None
) -> dict[str, Any]:
    """Compare a candidate run with a baseline; see the module docstring for the rules."""
    t = thresholds or Thresholds()
    problems = comparability_problems(baseline, candidate)
    plan, step_problems = phase_plan(baseline, candidate, t)
    problems += step_problems
    if problems:
        raise NotComparableError("not comparable: " + "; ".join(problems))
    used: set[str] = set()
    rows: list[dict[str, Any]] = []
    phases_out = []
    for phase, why in plan.items():
        gated = why is None
        bp, cp = baseline["phases"][phase], candidate["phases"][phase]
        phases_out.append(_phase_entry(phase, why, bp, cp))
        rows.append(_compare_phase(phase, bp, cp, t, gated, used))
        rows.extend(_compare_steps(phase, bp, cp, t, gated))
        groups = _compare_groups(baseline, candidate, phase, t, gated, used)
        rows.extend(_compare_stages(baseline, candidate, phase, t, gated, used, groups))
        rows.extend(g for g in groups if _listed(g, t))
    rows.sort(
        key=lambda r: (
            not r["fails"],
            LEVELS.index(r["level"]),
            -abs(r["delta_ns"] or 0),
            r["id"],
        )
    )
    gated_rows = [r for r in rows if r["gated"]]
    counts = {
        s: sum(r["status"] == s for r in gated_rows)
        for s in ("regression", "improvement", "new", "vanished", "unchanged")
    }
    failed = [{k: r[k] for k in ("id", "level", "status", "delta_ns", "change")} for r in rows if r["fails"]]
    failures = len(failed)
    notes = _notes(baseline, candidate, plan, t, used)
    return {
        "format_version": RESULT_FORMAT_VERSION,
        "kind": RESULT_KIND,
        "status": "fail" if failures else "pass",
        "failures": failures,
        "failed": failed,
        "counts": counts,
        "thresholds": _thresholds_entry(t),
        "baseline": _side(baseline),
        "candidate": _side(candidate),
        "phases": phases_out,
        "rows": rows,
        "notes": notes,
    }


def _phase_entry(phase: str, why: str | None, bp: Mapping[str, Any], cp: Mapping[str, Any]) -> dict[str, Any]:
    """The result's entry of one phase: whether it is gated (else why not) and both runs' sizes and times."""
    return {
        "phase": phase,
        "gated": why is None,
        "reason": why,
        "steps": _pair(bp["steps"], cp["steps"]),
        "tokens_per_step": _pair(bp.get("tokens_per_step"), cp.get("tokens_per_step")),
        "batch": _pair(bp.get("batch"), cp.get("batch")),
        "step_ns_p50": _pair(_step(bp, "p50"), _step(cp, "p50")),
        "step_ns_p90": _pair(_step(bp, "p90"), _step(cp, "p90")),
        "kernel_ns_p50": _pair(bp["kernel_ns"]["p50"], cp["kernel_ns"]["p50"]),
    }


def _compare_phase(
    phase: str, bp: Mapping[str, Any], cp: Mapping[str, Any], t: Thresholds, gated: bool, used: set[str]
) -> dict[str, Any]:
    """The phase's own row: its kernel time per step, the per-step median (a phase new in the candidate fails)."""
    thr, key = t.for_row(phase)
    used.update([key] if key else [])
    return _judge(
        {
            "level": "phase",
            "id": phase,
            "phase": phase,
            "stage": None,
            "group_key": None,
            "provider": None,
        },
        bp["kernel_ns"]["p50"],
        cp["kernel_ns"]["p50"],
        "p50",
        thr,
        key,
        t,
        gated,
        fails_if_new=True,
    )


def _thresholds_entry(t: Thresholds) -> dict[str, Any]:
    """The thresholds the comparison ran with, as the result records them."""
    return {
        "threshold": t.threshold,
        "step_threshold": t.step_threshold,
        "min_delta_ns": t.min_delta_ns,
        "min_steps": t.min_steps,
        "allow_few_steps": t.allow_few_steps,
        "overrides": dict(t.overrides),
    }


def _step(phase_entry: Mapping[str, Any], stat: str) -> int | None:
    """A phase's step-time statistic (None in a baseline written before it was kept)."""
    value = (phase_entry.get("step_ns") or {}).get(stat)
    return None if value is None else int(value)


def _compare_steps(
    phase: str, bp: Mapping[str, Any], cp: Mapping[str, Any], t: Thresholds, gated: bool
) -> list[dict[str, Any]]:
    """The phase's step-time rows (p50, p90 of step wall durations) both runs carry."""
    rows = []
    for stat in STEP_STATS:
        b, c = _step(bp, stat), _step(cp, stat)
        if b is None or c is None:
            continue  # an older baseline: _notes says so
        rows.append(
            _judge(
                {
                    "level": "step",
                    "id": f"{phase}.step_{stat}",
                    "phase": phase,
                    "stage": None,
                    "group_key": None,
                    "provider": None,
                },
                b,
                c,
                stat,
                t.step_threshold,
                None,
                t,
                gated,
                fails_if_new=False,
            )
        )
    return rows


def _pair(b: Any, c: Any) -> dict[str, Any]:
    return {"baseline": b, "candidate": c}


def _side(obj: dict[str, Any]) -> dict[str, Any]:
    gpu = obj["comparability"].get("gpu") or {}
    return {
        "inputs": [
            {k: i.get(k) for k in ("path", "sha256", "format", "rank")} for i in obj.get("inputs", [])
        ],
        "rules_sha256": obj.get("rules_sha256"),
        "tool_version": obj.get("tool_version"),
        "gpu": gpu.get("name") or gpu.get("device_name"),
    }


def _value(row: Mapping[str, Any] | None, stat: str) -> int | None:
    return None if row is None else int(row["p50_ns" if stat == "p50" else "mean_ns"])


def _stat(*rows: Mapping[str, Any] | None) -> str:
    """Medians when the work runs in most steps on every side that has it, else means."""
    present = [r for r in rows if r is not None]
    return "p50" if present and all(r["p50_ns"] > 0 for r in present) else "mean"


def _judge(
    row: dict[str, Any],
    b: int | None,
    c: int | None,
    stat: str,
    thr: float,
    key: str | None,
    t: Thresholds,
    gated: bool,
    fails_if_new: bool,
) -> dict[str, Any]:
    delta = None if b is None or c is None else c - b
    if b is None:
        status = "new"
        delta = c
    elif c is None:
        status = "vanished"
        delta = -b
    elif delta > t.min_delta_ns and c > b * (1 + thr):
        status = "regression"
    elif -delta > t.min_delta_ns and c < b * (1 - thr):
        status = "improvement"
    else:
        status = "unchanged"
    fails = gated and (
        status == "regression" or (status == "new" and fails_if_new and (c or 0) > t.min_delta_ns)
    )
    row.update(
        {
            "status": status,
            "fails": fails,
            "gated": gated,
            "statistic": stat,
            "baseline_ns": b,
            "candidate_ns": c,
            "delta_ns": delta,
            "change": (c - b) / b if b and c is not None else None,
            "threshold": thr,
            "threshold_from": key,
        }
    )
    return row


def _index(obj: dict[str, Any], table: str, phase: str) -> dict[tuple[str, ...], dict[str, Any]]:
    if table == "stages":
        return {(r["stage"],): r for r in obj["stages"] if r["phase"] == phase}
    return {(r["stage"], r["group_key"]): r for r in obj["groups"] if r["phase"] == phase}


def _tail(obj: dict[str, Any], phase: str, stage: str, group_key: str) -> dict[str, Any] | None:
    """A group kept only as a hash in a baseline's tail, as a row with its mean (p50 unknown: 0)."""
    keys = ((obj.get("tail_groups") or {}).get(phase) or {}).get("keys") or {}
    mean = keys.get(group_hash(stage, group_key))
    return None if mean is None else {"p50_ns": 0, "mean_ns": int(mean), "count_per_step": None, "tail": True}


def _compare_groups(
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    phase: str,
    t: Thresholds,
    gated: bool,
    used: set[str],
) -> list[dict[str, Any]]:
    b_idx, c_idx = _index(baseline, "groups", phase), _index(candidate, "groups", phase)
    out = []
    for key in list(b_idx) + [k for k in c_idx if k not in b_idx]:
        stage, gk = key
        b = b_idx.get(key) or _tail(baseline, phase, stage, gk)
        c = c_idx.get(key) or _tail(candidate, phase, stage, gk)
        stat = _stat(b, c)
        thr, okey = t.for_row(phase, stage, gk)
        src = b_idx.get(key) or c_idx.get(key) or {}
        row = _judge(
            {
                "level": "kernel",
                "id": f"{phase}.{stage}/{gk}",
                "phase": phase,
                "stage": stage,
                "group_key": gk,
                "provider": src.get("provider"),
            },
            _value(b, stat),
            _value(c, stat),
            stat,
            thr,
            okey,
            t,
            gated,
            fails_if_new=False,
        )
        row["count_per_step"] = _pair(b and b.get("count_per_step"), c and c.get("count_per_step"))
        row["in_baseline_top"] = key in b_idx
        if okey:
            used.add(okey)
        out.append(row)
    return out


def _listed(g: dict[str, Any], t: Thresholds) -> bool:
    """Kernel rows worth a line: the baseline's top groups, and any other group that moved."""
    if g["in_baseline_top"]:
        return True
    if g["status"] == "new":
        return (g["candidate_ns"] or 0) > t.min_delta_ns
    return g["status"] != "unchanged"


def _compare_stages(
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    phase: str,
    t: Thresholds,
    gated: bool,
    used: set[str],
    groups: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    b_idx, c_idx = _index(baseline, "stages", phase), _index(candidate, "stages", phase)
    out = []
    for key in list(b_idx) + [k for k in c_idx if k not in b_idx]:
        (stage,) = key
        b, c = b_idx.get(key), c_idx.get(key)
        stat = _stat(b, c)
        thr, okey = t.for_row(phase, stage)
        if okey:
            used.add(okey)
        row = _judge(
            {
                "level": "stage",
                "id": f"{phase}.{stage}",
                "phase": phase,
                "stage": stage,
                "group_key": None,
                "provider": None,
                "category": (b or c or {}).get("category"),
            },
            _value(b, stat),
            _value(c, stat),
            stat,
            thr,
            okey,
            t,
            gated,
            fails_if_new=True,
        )
        row["count_per_step"] = _pair(b and b.get("count_per_step"), c and c.get("count_per_step"))
        mine = [g for g in groups if g["stage"] == stage and (g["delta_ns"] or 0) != 0]
        sign = -1 if row["status"] in ("improvement", "vanished") else 1
        mine.sort(key=lambda g: (-sign * (g["delta_ns"] or 0), g["group_key"]))
        row["kernels"] = (
            [
                {
                    k: g[k]
                    for k in (
                        "group_key",
                        "provider",
                        "status",
                        "baseline_ns",
                        "candidate_ns",
                        "delta_ns",
                        "change",
                    )
                }
                for g in mine
                if sign * (g["delta_ns"] or 0) > 0
            ][:KERNELS_PER_STAGE]
            if row["status"] != "unchanged"
            else []
        )
        out.append(row)
    return out


def _notes(
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    plan: dict[str, str | None],
    t: Thresholds,
    used: set[str],
) -> list[str]:
    notes = [f"{p}: {why}" for p, why in plan.items() if why]
    if (
        baseline.get("rules_sha256")
        and candidate.get("rules_sha256")
        and baseline["rules_sha256"] != candidate["rules_sha256"]
    ):
        notes.append(
            "the classification rules changed since the baseline was written: stages may have "
            "moved; regenerate the baseline if they did (`llm-kernel-map baseline`)"
        )
    for phase in plan:
        for label, side in (("baseline", baseline), ("candidate", candidate)):
            entry = side["phases"][phase]
            missing = [stat for stat in STEP_STATS if _step(entry, stat) is None]
            if not missing:
                continue
            what = "step times" if len(missing) == len(STEP_STATS) else f"step time {', '.join(missing)}"
            notes.append(
                f"{phase}: the {label} has no {what} (written by an older version): not gated; "
                "regenerate it with `llm-kernel-map baseline`"
            )
    for phase in plan:
        tb = baseline["phases"][phase].get("tokens_per_step")
        tc = candidate["phases"][phase].get("tokens_per_step")
        if (tb is None) != (tc is None):
            notes.append(f"{phase}: tokens per step known in only one run, not checked")
    for key, _ in t.overrides:
        if key not in used:
            notes.append(f"stage threshold {key!r} matched nothing compared")
    return notes
