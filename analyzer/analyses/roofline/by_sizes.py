"""The work of GEMM-role and MoE-expert kernels without shapes, from the model's sizes.

Contract: the sizes are ``--model``'s architecture (``flops_source = model``), else those found in
the trace's own recorded shapes (:func:`analyzer.analyses.shape_roles.found_sizes`, ``found``); a
``--model`` that disagrees with the found sizes is a warning. With the step's token count, one role
of one layer in one step is one piece of work: its split-K reduce kernels get the reduce's numbers
and its other kernels share the rest by time; MoE weights count the experts touched (top-k x tokens,
at most all) in the format the kernel names or the model ships. A counted kernel's roof dtype is the
one its name spells (``[[kernel_dtype]]``), else the model's quantization (fp8) or dtype.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses import shape_roles
from analyzer.analyses.roofline.formulas import Tables
from analyzer.analyses.roofline.splitk import (
    PARTIAL_BYTES,
    largest_split,
    reduce_work,
    split_of,
    splitk_reduce_mask,
)
from analyzer.knowledge import architectures, hardware
from analyzer.knowledge.work_ops import WorkOps, load_work_ops
from analyzer.tables.dictionaries import dict_isin, objects
from analyzer.tables.launches import OpJoin

# bytes per weight of quantized formats: 4-bit values plus one 8-bit scale per block (MX: 32, NV: 16)
_QUANT_WEIGHT_BYTES = {"mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "fp8": 1.0}
_QUANT_IN_NAME = re.compile(r"mxfp4|nvfp4", re.IGNORECASE)
# what a model's GEMMs compute in by its quantization (config quant_method), where not its dtype:
# block-wise FP8 checkpoints (DeepSeek-V3) run FP8 x FP8 GEMMs; MXFP4 experts (gpt-oss) take bf16
# activations, so they keep the model's dtype
_QUANT_COMPUTE = {"fp8": "fp8", "fbgemm_fp8": "fp8"}
CONSUMER_WINDOW = 16  # ops after a gather searched for the one taking the gathered rows (work_ops.toml)
MODEL_STAGES = (
    "qkv_gemm",
    "o_gemm",
    "gate_up_gemm",
    "down_gemm",
    "lm_head_gemm",
    "moe_gate_gemm",
    "moe_expert_gemm",
)


@dataclasses.dataclass(frozen=True)
class WorkSizes:
    """The sizes that count GEMM roles and MoE experts without shapes: ``--model``'s architecture
    (``basis`` ``model``) or the sizes found in the trace (``found``). ``gemms``: (K, N) of each role's
    weights (all ranks: :func:`model_work` divides by ``tp``); experts: count, top-k, one expert's width."""

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
            gemms={r: shapes[r] for r in MODEL_STAGES if r in shapes},
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


def sizes_per_input(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    model: architectures.ModelArch | None,
    world: int,
    tables: Tables,
    wanting: np.ndarray,
    join: OpJoin | None = None,
) -> tuple[dict[int, tuple[str, WorkSizes]], list[str], dict[int, Any]]:
    """Per input (trace id): the sizes that count its kernels without shapes, and the warnings of
    a ``--model`` that disagrees with the sizes the input's shapes show; and per input whose shapes
    were looked at, the sizes they show (None: none), for the readers after the roofline. Sizes
    are looked for in an input only where its own kernels want them (``wanting``) or ``--model`` is
    to be checked: each input is measured from itself, alone or joined with others."""
    out: dict[int, tuple[str, WorkSizes]] = {}
    warnings: list[str] = []
    looked: dict[int, Any] = {}
    if kernels.num_rows == 0:
        return out, warnings, looked
    trace_of = kernels["trace_id"].to_numpy(zero_copy_only=False)
    traces = np.unique(trace_of).tolist()
    have_shapes = host_ops.num_rows > 0 and "input_dims" in host_ops.column_names
    for t in traces:
        if model is None and not wanting[trace_of == t].any():
            continue
        one = None if len(traces) == 1 else int(t)
        found = (
            shape_roles.found_sizes(kernels, host_ops, stage, tables.attention, tables.work, one, join)
            if have_shapes
            else None
        )
        if have_shapes:
            looked[int(t)] = found
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
    return out, warnings, looked


def model_work(
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
    tokens = np.asarray(kernels["tokens"].to_numpy(zero_copy_only=False), np.float64)
    moe = "moe_expert_gemm" if ws.is_moe else None
    rows = _rows_to_count(kernels, ws, moe, source, tokens, skip)
    if not len(rows):
        return
    dur = kernels["dur_ns"].to_numpy(zero_copy_only=False).astype(np.float64)
    reduce = splitk_reduce_mask(kernels)
    names = kernels["norm_name"].to_pylist() if ws.quant_method or moe else None
    row_dtype = _spelled_dtypes(kernels, rows, ws, work) if dtype is not None else {}
    for _, g in _instances(kernels, rows).groupby(["t", "r", "s", "l", "st"], sort=False):
        members = g["row"].to_numpy()
        s = str(g["st"].iloc[0])
        t = float(tokens[members[0]])
        red = members[reduce[members]]
        main = members[~reduce[members]]
        split = largest_split(split_of(kernels, members))
        wb = _weight_bytes(ws.quant_method, s, [names[i] for i in main] if names else [])
        f_all, b_all, out_n = _instance_work(ws, tp, s == moe, s, t, wb, split if len(red) else None)
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


def _rows_to_count(
    kernels: pa.Table,
    ws: WorkSizes,
    moe: str | None,
    source: list[str],
    tokens: np.ndarray,
    skip: np.ndarray | None,
) -> np.ndarray:
    """The kernels the sizes count: not counted yet, in a step with tokens, of a role the sizes
    give (or the experts), and not an LM head outside decode."""
    todo = (np.asarray(source, object) == "none") & ~np.isnan(tokens)
    if skip is not None and len(skip):
        todo &= ~skip
    roles = [r for r in ws.gemms if r != "gemm"]
    todo &= dict_isin(kernels["stage"], [*roles, *([moe] if moe else [])])
    if "phase" in kernels.column_names:
        # an LM head scores one row per sequence in a prefill (or every position): its rows are the
        # step's tokens only in decode
        todo &= ~(dict_isin(kernels["stage"], ["lm_head_gemm"]) & ~dict_isin(kernels["phase"], ["decode"]))
    return np.flatnonzero(todo)


def _spelled_dtypes(
    kernels: pa.Table, rows: np.ndarray, ws: WorkSizes, work: WorkOps | None
) -> dict[int, str]:
    """The dtype each counted kernel's name spells (``[[kernel_dtype]]``), else the sizes' dtype,
    looked up once per name."""
    row_dtype: dict[int, str] = {}
    spelled: dict[str, str] = {}
    table = work or load_work_ops()
    for r, nm in zip(rows.tolist(), kernels["norm_name"].take(pa.array(rows)).to_pylist(), strict=True):
        key = str(nm or "")
        if key not in spelled:
            spelled[key] = table.kernel_dtype(key) or ws.dtype
        row_dtype[r] = spelled[key]
    return row_dtype


def _instances(kernels: pa.Table, rows: np.ndarray) -> pd.DataFrame:
    """The role instance of each of ``rows``: trace, rank, step, layer and stage (``t r s l st``);
    a kernel outside any detected layer or step is its own instance."""
    n = kernels.num_rows

    def col(name: str, fill: int) -> np.ndarray:
        if name not in kernels.column_names:
            return np.full(n, fill, np.int64)
        return pc.fill_null(kernels[name], fill).to_numpy(zero_copy_only=False).astype(np.int64)

    stage = objects(kernels["stage"])
    layer, step = col("layer", -1), col("step", -1)
    trace, rank = col("trace_id", 0), col("rank", 0)
    frame = pd.DataFrame(
        {"t": trace[rows], "r": rank[rows], "s": step[rows], "l": layer[rows], "st": stage[rows], "row": rows}
    )
    own = (frame["l"] < 0) | (frame["s"] < 0)
    frame.loc[own, "l"] = -1 - frame.loc[own, "row"]  # a kernel outside layers: its own instance
    return frame


def _instance_work(
    ws: WorkSizes, tp: int, experts: bool, stage: str, t: float, wb: float, split: float | None
) -> tuple[float, float, float]:
    """(flops, bytes, output width) of one role instance of ``t`` tokens with ``wb`` bytes per
    weight; ``split``: the split-K factor when reduce kernels follow (None: C is written directly)."""
    if experts:
        e_in, e_out = ws.hidden, ws.expert_inter
        routed = t * ws.top_k
        touched = min(ws.experts, routed)  # experts touched: top-k x tokens, at most all
        w = 3 * e_in * e_out  # gate, up, down of each touched expert
        return 2.0 * routed * w, wb * touched * w + 2.0 * routed * (e_in + e_out) * 2, e_in
    k_in, n_out = ws.gemms[stage]
    w = k_in * n_out / tp  # each rank holds 1/tp of the weights
    out_n = n_out / tp
    # A and the weights read; C written, or the fp32 partials when a reduce kernel follows
    c_bytes = split * t * out_n * PARTIAL_BYTES if split is not None else 2.0 * t * out_n
    return 2.0 * t * w, wb * w + 2.0 * t * k_in + c_bytes, out_n


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
