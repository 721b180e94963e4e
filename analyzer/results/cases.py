"""Structure-rule cases: cut one step (or a few) of a real trace into a case file, and check a case.

Contract:

* :func:`cut_case` analyses a trace the way ``check`` does (truth ranges and step annotations
  removed: the unannotated path), keeps the kernels of the steps asked for (one rank, optionally one
  decoder layer with the forward's work outside every layer), the host ops and annotations of their
  time window, and writes the expectations beside them: each kernel's accepted stages and phase
  from the trace's truth ranges and ``lkm::step`` annotations, or from an engine's step annotations,
  else the analysis' own answer, marked ``pinned``; layers are always pinned. It then analyses the
  cut alone and records which structure and phase rules fired there (``fires``) and which did not
  (``not_fires``), and how many kernels disagree with the expectations (``known_wrong``).
* :func:`case_outcome` analyses a case's trace and returns what the tests compare: per kernel the
  stage, phase and layer, and the rule ids that fired (:func:`fired_rules`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses.phases import parse_annotation
from analyzer.errors import InputError, UsageError
from analyzer.knowledge.annotations import load_annotation_patterns
from analyzer.knowledge.structure_rules import load_structure
from analyzer.knowledge.truth import load_truth_table
from analyzer.model import ANNOTATION_SCHEMA, HOST_OP_SCHEMA, KERNEL_SCHEMA, Trace
from analyzer.pipeline import Analysis, analyze_trace
from analyzer.readers.case import case_document
from analyzer.results.accuracy import extract_truth, has_truth_ranges, strip_annotations
from analyzer.tables.launches import launch_calls

__all__ = ["case_outcome", "cut_case", "fired_rules", "parse_steps", "pinned_case", "score_case"]


def parse_steps(text: str) -> tuple[int, int]:
    """``N`` or ``A-B`` (inclusive) as a (first, last) pair; UsageError otherwise."""
    m = re.fullmatch(r"(\d{1,6})(?:-(\d{1,6}))?", text.strip())
    if not m:
        raise UsageError(f"--step {text!r}: expected N or A-B (step numbers of `analyze`)")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    if b < a:
        raise UsageError(f"--step {text!r}: the range ends before it starts")
    return a, b


def fired_rules(analysis: Analysis) -> set[str]:
    """The ids of the structure and phase rules that decided something in ``analysis``: a kernel's
    stage (``stage_rule``), a step's phase or its evidence, or a kernel's layer."""
    ids = {r.id for r in load_structure().rules}
    got = set(pc.unique(analysis.kernels["stage_rule"].combine_chunks().cast(pa.string())).to_pylist())
    steps = analysis.steps
    if steps is not None and len(steps):
        got.update(steps["phase_rule"].tolist())
        for ev in steps["phase_evidence"]:
            got.update(ev)
    got.update(analysis.layer_rules)
    return got & ids


def case_outcome(trace: Trace) -> tuple[Analysis, dict[str, list[Any]], set[str]]:
    """The analysis of a case's trace, its per-kernel answers and the rules that fired."""
    a = analyze_trace(trace)
    k = a.kernels
    out = {
        "stage": k["stage"].combine_chunks().cast(pa.string()).to_pylist(),
        "phase": k["phase"].combine_chunks().cast(pa.string()).to_pylist(),
        "layer": k["layer"].fill_null(-1).to_pylist(),
    }
    return a, out, fired_rules(a)


def _engine_step_names(annotations: pa.Table) -> np.ndarray:
    """Per annotation row: an engine's (or our capture's) step annotation."""
    pats = load_annotation_patterns()
    names = annotations["name"].to_pylist()
    memo: dict[str, bool] = {}
    out = np.zeros(len(names), bool)
    for i, n in enumerate(names):
        if n not in memo:
            hit = parse_annotation(n, pats)
            memo[n] = hit is not None and hit.phase is not None
        out[i] = memo[n]
    return out


def _window(trace: Trace, kernels: pa.Table) -> tuple[int, int]:
    """The host-time window of ``kernels``: their launch calls where recorded, else their run."""
    corr = kernels["correlation"].drop_null()
    calls = launch_calls(trace.host_ops, ["start_ns", "dur_ns", "correlation", "trace_id"])
    calls = calls.filter(pc.is_in(calls["correlation"], corr)) if len(corr) else calls.slice(0, 0)
    if calls.num_rows:
        st = calls["start_ns"].to_numpy(zero_copy_only=False)
        en = st + calls["dur_ns"].to_numpy(zero_copy_only=False)
        return int(st.min()), int(en.max())
    st = kernels["start_ns"].to_numpy(zero_copy_only=False)
    return int(st.min()), int((st + kernels["dur_ns"].to_numpy(zero_copy_only=False)).max())


def _overlapping(table: pa.Table, lo: int, hi: int, end: str | None = None) -> pa.Table:
    st = table["start_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    en = (
        table[end].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        if end
        else st + table["dur_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    )
    return table.filter(pa.array((st <= hi) & (en >= lo)))


def cut_case(
    trace: Trace,
    source: str,
    *,
    steps: tuple[int, int] | None = None,
    rank: int | None = None,
    layer: int | None = None,
    keep_annotations: bool = False,
    name: str = "",
    description: str = "",
) -> dict[str, Any]:
    """The case document of the steps ``steps`` (inclusive range; None: all) of ``trace`` (one
    input, read from ``source``). See the module docstring."""
    if len(trace.inputs) != 1:
        raise UsageError("cut takes one trace file (one rank's input)")
    truth = _source_truth(source)
    ann = trace.annotations
    engine_steps = _engine_step_names(ann) if ann.num_rows else np.zeros(0, bool)
    annotated = None
    if truth is None and engine_steps.any():
        annotated = analyze_trace(trace)  # the engine's annotations give the expected phases
    kept = strip_annotations(ann, keep_steps=keep_annotations)
    if not keep_annotations and kept.num_rows:
        kept = kept.filter(pa.array(~_engine_step_names(kept)))
    stripped = dataclasses.replace(trace, annotations=kept)
    a = analyze_trace(stripped)
    rows = _selected_rows(a.kernels, source, steps=steps, rank=rank, layer=layer)
    picked = a.kernels.take(pa.array(rows))
    cut = _as_trace_zero(_cut_trace(trace, stripped, kept, picked))
    expect, expect_from = _expectations(picked, truth, annotated, rows, layer)
    _, got, fired = case_outcome(cut)
    score = score_case(got, expect)
    full = {
        "stage": picked["stage"].combine_chunks().cast(pa.string()).to_pylist(),
        "phase": picked["phase"].combine_chunks().cast(pa.string()).to_pylist(),
    }
    # the cut alone answers otherwise than the whole trace did: it lost context (widen --step)
    context = sum(1 for f in ("stage", "phase") for x, y in zip(full[f], got[f], strict=True) if x != y)
    ids = [r.id for r in load_structure().rules]
    return case_document(
        cut,
        name=name,
        description=description,
        source={
            "trace": Path(source).as_posix(),
            "sha256": trace.inputs[0].sha256,
            "steps": list(steps) if steps else None,
            "rank": rank,
            "layer": layer,
            "annotations_kept": keep_annotations,
        },
        expect_from=expect_from,
        fires=sorted(fired),
        not_fires=[i for i in ids if i not in fired],
        known_wrong=score["wrong"],
        undecided=score["undecided"],
        differs_from_whole_trace=context,
        expect=expect,
    )


def _source_truth(source: str) -> pa.Table | None:
    """The truth ranges of the trace file ``source`` (a Kineto JSON written with ``--truth``), else None."""
    truth = None
    if source.endswith((".json", ".json.gz")):
        from analyzer.readers.raw_json import read_json

        doc = read_json(source)
        if has_truth_ranges(doc):
            truth = extract_truth(doc, load_truth_table())
        del doc
    return truth


def _selected_rows(
    k: pa.Table, source: str, *, steps: tuple[int, int] | None, rank: int | None, layer: int | None
) -> np.ndarray:
    """Row indices of the analysed kernels in the steps, rank and layer asked for (a layer keeps the
    forward's work outside every layer too); UsageError / InputError when nothing is left."""
    sel = ~k["aggregate"].to_numpy(zero_copy_only=False)
    step = k["step"].to_numpy(zero_copy_only=False)
    if steps is not None:
        sel &= (step >= steps[0]) & (step <= steps[1])
    if rank is not None:
        sel &= k["rank"].to_numpy(zero_copy_only=False) == rank
    lay = k["layer"].fill_null(-1).to_numpy(zero_copy_only=False)
    if layer is not None:
        if not (sel & (lay == layer)).any():
            raise UsageError(f"--layer {layer}: no kernel of the selected steps is in that layer")
        sel &= (lay == layer) | (lay < 0)
    rows = np.flatnonzero(sel)
    if not len(rows):
        raise InputError(f"{source}: no kernels in the selected steps (see the steps of `analyze`)")
    return rows


def _cut_trace(trace: Trace, stripped: Trace, kept: pa.Table, picked: pa.Table) -> Trace:
    """The trace of the ``picked`` kernels with the host ops of their rank and the annotations
    (``kept``) of their host-time window; its one input is the picked kernels' input."""
    lo, hi = _window(stripped, picked)
    tid, rk = int(picked["trace_id"][0].as_py()), int(picked["rank"][0].as_py())
    host = stripped.host_ops.filter(
        pc.and_(pc.equal(stripped.host_ops["trace_id"], tid), pc.equal(stripped.host_ops["rank"], rk))
    )
    host = _overlapping(host, lo, hi)
    notes = _overlapping(kept, lo, hi, end="end_ns") if kept.num_rows else kept
    return Trace(
        kernels=picked.select(KERNEL_SCHEMA.names).cast(KERNEL_SCHEMA),
        host_ops=host.select(HOST_OP_SCHEMA.names),
        annotations=notes.select(ANNOTATION_SCHEMA.names),
        inputs=[dataclasses.replace(trace.inputs[tid], trace_id=0, path="")],
    )


def pinned_case(trace: Trace, **fields: Any) -> dict[str, Any]:
    """The case document of ``trace`` whose expectations are the analysis' own answers (``pinned``):
    for cases derived from a real one by a documented change (tests/cases/derive.py)."""
    _, got, fired = case_outcome(trace)
    ids = [r.id for r in load_structure().rules]
    expect = {"stage": [[s] for s in got["stage"]], "phase": got["phase"], "layer": got["layer"]}
    return case_document(
        trace,
        **fields,
        expect_from={"stage": "pinned", "phase": "pinned", "layer": "pinned"},
        fires=sorted(fired),
        not_fires=[i for i in ids if i not in fired],
        known_wrong=0,
        undecided=0,
        differs_from_whole_trace=0,
        expect=expect,
    )


def score_case(got: dict[str, list[Any]], expect: dict[str, list[Any]]) -> dict[str, int]:
    """How many kernels' answers are wrong (a stage outside the accepted ones, a phase given and
    not the expected one, another layer) and how many phases are left unknown where one is expected."""
    wrong = undecided = 0
    for i, acc in enumerate(expect["stage"]):
        bad = acc is not None and got["stage"][i] not in acc
        ph = expect["phase"][i]
        if ph is not None and got["phase"][i] != ph:
            if got["phase"][i] == "unknown":
                undecided += 1
            else:
                bad = True
        bad = bad or got["layer"][i] != expect["layer"][i]
        wrong += bad
    return {"wrong": wrong, "undecided": undecided}


def _as_trace_zero(trace: Trace) -> Trace:
    """``trace`` with every row's trace_id 0 (a case holds one input)."""
    out = {}
    for name in ("kernels", "host_ops", "annotations"):
        t = getattr(trace, name)
        i = t.schema.get_field_index("trace_id")
        out[name] = t.set_column(i, "trace_id", pa.array(np.zeros(t.num_rows, np.int16)))
    return dataclasses.replace(trace, **out)


def _expectations(
    picked: pa.Table,
    truth: pa.Table | None,
    annotated: Analysis | None,
    rows: np.ndarray,
    layer: int | None,
) -> tuple[dict[str, list[Any]], dict[str, str]]:
    n = picked.num_rows
    stage = picked["stage"].combine_chunks().cast(pa.string()).to_pylist()
    phase = picked["phase"].combine_chunks().cast(pa.string()).to_pylist()
    lay = picked["layer"].fill_null(-1).to_pylist()
    if layer is not None:
        lay = [x - layer if x >= 0 else x for x in lay]
    exp: dict[str, list[Any]] = {"stage": [[s] for s in stage], "phase": list(phase), "layer": lay}
    src = {"stage": "pinned", "phase": "pinned", "layer": "pinned"}
    if truth is not None:
        key = {
            pair: i
            for i, pair in enumerate(
                zip(truth["correlation"].to_pylist(), truth["start_ns"].to_pylist(), strict=True)
            )
        }
        acc, t_phase = truth["accepted"].to_pylist(), truth["phase"].to_pylist()
        corr, start = picked["correlation"].to_pylist(), picked["start_ns"].to_pylist()
        at = [key.get((c, s)) for c, s in zip(corr, start, strict=True)]
        exp["stage"] = [acc[j] if j is not None and acc[j] else None for j in at]
        exp["phase"] = [t_phase[j] if j is not None else None for j in at]
        src["stage"] = src["phase"] = "truth"
    elif annotated is not None:
        ph = annotated.kernels["phase"].combine_chunks().cast(pa.string()).take(pa.array(rows)).to_pylist()
        exp["phase"] = [p if p != "unknown" else None for p in ph]
        src["phase"] = "annotations"
    assert len(exp["stage"]) == n
    return exp, src
