"""Roofline: FLOPs and bytes per kernel, achieved rates, and what bounds each kernel (DESIGN §5).

Contract (pure over the analysed tables, the GPU spec and an optional model architecture):

* **GPU**: ``--gpu`` if given, else detected from the first input's metadata (name, arch, SM/CU
  count and memory together). An unknown GPU leaves rates computed but bounds ``unknown``.
* **FLOPs / bytes**: from the launching host op's input shapes and dtypes when recorded
  (``flops_source = shapes``): GEMMs (mm, addmm, bmm, linear, matmul, scaled/grouped mm), SDPA and
  flash attention, and memory-bound ops (norm pieces, RoPE, activation, KV-cache writes, embedding,
  sampling, copies) as compulsory bytes (inputs read once, output written once). The numbers of an
  op go to its longest kernel; its helper kernels are not new work and keep null numbers, except a
  split-K reduce, which reads the fp32 partials and writes C (never the GEMM's A and B).
  Without shapes, GEMM roles and MoE experts get numbers from the model architecture (``--model``)
  and the step's token count (``flops_source = model``): one role of one layer in one step is one
  piece of work, its split-K reduce kernels get the reduce's numbers and its other kernels share
  the rest by time; MoE weights count the experts touched (top-k x tokens, at most all) in the
  format the kernel names or the model ships. Otherwise null (``none``).
* **Rates**: achieved TFLOP/s = flops / dur, TB/s = bytes / dur, intensity = flops / bytes,
  ``pct_of_peak`` = achieved FLOP/s over the roof at that intensity (min(peak, intensity x BW)), or
  achieved TB/s over peak BW when there are no FLOPs. ``bound``: ``compute`` / ``memory`` by the
  ridge point, ``latency`` when a short kernel reaches under 10% of its roof, ``invalid`` when a
  rate exceeds a peak (a data error: warned, never printed as fact), ``unknown`` without numbers
  or without a known GPU. rocprof's ``<barrier packet>`` pseudo-dispatches (rule ``MEM600``) are
  queue waits, not work: they never get numbers.
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

from analyzer.knowledge import architectures, hardware
from analyzer.knowledge.kernel_rules import BARRIER_RULE_ID
from analyzer.model import DICT_STRING, dict_isin, dict_strings, objects
from analyzer.tables import launches

COLUMNS = {
    "flops": pa.float64(),
    "bytes": pa.float64(),
    "flops_source": DICT_STRING,
    "achieved_tflops": pa.float64(),
    "achieved_tbps": pa.float64(),
    "pct_of_peak": pa.float64(),
    "intensity": pa.float64(),
    "bound": DICT_STRING,
}
_MISSING = object()
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
    "long int": 8,
    "int": 4,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "c10::complex<float>": 8,
}
GEMM_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "aten::_scaled_mm",
    "aten::_grouped_mm",
    "aten::_scaled_grouped_mm",
}
ATTN_OPS = {
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
    "aten::_cudnn_attention_forward",
    "aten::scaled_dot_product_attention",
}
# reductions: read the input once, write a (much) smaller output
REDUCTION_OPS = {
    "aten::mean",
    "aten::sum",
    "aten::argmax",
    "aten::argmin",
    "aten::max",
    "aten::min",
    "aten::amax",
    "aten::amin",
    "aten::prod",
    "aten::any",
    "aten::all",
    "aten::norm",
    "aten::linalg_vector_norm",
    "aten::var",
    "aten::std",
    "aten::var_mean",
    "aten::logsumexp",
}
# gathers / selections whose output size depends on index tensors not recorded in Input Dims
NO_OUTPUT_SIZE_OPS = {
    "aten::index",
    "aten::gather",
    "aten::nonzero",
    "aten::masked_select",
    "aten::take",
    "aten::index_put_",
    "aten::scatter",
    "aten::scatter_add_",
    "aten::index_add_",
}
# gathers that read only the selected rows of their table: bytes = selected rows read + written
GATHER_OPS = {"aten::index_select", "aten::embedding"}
# split-K reduce kernels (cuBLASLt splitKreduce_kernel, CK/hipBLASLt split-K reduce passes): they read
# the fp32 partial sums of the GEMM and write C, not the GEMM's A and B
SPLITK_REDUCE = re.compile(r"split_?k_?reduce|reduce_?split_?k", re.IGNORECASE)
PARTIAL_BYTES = 4.0  # split-K partial sums are fp32
MIN_SPLIT = 2  # a reduce kernel reads at least two partials: the compulsory minimum when the split is unknown
# bytes per weight of quantized formats: 4-bit values plus one 8-bit scale per block (MX: 32, NV: 16)
_QUANT_WEIGHT_BYTES = {"mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "fp8": 1.0}
_QUANT_IN_NAME = re.compile(r"mxfp4|nvfp4", re.IGNORECASE)


def base_op(name: str) -> str:
    """An ATen op without its private spelling: ``aten::_index_put_impl_`` -> ``aten::index_put_``."""
    if not name.startswith("aten::_"):
        return name
    base = "aten::" + name[len("aten::") :].lstrip("_")
    return base.replace("_impl_", "_").removesuffix("_impl")


# --------------------------------------------------------------------------- entry point


@dataclasses.dataclass(frozen=True)
class Measured:
    """What :func:`measure` gives: the kernels with the roofline columns, and the run's GPU."""

    kernels: pa.Table
    gpu: dict[str, Any]


def measure(
    kernels: pa.Table,
    host_ops: pa.Table,
    inputs: Sequence[Any],
    gpu: tuple[hardware.GpuSpec, str] | None = None,
    model: architectures.ModelArch | None = None,
    gpu_table: Mapping[str, hardware.GpuSpec] | None = None,
) -> Measured:
    """Work, rates and bound of every kernel. ``gpu`` is the ``--gpu`` override and how it was
    named (None: detected from the first input, among ``gpu_table``, rules/hardware.toml's entries);
    ``model`` the ``--model`` architecture. Inputs measured apart agree with the
    joined run when they resolve to the same GPU and world size."""
    spec, reason = resolve_gpu(inputs, gpu, gpu_table)
    flops, nbytes, source, dtype = kernel_work(kernels, host_ops, model, world_size=world_size(inputs))
    cols = rates(kernels["dur_ns"].to_numpy(zero_copy_only=False), flops, nbytes, dtype, spec)
    cols["flops_source"] = source
    k = kernels
    for name, typ in COLUMNS.items():
        arr = dict_strings(cols[name]) if typ == DICT_STRING else pa.array(cols[name], typ, from_pandas=True)
        k = (
            k.set_column(k.schema.get_field_index(name), name, arr)
            if name in k.column_names
            else k.append_column(name, arr)
        )
    return Measured(kernels=k, gpu=gpu_summary(spec, reason))


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


# --------------------------------------------------------------------------- work per kernel


def _bytes_of(dtype: str | None) -> float:
    return float(_DTYPE_BYTES.get(dtype or "", 2))


def _numel(shape: Sequence[int] | None) -> int:
    return int(math.prod(shape)) if shape else 0


def op_work(
    name: str, dims: list[list[int]] | None, types: list[str] | None
) -> tuple[float, float, str] | None:
    """(flops, bytes, dtype) of one host op from its recorded shapes; None when not derivable."""
    if not dims:
        return None
    types = types or []
    tensors = [(d, types[i] if i < len(types) else "") for i, d in enumerate(dims) if d]
    if not tensors:
        return None
    dt = next(
        (t for _, t in tensors if t in _DTYPE_BYTES and t not in ("long int", "int", "bool")), "c10::BFloat16"
    )
    b = _bytes_of(dt)
    dtype = hardware.normalize_dtype(dt) or "bf16"
    if name in GEMM_OPS:
        g = _gemm(name, [d for d, _ in tensors])
        if g is None:
            return None
        batch, m, k, n = g
        flops = 2.0 * batch * m * k * n
        nbytes = b * batch * (m * k + k * n + m * n)  # A, B (the weights) and C, each once
        return flops, nbytes, dtype
    if name in ATTN_OPS:
        if len(tensors) < 3 or len(tensors[0][0]) != 4:
            return None
        (bq, hq, sq, d), (_, hk, sk, _) = tensors[0][0], tensors[1][0]
        dv = tensors[2][0][-1]
        causal = 0.5 if sq == sk and sq > 1 else 1.0
        flops = 2.0 * bq * hq * sq * sk * (d + dv) * causal
        nbytes = b * (bq * hq * sq * d + 2 * bq * hk * sk * d + bq * hq * sq * dv)
        return flops, nbytes, dtype
    if name in NO_OUTPUT_SIZE_OPS or base_op(name) in NO_OUTPUT_SIZE_OPS or not name.startswith("aten::"):
        # the output size is not in the inputs' shapes; custom ops (aiter::, sgl_kernel::, vllm::)
        # often pass whole buffers (a KV-cache pool) of which the kernel touches a slice
        return None
    # memory-bound ops: inputs read once + output written once (output ~ largest input)
    sizes = [_numel(d) * _bytes_of(t) for d, t in tensors]
    largest = max(sizes)
    if name in GATHER_OPS:
        # gathers read only the selected rows: output = index count x row size
        w, idx = tensors[0][0], tensors[1][0] if len(tensors) > 1 else [1]
        row = _numel(w[1:]) * _bytes_of(tensors[0][1])
        return 0.0, 2.0 * _numel(idx) * row + _numel(idx) * 8, dtype
    numel = max(_numel(d) for d, _ in tensors)
    if name in REDUCTION_OPS:
        # the output is the input with the reduced dimensions gone: small next to the input
        return float(numel), float(sum(sizes)), dtype
    if name.endswith("_"):
        # in-place / out= style (copy_, add_, fill_): the first tensor is the output, written once
        return float(numel), float(sum(sizes)), dtype
    return float(numel), float(sum(sizes) + largest), dtype


def _gemm(name: str, d: list[list[int]]) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a GEMM op from its input shapes."""
    try:
        if name in ("aten::mm", "aten::_scaled_mm") and len(d[0]) == 2 and len(d[1]) == 2:
            return 1, d[0][0], d[0][1], d[1][1]
        if name == "aten::addmm" and len(d) >= 3:
            a, w = d[-2], d[-1]
            return 1, a[0], a[1], w[1]
        if name in ("aten::bmm",) and len(d[0]) == 3:
            return d[0][0], d[0][1], d[0][2], d[1][2]
        if name == "aten::baddbmm" and len(d) >= 3:
            return d[1][0], d[1][1], d[1][2], d[2][2]
        if name == "aten::linear" and len(d[1]) == 2:
            m = _numel(d[0][:-1])
            return 1, m, d[0][-1], d[1][0]
        if name == "aten::matmul" and len(d) >= 2:
            a, w = d[0], d[1]
            if len(w) == 2:
                return 1, _numel(a[:-1]), a[-1], w[-1]
            if len(a) == len(w) and len(a) >= 3:
                return _numel(a[:-2]), a[-2], a[-1], w[-1]
    except (IndexError, TypeError):
        return None
    return None


def kernel_work(
    kernels: pa.Table, host_ops: pa.Table, model: architectures.ModelArch | None, world_size: int = 1
) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """Per kernel: flops, bytes (NaN when unknown), flops_source and dtype."""
    n = kernels.num_rows
    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    source = ["none"] * n
    dtype = ["bf16"] * n
    kdf = pd.DataFrame(
        {
            "trace_id": kernels["trace_id"].to_numpy(zero_copy_only=False),
            "ext": kernels["launch_op_id"].to_pandas(),
            "dur": kernels["dur_ns"].to_numpy(zero_copy_only=False),
            "kind": kernels["kind"].to_pandas(),
        }
    )
    # 1. shapes: the numbers of each launching op go to its longest kernel
    found = launches.launching_op_rows(kernels, host_ops)
    if found is not None:
        ops, pos = found
        p = pc.fill_null(pos, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        # rocprof's barrier packets are queue waits, not kernels: never an op's lead kernel
        is_kernel = (kdf["kind"] == "kernel").to_numpy() & ~barrier_rows(kernels)
        cand = np.flatnonzero((p >= 0) & is_kernel)
        order = cand[np.argsort(-kdf["dur"].to_numpy()[cand], kind="stable")]
        _, first = np.unique(p[order], return_index=True)
        lead = order[first]  # one kernel per op: the longest
        op_rows = p[lead]
        sub = ops.take(pa.array(op_rows))
        name_col = sub["name"].combine_chunks()
        name_idx = (
            name_col.indices
            if isinstance(name_col, pa.DictionaryArray)
            else name_col.dictionary_encode().indices
        ).to_numpy(zero_copy_only=False)
        names = (
            name_col.dictionary
            if isinstance(name_col, pa.DictionaryArray)
            else name_col.dictionary_encode().dictionary
        ).to_pylist()
        sid = sub["shape_id"].combine_chunks()
        if sid.null_count < len(sid):
            # the same op on the same shapes repeats every layer and step: one computation per pair
            # shape ids are per input file: the trace id is part of the key
            # one int64 key per (op name, shape id, trace): shape ids are factorised first
            _, shape_code = np.unique(pc.fill_null(sid, -1).to_numpy(), return_inverse=True)
            trace_col = sub["trace_id"].combine_chunks().to_numpy(zero_copy_only=False).astype(np.int64)
            n_traces = int(trace_col.max()) + 1 if len(trace_col) else 1
            key = (
                name_idx.astype(np.int64) * (int(shape_code.max()) + 1) + shape_code
            ) * n_traces + trace_col
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            at = sub["row"].take(pa.array(first))
            dims = host_ops["input_dims"].take(at).to_pylist()
            types = host_ops["input_types"].take(at).to_pylist()
            first_names = name_idx[first].tolist()
            work = [
                op_work(names[ni], d, ty) if d is not None else None
                for ni, d, ty in zip(first_names, dims, types, strict=True)
            ]
            ok = np.array([w is not None for w in work], bool)
            w_flops = np.array([w[0] if w is not None else np.nan for w in work], np.float64)
            w_bytes = np.array([w[1] if w is not None else np.nan for w in work], np.float64)
            w_dtype = np.array([w[2] if w is not None else "" for w in work], object)
            inverse = np.asarray(inverse).reshape(-1)
            hit = ok[inverse]
            rows = lead[hit]
            flops[rows] = w_flops[inverse[hit]]
            nbytes[rows] = w_bytes[inverse[hit]]
            dt = w_dtype[inverse[hit]].tolist()
            for i, d in zip(rows.tolist(), dt, strict=True):
                dtype[i] = d
                source[i] = "shapes"
        else:
            dims = host_ops["input_dims"].take(sub["row"]).to_pylist()
            types = host_ops["input_types"].take(sub["row"]).to_pylist()
            memo: dict[bytes, Any] = {}
            per_row = []
            for ni, d, ty in zip(name_idx.tolist(), dims, types, strict=True):
                mk = orjson.dumps((ni, d, ty))
                if mk not in memo:
                    memo[mk] = op_work(names[ni], d, ty) if d is not None else None
                per_row.append(memo[mk])
            for i, w in zip(lead.tolist(), per_row, strict=True):
                if w is not None:
                    flops[i], nbytes[i], dtype[i] = w
                    source[i] = "shapes"
        covered = _helpers_of_measured_ops(kernels, host_ops, ops, p, lead, flops, nbytes, source, dtype)
    else:
        covered = np.zeros(n, bool)
    # 2. model architecture for the rest (an op's helper kernels are not new work)
    if model is not None:
        _model_work(kernels, model, world_size, flops, nbytes, source, skip=covered)
    return flops, nbytes, source, dtype


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
) -> np.ndarray:
    """The kernels whose launching op was measured from its shapes (its work is already counted on
    the op's longest kernel). A split-K reduce among them gets the reduce's own numbers: the op's
    M x N partials read ``split`` times and C written once."""
    measured = np.zeros(ops.num_rows, bool)
    done = np.array([source[i] == "shapes" for i in lead.tolist()], bool)
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
        for u, (nm, d) in enumerate(zip(group_names, dims, strict=True)):
            g = _gemm(str(nm), [x for x in (d or []) if x]) if nm in GEMM_OPS else None
            if g is not None:
                batch, m, _, nn = g
                mn[u] = batch * m * nn
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
    model: architectures.ModelArch,
    tp: int,
    flops: np.ndarray,
    nbytes: np.ndarray,
    source: list[str],
    skip: np.ndarray | None = None,
) -> None:
    """Numbers of the GEMM roles and the MoE experts from the architecture and the step's tokens.

    One role of one layer in one step is one piece of work (a role instance: trace, rank, step,
    layer, stage). Its split-K reduce kernels get the reduce's numbers (partials read, C written);
    the other kernels of the instance (a GEMM and its helpers, or the gate_up and down passes of
    the experts) share the instance's work in proportion to their time. A kernel outside any
    detected layer is its own instance."""
    if "tokens" not in kernels.column_names:
        return
    n = kernels.num_rows
    stage = np.asarray(kernels["stage"].to_pylist(), dtype=object)
    tokens = np.asarray(kernels["tokens"].to_numpy(zero_copy_only=False), np.float64)
    todo = np.array([src == "none" for src in source], bool) & ~np.isnan(tokens)
    if skip is not None and len(skip):
        todo &= ~skip
    shapes = model.gemm_shapes()
    roles = [r for r in shapes if r != "gemm"]
    moe = "moe_expert_gemm" if model.is_moe else None
    todo &= np.isin(stage, [*roles, *([moe] if moe else [])])
    if not todo.any():
        return
    rows = np.flatnonzero(todo)
    dur = kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.float64)
    reduce = splitk_reduce_mask(kernels)
    names = kernels["norm_name"].to_pylist() if model.quant_method or moe else None

    def col(name: str, fill: int) -> np.ndarray:
        if name not in kernels.column_names:
            return np.full(n, fill, np.int64)
        return pc.fill_null(kernels[name], fill).to_numpy(zero_copy_only=False).astype(np.int64)

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
            e_in, e_out = model.hidden_size, model.expert_intermediate_size
            routed = t * model.num_experts_per_tok
            touched = min(model.num_experts, routed)  # experts touched: top-k x tokens, at most all
            w = 3 * e_in * e_out  # gate, up, down of each touched expert
            wb = _weight_bytes(model, s, [names[i] for i in main] if names else [])
            f_all = 2.0 * routed * w
            b_all = wb * touched * w + 2.0 * routed * (e_in + e_out) * 2
            out_n = e_in
        else:
            k_in, n_out = shapes[s]
            w = k_in * n_out / tp  # each rank holds 1/tp of the weights
            wb = _weight_bytes(model, s, [names[i] for i in main] if names else [])
            out_n = n_out / tp
            f_all = 2.0 * t * w
            # A and the weights read; C written, or the fp32 partials when a reduce kernel follows
            c_bytes = split * t * out_n * PARTIAL_BYTES if len(red) else 2.0 * t * out_n
            b_all = wb * w + 2.0 * t * k_in + c_bytes
        for i in red:
            flops[i], nbytes[i] = reduce_work(t * out_n, split, 2.0)
            source[i] = "model"
        if len(main):
            share = dur[main] / dur[main].sum() if dur[main].sum() > 0 else np.full(len(main), 1 / len(main))
            flops[main] = f_all * share
            nbytes[main] = b_all * share
            for i in main:
                source[i] = "model"


def _weight_bytes(model: architectures.ModelArch, stage: str, names: list[str]) -> float:
    """Bytes per weight: a 4-bit format named by the kernel (``..._bf16xbf16xmxfp4_...``), else the
    model's quantization (gpt-oss quantizes only its experts), else 2 (bf16)."""
    for nm in names:
        m = _QUANT_IN_NAME.search(nm or "")
        if m:
            return _QUANT_WEIGHT_BYTES[m.group(0).lower()]
    q = (model.quant_method or "").lower()
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
    if spec is not None:
        bw = spec.hbm_tbps
        default = hardware.peak_tflops(spec, "bf16") or np.nan
        dts = np.asarray(dtype, dtype=object)
        peak = np.full(n, default)
        for d in set(dtype):
            p = hardware.peak_tflops(spec, d)
            peak[dts == d] = p if p else default
        has = ~(np.isnan(tbps) & np.isnan(tflops))
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
    }
