"""Roofline: FLOPs and bytes per kernel, achieved rates, and what bounds each kernel (docs/roofline-validation.md).

Contract (pure over the analysed tables, the GPU spec, the work tables and an optional model architecture):

* **GPU**: ``--gpu`` if given, else detected from the first input's metadata (name, arch, SM/CU
  count and memory together). An unknown GPU leaves rates computed but bounds ``unknown``.
* **FLOPs / bytes from shapes** (``flops_source = shapes``): from the launching host op's input
  shapes and dtypes, each layout declared as data: GEMMs (dense, grouped, scaled, int4 / int8
  weight-only) and gathers, reductions and unsized ops in ``rules/work_ops.toml``, attention front
  ends in ``rules/attention_ops.toml``; every other ATen op as memory-bound elementwise work
  (compulsory bytes: inputs read once, output written once). memcpy / memset activities move the
  bytes the trace records for them (``[[copy]]``). The numbers of an op go to its longest kernel;
  its helper kernels are not new work and keep null numbers, except a split-K reduce, which reads
  the fp32 partials and writes C (never the GEMM's A and B).
* **One causal convention** (:func:`causal_pairs`, stated in ``rules/attention_ops.toml`` and
  ``docs/roofline-validation.md``): an attention op with more than one query per sequence counts the
  (query, key) pairs a causal mask aligned to the end of the keys keeps - half the score matrix,
  diagonal included, for a whole prompt; decode counts every key. It holds for every attention
  family: fused kernels by their layout, attention composed of matmuls (the GEMMs of an attention
  stage) by the same pairs.
* **Without shapes**, GEMM roles and MoE experts get numbers from the model's sizes and the step's
  token count: ``--model`` (``flops_source = model``), else the sizes found in the trace's own
  recorded shapes (:func:`analyzer.analyses.shape_roles.found_sizes`, ``flops_source = found``; a
  disagreement between the two is a warning). One role of one layer in one step is one piece of
  work: its split-K reduce kernels get the reduce's numbers and its other kernels share the rest by
  time; MoE weights count the experts touched (top-k x tokens, at most all) in the format the kernel
  names or the model ships. Otherwise null (``none``), and ``uncounted`` says why (:data:`UNCOUNTED`).
* **Rates**: achieved TFLOP/s = flops / dur, TB/s = bytes / dur, intensity = flops / bytes,
  ``pct_of_peak`` = achieved FLOP/s over the roof at that intensity (min(peak, intensity x BW)), or
  achieved TB/s over peak BW when there are no FLOPs. ``bound``: ``compute`` / ``memory`` by the
  ridge point, ``latency`` when a short kernel reaches under 10% of its roof, ``invalid`` when a
  rate exceeds a peak (a data error: warned, never printed as fact), ``unknown`` without numbers
  or without a known GPU. rocprof's ``<barrier packet>`` pseudo-dispatches (rule ``MEM600``) are
  queue waits, not work: they never get numbers.
* **Each kernel's own compute peak** (``roof_dtype``: the dtype whose peak its roof uses, null without
  numbers or a known GPU): a GEMM's is the dtype it computes in - the work table's ``peak``, else its
  activation's (fp8 for ``_scaled_mm``, int8 for ``_int_mm``, bf16 for int4 weight-only, fp32 for
  ``_weight_int8pack_mm``'s CUDA-core kernel); counted from sizes, the dtype its kernel name spells
  (``[[kernel_dtype]]``), else the model's quantization (fp8) or dtype. Other work uses its inputs'
  dtype. A dtype the GPU has no peak for falls back to bf16 (and says so in ``roof_dtype``).

The package: :mod:`.measurement` (the entry point, :func:`measure`), :mod:`.gpu` (which GPU),
:mod:`.kernel_work` (every kernel's numbers and ``uncounted``), :mod:`.formulas` (one host op from its
shapes), :mod:`.by_shapes` (ops' numbers onto their kernels), :mod:`.by_sizes` (kernels without
shapes), :mod:`.splitk` (split-K reduces), :mod:`.work` (the per-kernel arrays) and :mod:`.rates`
(rates and bounds). What other modules and the tests use is re-exported here.
"""

from __future__ import annotations

from analyzer.analyses.roofline.by_shapes import CONSUMER_WINDOW
from analyzer.analyses.roofline.by_sizes import WorkSizes, model_work
from analyzer.analyses.roofline.formulas import (
    CAUSAL_CONVENTION,
    OpWork,
    Tables,
    attention_work,
    causal_pairs,
    composed_causal_share,
    consumer_rows,
    gather_work,
    gemm_work,
    op_work,
    read_op,
)
from analyzer.analyses.roofline.gpu import gpu_summary, resolve_gpu
from analyzer.analyses.roofline.kernel_work import barrier_rows, kernel_work
from analyzer.analyses.roofline.measurement import COLUMNS, Measured, measure, world_size
from analyzer.analyses.roofline.rates import BOUNDS, LATENCY_NS, LATENCY_PCT, rate_warnings, rates
from analyzer.analyses.roofline.splitk import (
    MIN_SPLIT,
    PARTIAL_BYTES,
    SPLITK_REDUCE,
    reduce_work,
    splitk_reduce_mask,
)
from analyzer.analyses.roofline.work import FLOPS_SOURCES, UNCOUNTED, Work

__all__ = [
    "BOUNDS",
    "CAUSAL_CONVENTION",
    "COLUMNS",
    "CONSUMER_WINDOW",
    "FLOPS_SOURCES",
    "LATENCY_NS",
    "LATENCY_PCT",
    "MIN_SPLIT",
    "PARTIAL_BYTES",
    "SPLITK_REDUCE",
    "UNCOUNTED",
    "Measured",
    "OpWork",
    "Tables",
    "Work",
    "WorkSizes",
    "attention_work",
    "barrier_rows",
    "causal_pairs",
    "composed_causal_share",
    "consumer_rows",
    "gather_work",
    "gemm_work",
    "gpu_summary",
    "kernel_work",
    "measure",
    "model_work",
    "op_work",
    "rate_warnings",
    "rates",
    "read_op",
    "reduce_work",
    "resolve_gpu",
    "splitk_reduce_mask",
    "world_size",
]
