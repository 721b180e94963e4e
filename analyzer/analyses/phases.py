"""Steps and phases: every kernel gets ``step`` (-1 outside every step), ``phase`` and ``tokens``.

Contract (DESIGN §4), strongest source first:

1. **Engine annotations** (vLLM ``execute_new_N_cached_M`` and ``execute_N_context_..._generation_...``,
   SGLang ``step[EXTEND|DECODE|MIXED ...]``, ATOM ``prefill[...]`` / ``decode[...]``, our own
   ``lkm::step phase=..``, NVTX / rocpd ranges naming prefill/extend/context or decode/generation) on
   the GPU timeline (kernel start inside the range) or the CPU timeline (launch call inside the
   range). ``capture_<bs>_...`` ranges are graph capture, not execution. ``ProfilerStep#N`` is only an
   outer bound and is never a step.
2. **Forward segmentation** when no annotation applies: the timeline of each device is cut at the
   first kernel of every forward (the embedding lookup, or the first layer's input norm when there is
   no embedding kernel), so sampling and bookkeeping after a forward belong to that forward's step.
   Without any forward structure, idle gaps cut steps.
3. **Labels** for unannotated steps: the attention op's query and key lengths from host-op shapes
   when recorded (one query token per sequence, or a few appended to a longer cache: decode; else
   prefill); packed continuous-batching steps count their decode tokens by request bookkeeping
   across steps (:func:`packed_decode_tokens`: prefill, decode or mixed); else the kernels' own
   signature: a step whose typical GEMM / attention kernel runs many times longer than the run's
   shortest steps is a prefill (within each model where a draft's and a target's steps alternate).
   Steps a trace cannot tell (padded to a CUDA graph's sizes, or replayed from one, in a continuous
   batcher) are ``unknown`` with a warning.
4. **Models**: ``draft`` / ``target`` by the attention ops' count and head size, or without shapes
   by the decoder layers each step ran; ``verify_k`` for a target's multi-token decode steps.

Annotation names are matched by the patterns in ``rules/annotations.toml``; the analyser never
looks at any other annotation (in particular never at test labels).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses.classify import is_training
from analyzer.analyses.walk.registry import WORK_OPS
from analyzer.knowledge.attention_ops import AttentionOps, load_attention_ops
from analyzer.knowledge.kernel_rules import PhaseEvidence
from analyzer.knowledge.structure_rules import StructureKnowledge, Thresholds, load_structure
from analyzer.knowledge.taxonomy import ALL_GEMM_STAGES, ATTENTION_KERNEL_STAGES
from analyzer.tables import intervals, launches
from analyzer.tables.dictionaries import dict_isin, dict_strings, filled, objects

# the GEMM and attention kernels: their run time says how much work a step did
HEAVY_STAGES = ALL_GEMM_STAGES + ATTENTION_KERNEL_STAGES
# the registry (rules/structure.toml): the phase rules' ids and the default thresholds
KNOWLEDGE = load_structure()
DEFAULT_THRESHOLDS: Thresholds = KNOWLEDGE.thresholds
# how many times longer a step's typical heavy kernel must be than in the run's lightest steps
PREFILL_WORK_RATIO = DEFAULT_THRESHOLDS.prefill_work_ratio
# an idle gap this many times the median inter-kernel gap (and >= 200 us) cuts a step when there
# is no forward structure at all
GAP_FACTOR = DEFAULT_THRESHOLDS.gap_factor
MIN_GAP_NS = DEFAULT_THRESHOLDS.min_gap_ns
_FILL_WORDS = KNOWLEDGE.words("fill_words")
_ID = KNOWLEDGE.id_of
ANNOTATION_STEPS = _ID("annotation-steps")
MERGE_NESTED = _ID("merge-nested")
FORWARD_STARTS = _ID("forward-starts")
GRAPH_LAUNCH_START = _ID("graph-launch-start")
HEAVY_PREFIX = _ID("heavy-prefix-step")
GAP_STEPS = _ID("gap-steps")
SHAPE_ONE_TOKEN = _ID("shape-one-token")
SHAPE_VERIFY = _ID("shape-verify")
SHAPE_PREFILL = _ID("shape-prefill")
RECOMPUTED_PREFIX = _ID("recomputed-prefix")
PACKED_STEP = _ID("packed-step")
PACKED_PHASE = _ID("packed-phase")
PACKED_BOOKKEEPING = _ID("packed-bookkeeping")
SCORED_UNKNOWN = _ID("scored-unknown")
SIGNATURE_WORK = _ID("signature-work")
SIGNATURE_NOVEL = _ID("signature-novel-names")
SINGLE_STEP = _ID("single-step-unknown")
SIGNATURE_ALL_HEAVY = _ID("signature-all-heavy")
PADDED_OR_REPLAYED = _ID("padded-or-replayed")
UNSHAPED_PREFILL_RUN = _ID("unshaped-prefill-run")
SIGNATURE_BY_MODEL = _ID("signature-by-model")
MODELS_BY_SHAPE = _ID("models-by-shape")
MODELS_BY_DEPTH = _ID("models-by-depth")
VERIFY_WIDTH = _ID("verify-width")
STATIC_BATCH = _ID("static-batch-decode")
KERNEL_EVIDENCE = _ID("kernel-phase-evidence")
TRAINING_RUN = _ID("training-run")
NO_LLM_STRUCTURE = _ID("no-llm-structure")
EVIDENCE_CONFLICT = _ID("evidence-conflict")
GRID_QUERY_TILES = _ID("grid-query-tiles")
GRID_SEQUENCES = _ID("grid-decode-sequences")
M_REGIME = _ID("gemm-m-regime")
FRESH_CONTEXT = _ID("no-cached-keys")
NORM_ROWS = _ID("norm-row-tokens")
# per kernel: the phase its family's rule says engines run it in (rules/kernels.toml `phases`), or
# prefill by its launch grid (a query longer than one tile, PHS030)
NO_EVIDENCE, DECODE_EVIDENCE, PREFILL_EVIDENCE, PREFILL_GRID_EVIDENCE = 0, 1, 2, 3
# per kernel: the M regime of a GEMM whose rule states its token tile (PHS032)
NO_REGIME, SKINNY, LARGE, BETWEEN = 0, 1, 2, 3
# GEMM roles whose rows are not the step's tokens: the LM head scores sampled rows only, the router's
# N is the expert count
_NOT_TOKEN_ROWS = ("lm_head_gemm", "moe_gate_gemm")


@dataclasses.dataclass
class StepAnnotation:
    """A parsed engine annotation: one forward step."""

    start_ns: int
    end_ns: int
    side: str
    phase: str
    tokens: int | None
    name: str
    trace_id: int
    rank: int
    capture: bool = False
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    model: str = "target"
    verify_k: int | None = None
    engine: str = ""  # the id of the annotation pattern that matched
    merged: bool = False  # two annotations of one step merged (:func:`merge_nested`)


# --------------------------------------------------------------------------- annotation patterns


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What one step annotation says: its engine, phase (None: graph capture) and token counts."""

    engine: str
    phase: str | None
    tokens: int | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    model: str = "target"
    verify_k: int | None = None


def parse_annotation(name: str, patterns: Sequence[Mapping[str, Any]]) -> StepInfo | None:
    """What a step annotation name says, else None (no step annotation, or an outer bound).

    ``patterns``: the annotation patterns of ``rules/annotations.toml``
    (:func:`analyzer.knowledge.annotations.load_annotation_patterns`), first match wins. Optional
    groups: ``tokens``, ``q`` x ``bs``, ``prefill_tokens`` / ``decode_tokens`` (the step's tokens of
    each kind) and ``model`` (``draft`` for a speculative draft model's step)."""
    for a in patterns:
        m = a["regex"].search(name)
        if not m:
            continue
        g = m.groupdict()
        kind = a["kind"]
        if kind == "capture":
            return StepInfo(a["id"], None)
        if kind == "outer":
            return None
        phase = _phase_of(a, g)
        tokens = _int(g.get("tokens"))
        q = _int(g.get("q"))
        if tokens is None and q is not None and g.get("bs"):
            tokens = q * int(g["bs"])
        if tokens is None and phase == "decode":
            tokens = _int(g.get("bs"))  # one new token per sequence
        pre, dec = _int(g.get("prefill_tokens")), _int(g.get("decode_tokens"))
        if pre is None and dec is None and tokens is not None:
            if phase == "prefill":
                pre, dec = tokens, 0
            elif phase == "decode":
                pre, dec = 0, tokens
        if tokens is None and pre is not None and dec is not None:
            tokens = pre + dec
        model = (g.get("model") or "target").lower()
        # a decode step that scores several tokens per sequence verifies a speculation
        verify = q if phase == "decode" and model != "draft" and q is not None and q > 1 else None
        return StepInfo(a["id"], phase, tokens, pre, dec, model, verify)
    return None


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _phase_of(a: dict[str, Any], g: dict[str, str | None]) -> str:
    kind = a["kind"]
    if kind == "fixed":
        return a["phase"]
    if kind == "word":
        w = (g.get("word") or "").lower()
        for phase, words in a["words"].items():
            if w in words:
                return phase
        return "unknown"
    if kind == "counts":
        p = _int(g.get("prefill")) or 0
        d = _int(g.get("decode")) or 0
        if p and d:
            return "mixed"
        if p:
            return "prefill"
        if d:
            return "decode"
        return "unknown"
    return "unknown"


def step_annotations(
    annotations: pa.Table, patterns: Sequence[Mapping[str, Any]]
) -> tuple[list[StepAnnotation], list[str]]:
    """Parse every recognised step annotation; return them and the engine ids found."""
    out: list[StepAnnotation] = []
    engines: set[str] = set()
    if annotations.num_rows == 0:
        return out, []
    df = annotations.to_pandas()
    names = df["name"].astype(str)
    cache: dict[str, Any] = {}
    for i, name in enumerate(names):
        if name not in cache:
            cache[name] = parse_annotation(name, patterns)
        hit = cache[name]
        if hit is None:
            continue
        engines.add(hit.engine)
        r = df.iloc[i]
        out.append(
            StepAnnotation(
                int(r.start_ns),
                int(r.end_ns),
                str(r.side),
                hit.phase or "unknown",
                hit.tokens,
                name,
                int(r["trace_id"]),
                int(r["rank"]),
                capture=hit.phase is None,
                prefill_tokens=hit.prefill_tokens,
                decode_tokens=hit.decode_tokens,
                model=hit.model,
                verify_k=hit.verify_k,
                engine=hit.engine,
            )
        )
    return out, sorted(engines)


# --------------------------------------------------------------------------- entry point


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
) -> Labelled:
    """Phase, step and tokens of every kernel, and the steps table. Each input's steps depend on
    that input alone, so inputs may be labelled apart and joined. ``attention_ops``: the layouts of
    ``rules/attention_ops.toml`` (loaded when not given); ``structure``: the registry with the run's
    thresholds (default: ``rules/structure.toml``); ``kernel_phases``: the kernel rules' phase facts
    (``RuleSet.phase_evidence``; a plain mapping: rule id -> ``prefill`` / ``decode`` families);
    ``calls``: the launch calls, where taken out of ``host_ops`` (``launches.split_launch_calls``)."""
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
            kernels, host_ops, anns, attention_ops, th, kernel_phases, calls
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
    engine step annotations, a run with neither an attention kernel nor a decoder layer (nothing
    of an LLM's structure, e.g. a kernel benchmark)."""
    if kernels.num_rows == 0:
        return None
    if is_training(kernels):
        return TRAINING_RUN, ""  # classify says "training, not inference"
    if annotated:
        return None
    attention = bool(dict_isin(kernels["stage"], ATTENTION_KERNEL_STAGES).any())
    layered = "layer" in kernels.column_names and kernels["layer"].null_count < kernels.num_rows
    if attention or layered:
        return None
    return NO_LLM_STRUCTURE, (
        f"no LLM structure: no attention kernel and no decoder layer among {kernels.num_rows:,} GPU "
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


STEP_COLUMNS = [
    "trace_id",
    "rank",
    "step",
    "phase",
    "start_ns",
    "dur_ns",
    "busy_ns",
    "kernel_ns",
    "kernels",
    "tokens",
    "prefill_tokens",
    "decode_tokens",
    "model",
    "verify_k",
    "source",
    "phase_rule",
    "phase_evidence",
    "m_regime",
]


def split_phases(
    kernels: pa.Table,
    host_ops: pa.Table,
    anns: list[StepAnnotation],
    attention_ops: AttentionOps | None = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
    kernel_phases: PhaseEvidence | Mapping[str, str] | None = None,
    calls: pa.Table | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, pd.DataFrame, list[str]]:
    """Per-kernel phase, step and tokens, plus the steps table and the warnings of each input
    (:func:`coverage_warnings` adds those of the whole run)."""
    n = kernels.num_rows
    phase = filled(n, "unknown")
    step = np.full(n, -1, np.int64)
    tokens = np.full(n, None, object)
    warnings: list[str] = []
    stage = objects(kernels["stage"])
    facts = _as_evidence(kernel_phases)
    # plain numpy columns: per-step slicing by position must not go through pandas indexing
    df = {
        "trace_id": kernels["trace_id"].to_numpy(zero_copy_only=False),
        "rank": kernels["rank"].to_numpy(zero_copy_only=False),
        "start": kernels["start_ns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64),
        "dur": kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.int64),
        "agg": kernels["aggregate"].to_numpy(zero_copy_only=False),
        "stage": stage,
        "stage_dict": dict_strings(kernels["stage"]),
        "is_attn": dict_isin(kernels["stage"], ATTENTION_KERNEL_STAGES),
        "is_heavy": dict_isin(kernels["stage"], HEAVY_STAGES),
        "fill": _is_fill(kernels),
        "corr": kernels["correlation"].to_numpy(zero_copy_only=False),
        "ext": kernels["launch_op_id"].to_numpy(zero_copy_only=False),
        "name": _name_codes(kernels),
        "lm_rows": _lm_head_rows(kernels, host_ops),
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
    launch_ts, launched = launches.launch_times(kernels, host_ops, calls)
    df["launch"], df["launched"] = launch_ts, launched
    shapes = attention_shapes(
        host_ops,
        (attention_ops if attention_ops is not None else load_attention_ops()).for_steps(),
        _launchers_of(kernels, host_ops, df["is_attn"]),
    )
    step_rows: list[dict[str, Any]] = []
    timed = np.flatnonzero(~df["agg"])
    for tid in np.unique(df["trace_id"][timed]).tolist():
        sel = timed[df["trace_id"][timed] == tid]
        idx = sel[np.argsort(df["start"][sel], kind="stable")]
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


def _inside(anns: list[StepAnnotation], start: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Which kernels lie in one of ``anns``: by kernel start for a GPU range, by launch call for a CPU one."""
    out = np.zeros(len(start), bool)
    for a in anns:
        at = start if a.side == "gpu" else launch
        out |= (at >= a.start_ns) & (at < a.end_ns)
    return out


def _launchers_of(kernels: pa.Table, host_ops: pa.Table, which: np.ndarray) -> np.ndarray:
    """The host-op rows that launched the kernels ``which`` marks (their innermost launching op)."""
    rows = np.flatnonzero(which)
    found = launches.launching_op_rows(kernels, host_ops) if len(rows) else None
    if found is None:
        return np.empty(0, np.int64)
    ops, pos = found
    at = pos.take(pa.array(rows))
    at = at.filter(at.is_valid())
    return np.unique(ops["row"].take(at).to_numpy(zero_copy_only=False).astype(np.int64))


def _as_evidence(facts: PhaseEvidence | Mapping[str, str] | None) -> PhaseEvidence:
    if isinstance(facts, PhaseEvidence):
        return facts
    return PhaseEvidence(families=dict(facts or {}))


def _rule_codes(kernels: pa.Table, values: Mapping[str, Any]) -> tuple[np.ndarray, list[Any]]:
    """Per kernel: the index (from 1) of its rule's value among the distinct values returned, 0 where
    its rule has none; looked up once per distinct rule id, so per-kernel work stays integer."""
    opts = list(dict.fromkeys(values.values()))
    n = kernels.num_rows
    if not opts or "rule_id" not in kernels.column_names:
        return np.zeros(n, np.int16), opts
    index = {v: i + 1 for i, v in enumerate(opts)}
    ids = dict_strings(kernels["rule_id"])
    words = ids.dictionary.to_pylist()
    lut = np.asarray([index.get(values.get(x or ""), 0) for x in words] + [0], np.int16)
    return lut[ids.indices.fill_null(len(words)).to_numpy(zero_copy_only=False)], opts


def _grid_axis(kernels: pa.Table, axis: str) -> np.ndarray:
    """The launch grid along ``axis`` (x / y / z) per kernel; 0 where the trace has none."""
    col = f"grid_{axis}"
    if col not in kernels.column_names:
        return np.zeros(kernels.num_rows, np.int64)
    return kernels[col].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _along(kernels: pa.Table, axes: Mapping[str, str]) -> np.ndarray | None:
    """Per kernel: its grid along the axis its rule names in ``axes`` (rule id -> x / y / z), else 0;
    None (nothing allocated) where no kernel's rule names one."""
    code, opts = _rule_codes(kernels, axes)
    if not code.any():
        return None
    out = np.zeros(kernels.num_rows, np.int32)
    for i, a in enumerate(opts, start=1):
        on = code == i
        if on.any():
            out[on] = _grid_axis(kernels, a)[on]
    return out


def _kernel_evidence(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray:
    """Per kernel: DECODE_EVIDENCE / PREFILL_EVIDENCE where its rule's family runs in that phase only;
    PREFILL_GRID_EVIDENCE where its rule's ``query_tile_axes`` are all >= 2 in its grid (PHS030: a
    query longer than one tile); else NO_EVIDENCE."""
    phase_code = {"decode": DECODE_EVIDENCE, "prefill": PREFILL_EVIDENCE}
    code, opts = _rule_codes(kernels, facts.families)
    out = np.asarray([NO_EVIDENCE] + [phase_code[p] for p in opts], np.int8)[code]
    code, opts = _rule_codes(kernels, facts.query_tile_axes)
    for i, axes in enumerate(opts, start=1):
        on = (code == i) & (out == NO_EVIDENCE)
        for a in axes:
            on &= _grid_axis(kernels, a) >= 2
        out[on] = PREFILL_GRID_EVIDENCE
    return out


def _grid_sequences(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray | None:
    """Per kernel: the sequences its launch grid counts along its decode family's ``sequences_axis``
    (PHS031), else 0."""
    return _along(kernels, facts.sequences_axis)


def _norm_rows(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray | None:
    """Per kernel: the token rows its launch grid counts along its norm family's ``rows_axis``
    (PHS034), else 0."""
    return _along(kernels, facts.rows_axis)


def _key_lengths(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray | None:
    """Per kernel: the key length its name carries by its rule's ``key_length`` pattern (PHS033),
    read once per distinct (name, pattern); 0 where none (no pattern, no match, or length 0); None
    where no kernel's rule has a pattern."""
    code, opts = _rule_codes(kernels, facts.key_length)
    sel = np.flatnonzero(code)
    if not len(sel) or "norm_name" not in kernels.column_names:
        return None
    out = np.zeros(kernels.num_rows, np.int32)
    names = dict_strings(kernels["norm_name"])
    words = names.dictionary.to_pylist() + [None]
    at = names.indices.fill_null(len(words) - 1).to_numpy(zero_copy_only=False)[sel]
    pairs, inv = np.unique(np.stack([at, code[sel]], axis=1), axis=0, return_inverse=True)
    values = np.zeros(len(pairs), np.int64)
    for u, (j, c) in enumerate(pairs.tolist()):
        m = opts[c - 1].search(words[j] or "")
        values[u] = int(m.group(1)) if m else 0
    out[sel] = values[np.asarray(inv).reshape(-1)]
    return out


def _fresh_context(seg: np.ndarray, df: Any) -> tuple[int, bool]:
    """The step's token rows (its first norm launch with a row axis; 0: none) and whether its
    attention attends only the step's own keys: every key length its launches name equals those
    rows, so no cached context exists and every token is a prompt token (PHS033)."""
    if df.get("rows") is None or not len(seg):
        return 0, False
    rows = df["rows"][seg]
    first = np.flatnonzero(rows > 0)
    tokens = int(rows[first[0]]) if len(first) else 0
    if df.get("keys") is None:
        return tokens, False
    keys = df["keys"][seg]
    keys = keys[keys > 0]
    return tokens, bool(tokens > 0 and len(keys) and (keys == tokens).all())


def _m_regimes(kernels: pa.Table, facts: PhaseEvidence, th: Thresholds) -> np.ndarray:
    """Per kernel: the M regime (SKINNY / LARGE / BETWEEN) of a GEMM whose rule says which decoded tile
    runs along the tokens (PHS032), NO_REGIME for every other kernel and for the LM head and router."""
    n = kernels.num_rows
    out = np.full(n, NO_REGIME, np.int8)
    if not facts.token_tile or "tile_m" not in kernels.column_names:
        return out
    code, opts = _rule_codes(kernels, facts.token_tile)
    tm = kernels["tile_m"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    tn = kernels["tile_n"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    tile = np.zeros(n, np.int64)
    for i, which in enumerate(opts, start=1):
        on = code == i
        tile[on] = (tm if which == "m" else tn if which == "n" else np.minimum(tm, tn))[on]
    known = (tile > 0) & ~dict_isin(kernels["stage"], _NOT_TOKEN_ROWS)
    out[known] = BETWEEN
    out[known & (tile <= th.skinny_token_tile)] = SKINNY
    out[known & (tile >= th.large_token_tile)] = LARGE
    return out


def _step_regime(members: np.ndarray, df: Any) -> str | None:
    """A step's M regime (PHS032): skinny / large where its regimed GEMMs show only that one, mixed
    where they show both; tiles between the thresholds say nothing."""
    if "regime" not in df:
        return None
    r = df["regime"][members]
    skinny, large = bool((r == SKINNY).any()), bool((r == LARGE).any())
    return "mixed" if skinny and large else "skinny" if skinny else "large" if large else None


def _evidence_phase(seg: np.ndarray, df: Any) -> tuple[str | None, str]:
    """The phase a step's own kernels say, and the rule that said it: decode families alone ->
    decode, prefill families, long-query grids or keys of the step's own tokens alone -> prefill,
    both -> mixed; None without any. The rule is PHS030 / PHS033 where a grid / the key lengths
    alone said it, else PHS025."""
    ev = df["evidence"][seg]
    dec = bool((ev == DECODE_EVIDENCE).any())
    by_family = bool((ev == PREFILL_EVIDENCE).any())
    by_grid = bool((ev == PREFILL_GRID_EVIDENCE).any())
    fresh = _fresh_context(seg, df)[1]
    if dec or by_family:
        rule = KERNEL_EVIDENCE
    else:
        rule = GRID_QUERY_TILES if by_grid else FRESH_CONTEXT
    if dec and (by_family or by_grid or fresh):
        return "mixed", rule
    return ("decode" if dec else "prefill" if by_family or by_grid or fresh else None), rule


def _name_codes(kernels: pa.Table) -> np.ndarray:
    """One integer per distinct kernel name (-1: none), so steps compare their kernels by name."""
    names = dict_strings(kernels["norm_name"] if "norm_name" in kernels.column_names else kernels["name"])
    return names.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def _is_fill(kernels: pa.Table) -> np.ndarray:
    """Buffer fills: memsets and the framework's fill kernels."""
    names = dict_strings(kernels["norm_name"] if "norm_name" in kernels.column_names else kernels["name"])
    # matched once per distinct name: the names themselves are never expanded per row
    fill = pc.fill_null(pc.match_substring(names.dictionary, _FILL_WORDS[0]), False)
    for w in _FILL_WORDS[1:]:
        fill = pc.or_(fill, pc.fill_null(pc.match_substring(names.dictionary, w), False))
    fill = fill.take(names.indices)
    return pc.fill_null(fill, False).to_numpy(zero_copy_only=False) | dict_isin(kernels["kind"], ["memset"])


# --------------------------------------------------------------------------- annotated steps


def _steps_from_annotations(
    idx: np.ndarray,
    df: pd.DataFrame,
    launch_ts: np.ndarray,
    launched: np.ndarray,
    anns: list[StepAnnotation],
    step: np.ndarray,
    phase: np.ndarray,
    tokens: np.ndarray,
    warnings: list[str],
    tid: int,
) -> list[dict[str, Any]]:
    # A step is the CPU range around the launch calls of its kernels. The profiler's GPU copy of a
    # range covers only the kernels whose innermost range it is, so once ranges nest (an engine's
    # step around its own module ranges) it misses most of the step: the GPU copies decide only
    # where the launch calls are not known (most kernels without one: no runtime events kept).
    gpu = [a for a in anns if a.side == "gpu"]
    cpu = [a for a in anns if a.side != "gpu"]
    on_gpu = bool(gpu) and not (cpu and launched[idx].mean() >= 0.5)
    use = merge_nested(sorted(gpu if on_gpu else cpu, key=lambda a: a.start_ns))
    for a, b in zip(use, use[1:], strict=False):
        if b.start_ns < a.end_ns:
            warnings.append(f"trace {tid}: overlapping step annotations {a.name!r} and {b.name!r}")
            break
    start = df["start"][idx]
    key = start if on_gpu else launch_ts[idx]
    rows = []
    k_start = df["start"]
    k_dur = df["dur"]
    # launch times are nearly, not exactly, in kernel order: a step's kernels are found by a
    # sorted search on them, then put back in kernel order (a mask per step is quadratic)
    by_launch = None if on_gpu else np.argsort(key, kind="stable")
    sorted_key = key if on_gpu else key[by_launch]
    for s, a in enumerate(use):
        lo = np.searchsorted(sorted_key, a.start_ns, side="left")
        hi = np.searchsorted(sorted_key, a.end_ns, side="left")
        members = idx[lo:hi] if by_launch is None else idx[np.sort(by_launch[lo:hi])]
        members = members[step[members] < 0]
        if len(members) == 0:
            warnings.append(f"trace {tid}: step annotation {a.name!r} holds no kernel")
            continue
        step[members] = s
        phase[members] = a.phase
        tokens[members] = a.tokens
        ks, ke = k_start[members], k_start[members] + k_dur[members]
        lo_t = min(int(ks.min()), a.start_ns) if on_gpu else int(ks.min())
        hi_t = max(int(ke.max()), a.end_ns) if on_gpu else int(ke.max())
        evidence = (ANNOTATION_STEPS, MERGE_NESTED) if a.merged else (ANNOTATION_STEPS,)
        label = StepLabel(
            a.phase, a.tokens, a.prefill_tokens, a.decode_tokens, a.model, a.verify_k, a.engine, evidence
        )
        rows.append(_step_row(tid, df, members, s, label, lo_t, hi_t, "annotation:" + a.name[:60]))
    return rows


def merge_nested(anns: list[StepAnnotation]) -> list[StepAnnotation]:
    """Engines and patches often annotate one step twice (``execute_...`` around ``step[...]``):
    annotations that mostly overlap are one step, with the outer range and whichever tokens and
    phase are known."""
    out: list[StepAnnotation] = []
    for a in anns:
        if out:
            b = out[-1]
            inter = min(a.end_ns, b.end_ns) - max(a.start_ns, b.start_ns)
            shorter = max(min(a.end_ns - a.start_ns, b.end_ns - b.start_ns), 1)
            if inter >= 0.5 * shorter:
                phase = b.phase if b.phase != "unknown" else a.phase
                if "unknown" not in (a.phase, b.phase) and a.phase != b.phase:
                    phase = "mixed"
                out[-1] = dataclasses.replace(
                    b,
                    start_ns=min(a.start_ns, b.start_ns),
                    end_ns=max(a.end_ns, b.end_ns),
                    phase=phase,
                    tokens=b.tokens if b.tokens is not None else a.tokens,
                    prefill_tokens=b.prefill_tokens if b.prefill_tokens is not None else a.prefill_tokens,
                    decode_tokens=b.decode_tokens if b.decode_tokens is not None else a.decode_tokens,
                    model=b.model if b.model != "target" else a.model,
                    verify_k=b.verify_k if b.verify_k is not None else a.verify_k,
                    name=b.name if len(b.name) <= len(a.name) else a.name,
                    engine=b.engine if len(b.name) <= len(a.name) else a.engine,
                    merged=True,
                )
                continue
        out.append(a)
    return out


@dataclasses.dataclass(frozen=True)
class StepLabel:
    """What a step row says besides its timing: phase, token counts, model, verify width."""

    phase: str
    tokens: int | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    model: str = "target"
    verify_k: int | None = None
    rule: str = ""  # the id of the rule (or annotation pattern) that decided the phase
    evidence: tuple[str, ...] = ()  # the ids of the rules whose evidence the decision used


def _step_row(
    tid: int,
    df: Any,
    members: np.ndarray,
    s: int,
    label: StepLabel,
    lo: int,
    hi: int,
    source: str,
) -> dict[str, Any]:
    st = df["start"][members]
    en = st + df["dur"][members]
    return {
        "trace_id": int(tid),
        "rank": int(df["rank"][members[0]]),
        "step": int(s),
        "phase": label.phase,
        "start_ns": int(lo),
        "dur_ns": int(hi - lo),
        "busy_ns": intervals.busy_ns(st, en),
        "kernel_ns": int(df["dur"][members].sum()),
        "kernels": len(members),
        "tokens": label.tokens,
        "prefill_tokens": label.prefill_tokens,
        "decode_tokens": label.decode_tokens,
        "model": label.model,
        "verify_k": label.verify_k,
        "source": source,
        "phase_rule": label.rule,
        "phase_evidence": list(dict.fromkeys(label.evidence)),
        "m_regime": _step_regime(members, df),
    }


# --------------------------------------------------------------------------- unannotated steps


def _stage_is(stages: Any, wanted: Sequence[str]) -> np.ndarray:
    """Per position: the stage is one of ``wanted``; ``stages`` as strings, or as a dictionary
    array (tested once per distinct stage)."""
    if isinstance(stages, (pa.Array, pa.ChunkedArray)):
        return dict_isin(stages, wanted)
    return np.isin(np.asarray(stages), list(wanted))


def forward_starts(stages: Any) -> np.ndarray:
    """Positions (in time order) where a forward begins: its first embedding lookup; for a forward without
    an embedding kernel (compiled into a fused kernel, replayed from a graph, run on the host), the
    first norm / QKV GEMM / attention kernel after the previous forward's LM head. ``stages``: the
    kernels' stages in time order (strings, or a dictionary array)."""
    is_emb = _stage_is(stages, ("embedding",))
    emb = np.flatnonzero(is_emb)
    # embedding kernels with no GEMM, attention or norm between them start one forward: a gather
    # and its scale, or the token lookup and a learned position lookup after the mask work (OPT)
    work = np.concatenate([[0], np.cumsum(_stage_is(stages, (*HEAVY_STAGES, "norm")))])
    joined = work[emb[1:]] == work[emb[:-1] + 1] if len(emb) else np.zeros(0, bool)
    starts = emb[np.concatenate([[True], ~joined])].tolist() if len(emb) else []
    attn = _stage_is(stages, ATTENTION_KERNEL_STAGES)
    if not attn.any():
        return np.asarray(starts, np.int64)
    is_open = _stage_is(stages, ("norm", "qkv_gemm", "embedding", *ATTENTION_KERNEL_STAGES))
    opens = np.flatnonzero(is_open)
    lm = np.flatnonzero(_stage_is(stages, ("lm_head_gemm",)))
    if not starts:
        starts = [0]
    for p in lm.tolist():
        k = int(np.searchsorted(opens, p + 1))
        if k < len(opens) and not is_emb[opens[k]]:
            starts.append(int(opens[k]))
    return np.unique(np.asarray(starts, np.int64))


def _steps_from_structure(
    idx: np.ndarray,
    df: Any,
    kernels: pa.Table,
    shapes: dict[int, dict[str, np.ndarray]],
    step: np.ndarray,
    phase: np.ndarray,
    tokens: np.ndarray,
    tid: int,
    warnings: list[str] | None = None,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> list[dict[str, Any]]:
    stages = df["stage"][idx]
    taken = df["stage_dict"].take(pa.array(idx))
    found = forward_starts(taken)
    starts = _graph_launch_start(found, df["corr"][idx], df["graph"][idx], df["fill"][idx], th)
    moved = set(starts.tolist()) - set(found.tolist())  # starts a graph replay moved back
    source, finder = "forward", FORWARD_STARTS
    k_st = df["start"][idx]
    k_du = df["dur"][idx]
    prefix = -1
    bare = not _stage_is(taken, ("embedding", "lm_head_gemm")).any()
    gaps = _gap_starts(k_st, k_du, th) if len(starts) == 0 or (bare and len(starts) <= 1) else None
    if gaps is not None and (len(starts) == 0 or len(gaps) > 1):
        # no forward start to cut at (no embedding, no LM head: the layers alone): idle gaps cut
        starts = gaps
        source, finder = "gaps", GAP_STEPS
    elif starts[0] > 0 and df["is_heavy"][idx[: starts[0]]].any():
        # a forward before the first recognised one (its embedding ran elsewhere, e.g. on the
        # host): the prefix is a step of its own rather than time outside every step
        first_heavy = int(np.flatnonzero(df["is_heavy"][idx[: starts[0]]])[0])
        lead = first_heavy
        while lead > 0 and stages[lead - 1] not in ("memset", "memcpy"):
            lead -= 1
        starts = np.unique(np.concatenate([[lead], starts]))
        prefix = lead
    bounds = list(starts.tolist()) + [len(idx)]
    found_by = [
        (finder, HEAVY_PREFIX) if a == prefix else (finder, GRAPH_LAUNCH_START) if a in moved else (finder,)
        for a, b in zip(bounds, bounds[1:], strict=False)
        if b > a
    ]
    segments = [idx[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    if not segments:
        return []
    labels = label_steps(segments, df, shapes.get(int(tid)), warnings, tid, th)
    labels = [
        dataclasses.replace(lab, evidence=(*f, *lab.evidence))
        for lab, f in zip(labels, found_by, strict=True)
    ]
    doubt = unshaped_prefill_runs(labels)
    for i in doubt:
        labels[i] = dataclasses.replace(
            labels[i],
            phase="unknown",
            rule=UNSHAPED_PREFILL_RUN,
            evidence=(*labels[i].evidence, labels[i].rule),
        )
    if doubt and warnings is not None:
        warnings.append(
            f"trace {tid}: {len(doubt)} steps run a prefill's kernels right after another prefill step "
            "and no shapes were recorded: under continuous batching or chunked prefill each may be a "
            "prompt chunk alone or one beside decode tokens (mixed), so their phase is unknown; "
            "capture with record_shapes=True to count each step's prefill and decode tokens"
        )
    rows = []
    k_start = df["start"]
    for s, seg in enumerate(segments):
        step[seg] = s
        phase[seg] = labels[s].phase
        tokens[seg] = labels[s].tokens
        lo = int(k_start[seg[0]])
        if s + 1 < len(segments):
            hi = int(k_start[segments[s + 1][0]])
        else:
            hi = int((k_start[seg] + df["dur"][seg]).max())
        rows.append(_step_row(tid, df, seg, s, labels[s], lo, hi, source))
    return rows


def label_steps(
    segments: list[np.ndarray],
    df: Any,
    shapes: dict[str, np.ndarray] | None,
    warnings: list[str] | None = None,
    tid: int = 0,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> list[StepLabel]:
    """The label of each unannotated step: from its attention ops' shapes where recorded
    (:func:`phase_from_shape`), else from the kernels' signature (:func:`_label_from_signature`);
    the model (``draft`` where a second, smaller model's steps interleave with the target's, told by
    the attention ops' count and head size) and the verify width of multi-token decode steps.

    A continuous batcher that replays CUDA graphs pads every step to the graph's sizes: packed steps
    whose key length never changes are padded (their shapes say nothing of their tokens), and a
    graph replay in a run of packed steps may hold prompt chunks as well as decodes. Such steps get
    ``unknown`` and a warning, not a guess."""
    hits = [_step_shapes(seg, df, shapes) for seg in segments]
    rows_out = [int(df["lm_rows"][seg].max()) if len(seg) else -1 for seg in segments]
    packed = [h is not None and _is_packed(h[0], h[1], r) for h, r in zip(hits, rows_out, strict=True)]
    scored = _every_token_scored(hits, rows_out)
    one_model = len({h[3] for h in hits if h is not None}) <= 1
    if any(packed) and one_model:
        # a continuous batcher's run: its step of decodes alone packs one token per request
        packed = [pk or sc for pk, sc in zip(packed, scored, strict=True)]
    verify_max = int(th.max_verify_tokens)
    phases: list[str | None] = [
        None if h is None else phase_of_packed(h[1], h[2], r) if pk else phase_from_shape(*h[:3], verify_max)
        for h, r, pk in zip(hits, rows_out, packed, strict=True)
    ]
    # which rule decided each phase, and the rules whose evidence it used
    rules: list[str] = [
        "" if h is None else PACKED_PHASE if pk else _shape_rule(h[1], h[2], verify_max)
        for h, pk in zip(hits, packed, strict=True)
    ]
    evidence: list[list[str]] = [[PACKED_STEP] if pk else [] for pk in packed]
    # outside a batcher's run, one sequence of many tokens that all score over a cached context is
    # a batcher's decodes or a continuation with every logit kept: no phase
    doubtful = [
        i
        for i, (h, sc, pk) in enumerate(zip(hits, scored, packed, strict=True))
        if sc and not pk and h is not None and h[1] > verify_max
    ]
    for i in doubtful:
        evidence[i].append(rules[i])
        rules[i] = SCORED_UNKNOWN
    _no_phase(
        phases, doubtful, warnings,
        f"trace {tid}: {len(doubtful)} steps score every token of one sequence over a cached "
        "context: a continuous batcher's decodes (one token per request) or a continuation that "
        "keeps every logit, so their phase is unknown (capture a step that also holds a prompt "
        "chunk, or engine step annotations, to tell them)",
    )  # fmt: skip
    recomputed_prefix(hits, packed, phases, rules, evidence)
    # each step's own kernels: families engines run in one phase only decide a step without shapes,
    # and a step whose shapes say otherwise has no phase (the two kinds of evidence contradict)
    said = [_evidence_phase(seg, df) if "evidence" in df else (None, KERNEL_EVIDENCE) for seg in segments]
    conflict = []
    for i, (ph, (ev, by)) in enumerate(zip(phases, said, strict=True)):
        if ev is None or i in doubtful:
            continue
        grid = (
            [GRID_QUERY_TILES] if bool((df["evidence"][segments[i]] == PREFILL_GRID_EVIDENCE).any()) else []
        )
        if _fresh_context(segments[i], df)[1]:
            grid.append(FRESH_CONTEXT)
        if ph is None:
            phases[i], rules[i] = ev, by
            evidence[i] += [r for r in grid if r != by]
        elif ev != "mixed" and ph != "mixed" and ev != ph:
            evidence[i] += [rules[i], KERNEL_EVIDENCE, *grid]
            rules[i] = EVIDENCE_CONFLICT
            conflict.append(i)
        else:
            evidence[i] += [KERNEL_EVIDENCE, *grid]
    _no_phase(
        phases, conflict, warnings,
        f"trace {tid}: {len(conflict)} steps have attention shapes of one phase and kernels that "
        "engines run only in the other: their phase is unknown (check the rule's `phases` with "
        "`rules explain`)",
    )  # fmt: skip
    depth = [int(df["layer"][seg].max()) + 1 if "layer" in df and len(seg) else 0 for seg in segments]
    by_depth = _depth_models(depth)  # draft / target without shapes, or None
    if any(p is None for p in phases):
        sig, sig_rules = _signature_by_model(segments, df, by_depth, th)
        for i, p in enumerate(phases):
            if p is None:
                phases[i], rules[i] = sig[i], sig_rules[i]
                if by_depth is not None:
                    evidence[i] += [SIGNATURE_BY_MODEL, MODELS_BY_DEPTH]
    if SINGLE_STEP in rules and warnings is not None:
        warnings.append(
            f"trace {tid}: a single step with no recorded shapes and no kernels that engines run in one "
            "phase only: its phase is unknown (a step is never decided by its position; a run of several "
            "steps, record_shapes=True or engine step annotations tell it)"
        )
    undecided = set(_padded_or_replayed(segments, df, hits, packed))
    decodes = packed_decode_tokens(
        [(h[1], h[2], r) if h is not None else None for h, r in zip(hits, rows_out, strict=True)],
        [pk and i not in undecided for i, pk in enumerate(packed)],
    )
    for i, d in enumerate(decodes):
        if d is not None and hits[i] is not None:
            q = hits[i][1]
            phases[i] = "prefill" if d == 0 else "decode" if d == q else "mixed"
            evidence[i].append(rules[i])
            rules[i] = PACKED_BOOKKEEPING
    for i in undecided:
        evidence[i].append(rules[i])
        rules[i] = PADDED_OR_REPLAYED
    _no_phase(
        phases, undecided, warnings,
        f"trace {tid}: {len(undecided)} steps of a continuous batcher have no phase: their attention "
        "ops are padded to fixed sizes or replayed from a CUDA graph, so they show neither their "
        "prompt nor their decode tokens (capture without CUDA graphs, or with engine step "
        "annotations, to tell them)",
    )  # fmt: skip
    models = _models(hits, phases, by_depth)
    by_shape = len({h[3] for h, p in zip(hits, phases, strict=True) if h is not None and p == "decode"}) >= 2
    if by_shape or by_depth is not None:
        for ev in evidence:
            ev.append(MODELS_BY_SHAPE if by_shape else MODELS_BY_DEPTH)
    # graph-replayed decode steps record no shapes: with static batching each sequence of the
    # prefill batch adds one token per decode step
    batches = {h[0] for h, p in zip(hits, phases, strict=True) if h is not None and p == "prefill"}
    batch = batches.pop() if len(batches) == 1 else None
    speculative = "draft" in models
    # a decode step without shapes: the sequences its decode family's launches count (PHS031)
    seqs = [int(df["seqs"][seg].max()) if df.get("seqs") is not None and len(seg) else 0 for seg in segments]
    # a step without shapes: the token rows of its first norm launch with a row axis (PHS034)
    rows = [_fresh_context(seg, df)[0] for seg in segments]
    out: list[StepLabel] = []
    for h, ph, model, pk, d_packed, rule, ev in zip(
        hits, phases, models, packed, decodes, rules, evidence, strict=True
    ):
        tok = verify = None
        if h is not None:
            b, q = h[0], h[1]
            tok = q * (b if b > 0 else 1)
            # a target's multi-token decode step verifies a speculation (its LM head scores every
            # candidate: not packed, :func:`_is_packed`); only where a draft model's steps show the
            # speculation: a continuous batcher's step of decodes alone looks the same (one packed
            # sequence, every token scored)
            if ph == "decode" and q > 1 and model == "target" and not pk and speculative:
                verify = q
                ev.append(VERIFY_WIDTH)
        elif ph == "decode" and seqs[len(out)] > 0:
            tok = seqs[len(out)]
            ev.append(GRID_SEQUENCES)
        elif rows[len(out)] > 0:
            tok = rows[len(out)]
            ev.append(NORM_ROWS)
        elif ph == "decode" and batch:
            tok = batch
            ev.append(STATIC_BATCH)
        pre = dec = None
        if tok is not None:
            pre, dec = (tok, 0) if ph == "prefill" else (0, tok) if ph == "decode" else (None, None)
        if pk and d_packed is not None and tok is not None:
            pre, dec = tok - d_packed, d_packed
        out.append(StepLabel(str(ph), tok, pre, dec, model, verify, rule, tuple(dict.fromkeys(ev))))
    return out


def recomputed_prefix(
    hits: Sequence[tuple[int, int, int, Any] | None],
    packed: Sequence[bool],
    phases: list[str | None],
    rules: list[str],
    evidence: list[list[str]],
) -> list[int]:
    """PHS035: a model run without a KV cache recomputes every sequence at each step. A step whose
    shapes say prefill (its query as long as its keys: no cached context) but whose query is the
    previous such step's plus one token per sequence, with the same batch and model, is that
    previous step continued by one generated token: a decode step (its tokens: every token it
    runs, as the engine's own step says). The first step of such a run stays the prefill. Returns
    the steps relabelled."""
    out = []
    for i in range(1, len(hits)):
        h, g = hits[i], hits[i - 1]
        if h is None or g is None or packed[i] or packed[i - 1] or rules[i] != SHAPE_PREFILL:
            continue
        if rules[i - 1] not in (SHAPE_PREFILL, RECOMPUTED_PREFIX):
            continue
        same = h[0] == g[0] and h[0] > 0 and h[3] == g[3]
        if same and h[1] == g[1] + 1 and h[2] == h[1] and g[2] == g[1]:
            phases[i] = "decode"
            evidence[i].append(rules[i])
            rules[i] = RECOMPUTED_PREFIX
            out.append(i)
    return out


def _no_phase(phases: list[str | None], steps: Any, warnings: list[str] | None, why: str) -> None:
    """Mark ``steps`` (positions) ``unknown`` and, if there are any, say ``why`` among the warnings."""
    for i in steps:
        phases[i] = "unknown"
    if steps and warnings is not None:
        warnings.append(why)


def _every_token_scored(
    hits: Sequence[tuple[int, int, int, tuple[int, int]] | None], rows_out: Sequence[int]
) -> list[bool]:
    """Per step: one sequence (or a batch unknown) of several query tokens over a cached context
    whose every token the LM head scores: a continuous batcher's step of decodes alone (one token
    per request, packed), or one sequence continued with every logit kept (a speculation's verify,
    a perplexity window)."""
    return [
        h is not None and h[0] <= 1 and 1 < h[1] < h[2] and r == h[1]
        for h, r in zip(hits, rows_out, strict=True)
    ]


def _padded_or_replayed(
    segments: list[np.ndarray],
    df: Any,
    hits: Sequence[tuple[int, int, int, tuple[int, int]] | None],
    packed: Sequence[bool],
) -> list[int]:
    """Steps of a continuous batcher whose phase the trace cannot show: packed steps whose key
    length is the same on every one of them (two or more: padded to the cache's size), and, in a
    run with packed steps, graph replays without shapes."""
    at = [i for i, pk in enumerate(packed) if pk and hits[i] is not None]
    if not at:
        return []
    keys = {hits[i][2] for i in at}  # type: ignore[index]
    longest = max(hits[i][1] for i in at)  # type: ignore[index]
    # the same key length on every packed step, longer than any step's queries (not new prompts)
    padded = len(at) >= 2 and len(keys) == 1 and min(keys) > longest
    out = list(at) if padded else []
    for i, seg in enumerate(segments):
        if hits[i] is None and len(seg) and df["graph"][seg].mean() > 0.5:
            out.append(i)
    return sorted(out)


def unshaped_prefill_runs(labels: Sequence[StepLabel]) -> list[int]:
    """The prefill steps without token counts (told from kernels, not shapes) that come right after
    another such prefill step of the same model: back-to-back forwards over many tokens are a
    continuous batcher's or a chunked prefill's, and kernels alone cannot tell a pure prompt chunk
    from one beside decodes. The first of a run is a prefill: nothing ran before it to decode."""
    return [
        i + 1
        for i, (a, b) in enumerate(zip(labels, labels[1:], strict=False))
        if a.phase == b.phase == "prefill" and a.tokens is None and b.tokens is None and a.model == b.model
    ]


def packed_decode_tokens(
    steps: Sequence[tuple[int, int, int] | None], packed: Sequence[bool]
) -> list[int | None]:
    """Decode tokens of each packed step by request bookkeeping; None where it cannot be told.

    ``steps``: per step in time order, (query tokens, key tokens, LM-head rows) or None. A packed
    step's keys less its queries are the cached context of the requests it continues; when that
    equals the previous step's keys, every request of the previous step continues (one LM-head row
    each) and the rest are new prompts. A continued request decodes unless its prompt was cut at the
    previous step's end: a continuous batcher fills a token budget (the largest step) with decodes
    first and prompt chunks after, so only a step that filled the budget leaves one prompt cut. A
    step with no cached context is a prefill (0); one token per row is decode. Where requests
    finished in between, or the counts contradict each other, the split stays undecided (None)."""
    known = [t[0] for t in steps if t is not None and t[0] > 0]
    budget = max(known, default=0)
    # a token budget shows as a cap that several steps reach; without that evidence a full-sized step
    # may or may not have cut a prompt, and the split after it stays undecided
    capped = known.count(budget) >= 2
    out: list[int | None] = [None] * len(steps)
    for i, (t, pk) in enumerate(zip(steps, packed, strict=True)):
        if t is None or not pk:
            continue
        q, kv, rows = t
        if q <= 0 or rows <= 0:
            continue
        ph = phase_of_packed(q, kv, rows)
        if ph != "mixed":  # no cached context, or one token per row
            out[i] = 0 if ph == "prefill" else q
            continue
        prev = steps[i - 1] if i > 0 else None
        if prev is None or kv < 0 or prev[1] <= 0 or prev[2] <= 0 or kv - q != prev[1]:
            continue
        prev_decode = out[i - 1] if packed[i - 1] else (0 if prev[0] > prev[2] else prev[0])
        full = prev[0] == budget and (prev_decode is None or prev_decode < prev[0])
        if full and not capped:
            continue
        cut = int(full)
        continued = prev[2]
        decode, new = continued - cut, rows - continued
        if decode >= 0 and new >= 0 and q - decode >= new + cut:
            out[i] = decode
    return out


# a decode step scores this many query tokens per sequence at most (one, or a speculation's
# candidates being verified); a longer continuation of a cached sequence is a prefill chunk
MAX_VERIFY_TOKENS = int(DEFAULT_THRESHOLDS.max_verify_tokens)


def phase_from_shape(batch: int, q: int, kv: int, max_verify: int = MAX_VERIFY_TOKENS) -> str:
    """Phase of a step from its attention op's query length ``q`` and key length ``kv`` (-1: unknown):
    one query token per sequence is decode; a few tokens appended to a longer cached context are
    a speculation being verified (decode); a query as long as its keys, or a long chunk, is prefill."""
    if q == 1:
        return "decode"
    if 0 < q < kv and q <= max_verify:
        return "decode"
    return "prefill"


def _shape_rule(q: int, kv: int, max_verify: int) -> str:
    """The id of the rule :func:`phase_from_shape` decided by."""
    if q == 1:
        return SHAPE_ONE_TOKEN
    if 0 < q < kv and q <= max_verify:
        return SHAPE_VERIFY
    return SHAPE_PREFILL


def _is_packed(batch: int, q: int, rows_out: int) -> bool:
    """Several sequences packed into one attention call (continuous batching: HF's paged attention,
    varlen kernels): the LM head scores more rows than the attention op has sequences, and fewer
    than its query tokens (a forward that scores every position, full-logits prefill or a
    speculation's verify, is one sequence per attention batch row, not a packing)."""
    return rows_out > 1 and rows_out > max(batch, 1) and rows_out < q * max(batch, 1)


def phase_of_packed(q: int, kv: int, rows_out: int) -> str:
    """Phase of a packed step from its total query tokens ``q``, total keys ``kv`` (-1: unknown) and
    the rows the LM head scores (one per sequence): no cached context is a prefill of new prompts;
    at most one token per sequence is decode; otherwise the step appends prompt chunks to cached
    sequences beside other sequences, which a continuous batcher schedules with decodes: mixed
    (``docs/accuracy.md`` names the case it gets wrong: several prompt chunks and no decode)."""
    if 0 < kv <= q:
        return "prefill"
    if q <= rows_out:
        return "decode"
    return "mixed"


def _lm_head_rows(kernels: pa.Table, host_ops: pa.Table) -> np.ndarray:
    """Per kernel: the rows an LM-head GEMM multiplies (its op's input rows), -1 elsewhere."""
    out = np.full(kernels.num_rows, -1, np.int32)
    lm = np.flatnonzero(dict_isin(kernels["stage"], ["lm_head_gemm"]))
    if not len(lm) or host_ops.num_rows == 0:
        return out
    found = launches.launching_op_rows(kernels, host_ops)
    if found is None:
        return out
    ops, pos = found
    at = pos.take(pa.array(lm))
    valid = at.is_valid().to_numpy(zero_copy_only=False)
    lm, at = lm[valid], at.filter(pa.array(valid))
    if not len(lm):
        return out
    op_rows = ops["row"].take(at)
    names = host_ops["name"].take(op_rows).to_pylist()
    dims = host_ops["input_dims"].take(op_rows).to_pylist()
    for r, nm, d in zip(lm.tolist(), names, dims, strict=True):
        out[r] = _gemm_rows(nm, d)
    return out


def _gemm_rows(op: str | None, dims: Any) -> int:
    """Rows (M) of a recorded GEMM op's activation (``rules/work_ops.toml``), -1 when the shapes do not say."""
    return WORK_OPS.rows(op, dims)


def _signature_by_model(
    segments: list[np.ndarray], df: Any, models: list[str] | None, th: Thresholds = DEFAULT_THRESHOLDS
) -> tuple[list[str], list[str]]:
    """:func:`_label_from_signature`, within each model of a speculative run told by its layer count
    (``models``, from :func:`_depth_models`; None: one model): a large target's verify steps
    outweigh its draft's decode steps many times and would all look like prefills beside them.
    Returns the phases and the ids of the rules that decided them."""
    if models is None:
        return _label_from_signature(segments, df, th)
    out = [""] * len(segments)
    why = [""] * len(segments)
    for name in ("draft", "target"):
        at = [i for i, m in enumerate(models) if m == name]
        phases, rules = _label_from_signature([segments[i] for i in at], df, th)
        for i, ph, rule in zip(at, phases, rules, strict=True):
            out[i], why[i] = ph, rule
    return out, why


def _depth_models(depth: Sequence[int]) -> list[str] | None:
    """``draft`` / ``target`` per step from the decoder layers each step ran, where exactly two
    depths alternate (each at least twice, three switches or more, the shallower at most half the
    deeper): a speculative run without shapes. None otherwise."""
    seq = [d for d in depth if d > 0]
    kinds = sorted(set(seq))
    if len(kinds) != 2 or 2 * kinds[0] > kinds[1] or min(seq.count(k) for k in kinds) < 2:
        return None
    if sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b) < 3:
        return None
    return ["draft" if d == kinds[0] else "target" for d in depth]


def _models(
    hits: list[tuple[int, int, int, tuple[int, int]] | None],
    phases: list[str | None],
    by_depth: list[str] | None = None,
) -> list[str]:
    """``target`` or ``draft`` per step. Speculative decoding runs two models whose decode steps
    interleave: their attention ops differ in count (layers) and head size; the larger is the target.
    Without shapes, by the decoder layers the walk numbered in each step (``by_depth``, from
    :func:`_depth_models`)."""
    keys = {h[3] for h, p in zip(hits, phases, strict=True) if h is not None and p == "decode"}
    if len(keys) >= 2:
        target = max(keys)
        return ["draft" if h is not None and h[3] in keys and h[3] != target else "target" for h in hits]
    if not keys and by_depth is not None and len(by_depth) == len(hits):
        return by_depth
    return ["target"] * len(hits)


MAX_STAGING_FILLS = int(DEFAULT_THRESHOLDS.max_staging_fills)


def _graph_launch_start(
    starts: np.ndarray,
    corr: np.ndarray,
    graph: np.ndarray,
    fill: np.ndarray,
    th: Thresholds = DEFAULT_THRESHOLDS,
) -> np.ndarray:
    """A forward replayed from a CUDA/HIP graph begins with the graph's first kernel (position ids,
    buffer fills ... come before the embedding), so move each start back to it; the eager fills
    launched right before the replay reset its static input buffers, so they open the step too."""
    out = []
    for s in starts.tolist():
        if graph[s]:
            while s > 0 and graph[s - 1] and corr[s - 1] == corr[s]:
                s -= 1
            k = 0
            while s > 0 and k < th.max_staging_fills and not graph[s - 1] and fill[s - 1]:
                s -= 1
                k += 1
        out.append(s)
    return np.unique(np.asarray(out, np.int64))


def _gap_starts(start: np.ndarray, dur: np.ndarray, th: Thresholds = DEFAULT_THRESHOLDS) -> np.ndarray:
    if len(start) == 0:
        return np.empty(0, np.int64)
    end = np.maximum.accumulate(start + dur)
    gaps = start[1:] - end[:-1]
    if len(gaps) == 0:
        return np.array([0])
    thresh = max(th.min_gap_ns, th.gap_factor * float(np.median(np.maximum(gaps, 0))))
    cuts = np.flatnonzero(gaps > thresh) + 1
    return np.concatenate([[0], cuts]).astype(np.int64)


def attention_shapes(
    host_ops: pa.Table, table: AttentionOps, attention_launchers: np.ndarray
) -> dict[int, dict[str, np.ndarray]]:
    """Per trace, the attention host ops of ``table`` with recorded input shapes, in start order:
    ``start``, ``ext`` (external id, -1: none), ``batch`` (-1: packed), ``q`` (query length),
    ``kv`` (key length, -1: unknown), ``layout`` (the layout's id) and ``head`` (head size, -1: unknown).

    Each op is read by its own layout (``rules/attention_ops.toml``): the backends put the query
    length in different dimensions. An op of a ``composed`` layout (a plain matmul) counts only
    where it encloses one of ``attention_launchers`` (the host-op rows that launched attention
    kernels: the matmul's own bmm)."""
    if host_ops.num_rows == 0 or "input_dims" not in host_ops.column_names:
        return {}
    names = dict_strings(host_ops["name"])
    layouts = [table.layout(n) for n in names.dictionary.to_pylist()]
    known = np.asarray([lay is not None for lay in layouts] + [False], bool)
    composed = np.asarray([lay is not None and lay.composed for lay in layouts] + [False], bool)
    codes = names.indices.fill_null(len(layouts)).to_numpy(zero_copy_only=False)
    wanted = known[codes]
    maybe = np.flatnonzero(wanted & composed[codes])
    if len(maybe):
        # a composed layout's op counts where it encloses an attention kernel's launching op
        inside = launches.enclosing_op(host_ops, maybe, attention_launchers)
        wanted[maybe] = False
        wanted[maybe[np.unique(inside[inside >= 0])]] = True
    rows = np.flatnonzero(wanted)
    if len(rows) == 0:
        return {}
    sel = host_ops.select(["trace_id", "external_id", "start_ns"]).take(pa.array(rows))
    group_names, first, inverse = launches.distinct_op_shapes(host_ops, rows)
    dims_of = host_ops["input_dims"].take(pa.array(rows[first])).to_pylist()
    group_layouts = [
        table.layout(nm, d) if nm is not None else None for nm, d in zip(group_names, dims_of, strict=True)
    ]
    read = [_read_layout(lay, d) for lay, d in zip(group_layouts, dims_of, strict=True)]
    ok = np.array([r is not None for r in read], bool)[inverse]
    trace = sel["trace_id"].to_numpy(zero_copy_only=False)
    start = sel["start_ns"].to_numpy(zero_copy_only=False)
    ok &= ~pd.isna(start)
    if not ok.any():
        return {}
    vals = np.array([r if r is not None else (0, 0, 0, 0) for r in read], np.int64)[inverse]
    lay_id = np.array([lay.id if lay else "" for lay in group_layouts], object)[inverse]
    ext = sel["external_id"].fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    out = {}
    for t in np.unique(trace[ok]).tolist():
        m = np.flatnonzero(ok & (trace == t))
        m = m[np.argsort(start[m].astype(np.int64), kind="stable")]
        out[int(t)] = {
            "start": start[m].astype(np.int64),
            "ext": ext[m],
            "batch": vals[m, 0],
            "q": vals[m, 1],
            "kv": vals[m, 2],
            "layout": lay_id[m],
            "head": vals[m, 3],
        }
    return out


def _read_layout(lay: Any, dims: Any) -> tuple[int, int, int, int] | None:
    """(batch, query length, key length, head size) of one attention op's input shapes by its
    layout (:meth:`~analyzer.knowledge.attention_ops.AttentionLayout.read`; -1: not given), or None
    when the shapes do not fit the layout."""
    got = lay.read(dims) if lay is not None else None
    return None if got is None else (got.batch, got.q, got.kv, got.head)


def _step_shapes(
    seg: np.ndarray, df: Any, shapes: dict[str, np.ndarray] | None
) -> tuple[int, int, int, tuple[int, int]] | None:
    """(batch, query length, key length, model key) of one step's first attention op, else None.

    The ops are the step's by host time (their start within the launch calls of the step's
    kernels), so ops that launch no kernel themselves (the SDPA front end above its backend, the
    math backend above its matmuls) count too; without launch calls, by the attention kernels'
    launching op. The model key is the number of attention ops of that layout and their head size."""
    if not shapes:
        return None
    if df["launched"][seg].any():
        launch = df["launch"][seg][df["launched"][seg]]
        lo = np.searchsorted(shapes["start"], int(launch.min()), side="left")
        hi = np.searchsorted(shapes["start"], int(launch.max()), side="right")
        pos = np.arange(lo, hi)
    else:
        att = seg[df["is_attn"][seg]]
        ext = df["ext"][att]
        ext = ext[ext == ext].astype(np.int64) if len(ext) else np.empty(0, np.int64)  # NaN: no host op
        pos = np.flatnonzero(np.isin(shapes["ext"], ext) & (shapes["ext"] >= 0))
    if len(pos) == 0:
        return None
    first = int(pos[0])
    same = int((shapes["layout"][pos] == shapes["layout"][first]).sum())
    key = (same, int(shapes["head"][first]))
    return int(shapes["batch"][first]), int(shapes["q"][first]), int(shapes["kv"][first]), key


def _label_from_signature(
    segments: list[np.ndarray], df: Any, th: Thresholds = DEFAULT_THRESHOLDS
) -> tuple[list[str], list[str]]:
    """Prefill steps do the same kernels' work over many tokens: their heavy kernels run longer, or
    (small models, where the time hardly grows with the tokens) run under other names: GEMM tiles
    and attention kernels picked for many query rows, which the run's repeated decode steps never
    use. A single step has nothing to be compared with: unknown. Returns the phases and the ids of
    the rules that decided them."""
    if len(segments) == 1:
        return ["unknown"], [SINGLE_STEP]
    work = []
    for seg in segments:
        dur = df["dur"][seg]
        heavy = dur[df["is_heavy"][seg]]
        work.append(float(np.median(heavy)) if len(heavy) else float(np.median(dur)))
    w = np.asarray(work)
    base = float(np.percentile(w, 25))
    by_work = (w > th.prefill_work_ratio * base) if base > 0 else np.zeros(len(w), bool)
    prefill = by_work.copy()
    if "name" in df:
        prefill |= (_novel_share(segments, df) > th.novel_share) & (w >= base)
    if prefill.all():
        return ["unknown"] * len(w), [SIGNATURE_ALL_HEAVY] * len(w)
    rules = [
        SIGNATURE_NOVEL if p and not bw else SIGNATURE_WORK for p, bw in zip(prefill, by_work, strict=True)
    ]
    return ["prefill" if p else "decode" for p in prefill], rules


# a step whose heavy kernel time is largely (a quarter and more) under names that most steps never
# run did other work (decode steps of the zoo and the H200 traces stay below 0.15)
NOVEL_SHARE = DEFAULT_THRESHOLDS.novel_share


def _novel_share(segments: list[np.ndarray], df: Any) -> np.ndarray:
    """Per step, the share of its heavy kernel time under names that at most half the steps run."""
    seg_of = np.concatenate([np.full(len(s), i) for i, s in enumerate(segments)])
    rows = np.concatenate(segments)
    heavy = df["is_heavy"][rows]
    seg_of, rows = seg_of[heavy], rows[heavy]
    if len(rows) == 0:
        return np.zeros(len(segments))
    code = df["name"][rows]
    pairs = np.unique(np.stack([seg_of, code]), axis=1)
    names, steps_with = np.unique(pairs[1], return_counts=True)
    common = names[steps_with >= len(segments) / 2]
    novel = ~np.isin(code, common)
    dur = df["dur"][rows].astype(float)
    tot = np.bincount(seg_of, dur, len(segments))
    nov = np.bincount(seg_of, dur * novel, len(segments))
    return np.divide(nov, tot, out=np.zeros(len(segments)), where=tot > 0)
