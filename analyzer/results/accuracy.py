"""Agreement of an analysis with a captured trace's own truth: truth extraction, stripping, scoring.

Contract (docs/accuracy.md): the truth of a kernel comes from the raw Kineto JSON document
(:func:`analyzer.readers.raw_json.read_json`), never from the analysis. Its *region* is the innermost
``lkm::truth region=..`` range around its launch call on the launching CPU thread (joined by
correlation id), its *phase* the innermost ``lkm::step phase=..`` range there; graph-replayed kernels
and kernels of compiled forwards carry phase truth only. The truth table
(:mod:`analyzer.knowledge.truth`) maps (region, whether the launching host op is a GEMM op, activity
kind) to the accepted stages. :func:`agreement` scores an analysed kernels table against that truth,
weighted by kernel time. Pure functions of values.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.knowledge.truth import TruthTable

TRUTH_PREFIX = "lkm::truth region="
STEP_PREFIX = "lkm::step "
KINDS = ("kernel", "memcpy", "memset")
_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_GRAPH_LAUNCH = re.compile(r"(?i)graphlaunch")
_PHASE = re.compile(r"\bphase=(prefill|decode|mixed)\b")
REPORT_VERSION = 1


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class _Sweep:
    """Innermost enclosing interval of each query point, for nested intervals of one thread."""

    def __init__(self, intervals: list[tuple[float, float, Any]]) -> None:
        self.iv = sorted(intervals, key=lambda x: (x[0], -x[1]))

    def innermost(self, points: Sequence[float]) -> list[Any]:
        order = sorted(range(len(points)), key=points.__getitem__)
        out: list[Any] = [None] * len(points)
        stack: list[tuple[float, float, Any]] = []
        i, n = 0, len(self.iv)
        for j in order:
            t = points[j]
            while i < n and self.iv[i][0] <= t:
                start = self.iv[i][0]
                while stack and stack[-1][1] < start:  # ranges that ended before this one began
                    stack.pop()
                stack.append(self.iv[i])
                i += 1
            while stack and stack[-1][1] < t:
                stack.pop()
            out[j] = stack[-1][2] if stack else None
        return out


def extract_truth(doc: Mapping[str, Any], table: TruthTable) -> pa.Table:
    """One row per GPU activity of the raw trace with its truth.

    Columns: ``correlation``, ``start_ns`` (as the Kineto reader computes it), ``name``, ``dur_ns``,
    ``kind``, ``graph`` (replayed from a CUDA graph), ``region`` (null: no stage truth), ``gemm_op``,
    ``phase`` (null: no phase truth), ``accepted`` (list of stages; empty without stage truth),
    ``step_id`` / ``step_name`` (the enclosing ``lkm::step`` range: its order in the document and
    its name; null outside every step).
    """
    base = doc.get("baseTimeNanoseconds")
    base = base if isinstance(base, int) and base > 0 else 0
    ranges, steps, ops, launches, gpu = _truth_events(doc)
    _mark_inline_attention(ranges)
    _mark_attention_gates(ranges)
    _mark_steps_with_ranges(steps, ranges)
    region_of, step_of, op_of = _innermost_at_launch(launches, ranges, steps, ops)
    _mark_module_outputs(ranges, launches, region_of, op_of, table.gemm_ops)
    has_truth = bool(ranges)
    rows: dict[str, list[Any]] = {k: [] for k in ("correlation", "start_ns", "name", "dur_ns", "kind", "graph",
                                                  "region", "gemm_op", "phase", "accepted", "step_id",
                                                  "step_name")}  # fmt: skip
    for corr, ts, dur, name, kind in gpu:
        launch = launches.get(corr) if corr is not None else None
        graph = bool(launch and launch[2])
        step = step_of.get(corr) if launch else None
        region = region_of.get(corr) if launch else None
        op = op_of.get(corr) if launch else None
        gemm = op in table.gemm_ops
        if launch is None or graph or not has_truth:
            region = None
        elif region is None and (step is None or step[1]):
            region = "outside_forward"  # in a step whose forward had ranges, or outside every step
        elif region == "embedding" and kind == "kernel" and table.lookup_ops and op not in table.lookup_ops:
            region = "embedding_arithmetic"  # the module's position arithmetic, no lookup
        rows["correlation"].append(corr)
        rows["start_ns"].append(int(np.rint(ts * 1000.0)) + base)
        rows["name"].append(name)
        rows["dur_ns"].append(int(np.rint(dur * 1000.0)))
        rows["kind"].append(kind)
        rows["graph"].append(graph)
        rows["region"].append(region)
        rows["gemm_op"].append(gemm)
        rows["phase"].append(step[0] if step else None)
        rows["step_id"].append(step[3] if step else None)
        rows["step_name"].append(step[2] if step else None)
        rows["accepted"].append(list(table.stages(region, gemm, kind)) if region else [])
    return _as_truth_table(rows)


_Intervals = dict[Any, list[tuple[float, float, Any]]]  # per (pid, tid): (start, end, payload)


def _truth_events(
    doc: Mapping[str, Any],
) -> tuple[_Intervals, _Intervals, _Intervals, dict[int, tuple[Any, float, bool]], list[Any]]:
    """The raw trace's truth ranges, ``lkm::step`` ranges (payload ``[phase, ran a forward with
    ranges, name, order]``) and CPU ops per thread; each launch call's (thread, ts, graph launch) by
    correlation id; and the GPU activities as (correlation, ts, dur, name, kind)."""
    ranges: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    steps: dict[Any, list[tuple[float, float, Any]]] = defaultdict(list)
    ops: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    launches: dict[int, tuple[Any, float, bool]] = {}
    gpu: list[tuple[int | None, float, float, str, str]] = []
    step_names: list[str] = []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name") or ""
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        if ts is None:
            continue
        dur = dur or 0.0
        thread = (e.get("pid"), e.get("tid"))
        if cat == "user_annotation":
            if name.startswith(TRUTH_PREFIX):
                ranges[thread].append((ts, ts + dur, name[len(TRUTH_PREFIX) :].split()[0]))
            elif name.startswith(STEP_PREFIX):
                m = _PHASE.search(name)
                steps[thread].append(
                    (ts, ts + dur, [m.group(1) if m else None, False, name, len(step_names)])
                )
                step_names.append(name)
        elif cat == "cpu_op":
            ops[thread].append((ts, ts + dur, name))
        elif cat in _LAUNCH_CATS:
            corr = (e.get("args") or {}).get("correlation")
            if isinstance(corr, int) and corr not in launches:
                launches[corr] = (thread, ts, bool(_GRAPH_LAUNCH.search(name)))
        elif cat in _GPU_CATS:
            corr = (e.get("args") or {}).get("correlation")
            gpu.append((corr if isinstance(corr, int) else None, ts, dur, name, _GPU_CATS[cat]))
    return ranges, steps, ops, launches, gpu


def _mark_inline_attention(ranges: _Intervals) -> None:
    """An attention module that entered no attention-interface function computes attention in its own
    code (Falcon, GPT-2's older paths): its own kernels are the place ``attention_inline``."""
    for rs in ranges.values():
        inner = sorted(r[0] for r in rs if r[2] == "attention")
        for i, (s, end, region) in enumerate(rs):
            if region == "attention_module":
                k = bisect.bisect_left(inner, s)
                if not (k < len(inner) and inner[k] <= end):
                    rs[i] = (s, end, "attention_inline")


def _mark_attention_gates(ranges: _Intervals) -> None:
    """A ``gate_up_proj`` range inside an attention module is no MLP's: it is the attention's own gate
    projection (AFMoE's, HRM's ``self_attn.gate_proj``, whose sigmoid gates the attention output),
    the place ``attention_gate``."""
    for rs in ranges.values():
        modules = sorted(
            (s, end) for s, end, region in rs if region in ("attention_module", "attention_inline")
        )
        starts = [s for s, _ in modules]
        for i, (s, end, region) in enumerate(rs):
            if region == "gate_up_proj":
                k = bisect.bisect_right(starts, s) - 1
                if k >= 0 and modules[k][1] >= end:
                    rs[i] = (s, end, "attention_gate")


#: modules whose own code may end with the layer's residual add after their output projection
_OUTPUT_MODULES = ("mlp", "attention_inline")
_OUTPUT_PROJECTIONS = ("down_proj", "o_proj")


def _mark_module_outputs(
    ranges: _Intervals,
    launches: dict[int, tuple[Any, float, bool]],
    region_of: dict[int, str | None],
    op_of: dict[int, str | None],
    gemm_ops: frozenset[str],
) -> None:
    """A kernel launched in an MLP or an inline-attention module's own code after the module's last
    GEMM, where that GEMM is its down or output projection (a ``down_proj`` / ``o_proj`` range), is
    in the place ``module_output``: Bloom's and MPT's
    modules add the residual themselves (``dropout_add``), so that add is the layer's residual add."""
    by_thread: dict[Any, list[tuple[float, int]]] = defaultdict(list)
    for corr, (thread, ts, _) in launches.items():
        by_thread[thread].append((ts, corr))
    for thread, rs in ranges.items():
        pts = sorted(by_thread.get(thread, []))
        times = [t for t, _ in pts]
        for s, end, region in rs:
            if region not in _OUTPUT_MODULES:
                continue
            inside = pts[bisect.bisect_left(times, s) : bisect.bisect_right(times, end)]
            last = max((i for i, (_, c) in enumerate(inside) if op_of.get(c) in gemm_ops), default=None)
            if last is None or region_of.get(inside[last][1]) not in _OUTPUT_PROJECTIONS:
                continue  # the module's last GEMM is no output projection (GIT's attention: P @ V)
            for _, c in inside[last + 1 :]:
                if region_of.get(c) == region:
                    region_of[c] = "module_output"


def _mark_steps_with_ranges(steps: _Intervals, ranges: _Intervals) -> None:
    """A step "ran a forward with ranges" when a truth range starts inside it on its thread."""
    for thread, st in steps.items():
        starts = sorted(r[0] for r in ranges.get(thread, ()))
        for s, end, payload in st:
            k = bisect.bisect_left(starts, s)
            payload[1] = k < len(starts) and starts[k] <= end


def _innermost_at_launch(
    launches: dict[int, tuple[Any, float, bool]], ranges: _Intervals, steps: _Intervals, ops: _Intervals
) -> tuple[dict[int, str | None], dict[int, Any], dict[int, str | None]]:
    """Per launch's correlation id: the innermost truth region, step and CPU op around the launch
    call on its thread."""
    by_thread: dict[Any, list[int]] = defaultdict(list)
    for corr in launches:
        by_thread[launches[corr][0]].append(corr)
    region_of: dict[int, str | None] = {}
    step_of: dict[int, Any] = {}
    op_of: dict[int, str | None] = {}
    for thread, corrs in by_thread.items():
        pts = [launches[c][1] for c in corrs]
        for store, iv in ((region_of, ranges), (step_of, steps), (op_of, ops)):
            found = _Sweep(iv.get(thread, [])).innermost(pts)
            store.update(zip(corrs, found, strict=True))
    return region_of, step_of, op_of


def _as_truth_table(rows: dict[str, list[Any]]) -> pa.Table:
    """The columns of :func:`extract_truth` as an Arrow table with their types."""
    return pa.table(
        {
            "correlation": pa.array(rows["correlation"], pa.int64()),
            "start_ns": pa.array(rows["start_ns"], pa.int64()),
            "name": pa.array(rows["name"], pa.string()),
            "dur_ns": pa.array(rows["dur_ns"], pa.int64()),
            "kind": pa.array(rows["kind"], pa.string()),
            "graph": pa.array(rows["graph"], pa.bool_()),
            "region": pa.array(rows["region"], pa.string()),
            "gemm_op": pa.array(rows["gemm_op"], pa.bool_()),
            "phase": pa.array(rows["phase"], pa.string()),
            "accepted": pa.array(rows["accepted"], pa.list_(pa.string())),
            "step_id": pa.array(rows["step_id"], pa.int64()),
            "step_name": pa.array(rows["step_name"], pa.string()),
        }
    )


def has_truth_ranges(doc: Mapping[str, Any]) -> bool:
    return any(
        isinstance(e, dict) and str(e.get("name", "")).startswith(TRUTH_PREFIX) for e in doc["traceEvents"]
    )


def strip_annotations(annotations: pa.Table, keep_steps: bool = False) -> pa.Table:
    """The annotations table without truth ranges (and without ``lkm::step`` ranges unless
    ``keep_steps``), CPU and GPU copies alike."""
    names = annotations["name"]
    drop = pc.starts_with(names, TRUTH_PREFIX)
    if not keep_steps:
        drop = pc.or_(drop, pc.starts_with(names, STEP_PREFIX))
    return annotations.filter(pc.invert(pc.fill_null(drop, False)))


# ----------------------------------------------------------------------------- scoring


def _frac(num: float, den: float) -> float | None:
    return round(num / den, 6) if den > 0 else None


def _count(acc: list[int], d: int, ok: bool) -> None:
    """Add a kernel of ``d`` ns to ``[agreeing ns, ns, kernels]``."""
    acc[0] += d if ok else 0
    acc[1] += d
    acc[2] += 1


def _truth_rows(truth: pa.Table) -> dict[tuple[Any, Any], int]:
    """The truth row of each (correlation, start_ns): how analysed kernels are matched to it."""
    pairs = zip(truth["correlation"].to_pylist(), truth["start_ns"].to_pylist(), strict=True)
    return {pair: i for i, pair in enumerate(pairs)}


#: the ``by_rule`` key of kernels outside every step (no phase rule decided their phase)
NO_STEP_RULE = "(no step)"


def _kernel_phase_rules(kernels: pa.Table, steps: Any) -> list[str] | None:
    """Per kernel the ``phase_rule`` of its step (:data:`NO_STEP_RULE` outside every step); None
    without steps or without the ``trace_id`` / ``step`` columns."""
    if steps is None or "phase_rule" not in steps or not {"trace_id", "step"} <= set(kernels.column_names):
        return None
    rule_of = {
        (int(t), int(st)): r if isinstance(r, str) else NO_STEP_RULE
        for t, st, r in zip(steps["trace_id"], steps["step"], steps["phase_rule"], strict=True)
    }
    pairs = zip(kernels["trace_id"].to_pylist(), kernels["step"].to_pylist(), strict=True)
    return [rule_of.get((t, st), NO_STEP_RULE) for t, st in pairs]


def _by_rule(acc: Mapping[str, list[int]]) -> dict[str, dict[str, Any]]:
    """``{rule id: {time_ns, agree_ns, kernels, agreement}}`` from ``[agreeing ns, ns, kernels]``
    per rule, the rule with most time with truth first (ties by id)."""
    rows = sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))
    return {
        rid: {"time_ns": t, "agree_ns": ok, "kernels": cnt, "agreement": _frac(ok, t)}
        for rid, (ok, t, cnt) in rows
    }


def agreement(
    kernels: pa.Table, truth: pa.Table, table: TruthTable, *, worst: int = 10, steps: Any = None
) -> dict[str, Any]:
    """Time-weighted agreement of an analysed kernels table with the truth rows of its trace.

    ``kernels`` needs ``correlation``, ``start_ns``, ``dur_ns``, ``name``, ``stage``, ``category``
    and ``phase``; rows are matched on (correlation, start_ns). With a ``stage_rule`` column the
    stage agreement is also given per rule id (``stage.by_rule``); with ``steps`` (the step rows,
    ``trace_id``, ``step``, ``phase_rule``) and the kernels' ``trace_id`` / ``step`` the phase
    agreement is given per ``phase_rule`` of each kernel's step (``phase.by_rule``, weighted by
    kernel time like the rest). Returns the report dict (its keys are documented in docs/accuracy.md).
    """
    cols = kernels.select(
        ["correlation", "start_ns", "dur_ns", "name", "stage", "category", "phase"]
    ).to_pydict()
    stage_rule = kernels["stage_rule"].to_pylist() if "stage_rule" in kernels.column_names else None
    phase_rule = _kernel_phase_rules(kernels, steps)
    tally = _tally(cols, truth, table, stage_rule, phase_rule)
    return _report(tally, len(cols["name"]), sum(d or 0 for d in cols["dur_ns"]), worst)


class _Tally(NamedTuple):
    """What :func:`agreement` counts over the kernels: ``[agreeing ns, ns, kernels]`` per score
    (``acc``), per truth region and per deciding rule; ``[ns, kernels]`` per kind of disagreement."""

    acc: dict[str, list[int]]
    regions: dict[str, list[int]]
    bad_stage: dict[tuple[str, str, str, str], list[int]]
    bad_phase: dict[tuple[str, str, str], list[int]]
    by_rule: dict[str, dict[str, list[int]]]
    unmatched: int
    undecided: int


def _tally(
    cols: dict[str, list[Any]],
    truth: pa.Table,
    table: TruthTable,
    stage_rule: list[Any] | None,
    phase_rule: list[str] | None,
) -> _Tally:
    """Match each kernel to its truth row and count its time where it agrees and where not."""
    key = _truth_rows(truth)
    t_region = truth["region"].to_pylist()
    t_phase = truth["phase"].to_pylist()
    t_acc = truth["accepted"].to_pylist()
    t_kind = truth["kind"].to_pylist()
    n = len(cols["name"])
    by_rule: dict[str, dict[str, list[int]]] = {
        "stage": defaultdict(lambda: [0, 0, 0]),
        "phase": defaultdict(lambda: [0, 0, 0]),
    }
    acc = {"stage": [0, 0, 0], "category": [0, 0, 0], "phase": [0, 0, 0]}  # ok time, time, kernels
    regions: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    bad_stage: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    bad_phase: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    unmatched = 0
    undecided = 0  # phase-truth time the analysis left unknown (said it cannot tell)
    for i in range(n):
        j = key.get((cols["correlation"][i], cols["start_ns"][i]))
        if j is None:
            unmatched += 1
            continue
        d = int(cols["dur_ns"][i] or 0)
        accepted = t_acc[j]
        if accepted:
            stage = cols["stage"][i]
            ok = stage in accepted
            cat_ok = cols["category"][i] in table.categories(accepted)
            for k, good in (("stage", ok), ("category", cat_ok)):
                acc[k][0] += d if good else 0
                acc[k][1] += d
                acc[k][2] += 1
            r = regions[f"{t_region[j]}" if t_kind[j] == "kernel" else f"{t_region[j]} ({t_kind[j]})"]
            r[0] += d if ok else 0
            r[1] += d
            r[2] += 1
            if stage_rule is not None:
                _count(by_rule["stage"][str(stage_rule[i])], d, ok)
            if not ok:
                b = bad_stage[(cols["name"][i], str(stage), t_region[j], "|".join(accepted))]
                b[0] += d
                b[1] += 1
        if t_phase[j] is not None:
            good = cols["phase"][i] == t_phase[j]
            acc["phase"][0] += d if good else 0
            acc["phase"][1] += d
            acc["phase"][2] += 1
            if phase_rule is not None:
                _count(by_rule["phase"][phase_rule[i]], d, good)
            if cols["phase"][i] == "unknown":
                undecided += d
            if not good:
                b = bad_phase[(cols["name"][i], str(cols["phase"][i]), t_phase[j])]
                b[0] += d
                b[1] += 1
    return _Tally(acc, regions, bad_stage, bad_phase, by_rule, unmatched, undecided)


def _report(tally: _Tally, n: int, total: int, worst: int) -> dict[str, Any]:
    """The agreement report of :func:`agreement` from its tally (``n`` kernels of ``total`` ns)."""
    acc, regions, bad_stage, bad_phase, by_rule, unmatched, undecided = tally
    report: dict[str, Any] = {
        "format_version": REPORT_VERSION,
        "kernels": n,
        "kernel_ns": total,
        "unmatched": unmatched,
    }
    for k, (ok_t, t, cnt) in acc.items():
        report[k] = {"agreement": _frac(ok_t, t), "time_ns": t, "kernels": cnt, "coverage": _frac(t, total)}
    # an unknown phase is counted as a disagreement above; these two keep "cannot tell" apart from
    # a wrong answer: the share left unknown, and the agreement where a phase was given
    report["phase"]["undecided"] = _frac(undecided, acc["phase"][1])
    report["phase"]["decided_agreement"] = _frac(acc["phase"][0], acc["phase"][1] - undecided)
    # which rule gave each answer: a wrong answer names the rule that made it
    report["stage"]["by_rule"] = _by_rule(by_rule["stage"])
    report["phase"]["by_rule"] = _by_rule(by_rule["phase"])
    report["regions"] = [
        {"region": r, "time_ns": v[1], "kernels": v[2], "stage_agreement": _frac(v[0], v[1])}
        for r, v in sorted(regions.items(), key=lambda kv: -kv[1][1])
    ]
    report["disagreements"] = {
        "stage": [
            {
                "kernel": k[0],
                "analyzer": k[1],
                "region": k[2],
                "accepted": k[3].split("|"),
                "time_ns": v[0],
                "count": v[1],
                "share": _frac(v[0], acc["stage"][1]),
            }
            for k, v in sorted(bad_stage.items(), key=lambda kv: -kv[1][0])[:worst]
        ],  # fmt: skip
        "phase": [
            {
                "kernel": k[0],
                "analyzer": k[1],
                "truth": k[2],
                "time_ns": v[0],
                "count": v[1],
                "share": _frac(v[0], acc["phase"][1]),
            }
            for k, v in sorted(bad_phase.items(), key=lambda kv: -kv[1][0])[:worst]
        ],  # fmt: skip
    }
    return report


# ----------------------------------------------------------------------------- step fields

STEP_FIELDS = ("phase", "prefill_tokens", "decode_tokens", "model", "verify_k")


def _field(v: Any) -> Any:
    """A step row's value with pandas' missing markers (None, NaN, NA) and the phase ``unknown``
    read as None (not given)."""
    if v is None or v == "unknown":
        return None
    try:
        if v != v:  # NaN
            return None
    except (TypeError, ValueError):
        return None
    return int(v) if isinstance(v, (float, np.floating, np.integer)) else v


def step_agreement(
    kernels: pa.Table, truth: pa.Table, steps: Any, patterns: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """How far the analysis's step rows agree with the capture's ``lkm::step`` ranges.

    Each analysed step is paired with the truth step holding most of its kernel time, one to one
    (a truth step split over several analysed steps pairs with the largest part). For each field of
    :data:`STEP_FIELDS` it counts, over the paired steps: ``agree``; ``wrong``, a value given that
    differs from the truth (a ``verify_k`` where the truth verifies nothing is wrong too); and
    ``not_given``, a null where the truth has a value (the analysis said it cannot tell). A count
    the truth leaves out is not scored.
    ``patterns``: the annotation patterns that read the truth names (``rules/annotations.toml``).
    """
    from analyzer.analyses.phases import parse_annotation

    key = _truth_rows(truth)
    t_step = truth["step_id"].to_pylist()
    t_name = truth["step_name"].to_pylist()
    names: dict[int, str] = {}
    cols = kernels.select(["correlation", "start_ns", "dur_ns", "trace_id", "step"]).to_pydict()
    time: dict[tuple[int, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for c, s, d, tid, st in zip(*(cols[k] for k in ("correlation", "start_ns", "dur_ns", "trace_id", "step")),
                                strict=True):  # fmt: skip
        j = key.get((c, s))
        if j is None or st is None or t_step[j] is None:
            continue
        names[t_step[j]] = t_name[j]
        time[(tid, st)][t_step[j]] += int(d or 0)
    best: dict[int, tuple[int, tuple[int, int]]] = {}  # truth step -> (time, analysed step)
    for found, by_truth in time.items():
        t, d = max(by_truth.items(), key=lambda kv: (kv[1], -kv[0]))
        if t not in best or d > best[t][0]:
            best[t] = (d, found)
    rows = {}
    if steps is not None and len(steps):
        for r in steps[["trace_id", "step", *STEP_FIELDS]].itertuples(index=False):
            rows[(int(r.trace_id), int(r.step))] = r
    fields = {f: {"agree": 0, "wrong": 0, "not_given": 0} for f in STEP_FIELDS}
    paired = 0
    for t, (_, found) in sorted(best.items()):
        info = parse_annotation(names[t], patterns)
        row = rows.get(found)
        if info is None or info.phase is None or row is None:
            continue
        paired += 1
        for f in STEP_FIELDS:
            want, got = _field(getattr(info, f)), _field(getattr(row, f))
            if got is None and want is not None:
                fields[f]["not_given"] += 1
            elif got == want:
                fields[f]["agree"] += 1
            elif want is not None or f == "verify_k":
                fields[f]["wrong"] += 1
    truth_steps = len({s for s in t_step if s is not None})
    return {"truth": truth_steps, "found": len(rows), "paired": paired, "fields": fields}
