"""Roofline: FLOPs and bytes per kernel, achieved rates, and what bounds each kernel (DESIGN §5).

Contract (pure over the analysed tables, the GPU spec and an optional model architecture):

* **GPU**: ``--gpu`` if given, else detected from the first input's metadata (name, arch, SM/CU
  count and memory together). An unknown GPU leaves rates computed but bounds ``unknown``.
* **FLOPs / bytes**: from the launching host op's input shapes and dtypes when recorded
  (``flops_source = shapes``): GEMMs (mm, addmm, bmm, linear, matmul, scaled/grouped mm), SDPA and
  flash attention, and memory-bound ops (norm pieces, RoPE, activation, KV-cache writes, embedding,
  sampling, copies) as compulsory bytes (inputs read once, output written once). The numbers of an
  op go to its longest kernel; its helper kernels (split-K reduce, sort passes) keep null numbers.
  Without shapes, GEMM roles and attention get numbers from the model architecture (``--model``)
  and the step's token count (``flops_source = model``). Otherwise null (``none``).
* **Rates**: achieved TFLOP/s = flops / dur, TB/s = bytes / dur, intensity = flops / bytes,
  ``pct_of_peak`` = achieved FLOP/s over the roof at that intensity (min(peak, intensity x BW)), or
  achieved TB/s over peak BW when there are no FLOPs. ``bound``: ``compute`` / ``memory`` by the
  ridge point, ``latency`` when a short kernel reaches under 10% of its roof, ``invalid`` when a
  rate exceeds a peak (a data error: warned, never printed as fact), ``unknown`` without numbers
  or without a known GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.knowledge import architectures, hardware
from analyzer.model import DICT_STRING, dict_isin, dict_strings, objects

if TYPE_CHECKING:
    from analyzer.pipeline import Analysis, Options

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


# --------------------------------------------------------------------------- entry point


def run(analysis: Analysis, options: Options) -> None:
    measure(analysis, options)
    analysis.warnings.extend(rate_warnings(analysis))


def measure(analysis: Analysis, options: Options) -> None:
    """Work, rates and bound of every kernel: the per-trace part of :func:`run`. Inputs measured
    apart agree with the joined run when they resolve to the same GPU and world size."""
    spec, reason = resolve_gpu(analysis, options.gpu)
    analysis.gpu = gpu_summary(spec, reason)
    model = None
    if options.model:
        model = architectures.load_model(options.model)
        analysis.model = model
    flops, nbytes, source, dtype = kernel_work(
        analysis.kernels,
        analysis.trace.host_ops,
        model,
        world_size=world_size(analysis.trace.inputs),
    )
    cols = rates(analysis.kernels["dur_ns"].to_numpy(zero_copy_only=False), flops, nbytes, dtype, spec)
    cols["flops_source"] = source
    k = analysis.kernels
    for name, typ in COLUMNS.items():
        arr = dict_strings(cols[name]) if typ == DICT_STRING else pa.array(cols[name], typ, from_pandas=True)
        k = (
            k.set_column(k.schema.get_field_index(name), name, arr)
            if name in k.column_names
            else k.append_column(name, arr)
        )
    analysis.kernels = k


def world_size(inputs: Sequence[Any]) -> int:
    """The run's world size: collectives move data across this many ranks."""
    return max(m.world_size for m in inputs)


def rate_warnings(analysis: Analysis) -> list[str]:
    """An unknown GPU, and kernels measured faster than the GPU's peaks, over the whole run."""
    gpu = analysis.gpu or {}
    if gpu.get("name") is None:
        return [
            f"GPU not known to rules/hardware.toml ({gpu.get('reason')}): times only, no bounds (use --gpu NAME)"
        ]
    invalid = dict_isin(analysis.kernels["bound"], ["invalid"])
    if not invalid.any():
        return []
    names = pd.Series(objects(analysis.kernels["norm_name"]))[invalid].value_counts()
    top = "; ".join(f"{n[:60]} (x{c})" for n, c in names.head(3).items())
    return [
        f"{int(invalid.sum())} kernels exceed a peak of {gpu['name']} "
        f"(bound=invalid, rates not trusted): {top}"
    ]


def resolve_gpu(analysis: Analysis, override: str | None) -> tuple[hardware.GpuSpec | None, str]:
    if override:
        return gpu_override(override), f"--gpu {override}"
    m = analysis.trace.inputs[0]
    return hardware.detect_gpu(m.gpu_name, m.arch, m.sm_count, m.total_memory)


def gpu_override(name: str) -> hardware.GpuSpec:
    """The GPU named by ``--gpu``; UsageError when rules/hardware.toml does not know it."""
    spec = hardware.find_gpu(name)
    if spec is None:
        from analyzer.errors import UsageError

        known = ", ".join(sorted(hardware.load_hardware()))
        raise UsageError(f"--gpu {name!r} is not in rules/hardware.toml (known: {known})")
    return spec


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
    if name in NO_OUTPUT_SIZE_OPS or not name.startswith("aten::"):
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
    from analyzer.analyses.classify import launching_op_rows

    found = launching_op_rows(kernels, host_ops)
    if found is not None:
        ops, pos = found
        p = pc.fill_null(pos, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        is_kernel = (kdf["kind"] == "kernel").to_numpy()
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
    # 2. model architecture for the rest
    if model is not None:
        _model_work(kernels, model, world_size, flops, nbytes, source)
    return flops, nbytes, source, dtype


def _model_work(
    kernels: pa.Table,
    model: architectures.ModelArch,
    tp: int,
    flops: np.ndarray,
    nbytes: np.ndarray,
    source: list[str],
) -> None:
    if "tokens" not in kernels.column_names:
        return
    stage = kernels["stage"].to_pylist()
    tokens = kernels["tokens"].to_pylist()
    shapes = model.gemm_shapes()
    wb = 2.0
    for i, s in enumerate(stage):
        if source[i] != "none" or tokens[i] is None:
            continue
        t = float(tokens[i])
        if s in shapes and s != "gemm":
            k_in, n_out = shapes[s]
            w = k_in * n_out / tp  # each rank holds 1/tp of the weights
            flops[i] = 2.0 * t * w
            nbytes[i] = wb * (w + t * (k_in + n_out / tp))
            source[i] = "model"
        elif s == "moe_expert_gemm" and model.is_moe:
            e_in, e_out = model.hidden_size, model.expert_intermediate_size
            routed = t * model.num_experts_per_tok
            active = min(model.num_experts, routed)
            w = 3 * e_in * e_out  # gate, up, down of each active expert
            flops[i] = 2.0 * routed * w
            nbytes[i] = wb * (active * w + routed * (e_in + e_out) * 2)
            source[i] = "model"


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
