"""The one analysis path: Options -> Context (resolved once) -> the ordered analyses -> Analysis.

Contract:

* :func:`resolve_context` is the only place a run's knowledge is looked up: the rule set (with the
  user's rule files), op hints, annotation patterns, finding settings, the providers of shared kernel
  names (``rules/providers.toml``), the ``--gpu`` override and the
  ``--model`` architecture, each read and validated by :mod:`analyzer.knowledge` (which caches them).
* The analyses are pure functions of tables and the :class:`Context` (:mod:`analyzer.analyses`);
  this module holds their order, as two lists of steps, and is the only place that sequences them:

  - :data:`INPUT_STEPS` label each input from that input alone (and the run's GPU and world size):
    classification, phases, roofline. Inputs may run them apart and be joined
    (:mod:`analyzer.runtime.rank_workers`);
  - :data:`RUN_STEPS` need the whole run: its warnings, then the findings.

  A step takes an :class:`Analysis` and returns a new one (``dataclasses.replace``); none mutates the
  analysis it is given, opens a file, starts a process or reads the environment.
* Loading the traces (processes, pools, the parsed-trace cache) belongs to :mod:`analyzer.runtime`,
  whose ``analyze`` calls :func:`analyze_trace` here: the CLI, the tests and the Python API all take
  that path.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.analyses import brief, classify, findings, phases, roofline
from analyzer.errors import UsageError, option
from analyzer.knowledge import architectures, brief_settings, hardware, kernel_rules
from analyzer.knowledge.annotations import load_annotation_patterns
from analyzer.knowledge.attention_ops import AttentionOps, load_attention_ops
from analyzer.knowledge.finding_settings import load_finding_settings
from analyzer.knowledge.op_hints import load_op_hints
from analyzer.knowledge.provider_ops import ProviderFacts, load_provider_facts
from analyzer.knowledge.structure_rules import (
    SETTING_PREFIX,
    StructureKnowledge,
    load_structure,
    with_overrides,
)
from analyzer.knowledge.work_ops import WorkOps, load_work_ops
from analyzer.model import Trace
from analyzer.options import Options
from analyzer.tables import launches
from analyzer.tables.frames import to_frame


@dataclasses.dataclass(frozen=True)
class Context:
    """Everything the analyses know besides the trace, resolved once per run from :class:`Options`."""

    options: Options
    ruleset: kernel_rules.RuleSet
    op_hints: Mapping[str, str]
    annotation_patterns: Sequence[Mapping[str, Any]]
    attention_ops: AttentionOps  # where each attention op keeps its query length (rules/attention_ops.toml)
    work_ops: WorkOps  # what work each host op does from its shapes (rules/work_ops.toml)
    finding_settings: Mapping[str, Mapping[str, Any]]
    structure: StructureKnowledge  # the structure / phase rules and their thresholds (rules/structure.toml)
    provider_facts: ProviderFacts  # host op -> provider for shared kernel names (rules/providers.toml)
    gpu: tuple[hardware.GpuSpec, str] | None  # the ``--gpu`` override and its name; None: detect it
    gpu_table: Mapping[str, hardware.GpuSpec]  # rules/hardware.toml: the GPUs detection chooses from
    model: architectures.ModelArch | None
    brief_settings: Mapping[str, float] = dataclasses.field(default_factory=dict)  # --set brief.NAME=


def resolve_context(options: Options | None = None) -> Context:
    """The run's knowledge for ``options``; a bad rule file, ``--gpu``, ``--model`` or ``--set``
    fails here, before any trace is read."""
    options = options or Options()
    ruleset = kernel_rules.load_rules(list(options.rules))
    gpu = None
    if options.gpu:
        spec = hardware.find_gpu(options.gpu)
        if spec is None:
            known = ", ".join(sorted(hardware.load_hardware()))
            raise UsageError(f"{option('gpu', options.gpu)} is not in rules/hardware.toml (known: {known})")
        gpu = (spec, options.gpu)
    model = architectures.load_model(options.model) if options.model else None
    return Context(
        options=options,
        ruleset=ruleset,
        op_hints=load_op_hints(),
        annotation_patterns=load_annotation_patterns(),
        attention_ops=load_attention_ops(),
        work_ops=load_work_ops(),
        finding_settings=load_finding_settings(
            {
                k: v
                for k, v in options.settings.items()
                if not k.startswith(SETTING_PREFIX) and not k.startswith(brief_settings.PREFIX)
            }
        ),
        structure=with_overrides(load_structure(), options.settings),
        provider_facts=load_provider_facts(),
        gpu=gpu,
        gpu_table=hardware.default_table(),
        model=model,
        brief_settings=brief_settings.parse(options.settings),
    )


@dataclasses.dataclass
class Analysis:
    """An analysed run: the kernels table with every analysis column, and what the summary needs."""

    trace: Trace
    kernels: pa.Table
    steps: pd.DataFrame | None = None
    gpu: dict[str, Any] | None = None
    model: Any = None
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    annotations_found: list[str] = dataclasses.field(default_factory=list)
    rules_sha256: str = ""
    # kernels per id of the structure rules that decided layers only, or dropped a walk (the
    # stage deciders are in the kernels' stage_rule column)
    layer_rules: dict[str, int] = dataclasses.field(default_factory=dict)
    # per rule group of the structure registry: whether it ran (its precondition held on the run)
    rule_groups: dict[str, bool] = dataclasses.field(default_factory=dict)
    # per input (trace id as text): the sizes that counted kernels without shapes (roofline)
    work_sizes: dict[str, Any] = dataclasses.field(default_factory=dict)
    # per input (trace id) whose shapes the roofline looked at: the sizes they show (ModelDims or
    # None), handed to the brief's facts so that they are found once; emptied by that step
    found_sizes: dict[int, Any] = dataclasses.field(default_factory=dict)
    # per input (trace id as text): what its host ops tell the brief (analyses.brief.facts)
    brief_facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the prefill-vs-decode brief (analyses.brief), made by the last run step
    brief: dict[str, Any] = dataclasses.field(default_factory=dict)
    # each kernel's launch time and whether its launch call was found (launches.launch_times), read
    # when the launch calls are taken out of the host ops (launches.take_launch_calls), until the
    # phases are split
    launched: tuple[np.ndarray, np.ndarray] | None = None
    # the kernel -> launching-op join, made once by the classification, read by the phase split and
    # the roofline; dropped with the host ops
    op_join: launches.OpJoin | None = None
    _frame: tuple[pa.Table, pd.DataFrame] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def frame(self) -> pd.DataFrame:
        """The kernels as pandas (:func:`analyzer.tables.frames.to_frame`), built once per kernels
        table: the findings, the summary and the baseline read the same frame."""
        if self._frame is None or self._frame[0] is not self.kernels:
            self._frame = (self.kernels, to_frame(self.kernels))
        return self._frame[1]


Step = Callable[[Analysis, Context], Analysis]


# --------------------------------------------------------------------------- the steps


def classify_step(a: Analysis, ctx: Context) -> Analysis:
    fired: Counter = Counter()
    join = launches.OpJoin.of(a.kernels, a.trace.host_ops)
    groups: dict[str, bool] = {}
    kernels, warnings = classify.classify_and_check(
        a.kernels,
        a.trace.host_ops,
        ctx.ruleset,
        ctx.op_hints,
        ctx.provider_facts,
        ctx.model,
        ctx.structure,
        fired,
        join,
        groups,
    )
    return dataclasses.replace(
        a,
        op_join=join,
        kernels=kernels,
        rules_sha256=ctx.ruleset.sha256,
        warnings=[*a.warnings, *warnings],
        layer_rules=dict(fired),
        rule_groups=groups,
    )


def phases_step(a: Analysis, ctx: Context) -> Analysis:
    got = phases.label_phases(
        a.kernels,
        a.trace.host_ops,
        a.trace.annotations,
        ctx.annotation_patterns,
        ctx.attention_ops,
        ctx.structure,
        ctx.ruleset.phase_evidence(),
        join=a.op_join,
        launched=a.launched,
    )
    return dataclasses.replace(
        a,
        launched=None,  # read by the phase split alone
        kernels=got.kernels,
        steps=got.steps,
        annotations_found=got.annotations_found,
        warnings=[*a.warnings, *got.warnings],
        layer_rules={**a.layer_rules, **got.fired},
    )


def roofline_step(a: Analysis, ctx: Context) -> Analysis:
    got = roofline.measure(
        a.kernels,
        a.trace.host_ops,
        a.trace.inputs,
        ctx.gpu,
        ctx.model,
        ctx.gpu_table,
        roofline.Tables(ctx.work_ops, ctx.attention_ops),
        a.op_join,
    )
    return dataclasses.replace(
        a,
        kernels=got.kernels,
        gpu=got.gpu,
        model=ctx.model if ctx.model is not None else a.model,
        work_sizes={**a.work_sizes, **got.sizes},
        found_sizes={**a.found_sizes, **got.found},
        warnings=[*a.warnings, *got.warnings],
    )


def brief_facts_step(a: Analysis, ctx: Context) -> Analysis:
    """What the host ops tell the brief, read while the input still holds them."""
    k = a.kernels
    if k.num_rows == 0 or a.trace.host_ops.num_rows == 0:
        return a
    traces = np.unique(k["trace_id"].to_numpy(zero_copy_only=False)).tolist()
    got = {
        str(t): brief.input_facts(
            k,
            a.trace.host_ops,
            ctx.attention_ops,
            ctx.work_ops,
            None if len(traces) == 1 else int(t),
            a.op_join,
            **({"found": a.found_sizes[int(t)]} if int(t) in a.found_sizes else {}),
        )
        for t in traces
    }
    return dataclasses.replace(a, brief_facts={**a.brief_facts, **got}, found_sizes={})


def run_warnings_step(a: Analysis, ctx: Context) -> Analysis:
    more = phases.coverage_warnings(a.kernels) + roofline.rate_warnings(a.kernels, a.gpu)
    return dataclasses.replace(a, warnings=[*a.warnings, *more])


def _same_kernels(a: Analysis, **changes: Any) -> Analysis:
    """``a`` with ``changes`` made to fields other than the kernels: the frame built from them is
    handed on, not built again by the next reader."""
    out = dataclasses.replace(a, **changes)
    out._frame = a._frame
    return out


def findings_step(a: Analysis, ctx: Context) -> Analysis:
    return _same_kernels(a, findings=findings.find(a.frame, a.steps, ctx.finding_settings))


def brief_step(a: Analysis, ctx: Context) -> Analysis:
    made = brief.build_brief(
        a.frame,
        a.steps,
        a.brief_facts,
        a.gpu,
        ctx.model,
        roofline.world_size(a.trace.inputs) if a.trace.inputs else 1,
        ctx.brief_settings,
    )
    return _same_kernels(a, brief=made)


INPUT_STEPS: tuple[Step, ...] = (classify_step, phases_step, roofline_step, brief_facts_step)
RUN_STEPS: tuple[Step, ...] = (run_warnings_step, findings_step, brief_step)


# --------------------------------------------------------------------------- sequencing


def as_context(options: Options | Context | None) -> Context:
    return options if isinstance(options, Context) else resolve_context(options)


def analyze_inputs(analysis: Analysis, options: Options | Context | None = None) -> Analysis:
    """:data:`INPUT_STEPS` in order."""
    context = as_context(options)
    for step in INPUT_STEPS:
        analysis = step(analysis, context)
    return analysis


def finish_run(analysis: Analysis, options: Options | Context | None = None) -> Analysis:
    """:data:`RUN_STEPS` in order."""
    context = as_context(options)
    for step in RUN_STEPS:
        analysis = step(analysis, context)
    return analysis


def start(trace: Trace) -> Analysis:
    """The analysis of ``trace`` before any step ran: its kernels as read, the reader's warnings."""
    return Analysis(trace=trace, kernels=trace.kernels, warnings=list(trace.warnings))


def analyze_trace(
    trace: Trace, options: Options | Context | None = None, *, keep_host_ops: bool = True
) -> Analysis:
    """Every analysis, in order, on a loaded trace.

    Host ops are read by the input steps only. With ``keep_host_ops=False`` (a caller that holds no
    other reference to the trace) the analysis takes the launch calls out of the host ops from the
    start (about half the host rows) and keeps only what the phase split reads of them, each
    kernel's launch time; it drops the annotations once the phases are split (their only reader) and
    the host ops before the run steps, so the roofline runs without the annotations and the
    findings' and the summary's frames are built without either in memory.
    """
    context = as_context(options)
    analysis = start(trace)
    if not keep_host_ops:
        del trace
        # the host ops held by this list alone while their launch calls are taken out (column by
        # column: never twice in memory)
        t = analysis.trace
        parts = [t.host_ops]
        analysis = dataclasses.replace(
            analysis, trace=dataclasses.replace(t, host_ops=t.host_ops.schema.empty_table())
        )
        del t
        host_ops, calls = launches.take_launch_calls(parts)
        # the launch times are all the analysis reads of the calls
        launched = None if calls is None else launches.launch_times(analysis.kernels, host_ops, calls)
        del calls
        analysis = dataclasses.replace(
            analysis, trace=dataclasses.replace(analysis.trace, host_ops=host_ops), launched=launched
        )
        del host_ops, launched
    for step in INPUT_STEPS:  # as analyze_inputs, with no name left on a step's input once it returns
        analysis = step(analysis, context)
        if not keep_host_ops and step is phases_step:  # the phase split is the annotations' only reader
            analysis = _without(analysis, "annotations")
        if not keep_host_ops and step is roofline_step:  # the last reader of the host ops' times
            analysis = _narrow_host_ops(analysis)
    if not keep_host_ops:
        analysis = dataclasses.replace(_without(analysis, "host_ops"), op_join=None)
    return finish_run(analysis, context)


#: host op columns the brief's facts do not read (the phase split and the roofline's following ops
#: read the times and threads; the launch join holds its own positions)
_PHASE_ONLY_HOST_COLUMNS = ("start_ns", "dur_ns", "tid", "correlation")


def _narrow_host_ops(analysis: Analysis) -> Analysis:
    """``analysis`` with the host ops' times, threads and correlation ids dropped before the brief's
    facts (a 10 GB trace's millions of host ops: four int64 columns, 32 bytes a row)."""
    t = analysis.trace
    gone = [c for c in _PHASE_ONLY_HOST_COLUMNS if c in t.host_ops.column_names]
    return dataclasses.replace(analysis, trace=dataclasses.replace(t, host_ops=t.host_ops.drop_columns(gone)))


def _without(analysis: Analysis, table: str) -> Analysis:
    """``analysis`` with the trace's ``table`` emptied (its columns kept)."""
    t = analysis.trace
    empty = getattr(t, table).schema.empty_table()
    return dataclasses.replace(analysis, trace=dataclasses.replace(t, **{table: empty}))
