"""The entry point: every kernel's step, phase and tokens, and the steps table of a run.

Contract: :func:`label_phases` gives a :class:`Labelled`; a training run or one with no LLM structure
gets no steps (:func:`not_inference`); otherwise :func:`split_phases` takes each trace's steps from
its execution annotations where it has any (:mod:`.annotated`), else from its structure
(:mod:`.structure`). Each input's steps depend on that input alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.analyses.classify import is_training
from analyzer.analyses.phases.annotated import (
    StepAnnotation,
    _inside,
    _steps_from_annotations,
    step_annotations,
)
from analyzer.analyses.phases.evidence import (
    _as_evidence,
    _grid_sequences,
    _is_fill,
    _kernel_evidence,
    _key_lengths,
    _lm_head_rows,
    _m_regimes,
    _name_codes,
    _norm_rows,
    _prologue_rows,
)
from analyzer.analyses.phases.registry import (
    DEFAULT_THRESHOLDS,
    HEAVY_STAGES,
    M_REGIME,
    NO_LLM_STRUCTURE,
    PROLOGUE_RULE,
    TRAINING_RUN,
)
from analyzer.analyses.phases.shapes import _launchers_of, attention_shapes
from analyzer.analyses.phases.steps import STEP_COLUMNS
from analyzer.analyses.phases.structure import _steps_from_structure
from analyzer.knowledge.attention_ops import AttentionOps, load_attention_ops
from analyzer.knowledge.kernel_rules import PhaseEvidence
from analyzer.knowledge.structure_rules import StructureKnowledge, Thresholds
from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES
from analyzer.tables import launches
from analyzer.tables.dictionaries import dict_isin, dict_strings, filled, objects


@dataclasses.dataclass(frozen=True)
class Labelled:
    """What :func:`label_phases` gives."""

    kernels: pa.Table  # with the phase, step and tokens columns
    steps: pd.DataFrame  # one row per step (:data:`STEP_COLUMNS`)
    annotations_found: list[str]  # ids of the engines whose step annotations were found
    warnings: list[str]
    fired: dict[str, int] = dataclasses.field(default_factory=dict)  # rules that decided the whole run


def label_phases(
    kernels: pa.Table,
    host_ops: pa.Table,
    annotations: pa.Table,
    patterns: Sequence[Mapping[str, Any]],
    attention_ops: AttentionOps | None = None,
    structure: StructureKnowledge | None = None,
    kernel_phases: PhaseEvidence | Mapping[str, str] | None = None,
    calls: pa.Table | None = None,
    join: launches.OpJoin | None = None,
    launched: tuple[np.ndarray, np.ndarray] | None = None,
) -> Labelled:
    """Phase, step and tokens of every kernel, and the steps table. Each input's steps depend on
    that input alone, so inputs may be labelled apart and joined. ``attention_ops``: the layouts of
    ``rules/attention_ops.toml`` (loaded when not given); ``structure``: the registry with the run's
    thresholds (default: ``rules/structure.toml``); ``kernel_phases``: the kernel rules' phase facts
    (``RuleSet.phase_evidence``; a plain mapping: rule id -> ``prefill`` / ``decode`` families);
    ``calls``: the launch calls, where taken out of ``host_ops`` (``launches.split_launch_calls``);
    ``join``: the kernel -> launching-op join (made here when not given); ``launched``: what
    ``launches.launch_times`` gives for these kernels, where read already (then ``calls`` is not)."""
    anns, engines = step_annotations(annotations, patterns)
    th = structure.thresholds if structure is not None else DEFAULT_THRESHOLDS
    whole = not_inference(kernels, bool(engines))
    fired: dict[str, int] = {}
    if whole is not None:
        # a training run, or no LLM at all: no steps, no phases (the findings then have none to judge)
        rule, why = whole
        n = kernels.num_rows
        phase, step, tokens = (
            filled(n, "unknown"),
            np.full(n, -1, np.int64),
            np.full(n, None, object),
        )
        steps, warnings = pd.DataFrame([], columns=STEP_COLUMNS), [why] if why else []
        fired[rule] = n
    else:
        phase, step, tokens, steps, warnings = split_phases(
            kernels, host_ops, anns, attention_ops, th, kernel_phases, calls, join, launched
        )
        regimed = int(steps["m_regime"].notna().sum()) if len(steps) else 0
        if regimed:
            fired[M_REGIME] = regimed
    for name, arr in (
        ("phase", dict_strings(pa.array(phase, pa.string()))),
        ("step", pa.array(step, pa.int32())),
        ("tokens", pa.array(tokens, pa.int64())),
    ):
        if name in kernels.column_names:
            kernels = kernels.set_column(kernels.schema.get_field_index(name), name, arr)
        else:
            kernels = kernels.append_column(name, arr)
    return Labelled(
        kernels=kernels, steps=steps, annotations_found=engines, warnings=list(warnings), fired=fired
    )


def not_inference(kernels: pa.Table, annotated: bool) -> tuple[str, str] | None:
    """(rule id, the warning to give: empty where the classification gave it) when the run is no
    LLM inference: a training run (an optimizer kernel, or backward kernels by name), or, without
    engine step annotations, a run with neither an attention kernel, nor a decoder layer, nor an
    embedding lookup and an LM head (nothing of an LLM's structure, e.g. a kernel benchmark)."""
    if kernels.num_rows == 0:
        return None
    if is_training(kernels):
        return TRAINING_RUN, ""  # classify says "training, not inference"
    if annotated:
        return None
    attention = bool(dict_isin(kernels["stage"], ATTENTION_KERNEL_STAGES).any())
    layered = "layer" in kernels.column_names and kernels["layer"].null_count < kernels.num_rows
    # a model's two ends, an embedding lookup and an LM head GEMM: its forwards can be cut and
    # labelled though its layers were not found (a token mixer no rule knows)
    ends = (
        dict_isin(kernels["stage"], ("embedding",)).any()
        and dict_isin(kernels["stage"], ("lm_head_gemm",)).any()
    )
    if attention or layered or ends:
        return None
    return NO_LLM_STRUCTURE, (
        f"no LLM structure: no attention kernel, no decoder layer and no embedding lookup with an LM head among {kernels.num_rows:,} GPU "
        "activities, so no steps, phases or inference findings (stages and the roofline still hold)"
    )


def coverage_warnings(kernels: pa.Table) -> list[str]:
    """What the labelled run leaves without a phase: totals-only rows, activity outside every step."""
    out = []
    agg = kernels["aggregate"].to_numpy(zero_copy_only=False)
    if agg.any():
        out.append(f"{int(agg.sum())} kernel rows are totals only (no timeline): no step or phase")
    outside = kernels["step"].to_numpy(zero_copy_only=False) < 0
    if outside.any() and (~outside).any():
        dur = kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.int64)
        share = dur[outside].sum() / max(dur.sum(), 1)
        if share > 0.001:
            out.append(
                f"{int(outside.sum())} GPU activities ({100 * share:.1f}% of kernel time) are outside "
                "every step (phase unknown)"
            )
    return out


def split_phases(
    kernels: pa.Table,
    host_ops: pa.Table,
    anns: list[StepAnnotation],
    attention_ops: AttentionOps | None = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
    kernel_phases: PhaseEvidence | Mapping[str, str] | None = None,
    calls: pa.Table | None = None,
    join: launches.OpJoin | None = None,
    launched: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, pd.DataFrame, list[str]]:
    """Per-kernel phase, step and tokens, plus the steps table and the warnings of each input
    (:func:`coverage_warnings` adds those of the whole run)."""
    n = kernels.num_rows
    phase = filled(n, "unknown")
    step = np.full(n, -1, np.int64)
    tokens = np.full(n, None, object)
    warnings: list[str] = []
    join = join if join is not None else launches.OpJoin.of(kernels, host_ops)
    df = _kernel_columns(kernels, host_ops, _as_evidence(kernel_phases), th, calls, join, launched)
    launch_ts, launched = df["launch"], df["launched"]
    shapes = attention_shapes(
        host_ops,
        (attention_ops if attention_ops is not None else load_attention_ops()).for_steps(),
        _launchers_of(kernels, host_ops, df["is_attn"], join),
    )
    step_rows: list[dict[str, Any]] = []
    timed = np.flatnonzero(~df["agg"])
    traces = np.unique(df["trace_id"][timed]).tolist()
    for tid in traces:
        sel = timed if len(traces) == 1 else timed[df["trace_id"][timed] == tid]
        idx = _by_start(sel, df["start"])
        t_anns = [a for a in anns if a.trace_id == tid]
        capture = [a for a in t_anns if a.capture]
        execs = [a for a in t_anns if not a.capture]
        if capture and not execs:
            warnings.append(
                f"trace {tid}: only graph-capture annotations ({capture[0].name} ...): "
                "kernels inside them are capture, not execution"
            )
        if capture:  # capture work (warm-up, buffer fills) is no step: step -1, phase unknown
            idx = idx[~_inside(capture, df["start"][idx], launch_ts[idx])]
        if execs:
            rows = _steps_from_annotations(
                idx, df, launch_ts, launched, execs, step, phase, tokens, warnings, tid
            )
        else:
            rows = _steps_from_structure(idx, df, kernels, shapes, step, phase, tokens, tid, warnings, th)
        step_rows.extend(rows)
    steps = pd.DataFrame(step_rows, columns=STEP_COLUMNS)
    return phase, step, tokens, steps, warnings


def _by_start(rows: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``rows`` (increasing) in the order of their ``start``, ties in row order: the rows themselves
    where they are in that order already (a reader's kernels are in time order), checked a block at
    a time, else sorted."""
    block = 1 << 20
    for b in range(0, len(rows), block):
        s = start[rows[b : b + block + 1]]
        if (s[1:] < s[:-1]).any():
            return rows[np.argsort(start[rows], kind="stable")]
    return rows


def _int64(column: pa.ChunkedArray) -> np.ndarray:
    """``column`` as int64, nulls 0: a view of its values where it has no nulls."""
    if column.null_count:
        column = column.fill_null(0)
    return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _kernel_columns(
    kernels: pa.Table,
    host_ops: pa.Table,
    facts: PhaseEvidence,
    th: Thresholds,
    calls: pa.Table | None,
    join: launches.OpJoin | None = None,
    launched: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The per-kernel columns steps are found and labelled by: timing, stages, names, the phase
    evidence of :mod:`.evidence`, the decoder layer and the launch calls' times."""
    n = kernels.num_rows
    # plain numpy columns: per-step slicing by position must not go through pandas indexing
    df = {
        "trace_id": kernels["trace_id"].to_numpy(zero_copy_only=False),
        "rank": kernels["rank"].to_numpy(zero_copy_only=False),
        # views of the table's columns where they have no nulls (read, never written)
        "start": _int64(kernels["start_ns"]),
        "dur": _int64(kernels["dur_ns"]),
        "agg": kernels["aggregate"].to_numpy(zero_copy_only=False),
        "stage": objects(kernels["stage"]),
        "stage_dict": dict_strings(kernels["stage"]),
        "is_attn": dict_isin(kernels["stage"], ATTENTION_KERNEL_STAGES),
        "is_heavy": dict_isin(kernels["stage"], HEAVY_STAGES),
        "fill": _is_fill(kernels),
        "prologue": _prologue_rows(kernels, PROLOGUE_RULE),
        "corr": kernels["correlation"].to_numpy(zero_copy_only=False),
        "ext": kernels["launch_op_id"].to_numpy(zero_copy_only=False),
        "name": _name_codes(kernels),
        "lm_rows": _lm_head_rows(kernels, host_ops, join),
        "graph": kernels["graph_launch"].fill_null(False).to_numpy(zero_copy_only=False).astype(bool),
        "evidence": _kernel_evidence(kernels, facts),
        "seqs": _grid_sequences(kernels, facts),
        "rows": _norm_rows(kernels, facts),
        "keys": _key_lengths(kernels, facts),
        "regime": _m_regimes(kernels, facts, th),
        "layer": (
            kernels["layer"].fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
            if "layer" in kernels.column_names
            else np.full(n, -1, np.int32)
        ),
    }
    df["launch"], df["launched"] = (
        launched if launched is not None else launches.launch_times(kernels, host_ops, calls)
    )
    return df
