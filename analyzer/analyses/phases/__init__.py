"""Steps and phases: every kernel gets ``step`` (-1 outside every step), ``phase`` and ``tokens``.

Contract (README.md 'How it works'), strongest source first:

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

The package, one module per part of that contract (each imports only those listed before it):

- :mod:`.registry`: the phase rules' ids and thresholds (``rules/structure.toml``), evidence codes;
- :mod:`.evidence`: per-kernel phase evidence from the kernel rules, and what a step's kernels say;
- :mod:`.steps`: the steps table's columns, :class:`StepLabel` and a step's row;
- :mod:`.annotated`: annotation patterns and the steps engine annotations give (1);
- :mod:`.shapes`: attention shapes, the phase they say, packed steps' bookkeeping (3);
- :mod:`.signature`: the kernels' signature and the models of a speculative run (3, 4);
- :mod:`.labels`: the label of each unannotated step, weighing all of the above (3, 4);
- :mod:`.structure`: steps cut at forwards or idle gaps (2);
- :mod:`.split`: the entry point, :func:`label_phases`.
"""

from analyzer.analyses.phases.annotated import (
    StepAnnotation,
    merge_nested,
    parse_annotation,
)
from analyzer.analyses.phases.labels import unshaped_prefill_runs
from analyzer.analyses.phases.registry import (
    PREFILL_WORK_RATIO,
    RECOMPUTED_PREFIX,
    SHAPE_PREFILL,
)
from analyzer.analyses.phases.shapes import (
    _every_token_scored,
    _is_packed,
    _padded_or_replayed,
    attention_shapes,
    packed_decode_tokens,
    phase_from_shape,
    recomputed_prefix,
)
from analyzer.analyses.phases.signature import _depth_models, _label_from_signature
from analyzer.analyses.phases.split import coverage_warnings, label_phases
from analyzer.analyses.phases.steps import STEP_COLUMNS, StepLabel
from analyzer.analyses.phases.structure import forward_starts

__all__ = [
    "PREFILL_WORK_RATIO",
    "RECOMPUTED_PREFIX",
    "SHAPE_PREFILL",
    "STEP_COLUMNS",
    "StepAnnotation",
    "StepLabel",
    "_depth_models",
    "_every_token_scored",
    "_is_packed",
    "_label_from_signature",
    "_padded_or_replayed",
    "attention_shapes",
    "coverage_warnings",
    "forward_starts",
    "label_phases",
    "merge_nested",
    "packed_decode_tokens",
    "parse_annotation",
    "phase_from_shape",
    "recomputed_prefix",
    "unshaped_prefill_runs",
]
