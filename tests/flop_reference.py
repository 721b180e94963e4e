"""An independent FLOP count of the zoo's runs: PyTorch's own counter on the CPU (issue 32, item 4a).

Shares no code or table with the analyzer's roofline: the zoo case's model (its config, dtype aside,
built by ``analyzer.capture.hf`` as the capture built it) runs the captured workload again on the CPU
under ``torch.utils.flop_counter.FlopCounterMode``, which counts each matrix product and SDPA call
from the tensors it sees. What the counter lacks is added here from the tensors, not from shapes
read by a layout: ``_grouped_mm`` counts the rows its group offsets cover, the CPU SDPA kernel counts
the (query, key) pairs its mask keeps (or ``is_causal``'s triangle), and the matmuls of attention
composed of kernels (eager, math SDPA) count the causal pairs of their score matrix.

Matching (:func:`compare`, docs/roofline-validation.md):

* **steps**: every forward of the model is one step, in order; the zoo's ``lkm::step`` annotations
  wrap the same forwards, so step *i* of the trace (by start) is forward *i* here. Cases whose
  forwards depend on token values (assisted generation: acceptance follows the random weights,
  which differ between the CUDA capture and this CPU run) or run elsewhere (continuous batching's
  own thread, compiled flex attention, a GPU-only Triton kernel) are not compared (:data:`NOT_COMPARED`).
* **ops**: the counter sees ATen ops after decomposition (``linear`` -> ``mm`` / ``addmm``,
  ``matmul`` -> ``bmm``), as the trace's innermost launching ops are; each counted call is one op.
  Compared are the matrix products and attention (the work under the compute roof); elementwise
  ops, one FLOP an element in the analyzer, are not in PyTorch's counter. Per step and per group
  (attention: the fused calls and the matmuls of an attention module; GEMMs: every other product),
  the sorted per-op FLOPs of the two sides are paired one to one where the two sides ran as many
  ops; where they did not - an attention the CPU runs as two matmuls and the GPU as one fused call
  (an fp32 or MLA SDPA), experts the GPU runs per token (bmm) and the CPU grouped, or a loop over
  experts whose per-expert rows follow the routing of the random weights - the step's total of those
  products is compared instead. GEMMs are paired within their weight shape (K, N).
* **kernels without shapes** (CUDA-graph replays, captures without shapes): the step's GEMM total
  of the kernels counted from sizes (found in the trace, or ``--model`` from the case's config)
  against the counter's GEMM total of that forward.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils import flop_counter as fc

aten = torch.ops.aten

#: cases whose forwards cannot be replayed here, and why
NOT_COMPARED = {
    "assisted": "assisted generation: how many tokens a verify accepts follows the random weights (CUDA vs CPU)",
    "continuous-batching": "continuous batching runs its steps on its own thread with its own scheduler",
    "flex_attention": "flex attention runs compiled (Inductor) on the GPU; uncompiled on the CPU it is another program",
    "triton_fused": "our Triton fused-MoE kernel needs a GPU",
}


@dataclasses.dataclass(frozen=True)
class RefOp:
    """One counted call: its step (forward), op, useful FLOPs, whether it is attention (SDPA, or a
    matmul of an attention module), the (K, N) of a product's right operand, and whether it is one
    expert's product in a loop over experts (routed: its rows follow the router)."""

    step: int
    op: str
    flops: float
    attention: bool
    kn: tuple[int, int] | None = None
    routed: bool = False


def why_not(meta: dict[str, Any]) -> str | None:
    """Why a case is not compared (None: it is)."""
    if meta.get("assistant"):
        return NOT_COMPARED["assisted"]
    if meta.get("mode") == "continuous-batching":
        return NOT_COMPARED["continuous-batching"]
    if meta.get("attn") == "flex_attention":
        return NOT_COMPARED["flex_attention"]
    if meta.get("experts_implementation") == "triton_fused":
        return NOT_COMPARED["triton_fused"]
    return None


def _pairs(q: int, kv: int) -> float:
    """Causal pairs of a mask aligned to the end of the keys (the reference's own formula)."""
    return float(sum(min(kv, max(0, kv - q + i + 1)) for i in range(q)))


class _Counter(fc.FlopCounterMode):
    """FlopCounterMode that keeps every call (step, op, FLOPs) instead of totals per module."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(display=False, **kw)
        self.calls: list[RefOp] = []
        self.step = -1
        self.attn_calls = 0  # matmuls since the current attention module began

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        if func_packet not in self.flop_registry:
            return out
        flops = float(self.flop_registry[func_packet](*args, **kwargs, out_val=out))
        name = str(func_packet).replace("aten.", "aten::")
        inner = max(self.mod_tracker.parents, key=len) if self.mod_tracker.parents else ""
        attention = name.startswith("aten::_scaled_dot_product") or name == "flex_attention"
        if not attention and func_packet in (aten.bmm, aten.baddbmm) and _is_attention_module(inner):
            attention = True
            a, b = (args[0], args[1]) if func_packet is aten.bmm else (args[1], args[2])
            q = a.shape[-2]
            # the score product first (q x d) @ (d x kv), then the weighted values (q x kv) @ (kv x d)
            kv = b.shape[-1] if self.attn_calls % 2 == 0 else a.shape[-1]
            self.attn_calls += 1
            flops *= _pairs(q, kv) / (q * kv)
        if flops:
            # a loop over experts multiplies each expert's own rows, which follow the router (and so
            # the random weights); grouped and per-token batched experts multiply all routed rows
            routed = func_packet in (aten.mm, aten.addmm) and any(
                ".experts" in p for p in self.mod_tracker.parents
            )
            self.calls.append(
                RefOp(
                    self.step, name, flops, attention, None if attention else _kn(func_packet, args), routed
                )
            )
        return out


def _kn(func_packet: Any, args: Any) -> tuple[int, int] | None:
    """K and N of a product's right operand (the weights), from the tensors."""
    a, b = (args[1], args[2]) if func_packet in (aten.addmm, aten.baddbmm) else (args[0], args[1])
    if not hasattr(a, "shape") or not hasattr(b, "shape"):
        return None
    return int(a.shape[-1]), int(b.shape[-1])


_ATTN_MODULES: set[str] = set()


def _is_attention_module(fqn: str) -> bool:
    return fqn in _ATTN_MODULES


def _sdpa_cpu(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kw: Any) -> float:
    """The CPU SDPA kernel: PyTorch's SDPA formula times the share of (query, key) pairs its mask
    (or ``is_causal``) keeps."""
    full = fc.sdpa_flop_count(tuple(query.shape), tuple(key.shape), tuple(value.shape))
    is_causal = kw.get("is_causal", args[1] if len(args) > 1 else False)
    mask = kw.get("attn_mask", args[2] if len(args) > 2 else None)
    q, kv = query.shape[-2], key.shape[-2]
    if mask is not None:
        keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        keep = keep.expand(*query.shape[:-2], q, kv)
        return full * float(keep.sum()) / keep.numel()
    if is_causal:
        return full * _pairs(q, kv) / (q * kv)
    return float(full)


_sdpa_cpu._get_raw = True  # type: ignore[attr-defined]


def _grouped_mm(a: Any, b: Any, offs: Any = None, *args: Any, out_val: Any = None, **kw: Any) -> float:
    """torch._grouped_mm: 2-D x 3-D multiplies the rows its offsets cover, each by one group."""
    if a.dim() == 2 and b.dim() == 3:
        rows = int(offs[-1]) if offs is not None else a.shape[0]
        return 2.0 * rows * a.shape[1] * b.shape[-1]
    if a.dim() == 3 and b.dim() == 3:
        return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[-1]


_grouped_mm._get_raw = True  # type: ignore[attr-defined]


def reference_ops(case_dir: Path) -> list[RefOp]:
    """Every counted call of the case's workload, rerun on the CPU."""
    from analyzer.capture import hf

    meta = json.loads((case_dir / "meta.json").read_text(encoding="utf-8"))
    reason = why_not(meta)
    if reason:
        raise ValueError(reason)
    cfg = {"model_type": meta["model_type"], **meta["config"]}
    spec = hf.CaptureSpec(
        config=cfg,
        output="",
        device="cpu",
        dtype="fp32" if meta["dtype"] != "bf16" else "bf16",
        attn=meta["attn"],
        experts=meta.get("experts_implementation"),
        mode=meta["mode"],
        sampling=meta["sampling"],
        batch=meta["batch"],
        prompt=meta["prompt"],
        new_tokens=meta["new_tokens"],
        seed=meta["seed"],
    )
    torch.manual_seed(0)
    model = hf.build(
        cfg, dtype=spec.dtype, device="cpu", attn=spec.attn, experts=spec.experts, seed=spec.seed
    )
    ids = hf._prompts(spec, int(model.config.get_text_config().vocab_size), "cpu")
    counter = _Counter(
        custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
            aten._grouped_mm: _grouped_mm,
        }
    )
    _ATTN_MODULES.clear()
    root = type(model).__name__  # the counter names modules "<root class>.<path>"
    for fqn, mod in model.named_modules():
        if "Attention" in type(mod).__name__:
            _ATTN_MODULES.add(f"{root}.{fqn}")
            mod.register_forward_pre_hook(lambda *_: setattr(counter, "attn_calls", 0))

    def step_hook(*_: Any) -> None:
        counter.step += 1

    model.register_forward_pre_hook(step_hook)
    backend = "math" if meta.get("sdpa_backend") == "math" else None
    with hf._sdpa_context(backend), counter:
        hf._run(spec, model, None, ids, None)
    return counter.calls


# --------------------------------------------------------------------------- the comparison


@dataclasses.dataclass
class Comparison:
    """One case: per paired op (step, group, the analyzer's rule, reference, analyzer), per step and
    group the two totals where ops cannot be paired (step, group, basis, reference, analyzer), and
    the work the analyzer leaves uncounted (step, group, reference)."""

    case: str
    ops: list[tuple[int, str, str, float, float]] = dataclasses.field(default_factory=list)
    totals: list[tuple[int, str, str, float, float]] = dataclasses.field(default_factory=list)
    uncounted: list[tuple[int, str, float]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def errors(self) -> list[float]:
        return [abs(a - r) / r for *_, r, a in [*self.ops, *self.totals] if r > 0]

    def worst(self) -> float:
        return max(self.errors(), default=0.0)


def _analyzer_ops(
    path: Path, model: str | None
) -> tuple[dict[int, list[tuple[Any, str, float]]], dict[int, dict[str, float]]]:
    """The analyzer's side: per step (in start order), each host op counted from shapes by a GEMM or
    attention entry - (its (K, N), or "attention"; rule; FLOPs) - and the product kernels counted
    from sizes, per basis."""
    import numpy as np

    from analyzer.analyses import roofline
    from analyzer.knowledge.taxonomy import ATTENTION_KERNEL_STAGES
    from analyzer.options import Options
    from analyzer.tables import launches
    from tests.runs import analyze_paths

    a = analyze_paths([str(path)], Options(model=model) if model else None)
    k = a.kernels
    tables = roofline.Tables.load()
    steps = a.steps.sort_values("start_ns")["step"].tolist() if a.steps is not None and len(a.steps) else []
    order = {int(s): i for i, s in enumerate(steps)}
    kd = k.select(["step", "flops", "flops_source", "stage"]).to_pandas()
    found = launches.launching_op_rows(k, a.trace.host_ops)
    pos = found[1].to_pylist() if found is not None else [None] * len(kd)
    ops_rows = found[0]["row"].to_numpy(zero_copy_only=False) if found is not None else np.empty(0)
    host = a.trace.host_ops
    per_op: dict[int, list[tuple[Any, str, float]]] = {}
    sized: dict[int, dict[str, float]] = {}
    for i, (st, fl, src, stage) in enumerate(kd.itertuples(index=False)):
        if st < 0 or st not in order or not fl > 0:
            continue
        step = order[st]
        if src in ("found", "model"):
            sized.setdefault(step, {}).setdefault(src, 0.0)
            sized[step][src] += float(fl)
            continue
        if src != "shapes" or pos[i] is None:
            continue
        r = int(ops_rows[pos[i]])
        nm, d, ty = host["name"][r].as_py(), host["input_dims"][r].as_py(), host["input_types"][r].as_py()
        got = roofline.read_op(nm, d, ty, tables)
        gemm = tables.work.gemm(nm, d)
        if got is None:
            continue
        if gemm is not None:
            key: Any = "attention" if stage in ATTENTION_KERNEL_STAGES else (gemm[1].k, gemm[1].n)
        elif not got.rule.startswith("WRK") and got.rule not in ("elementwise", "reduce"):
            key = "attention"  # read by an attention layout (its id)
        else:
            continue  # not a product: elementwise, reductions, gathers
        per_op.setdefault(step, []).append((key, got.rule, float(fl)))
    return per_op, sized


def compare(case_dir: Path, model: str | None = None) -> Comparison:
    """The analyzer's FLOPs of the case's trace against :func:`reference_ops` (see the module doc).
    ``model``: a ``--model`` for the analyzer (a case captured without shapes)."""
    import time

    t0 = time.perf_counter()
    ref = reference_ops(case_dir)
    per_op, sized = _analyzer_ops(case_dir / "trace.json.gz", model)
    out = Comparison(case_dir.name)
    for step in sorted({x.step for x in ref} | set(per_op) | set(sized)):
        mine = [x for x in ref if x.step == step]
        theirs = per_op.get(step, [])
        if sized.get(step):
            # products without shapes: the step's total against the forward's products
            r = sum(x.flops for x in mine if not x.attention)
            shaped = sum(f for key, _, f in theirs if key != "attention")
            for basis, total in sized[step].items():
                out.totals.append((step, "products", basis, r, total + shaped))
            keys: list[Any] = ["attention"]
        else:
            keys = [
                "attention",
                *sorted(
                    {x.kn for x in mine if not x.attention} | {k for k, _, _ in theirs if k != "attention"},
                    key=str,
                ),
            ]
        rest_r = rest_a = 0.0  # products that cannot be paired op by op: their step total
        for key in keys:
            r_ops = [
                x for x in mine if (x.attention if key == "attention" else (not x.attention and x.kn == key))
            ]
            a_ops = sorted((x for x in theirs if x[0] == key), key=lambda x: x[2])
            r = sorted(x.flops for x in r_ops)
            label = "attention" if key == "attention" else f"K{key[0]} N{key[1]}"
            if len(r) == len(a_ops) and r and not any(x.routed for x in r_ops):
                out.ops.extend((step, label, rule, x, f) for x, (_, rule, f) in zip(r, a_ops, strict=True))
            elif key == "attention":
                if not a_ops:
                    out.uncounted.append((step, label, sum(r))) if r else None
                else:
                    out.totals.append((step, label, "shapes", sum(r), sum(x[2] for x in a_ops)))
            else:
                rest_r += sum(r)
                rest_a += sum(x[2] for x in a_ops)
        if rest_r or rest_a:
            out.totals.append((step, "products", "shapes", rest_r, rest_a))
    out.seconds = time.perf_counter() - t0
    return out
