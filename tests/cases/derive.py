"""Cases derived from a real case by one documented change, for rules no real trace here exercises
(``make cases`` runs it after the cuts). Their expectations are the analysis' own answers (``pinned``).

Each entry: the real case it starts from, the change (a function over the case's tables), and why
that change stands for something real traces do.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from analyzer.model import Trace  # noqa: E402
from analyzer.readers.case import read_case, write_case  # noqa: E402
from analyzer.results.cases import pinned_case  # noqa: E402


def _rename(trace: Trace, pattern: str, new: str, rows: pa.Array | None = None) -> Trace:
    """Kernels whose name matches ``pattern`` (only ``rows`` where given) renamed ``new``."""
    k = trace.kernels
    names = k["name"].combine_chunks().cast(pa.string())
    hit = pc.match_substring_regex(names, pattern)
    if rows is not None:
        hit = pc.and_(hit, rows)
    renamed = pc.if_else(hit, pa.scalar(new), names).dictionary_encode().cast(k.schema.field("name").type)
    for col in ("name", "norm_name"):
        k = k.set_column(k.schema.get_field_index(col), col, renamed)
    return dataclasses.replace(trace, kernels=k)


def _without_host_ops(trace: Trace) -> Trace:
    """As a capture without host ops (a CUDA-graph replay, rocprof, nsys) shows it."""
    k = trace.kernels
    k = k.set_column(
        k.schema.get_field_index("launch_op_id"), "launch_op_id", pa.nulls(k.num_rows, pa.int64())
    )
    return dataclasses.replace(trace, kernels=k, host_ops=trace.host_ops.slice(0, 0))


def unknown_attention(t: Trace) -> Trace:
    # an attention library no rule knows yet: its kernel is unclassified, so no attention anchors
    # the layers and the walk's answer is dropped (the self-check)
    return _rename(t, r"flash|fmha|attention|Attention", "vendor_x_custom_kernel_v2")


def routing_by_sort(t: Trace) -> Trace:
    # an engine whose router hands its softmax straight to a fused sort (no top-k kernel, no host
    # ops): the walk's role rule, not the router rule, takes the router GEMM
    t = _without_host_ops(t)
    return _rename(t, r"(?i)topk|gatherTopK|sbtopk", "moe_align_block_size_kernel")


def norm_before_quantize(t: Trace) -> Trace:
    # an input norm the rules cannot tell from its kernels (an engine's fused norm named like
    # generic work): no norm shape is learned, so the residual add is found by its op
    return _rename(t, r"(?i)rsqrt|MeanOps|norm|pow_tensor", "vectorized_elementwise_kernel<4, fused_op>")


def every_step_novel(t: Trace) -> Trace:
    # forwards without shapes whose GEMM and attention kernels share no name from step to step
    # (each step tuned apart): every step looks like a prefill beside the others, so none can be told
    from analyzer.results.cases import case_outcome

    _, got, _ = case_outcome(t)
    import numpy as np

    step = np.asarray(case_outcome(t)[0].kernels["step"].to_numpy(zero_copy_only=False))
    for s in np.unique(step[step >= 0]).tolist():
        t = _rename(
            t,
            r"nvjet|gemm|Gemm|cutlass",
            f"nvjet_sm90_tst_{65 + s}x8_64x16_2x4_h_bz_TNT",
            pa.array(step == s),
        )
    h = t.host_ops
    h = h.set_column(
        h.schema.get_field_index("input_dims"),
        "input_dims",
        pa.nulls(h.num_rows, h.schema.field("input_dims").type),
    )
    return dataclasses.replace(t, host_ops=h)


def decode_kernel_in_prefill(t: Trace) -> Trace:
    # a decode-only attention family (vLLM's paged decode) where the shapes say prefill: the two
    # kinds of evidence contradict, so the step has no phase (a wrong `phases` or layout shows here)
    import numpy as np

    start = t.kernels["start_ns"].to_numpy(zero_copy_only=False)
    first = pa.array(start < np.median(start))
    return _rename(t, r"cudnn_generated_fort_native_sdpa|flash_fwd|fmha", "paged_attention_v1_kernel", first)


def layers_alone(t: Trace) -> Trace:
    # a benchmark of the decoder layers alone (no embedding, no LM head, no sampler): no forward
    # start to cut at, so idle gaps between the forwards cut the steps
    import numpy as np

    from analyzer.results.cases import case_outcome

    a, got, _ = case_outcome(t)
    drop = {"embedding", "lm_head_gemm", "sampling"}
    keep = np.array([s not in drop for s in got["stage"]])
    second = a.kernels["step"].to_numpy(zero_copy_only=False) >= 1
    t = _without_host_ops(t)  # captured without host ops (nsys, rocprof): the step boundary is time alone
    k = t.kernels
    start = k["start_ns"].to_numpy(zero_copy_only=False) + np.where(
        second, 5_000_000, 0
    )  # the host's 5 ms between
    k = k.set_column(k.schema.get_field_index("start_ns"), "start_ns", pa.array(start, pa.int64()))
    return dataclasses.replace(t, kernels=k.filter(pa.array(keep)))


def eager_decode_grids(t: Trace) -> Trace:
    # the same decode captured without CUDA graphs: every launch records its grid, and aiter's ll4mi
    # paged attention launches (sequences, KV partitions, KV heads); the step's 16 sequences (its
    # annotation's token count) on x, one partition, Llama-3-8B's 8 KV heads
    k = t.kernels
    pa_kernel = pc.match_substring(k["name"].combine_chunks().cast(pa.string()), "paged_attention_ll4mi_QKV")
    for col, v in (("grid_x", 16), ("grid_y", 1), ("grid_z", 8)):
        old = k[col].combine_chunks()
        k = k.set_column(
            k.schema.get_field_index(col), col, pc.if_else(pa_kernel, pa.scalar(v, old.type), old)
        )
    return dataclasses.replace(t, kernels=k)


def foreign_gates(t: Trace) -> Trace:
    # a recurrence's gates where RoPE, a norm or an activation should be: the same kernels, launched
    # by aten::softplus instead of aten::mul (what an SSM or a gated linear-attention layer runs
    # between its projections); the walk still places them by position, and STR051 says so
    h = t.host_ops
    names = h["name"].combine_chunks().cast(pa.string())
    renamed = pc.if_else(pc.equal(names, "aten::mul"), pa.scalar("aten::softplus"), names)
    renamed = renamed.dictionary_encode().cast(h.schema.field("name").type)
    return dataclasses.replace(t, host_ops=h.set_column(h.schema.get_field_index("name"), "name", renamed))


def recomputed_prefix(t: Trace) -> Trace:
    # generation without a KV cache: the decode step runs its sequences again with one token more
    # (the attention ops' query as long as their keys, 48 + 1 tokens), as MPT or GPT-1 do in generate
    h = t.host_ops
    names = h["name"].to_pylist()
    dims = h["input_dims"].to_pylist()
    sdpa = (
        "scaled_dot_product",
        "_flash_attention_forward",
        "_efficient_attention_forward",
        "cudnn_attention",
    )
    for name, d in zip(names, dims, strict=True):
        if name and any(w in name for w in sdpa) and d and len(d) > 1 and d[0] and len(d[0]) == 4:
            if d[0][2] == 1 and len(d[1]) == 4:  # a decode op: one query over the cached keys
                d[0] = [d[0][0], d[0][1], d[1][2], d[0][3]]
    col = pa.array(dims, h.schema.field("input_dims").type)
    return dataclasses.replace(
        t, host_ops=h.set_column(h.schema.get_field_index("input_dims"), "input_dims", col)
    )


def indexer_by_sort(t: Trace) -> Trace:
    # a sparse attention whose indexer picks its keys by a full sort of the scores (aten::sort, a
    # radix sort's kernels) rather than a top-k: no top-k candidate, so the sparse-attention rule
    # does not run; the walk reads the indexer's GEMM and sort as an LM head and a sampler, and
    # STR060 says that attention then lies outside every layer
    h = t.host_ops
    names = h["name"].combine_chunks().cast(pa.string())
    renamed = pc.if_else(pc.equal(names, "aten::topk"), pa.scalar("aten::sort"), names)
    renamed = renamed.dictionary_encode().cast(h.schema.field("name").type)
    t = dataclasses.replace(t, host_ops=h.set_column(h.schema.get_field_index("name"), "name", renamed))
    return _rename(
        t, r"gatherTopK|sbtopk|bitonicSortKV", "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel"
    )


def without_shapes(t: Trace) -> Trace:
    # the same capture without record_shapes: no op's input dims, so a gather the names call an
    # embedding lookup cannot be told from one by its source's shape
    h = t.host_ops
    i = h.schema.get_field_index("input_dims")
    return dataclasses.replace(
        t, host_ops=h.set_column(i, "input_dims", pa.nulls(h.num_rows, h.schema.field(i).type))
    )


DERIVED: list[tuple[str, str, Callable[[Trace], Trace], str]] = [
    ("derived-unknown-attention", "llama-sdpa-prefill-decode", unknown_attention,
     "An attention kernel no rule knows: the layer structure is not found with confidence, names kept"),
    ("derived-routing-by-sort", "qwen3-moe-fused-experts", routing_by_sort,
     "MoE routing by a fused sort without host ops: the router GEMM found by what follows it"),
    ("derived-unseen-input-norm", "llama-sdpa-prefill-decode", norm_before_quantize,
     "Input norms whose kernels the rules cannot see: the residual add found by its op"),
    ("derived-decode-kernel-in-prefill", "llama-sdpa-prefill-decode", decode_kernel_in_prefill,
     "A decode-only attention kernel in a step whose shapes say prefill: contradicting evidence, no phase"),
    ("derived-layers-alone", "llama-sdpa-prefill-decode", layers_alone,
     "The decoder layers alone (a layer benchmark without host ops, 5 ms of host work between forwards): no forward start, idle gaps cut the steps"),
    ("derived-every-step-novel", "llama-assisted-noshape-depth", every_step_novel,
     "Without shapes, two halves of a run whose heavy kernels share no name: no phase"),
    ("derived-eager-decode-grids", "sglang-llama8b-decode-mi300x-bare", eager_decode_grids,
     "The SGLang MI300X decode step as an eager capture records it: the paged decode kernel's grid counts the step's 16 sequences"),
    ("derived-recomputed-prefix", "llama-sdpa-prefill-decode", recomputed_prefix,
     "Generation without a KV cache: the second step's attention runs 49 queries over 49 keys, the first step's 48 plus one: a decode that recomputes its prefix"),
    ("derived-foreign-gates", "llama-sdpa-prefill-decode", foreign_gates,
     "Gates of a recurrence where RoPE, norms and activations sit (aten::mul launched as aten::softplus): placed by position under foreign ops, announced"),
    ("derived-token-gather-no-shapes", "aria-token-gather-in-layers", without_shapes,
     "Aria's expert block without recorded shapes: its index_select token gather keeps the lookup's stage by name; every forward ends in its LM head, so a lookup after attention and before the LM head starts no forward (PHS037)"),
    ("derived-indexer-by-sort", "hy-v4-composed-sparse-attention", indexer_by_sort,
     "A sparse attention's indexer that sorts its scores instead of a top-k: no top-k, so the walk misreads the layers (its narrow scoring GEMM is no LM head, STR069); attention outside every layer, announced (STR060)"),
]  # fmt: skip


def main() -> int:
    only = set(sys.argv[1:])
    for name, base, change, description in DERIVED:
        if only and name not in only:
            continue
        trace, meta = read_case(HERE / f"{base}.json.xz")
        derived = change(trace)
        derived.validate()
        doc = pinned_case(
            derived,
            name=name,
            description=description,
            source={"case": f"{base}.json.xz", "change": change.__name__, "trace": meta["source"]["trace"]},
        )
        write_case(doc, HERE / f"{name}.json.xz")
        print(f"wrote {name}.json.xz: rules firing {', '.join(doc['fires'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
