"""Roofline: FLOPs and bytes per kernel, achieved rates, and what bounds each kernel (DESIGN §5).

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
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses import shape_roles
from analyzer.knowledge import architectures, hardware
from analyzer.knowledge.attention_ops import AttentionOps, AttentionShape, load_attention_ops
from analyzer.knowledge.kernel_rules import BARRIER_RULE_ID
from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES
from analyzer.knowledge.work_ops import GemmDims, GemmOp, WorkOps, load_work_ops
from analyzer.tables import launches
from analyzer.tables.dictionaries import DICT_STRING, dict_isin, dict_strings, filled, objects

COLUMNS = {
    "flops": pa.float64(),
    "bytes": pa.float64(),
    "flops_source": DICT_STRING,
    "uncounted": DICT_STRING,
    "achieved_tflops": pa.float64(),
    "achieved_tbps": pa.float64(),
    "pct_of_peak": pa.float64(),
    "intensity": pa.float64(),
    "bound": DICT_STRING,
    "roof_dtype": DICT_STRING,
}
#: the one causal convention of every attention family, as the summary and the report state it
CAUSAL_CONVENTION = (
    "a causal prefill counts half the score matrix: the (query, key) pairs its mask keeps, "
    "q x (kv - q) + q (q + 1) / 2 per sequence and head; decode counts every key"
)
#: the basis of a kernel's numbers: recorded shapes, sizes found in the trace, ``--model``, none
FLOPS_SOURCES = ("shapes", "found", "model", "none")
#: why a kernel has no numbers (the ``uncounted`` column; null where it has them)
UNCOUNTED = {
    "helper": "a helper kernel of an op whose work is counted on the op's longest kernel",
    "no_formula": "its launching op's shapes are recorded, but no table says what work that op does",
    "output_unknown": "a gather / scatter / selection whose output size the recorded shapes do not give",
    "shapes_unreadable": "its launching op is in a work table, but the recorded shapes do not fit its layout",
    "no_shapes": "no recorded shapes for its launch (shapes off, CUDA-graph replay, compiled region) and no sizes count its stage",
    "no_sizes": "a GEMM-role or MoE-expert kernel without shapes: no sizes were found in the trace; --model would count it",
    "no_tokens": "a GEMM-role or MoE-expert kernel without shapes in a step whose token count is unknown (an LM head outside decode: the rows it scores are unknown)",
    "not_work": "not work: a barrier packet, or a copy without a recorded size",
}
# what a kernel's launch said about its numbers while they were read (int8 codes per kernel): nothing
# yet, "has a launching op", or an UNCOUNTED reason
_REASONS = ("", "op", *UNCOUNTED)
_R = {r: np.int8(i) for i, r in enumerate(_REASONS)}
BOUNDS = ("unknown", "compute", "memory", "latency", "invalid")
_BOUND_CODE = {b: i for i, b in enumerate(BOUNDS)}
LATENCY_NS = 10_000  # a kernel shorter than this that reaches < LATENCY_PCT of its roof
LATENCY_PCT = 0.10

_DTYPE_BYTES = {
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "float": 4,
    "double": 8,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1,
    "c10::Float4_e2m1fn_x2": 1,
    "long int": 8,
    "int": 4,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "c10::complex<float>": 8,
}
_INT_TYPES = ("long int", "int", "bool", "short int", "unsigned char")
_NOT_TENSORS = ("", "Scalar", "ScalarList", "TensorList", "GenericList", "Device", "None")
# attention kernels whose GEMMs follow the causal convention (composed attention); linear
# attention / state-space mixers have no causal score matrix
_SOFTMAX_ATTENTION = frozenset(s for s in ATTENTION_KERNEL_STAGES if s != "linear_attention")
# split-K reduce kernels (cuBLASLt splitKreduce_kernel, CK/hipBLASLt split-K reduce passes): they read
# the fp32 partial sums of the GEMM and write C, not the GEMM's A and B
SPLITK_REDUCE = re.compile(r"split_?k_?reduce|reduce_?split_?k", re.IGNORECASE)
PARTIAL_BYTES = 4.0  # split-K partial sums are fp32
MIN_SPLIT = 2  # a reduce kernel reads at least two partials: the compulsory minimum when the split is unknown
# bytes per weight of quantized formats: 4-bit values plus one 8-bit scale per block (MX: 32, NV: 16)
_QUANT_WEIGHT_BYTES = {"mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "fp8": 1.0}
_QUANT_IN_NAME = re.compile(r"mxfp4|nvfp4", re.IGNORECASE)
# what a model's GEMMs compute in by its quantization (config quant_method), where not its dtype:
# block-wise FP8 checkpoints (DeepSeek-V3) run FP8 x FP8 GEMMs; MXFP4 experts (gpt-oss) take bf16
# activations, so they keep the model's dtype
_QUANT_COMPUTE = {"fp8": "fp8", "fbgemm_fp8": "fp8"}
CONSUMER_WINDOW = 16  # ops after a gather searched for the one taking the gathered rows (work_ops.toml)
_MODEL_STAGES = (
    "qkv_gemm",
    "o_gemm",
    "gate_up_gemm",
    "down_gemm",
    "lm_head_gemm",
    "moe_gate_gemm",
    "moe_expert_gemm",
)


# --------------------------------------------------------------------------- entry point


@dataclasses.dataclass(frozen=True)
class Measured:
    """What :func:`measure` gives: the kernels with the roofline columns, the run's GPU, the sizes
    that counted kernels without shapes (per input) and the warnings of that (a ``--model`` that
    disagrees with the sizes the trace shows)."""

    kernels: pa.Table
    gpu: dict[str, Any]
    sizes: dict[str, Any] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Tables:
    """The work tables the roofline reads (``rules/work_ops.toml``, ``rules/attention_ops.toml``)."""

    work: WorkOps
    attention: AttentionOps

    @classmethod
    def load(cls, work: WorkOps | None = None, attention: AttentionOps | None = None) -> Tables:
        return cls(work or load_work_ops(), attention or load_attention_ops())


def measure(
    kernels: pa.Table,
    host_ops: pa.Table,
    inputs: Sequence[Any],
    gpu: tuple[hardware.GpuSpec, str] | None = None,
    model: architectures.ModelArch | None = None,
    gpu_table: Mapping[str, hardware.GpuSpec] | None = None,
    tables: Tables | None = None,
) -> Measured:
    """Work, rates and bound of every kernel. ``gpu`` is the ``--gpu`` override and how it was
    named (None: detected from the first input, among ``gpu_table``, rules/hardware.toml's entries);
    ``model`` the ``--model`` architecture; ``tables`` the work tables (None: the built-in ones).
    Inputs measured apart agree with the joined run when they resolve to the same GPU and world size."""
    spec, reason = resolve_gpu(inputs, gpu, gpu_table)
    got = kernel_work(kernels, host_ops, model, world_size=world_size(inputs), tables=tables)
    cols = rates(kernels["dur_ns"].to_numpy(zero_copy_only=False), got.flops, got.bytes, got.dtype, spec)
    cols["flops_source"] = got.source
    cols["uncounted"] = got.uncounted
    k = kernels
    for name, typ in COLUMNS.items():
        arr = dict_strings(cols[name]) if typ == DICT_STRING else pa.array(cols[name], typ, from_pandas=True)
        k = (
            k.set_column(k.schema.get_field_index(name), name, arr)
            if name in k.column_names
            else k.append_column(name, arr)
        )
    return Measured(kernels=k, gpu=gpu_summary(spec, reason), sizes=got.sizes, warnings=got.warnings)


def world_size(inputs: Sequence[Any]) -> int:
    """The run's world size: collectives move data across this many ranks."""
    return max(m.world_size for m in inputs)


def rate_warnings(kernels: pa.Table, gpu: dict[str, Any] | None) -> list[str]:
    """An unknown GPU, and kernels measured faster than the GPU's peaks, over the whole run."""
    gpu = gpu or {}
    if gpu.get("name") is None:
        return [
            f"GPU not known to rules/hardware.toml ({gpu.get('reason')}): times only, no bounds (use --gpu NAME)"
        ]
    invalid = dict_isin(kernels["bound"], ["invalid"])
    if not invalid.any():
        return []
    names = pd.Series(objects(kernels["norm_name"]))[invalid].value_counts()
    top = "; ".join(f"{n[:60]} (x{c})" for n, c in names.head(3).items())
    return [
        f"{int(invalid.sum())} kernels exceed a peak of {gpu['name']} "
        f"(bound=invalid, rates not trusted): {top}"
    ]


def resolve_gpu(
    inputs: Sequence[Any],
    override: tuple[hardware.GpuSpec, str] | None = None,
    table: Mapping[str, hardware.GpuSpec] | None = None,
) -> tuple[hardware.GpuSpec | None, str]:
    """The GPU of the run and how it was found: the override, or detected from the first input."""
    if override is not None:
        spec, named = override
        return spec, f"--gpu {named}"
    m = inputs[0]
    spec, reason = hardware.detect_gpu(m.gpu_name, m.arch, m.sm_count, m.total_memory, table)
    if spec is None and not m.gpu_name:
        # say what the trace lacked rather than quoting an empty name
        missing = [w for w, v in (("name", m.gpu_name), ("arch", m.arch), ("SM count", m.sm_count)) if not v]
        had = [f"{w} {v}" for w, v in (("arch", m.arch), ("SM/CU count", m.sm_count)) if v]
        reason = (
            f"no GPU {', '.join(missing[:-1])} or {missing[-1]} in the trace"
            if len(missing) > 1
            else "no GPU name in the trace"
        ) + (f" ({', '.join(had)}: too little to match)" if had else "")
    return spec, reason


def gpu_summary(spec: hardware.GpuSpec | None, reason: str) -> dict[str, Any]:
    if spec is None:
        return {"name": None, "arch": None, "peaks": {}, "reason": reason}
    peaks = {f"{d}_tflops": v for d, v in spec.peaks.items()}
    peaks["hbm_tbps"] = spec.hbm_tbps
    return {
        "name": spec.name,
        "key": spec.key,
        "arch": spec.arch,
        "peaks": peaks,
        "measured": dict(spec.measured),
        "source": spec.source,
        "reason": reason,
    }


# --------------------------------------------------------------------------- work of one host op


def _bytes_of(dtype: str | None) -> float:
    return float(_DTYPE_BYTES.get(dtype or "", 2))


def _numel(shape: Sequence[int] | None) -> int:
    return int(math.prod(shape)) if shape else 0


def _type(types: Sequence[str], i: int) -> str:
    return types[i] if i < len(types) and types[i] else ""


def causal_pairs(q: float, kv: float) -> float:
    """The (query, key) pairs of one sequence that attention counts (the causal convention): a mask
    aligned to the end of the keys, query i of q seeing keys up to kv - q + i. One query sees every
    key; a whole prompt (q = kv) counts q (q + 1) / 2, half the score matrix with its diagonal."""
    if q <= 1:
        return q * kv
    seen_all = max(0.0, kv - q)  # keys every query sees (the cached context before the chunk)
    tri = min(q, kv)  # queries inside the triangle
    return q * seen_all + tri * (tri + 1) / 2


@dataclasses.dataclass(frozen=True)
class OpWork:
    """What one host op did: FLOPs, compulsory bytes, the dtype of its roof and the rule that said so."""

    flops: float
    bytes: float
    dtype: str
    rule: str


def op_work(
    name: str,
    dims: list[list[int]] | None,
    types: list[str] | None,
    tables: Tables | None = None,
    consumer: list[list[int]] | None = None,
) -> tuple[float, float, str] | None:
    """(flops, bytes, dtype) of one host op from its recorded shapes; None when not derivable.
    ``consumer``: the shapes of the op that takes a gather's rows (:func:`gather_consumers`)."""
    got = read_op(name, dims, types, tables or Tables.load(), consumer)
    return None if got is None else (got.flops, got.bytes, got.dtype)


def read_op(
    name: str,
    dims: list[list[int]] | None,
    types: list[str] | None,
    tables: Tables,
    consumer: list[list[int]] | None = None,
) -> OpWork | None:
    """The :class:`OpWork` of one host op (its ``rule``: the table entry, or ``elementwise``)."""
    if not dims:
        return None
    types = list(types or [])
    g = tables.work.gemm(name, dims)
    if g is not None:
        return gemm_work(g[0], g[1], dims, types)
    lay = tables.attention.layout(name, dims)
    if lay is not None and not lay.composed:
        s = lay.read(dims)
        return attention_work(s, _type(types, lay.query), lay.id) if s is not None else None
    gather = tables.work.gather(name)
    if gather is not None:
        return gather_work(gather, dims, types, consumer)
    kind = tables.work.kind(name)
    if kind == "unsized" or not name.startswith("aten::") or tables.work.is_gemm(name):
        # the output size is not in the inputs' shapes; custom ops (aiter::, sgl_kernel::, vllm::)
        # often pass whole buffers (a KV-cache pool) of which the kernel touches a slice
        return None
    tensors = [(d, _type(types, i)) for i, d in enumerate(dims) if d]
    if not tensors:
        return None
    dt = next((t for _, t in tensors if t in _DTYPE_BYTES and t not in _INT_TYPES), "c10::BFloat16")
    dtype = hardware.normalize_dtype(dt) or "bf16"
    sizes = [_numel(d) * _bytes_of(t) for d, t in tensors]
    numel = max(_numel(d) for d, _ in tensors)
    if kind == "reduce":
        # the output is the input with the reduced dimensions gone: small next to the input
        return OpWork(float(numel), float(sum(sizes)), dtype, "reduce")
    if name.endswith("_"):
        # in-place / out= style (copy_, add_, fill_): the first tensor is the output, written once
        return OpWork(float(numel), float(sum(sizes)), dtype, "elementwise")
    # memory-bound ops: inputs read once + output written once (output ~ largest input)
    return OpWork(float(numel), float(sum(sizes) + max(sizes)), dtype, "elementwise")


def gemm_work(op: GemmOp, g: GemmDims, dims: Sequence[Any], types: Sequence[str]) -> OpWork:
    """A GEMM's useful FLOPs (2 x batch x M x K x N) and compulsory bytes (rules/work_ops.toml)."""
    a_t, b_t = _type(types, op.a), _type(types, op.b)
    a_el = _bytes_of(a_t)
    weights = _numel(dims[op.b]) * _bytes_of(b_t)
    if g.groups:
        weights *= min(g.groups, g.rows) / g.groups  # only the groups the rows reach are read
    other = sum(
        _numel(d) * _bytes_of(_type(types, i))
        for i, d in enumerate(dims)
        if d and i not in (op.a, op.b) and _type(types, i) not in _NOT_TENSORS
    )
    out = g.batch * g.m * g.n * (op.out_bytes or a_el)
    nbytes = _numel(dims[op.a]) * a_el + weights + other + out
    dtype = op.peak or hardware.normalize_dtype(a_t) or "bf16"
    return OpWork(2.0 * g.batch * g.m * g.k * g.n, float(nbytes), dtype, op.id)


def attention_work(s: AttentionShape, dtype_name: str, rule: str) -> OpWork | None:
    """FLOPs = 2 x batch x heads x :func:`causal_pairs` x (head size + value head size); bytes = Q,
    K, V read once and the output written once. None when the shapes leave a size unknown (a packed
    call without its sequence count)."""
    if min(s.q, s.kv, s.head, s.heads) <= 0:
        return None
    dv = s.value_head if s.value_head > 0 else s.head
    kvh = s.kv_heads if s.kv_heads > 0 else s.heads
    if s.packed:
        if s.sequences <= 0:
            return None
        seqs = float(s.sequences)
        q_tot, kv_tot = float(s.q), float(s.kv)
    else:
        seqs = float(max(s.batch, 1))
        q_tot, kv_tot = seqs * s.q, seqs * s.kv
    pairs = seqs * causal_pairs(q_tot / seqs, kv_tot / seqs)
    el = _bytes_of(dtype_name)
    nbytes = el * (q_tot * s.heads * s.head + kv_tot * kvh * (s.head + dv) + q_tot * s.heads * dv)
    dtype = hardware.normalize_dtype(dtype_name) or "bf16"
    return OpWork(2.0 * s.heads * pairs * (s.head + dv), float(nbytes), dtype, rule)


def gather_work(op: Any, dims: Sequence[Any], types: Sequence[str], consumer: Any) -> OpWork | None:
    """A gather's bytes: the selected elements written once and read once - at most the whole table
    (a row selected again is read again from cache, not from memory) - plus the int64 row ids."""
    table = dims[op.table] if len(dims) > op.table else None
    if not table:
        return None
    el = _bytes_of(_type(types, op.table))
    dtype = hardware.normalize_dtype(_type(types, op.table)) or "bf16"
    row = _numel(table[1:]) if len(table) > 1 else 1
    if op.select == "elements":
        idx = dims[op.index] if len(dims) > op.index else None
        if not idx:
            return None
        picked = _numel(idx)
        return OpWork(0.0, (min(picked, _numel(table)) + picked) * el, dtype, op.id)
    if op.select == "rows":
        idx = dims[op.index] if len(dims) > op.index else None
        if not idx:
            return None
        rows = _numel(idx)
    else:
        rows = consumer_rows(table, consumer)
        if rows is None:
            return None
    return OpWork(0.0, (min(rows, table[0]) + rows) * row * el + rows * 8.0, dtype, op.id)


def consumer_rows(table: Sequence[int], consumer: Any) -> int | None:
    """Rows of a gathered tensor as the op after the gather takes it: its first input whose trailing
    dimensions are the table's row shape; its leading dimensions are the rows."""
    if not consumer or len(table) < 2:
        return None
    tail = list(table[1:])
    for d in consumer:
        if d and len(d) > len(tail) and list(d[-len(tail) :]) == tail:
            return _numel(d[: -len(tail)])
    return None


# --------------------------------------------------------------------------- work per kernel


@dataclasses.dataclass
class Work:
    """Per kernel: flops, bytes (NaN when unknown), flops_source, dtype of the roof and, where no
    numbers, why (:data:`UNCOUNTED`); the sizes that counted kernels without shapes, and warnings."""

    flops: np.ndarray
    bytes: np.ndarray
    source: np.ndarray  # object (str)
    dtype: np.ndarray  # object (str)
    uncounted: Any  # a dictionary array (null where counted), or a sequence of str / None
    sizes: dict[str, Any] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def __iter__(self) -> Any:  # (flops, bytes, source, dtype), as kernel_work returned before
        return iter((self.flops, self.bytes, self.source, self.dtype))


def kernel_work(
    kernels: pa.Table,
    host_ops: pa.Table,
    model: architectures.ModelArch | None,
    world_size: int = 1,
    tables: Tables | None = None,
) -> Work:
    """Per kernel: its numbers and their basis (see the module contract)."""
    tables = tables or Tables.load()
    n = kernels.num_rows
    w = Work(
        np.full(n, np.nan),
        np.full(n, np.nan),
        filled(n, "none"),
        filled(n, "bf16"),
        None,
    )
    reason = np.zeros(n, np.int8)  # codes of _REASONS
    kind = kernels["kind"]
    is_kernel = pc.equal(kind, "kernel").fill_null(False).to_numpy(zero_copy_only=False)
    is_copy = pc.is_in(kind, pa.array(["memcpy", "memset"])).fill_null(False).to_numpy(zero_copy_only=False)
    barrier = barrier_rows(kernels)
    # 1. shapes: the numbers of each launching op go to its longest kernel
    found = launches.launching_op_rows(kernels, host_ops)
    covered = np.zeros(n, bool)
    if found is not None:
        ops, pos = found
        p = pc.fill_null(pos, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        reason[p >= 0] = _R["op"]  # has a launching op: decided below
        covered = _shape_work(kernels, host_ops, ops, p, is_kernel & ~barrier, tables, w, reason)
    # 2. memcpy / memset: the bytes the trace records
    _copy_work(kernels, is_copy, tables.work, w, reason)
    # 3. sizes (--model, else found in the trace) for GEMM roles and experts without shapes
    # sizes are looked for only where a kernel needs them (or --model is to be checked against them)
    wanting = (
        dict_isin(kernels["stage"], list(_MODEL_STAGES)) & (w.source == "none") & ~covered
        if "stage" in kernels.column_names
        else np.zeros(n, bool)
    )
    sizes, warnings = (
        _sizes(kernels, host_ops, objects(kernels["stage"]), model, world_size, tables, wanting)
        if "stage" in kernels.column_names and (model is not None or wanting.any())
        else ({}, [])
    )
    w.warnings.extend(warnings)
    for t, (label, ws) in sizes.items():
        mine = kernels["trace_id"].to_numpy(zero_copy_only=False) == t if t >= 0 else np.ones(n, bool)
        _model_work(
            kernels,
            ws,
            ws.tp,
            w.flops,
            w.bytes,
            w.source,
            skip=covered | ~mine,
            label=label,
            dtype=w.dtype,
            work=tables.work,
        )
        w.sizes[str(t)] = ws.describe()
    # 4. why the rest has no numbers
    w.uncounted = _why_uncounted(kernels, w, reason, covered, barrier, sizes)
    return w


def _shape_work(
    kernels: pa.Table,
    host_ops: pa.Table,
    ops: pa.Table,
    p: np.ndarray,
    can_lead: np.ndarray,
    tables: Tables,
    w: Work,
    reason: np.ndarray,
) -> np.ndarray:
    """Numbers of every launching op with shapes on its longest kernel; returns the op's other
    (helper) kernels. ``reason`` gets, per lead kernel, what the op's shapes could not say."""
    n = kernels.num_rows
    dur = kernels["dur_ns"].to_numpy(zero_copy_only=False)
    cand = np.flatnonzero((p >= 0) & can_lead)
    order = cand[np.argsort(-dur[cand], kind="stable")]
    _, first = np.unique(p[order], return_index=True)
    lead = order[first]  # one kernel per op: the longest
    if not len(lead):
        return np.zeros(n, bool)
    op_rows = ops["row"].take(pa.array(p[lead])).to_numpy(zero_copy_only=False).astype(np.int64)
    group_names, gfirst, inverse = launches.distinct_op_shapes(host_ops, op_rows)
    dims = host_ops["input_dims"].take(pa.array(op_rows[gfirst])).to_pylist()
    types = host_ops["input_types"].take(pa.array(op_rows[gfirst])).to_pylist()
    # ops whose rows are read from the op after them: one lookup per op, not per shape
    consumer_ops = {nm for g in tables.work.gathers if g.select == "consumer" for nm in g.names}
    per_group: list[Any] = []
    memo: dict[bytes, Any] = {}
    for nm, d, ty in zip(group_names, dims, types, strict=True):
        if nm is None or d is None:
            per_group.append(None)
            continue
        if nm in consumer_ops:
            per_group.append("consumer")
            continue
        key = orjson.dumps((nm, d, ty))
        if key not in memo:
            memo[key] = read_op(nm, d, ty, tables)
        per_group.append(memo[key])
    ng = len(group_names)
    g_flops, g_bytes = np.full(ng, np.nan), np.full(ng, np.nan)
    g_dtype = filled(ng, "bf16")
    g_ok = np.zeros(ng, bool)
    g_consumer = np.zeros(ng, bool)
    g_share = np.ones(ng)  # the causal share of a GEMM group where it runs an attention (composed)
    g_reason = np.zeros(ng, np.int8)
    for g, (nm, r) in enumerate(zip(group_names, per_group, strict=True)):
        if isinstance(r, OpWork):
            g_flops[g], g_bytes[g], g_dtype[g], g_ok[g] = r.flops, r.bytes, r.dtype, True
            if tables.work.is_gemm(nm):
                g_share[g] = _composed_causal_share(tables.work.gemm(nm, dims[g]))
        elif r == "consumer":
            g_consumer[g] = True
        else:
            g_reason[g] = _R[_no_count_reason(nm or "", dims[g], tables)]
    inv = np.asarray(inverse, np.int64)
    # ops whose rows are read from the op after them: one lookup per op (a few per layer)
    per_op_f, per_op_b = np.full(len(lead), np.nan), np.full(len(lead), np.nan)
    per_op_dt = filled(len(lead), "bf16")
    need = np.flatnonzero(g_consumer[inv])
    if len(need):
        nxt = launches.following_ops(host_ops, op_rows[need], CONSUMER_WINDOW)
        for i, follow in zip(need.tolist(), nxt, strict=True):
            r = int(op_rows[i])
            nm = str(host_ops["name"][r])
            d, ty = host_ops["input_dims"][r].as_py(), host_ops["input_types"][r].as_py()
            table = d[0] if d else None
            for f in follow.tolist():
                cons = host_ops["input_dims"][f].as_py()
                if table and consumer_rows(table, cons) is not None:
                    got = read_op(nm, d, ty, tables, consumer=cons)
                    if got is not None:
                        per_op_f[i], per_op_b[i], per_op_dt[i] = got.flops, got.bytes, got.dtype
                    break
    fl, by, dt = g_flops[inv], g_bytes[inv], g_dtype[inv]
    cons = g_consumer[inv]
    fl[cons], by[cons], dt[cons] = per_op_f[cons], per_op_b[cons], per_op_dt[cons]
    ok = g_ok[inv] | (cons & ~np.isnan(per_op_b))
    attention = (
        dict_isin(kernels["stage"], list(_SOFTMAX_ATTENTION))[lead]
        if "stage" in kernels.column_names
        else np.zeros(len(lead), bool)
    )
    fl = np.where(attention, fl * g_share[inv], fl)
    rows = lead[ok]
    w.flops[rows], w.bytes[rows] = fl[ok], by[ok]
    w.dtype[rows] = dt[ok]
    w.source[rows] = "shapes"
    reason[rows] = _R[""]
    bad = ~ok
    why = np.where(cons, _R["output_unknown"], g_reason[inv]).astype(np.int8)
    reason[lead[bad]] = why[bad]
    op_reason = np.zeros(ops.num_rows, np.int8)
    op_reason[p[lead[bad]]] = why[bad]
    rest = np.flatnonzero((p >= 0) & (reason == _R["op"]))
    reason[rest] = op_reason[p[rest]]  # the op's other kernels: what its shapes could not say
    return _helpers_of_measured_ops(
        kernels, host_ops, ops, p, lead, w.flops, w.bytes, w.source, w.dtype, tables
    )


def _composed_causal_share(got: tuple[GemmOp, GemmDims] | None) -> float:
    """The causal convention for attention composed of matmuls (eager / math SDPA): the score product
    (q x d) @ (d x kv) and the weighted values (q x kv) @ (kv x d) of a prefill count the pairs the
    mask keeps. The key length is the operand dimension that is not the head size: the one equal to
    the query length (a whole prompt), else the longer one."""
    if got is None:
        return 1.0
    g = got[1]
    q = g.m
    if q <= 1:
        return 1.0
    if g.n == q or g.k == q:
        kv = q
    else:
        kv = max(g.k, g.n)
    if kv < q:
        return 1.0
    return causal_pairs(q, kv) / (q * kv)


def _no_count_reason(name: str, dims: Any, tables: Tables) -> str:
    if not dims:
        return "no_shapes"
    if tables.work.gather(name) is not None or tables.work.kind(name) == "unsized":
        return "output_unknown"
    lay = tables.attention.layout(name)
    if tables.work.is_gemm(name) or (lay is not None and not lay.composed):
        return "shapes_unreadable"
    return "no_formula"


def _copy_work(kernels: pa.Table, is_copy: np.ndarray, work: WorkOps, w: Work, reason: np.ndarray) -> None:
    """memcpy / memset activities: the bytes the trace records, as ``[[copy]]`` counts them."""
    if "bytes_recorded" not in kernels.column_names:
        return
    rows = np.flatnonzero(is_copy)
    if not len(rows):
        return
    rec = kernels["bytes_recorded"].take(pa.array(rows)).to_numpy(zero_copy_only=False).astype(np.float64)
    names = objects(kernels["name"].take(pa.array(rows)))
    uniq, at = np.unique(names.astype(str), return_inverse=True)
    moved = np.array([work.moved(str(u)) or np.nan for u in uniq.tolist()], np.float64)[at.reshape(-1)]
    unknown = np.isnan(rec) | (rec < 0)
    reason[rows[unknown]] = _R["not_work"]
    ok = ~unknown & ~np.isnan(moved)
    rows = rows[ok]
    w.flops[rows], w.bytes[rows] = 0.0, rec[ok] * moved[ok]
    w.dtype[rows], w.source[rows] = "bf16", "shapes"
    reason[rows] = _R[""]


def _why_uncounted(
    kernels: pa.Table,
    w: Work,
    reason: np.ndarray,
    covered: np.ndarray,
    barrier: np.ndarray,
    sizes: dict[int, Any],
) -> pa.DictionaryArray:
    """Per kernel without numbers, why (:data:`UNCOUNTED`); null where it has numbers."""
    n = kernels.num_rows
    out = np.zeros(n, np.int8)  # codes of _REASONS; 0: null
    unc = np.isnan(w.flops) & np.isnan(w.bytes)
    tokens = (
        kernels["tokens"].to_numpy(zero_copy_only=False).astype(np.float64)
        if "tokens" in kernels.column_names
        else np.full(n, np.nan)
    )
    trace = kernels["trace_id"].to_numpy(zero_copy_only=False).astype(np.int64)
    out[unc & barrier] = _R["not_work"]
    out[unc & ~barrier & covered] = _R["helper"]
    rest = unc & ~barrier & ~covered
    quiet = (reason == _R[""]) | (reason == _R["op"])  # nothing said about the op's shapes
    plain = quiet | (reason == _R["no_shapes"])
    staged = "stage" in kernels.column_names
    by_sizes = rest & plain & (dict_isin(kernels["stage"], list(_MODEL_STAGES)) if staged else False)
    has = np.isin(trace, list(sizes)) | (-1 in sizes)
    lm_head = dict_isin(kernels["stage"], ["lm_head_gemm"]) if staged else np.zeros(n, bool)
    decode = dict_isin(kernels["phase"], ["decode"]) if "phase" in kernels.column_names else np.zeros(n, bool)
    # an LM head outside decode: sizes would not count it either (the rows it scores are unknown)
    rows_unknown = np.isnan(tokens) | (lm_head & ~decode)
    out[by_sizes & (has | (lm_head & ~decode)) & rows_unknown] = _R["no_tokens"]
    out[by_sizes & has & ~rows_unknown] = _R["no_shapes"]
    out[by_sizes & ~has & ~(lm_head & ~decode)] = _R["no_sizes"]
    other = rest & ~by_sizes
    said = other & ~quiet
    out[said] = reason[said]
    out[other & ~said] = _R["no_shapes"]
    labels = pa.array(list(_REASONS), pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(out.astype(np.int32), mask=out == 0), labels).cast(
        DICT_STRING
    )


# --------------------------------------------------------------------------- sizes for kernels without shapes


@dataclasses.dataclass(frozen=True)
class WorkSizes:
    """The sizes that count GEMM roles and MoE experts without shapes: ``--model``'s architecture
    (``basis`` ``model``) or the sizes found in the trace (``found``). ``gemms``: (K, N) of each role's
    weights (all ranks: :func:`_model_work` divides by ``tp``); experts: count, top-k, one expert's width."""

    basis: str
    name: str | None
    tp: int
    hidden: int
    gemms: dict[str, tuple[int, int]]
    experts: int = 0
    top_k: int = 0
    expert_inter: int = 0
    quant_method: str | None = None
    sizes: dict[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "bf16"  # what its GEMMs compute in when their kernel names do not say

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.top_k > 0 and self.expert_inter > 0

    @classmethod
    def from_arch(cls, arch: architectures.ModelArch, tp: int) -> WorkSizes:
        shapes = arch.gemm_shapes()
        return cls(
            basis="model",
            name=arch.name,
            tp=max(1, tp),
            hidden=arch.hidden_size,
            gemms={r: shapes[r] for r in _MODEL_STAGES if r in shapes},
            experts=arch.num_experts if arch.is_moe else 0,
            top_k=arch.num_experts_per_tok,
            expert_inter=arch.expert_intermediate_size,
            quant_method=arch.quant_method,
            dtype=_QUANT_COMPUTE.get((arch.quant_method or "").lower())
            or hardware.normalize_dtype(arch.dtype)
            or "bf16",
            sizes={
                "hidden_size": arch.hidden_size,
                "vocab_size": arch.vocab_size,
                "intermediate_size": arch.intermediate_size,
                "num_attention_heads": arch.num_attention_heads,
                "num_key_value_heads": arch.num_key_value_heads,
                "head_dim": arch.head_dim,
                "num_hidden_layers": arch.num_hidden_layers,
                "num_experts": arch.num_experts or None,
                "num_experts_per_tok": arch.num_experts_per_tok or None,
                "moe_intermediate_size": arch.moe_intermediate_size,
            },
        )

    @classmethod
    def from_found(cls, d: shape_roles.ModelDims) -> WorkSizes | None:
        """The roles the found sizes give (per rank: a rank's shapes are what its trace records)."""
        h = d.hidden
        gemms: dict[str, tuple[int, int]] = {}
        if d.heads and d.head_dim:
            kv = d.kv_heads or d.heads
            gemms["qkv_gemm"] = (h, (d.heads + 2 * kv) * d.head_dim)
            gemms["o_gemm"] = (d.heads * (d.value_head_dim or d.head_dim), h)
        if d.intermediate:
            gemms["gate_up_gemm"] = (h, 2 * d.intermediate)
            gemms["down_gemm"] = (d.intermediate, h)
        if d.lm_head_out:
            gemms["lm_head_gemm"] = (h, d.lm_head_out)
        if d.experts:
            gemms["moe_gate_gemm"] = (h, d.experts)
        moe = bool(d.experts and d.experts_per_tok and d.expert_intermediate)
        if not gemms and not moe:
            return None
        return cls(
            basis="found",
            name=None,
            tp=1,
            hidden=h,
            gemms=gemms,
            experts=(d.experts or 0) if moe else 0,
            top_k=(d.experts_per_tok or 0) if moe else 0,
            expert_inter=(d.expert_intermediate or 0) if moe else 0,
            sizes=d.as_dict(),
        )

    def describe(self) -> dict[str, Any]:
        """The summary's account of these sizes."""
        return {
            "basis": self.basis,
            "model": self.name,
            "sizes": dict(self.sizes),
            "roles": sorted(self.gemms),
        }


def _sizes(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    model: architectures.ModelArch | None,
    world: int,
    tables: Tables,
    wanting: np.ndarray,
) -> tuple[dict[int, tuple[str, WorkSizes]], list[str]]:
    """Per input (trace id): the sizes that count its kernels without shapes, and the warnings of
    a ``--model`` that disagrees with the sizes the input's shapes show. Sizes are looked for in an
    input only where its own kernels want them (``wanting``) or ``--model`` is to be checked: each
    input is measured from itself, alone or joined with others."""
    out: dict[int, tuple[str, WorkSizes]] = {}
    warnings: list[str] = []
    if kernels.num_rows == 0:
        return out, warnings
    trace_of = kernels["trace_id"].to_numpy(zero_copy_only=False)
    traces = np.unique(trace_of).tolist()
    have_shapes = host_ops.num_rows > 0 and "input_dims" in host_ops.column_names
    for t in traces:
        if model is None and not wanting[trace_of == t].any():
            continue
        one = None if len(traces) == 1 else int(t)
        found = (
            shape_roles.found_sizes(kernels, host_ops, stage, tables.attention, tables.work, one)
            if have_shapes
            else None
        )
        if model is not None:
            ws = WorkSizes.from_arch(model, world)
            out[int(t)] = ("model", ws)
            if found is not None:
                bad = shape_roles.size_disagreements(found, model, world)
                if bad:
                    warnings.append(
                        f"--model {model.name} disagrees with the sizes input {t}'s shapes show: "
                        f"{'; '.join(bad)}; kernels without shapes are counted with --model's"
                    )
            continue
        ws_found = WorkSizes.from_found(found) if found is not None else None
        if ws_found is not None:
            out[int(t)] = ("found", ws_found)
    return out, warnings


def barrier_rows(kernels: pa.Table) -> np.ndarray:
    """The rows that are rocprof ``<barrier packet>`` pseudo-dispatches (their own rule id)."""
    if "rule_id" not in kernels.column_names:
        return np.zeros(kernels.num_rows, bool)
    return dict_isin(kernels["rule_id"], [BARRIER_RULE_ID])


def splitk_reduce_mask(kernels: pa.Table) -> np.ndarray:
    """The split-K reduce kernels (matched once per unique name)."""
    col = kernels["norm_name"].combine_chunks()
    if not isinstance(col, pa.DictionaryArray):
        col = col.dictionary_encode()
    hit = np.array([bool(SPLITK_REDUCE.search(str(v))) for v in col.dictionary.to_pylist()], bool)
    if not hit.any():
        return np.zeros(len(col), bool)
    idx = pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.where(idx >= 0, hit[np.maximum(idx, 0)], False)


def reduce_work(mn: float, split: float, out_bytes: float) -> tuple[float, float]:
    """(flops, bytes) of a split-K reduce of an M x N output: ``split`` fp32 partials read, C written.
    Its additions are part of the GEMM's 2·M·N·K already: no FLOPs of its own (a pure memory pass)."""
    return 0.0, float(split * mn * PARTIAL_BYTES + mn * out_bytes)


def _split_of(kernels: pa.Table, rows: np.ndarray) -> np.ndarray:
    """The decoded split-K factor of ``rows`` (NaN where unknown)."""
    if "split_k" not in kernels.column_names or not len(rows):
        return np.full(len(rows), np.nan)
    sk = kernels["split_k"].take(pa.array(rows)).to_numpy(zero_copy_only=False)
    return np.asarray(sk, np.float64)


def _split(values: np.ndarray) -> float:
    """The largest decoded split-K factor among ``values``; :data:`MIN_SPLIT` when none is known."""
    ok = values[~np.isnan(values) & (values >= MIN_SPLIT)]
    return float(ok.max()) if len(ok) else float(MIN_SPLIT)


def _helpers_of_measured_ops(
    kernels: pa.Table,
    host_ops: pa.Table,
    ops: pa.Table,
    p: np.ndarray,
    lead: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
    source: list[str],
    dtype: list[str],
    tables: Tables | None = None,
) -> np.ndarray:
    """The kernels whose launching op was measured from its shapes (its work is already counted on
    the op's longest kernel). A split-K reduce among them gets the reduce's own numbers: the op's
    M x N partials read ``split`` times and C written once."""
    measured = np.zeros(ops.num_rows, bool)
    done = np.asarray(source, object)[lead] == "shapes"
    measured[p[lead[done]]] = True
    covered = (p >= 0) & measured[np.maximum(p, 0)]
    covered[lead[done]] = False
    red = np.flatnonzero(covered & splitk_reduce_mask(kernels) & np.isnan(nbytes))
    if len(red):
        lead_of = np.full(ops.num_rows, -1, np.int64)
        lead_of[p[lead]] = lead
        partner = lead_of[p[red]]
        split = np.fmax(_split_of(kernels, red), _split_of(kernels, partner))
        at = ops["row"].take(pa.array(p[red])).to_numpy(zero_copy_only=False).astype(np.int64)
        sp = np.where(np.isnan(split) | (split < MIN_SPLIT), float(MIN_SPLIT), split)
        fp32 = np.array([j >= 0 and dtype[j] == "fp32" for j in partner.tolist()], bool)
        out_bytes = np.where(fp32, 4.0, 2.0)  # C in the GEMM's dtype
        # the op's M x N read once per distinct op shape (it repeats in every layer and step)
        group_names, first, inverse = launches.distinct_op_shapes(host_ops, at)
        dims = host_ops["input_dims"].take(pa.array(at[first])).to_pylist()
        mn = np.full(len(first), np.nan)
        work = (tables or Tables.load()).work
        for u, (nm, d) in enumerate(zip(group_names, dims, strict=True)):
            g = work.gemm(nm, d)
            if g is not None:
                mn[u] = g[1].batch * g[1].m * g[1].n
        work_mn = mn[inverse]
        ok = ~np.isnan(work_mn)
        rows_ok = red[ok]
        flops[rows_ok] = 0.0  # a reduce's additions are the GEMM's (see reduce_work)
        nbytes[rows_ok] = sp[ok] * work_mn[ok] * PARTIAL_BYTES + work_mn[ok] * out_bytes[ok]
        for i in rows_ok.tolist():
            dtype[i], source[i] = "fp32", "shapes"
    return covered


def _model_work(
    kernels: pa.Table,
    model: architectures.ModelArch | WorkSizes,
    tp: int,
    flops: np.ndarray,
    nbytes: np.ndarray,
    source: list[str],
    skip: np.ndarray | None = None,
    label: str = "model",
    dtype: np.ndarray | None = None,
    work: WorkOps | None = None,
) -> None:
    """Numbers of the GEMM roles and the MoE experts from the sizes (``--model``'s architecture or
    those found in the trace: :class:`WorkSizes`) and the step's tokens; ``source`` gets ``label``.

    One role of one layer in one step is one piece of work (a role instance: trace, rank, step,
    layer, stage). Its split-K reduce kernels get the reduce's numbers (partials read, C written);
    the other kernels of the instance (a GEMM and its helpers, or the gate_up and down passes of
    the experts) share the instance's work in proportion to their time. A kernel outside any
    detected layer is its own instance. ``dtype`` (when given) gets each counted kernel's roof dtype:
    the one its name spells (``work``'s ``[[kernel_dtype]]``), else the sizes' (:attr:`WorkSizes.dtype`)."""
    if "tokens" not in kernels.column_names:
        return
    ws = model if isinstance(model, WorkSizes) else WorkSizes.from_arch(model, tp)
    tp = ws.tp if isinstance(model, WorkSizes) else max(1, tp)
    n = kernels.num_rows
    tokens = np.asarray(kernels["tokens"].to_numpy(zero_copy_only=False), np.float64)
    todo = (np.asarray(source, object) == "none") & ~np.isnan(tokens)
    if skip is not None and len(skip):
        todo &= ~skip
    shapes = ws.gemms
    roles = [r for r in shapes if r != "gemm"]
    moe = "moe_expert_gemm" if ws.is_moe else None
    todo &= dict_isin(kernels["stage"], [*roles, *([moe] if moe else [])])
    if "phase" in kernels.column_names:
        # an LM head scores one row per sequence in a prefill (or every position): its rows are the
        # step's tokens only in decode
        todo &= ~(dict_isin(kernels["stage"], ["lm_head_gemm"]) & ~dict_isin(kernels["phase"], ["decode"]))
    if not todo.any():
        return
    rows = np.flatnonzero(todo)
    stage = objects(kernels["stage"])
    dur = kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.float64)
    reduce = splitk_reduce_mask(kernels)
    names = kernels["norm_name"].to_pylist() if ws.quant_method or moe else None

    def col(name: str, fill: int) -> np.ndarray:
        if name not in kernels.column_names:
            return np.full(n, fill, np.int64)
        return pc.fill_null(kernels[name], fill).to_numpy(zero_copy_only=False).astype(np.int64)

    row_dtype: dict[int, str] = {}
    if dtype is not None:  # the dtype each counted kernel's name spells, looked up once per name
        spelled: dict[str, str] = {}
        table = work or load_work_ops()
        for r, nm in zip(rows.tolist(), kernels["norm_name"].take(pa.array(rows)).to_pylist(), strict=True):
            key = str(nm or "")
            if key not in spelled:
                spelled[key] = table.kernel_dtype(key) or ws.dtype
            row_dtype[r] = spelled[key]
    layer, step = col("layer", -1), col("step", -1)
    trace, rank = col("trace_id", 0), col("rank", 0)
    frame = pd.DataFrame(
        {"t": trace[rows], "r": rank[rows], "s": step[rows], "l": layer[rows], "st": stage[rows], "row": rows}
    )
    own = (frame["l"] < 0) | (frame["s"] < 0)
    frame.loc[own, "l"] = -1 - frame.loc[own, "row"]  # a kernel outside layers: its own instance
    for _, g in frame.groupby(["t", "r", "s", "l", "st"], sort=False):
        members = g["row"].to_numpy()
        s = str(g["st"].iloc[0])
        t = float(tokens[members[0]])
        red = members[reduce[members]]
        main = members[~reduce[members]]
        split = _split(_split_of(kernels, members))
        if s == moe:
            e_in, e_out = ws.hidden, ws.expert_inter
            routed = t * ws.top_k
            touched = min(ws.experts, routed)  # experts touched: top-k x tokens, at most all
            w = 3 * e_in * e_out  # gate, up, down of each touched expert
            wb = _weight_bytes(ws.quant_method, s, [names[i] for i in main] if names else [])
            f_all = 2.0 * routed * w
            b_all = wb * touched * w + 2.0 * routed * (e_in + e_out) * 2
            out_n = e_in
        else:
            k_in, n_out = shapes[s]
            w = k_in * n_out / tp  # each rank holds 1/tp of the weights
            wb = _weight_bytes(ws.quant_method, s, [names[i] for i in main] if names else [])
            out_n = n_out / tp
            f_all = 2.0 * t * w
            # A and the weights read; C written, or the fp32 partials when a reduce kernel follows
            c_bytes = split * t * out_n * PARTIAL_BYTES if len(red) else 2.0 * t * out_n
            b_all = wb * w + 2.0 * t * k_in + c_bytes
        for i in red:
            flops[i], nbytes[i] = reduce_work(t * out_n, split, 2.0)
            source[i] = label
            if dtype is not None:
                dtype[i] = "fp32"  # a reduce reads fp32 partials (a memory pass)
        if len(main):
            share = dur[main] / dur[main].sum() if dur[main].sum() > 0 else np.full(len(main), 1 / len(main))
            flops[main] = f_all * share
            nbytes[main] = b_all * share
            for i in main:
                source[i] = label
                if dtype is not None:
                    dtype[i] = row_dtype[int(i)]


def _weight_bytes(quant_method: str | None, stage: str, names: list[str]) -> float:
    """Bytes per weight: a 4-bit format named by the kernel (``..._bf16xbf16xmxfp4_...``), else the
    model's quantization (gpt-oss quantizes only its experts), else 2 (bf16)."""
    for nm in names:
        m = _QUANT_IN_NAME.search(nm or "")
        if m:
            return _QUANT_WEIGHT_BYTES[m.group(0).lower()]
    q = (quant_method or "").lower()
    if q == "mxfp4" and stage != "moe_expert_gemm":
        return 2.0
    return _QUANT_WEIGHT_BYTES.get(q, 2.0)


# --------------------------------------------------------------------------- rates and bounds


def rates(
    dur_ns: np.ndarray, flops: np.ndarray, nbytes: np.ndarray, dtype: list[str], spec: hardware.GpuSpec | None
) -> dict[str, Any]:
    dur = np.asarray(dur_ns, np.float64)
    flops = np.asarray(flops, np.float64)
    nbytes = np.asarray(nbytes, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tflops = np.where(dur > 0, flops / dur / 1e3, np.nan)  # flop/ns = GFLOP/s; /1e3 -> TFLOP/s
        tbps = np.where(dur > 0, nbytes / dur / 1e3, np.nan)  # byte/ns = GB/s; /1e3 -> TB/s
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
    n = len(dur)
    pct = np.full(n, np.nan)
    code = np.zeros(n, np.int8)  # positions in BOUNDS: no per-row strings for millions of kernels
    roof_names: list[str] = []  # the dtypes whose peaks the roofs use (roof_dtype), by code
    roof_code = np.full(n, -1, np.int32)
    if spec is not None:
        bw = spec.hbm_tbps
        default = hardware.peak_tflops(spec, "bf16") or np.nan
        dts = np.asarray(dtype, dtype=object)
        peak = np.full(n, default)
        for d in set(dtype):
            p = hardware.peak_tflops(spec, d)
            sel = dts == d
            peak[sel] = p if p else default
            used = (hardware.normalize_dtype(d) or d) if p else ("bf16" if default == default else None)
            if used is not None:
                if used not in roof_names:
                    roof_names.append(used)
                roof_code[sel] = roof_names.index(used)
        has = ~(np.isnan(tbps) & np.isnan(tflops))
        roof_code[~has] = -1
        over = has & ((~np.isnan(tflops) & (tflops > peak)) | (~np.isnan(tbps) & (tbps > bw)))
        with np.errstate(divide="ignore", invalid="ignore"):
            roof = np.where(np.isnan(intensity), peak, np.minimum(peak, intensity * bw))
            compute_pct = np.where(roof > 0, tflops / roof, np.nan)
        has_flops = has & ~over & (np.nan_to_num(flops) > 0) & ~np.isnan(peak)
        mem_only = has & ~over & ~has_flops
        pct = np.where(has_flops, compute_pct, np.where(mem_only, tbps / bw, np.nan))
        kind = np.where(has_flops & (intensity >= peak / bw), _BOUND_CODE["compute"], _BOUND_CODE["memory"])
        latency = (dur < LATENCY_NS) & (pct < LATENCY_PCT)
        ok = has & ~over
        code = np.where(ok, np.where(latency, _BOUND_CODE["latency"], kind), code)
        code = np.where(over, _BOUND_CODE["invalid"], code).astype(np.int8)
        tflops = np.where(over, np.nan, tflops)
        tbps = np.where(over, np.nan, tbps)
    return {
        "flops": flops,
        "bytes": nbytes,
        "achieved_tflops": tflops,
        "achieved_tbps": tbps,
        "pct_of_peak": pct,
        "intensity": intensity,
        "bound": pd.Categorical.from_codes(code, categories=BOUNDS).remove_unused_categories(),
        "roof_dtype": pd.Categorical.from_codes(roof_code, categories=roof_names).remove_unused_categories(),
    }
