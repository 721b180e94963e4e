"""The work of one host op from its recorded shapes: FLOPs, compulsory bytes and the dtype of its roof.

Contract: pure functions of an op's name, input shapes and types and the work tables
(:class:`Tables`: ``rules/work_ops.toml``, ``rules/attention_ops.toml``). GEMMs (dense, grouped,
scaled, int4 / int8 weight-only) by their ``[[gemm]]`` layout, attention front ends by their layout,
gathers by ``[[gather]]``, reductions as reductions, every other ATen op as memory-bound elementwise
work (inputs read once, output written once); None where the shapes do not give the work. The one
causal convention (:func:`causal_pairs`, :data:`CAUSAL_CONVENTION`) lives here, for fused attention
and for attention composed of matmuls (:func:`composed_causal_share`) alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from analyzer.knowledge import hardware
from analyzer.knowledge.attention_ops import AttentionOps, AttentionShape, load_attention_ops
from analyzer.knowledge.work_ops import GemmDims, GemmOp, WorkOps, load_work_ops
from analyzer.tables.shapes import input_shape

#: the one causal convention of every attention family, as the summary and the report state it
CAUSAL_CONVENTION = (
    "a causal prefill counts half the score matrix: the (query, key) pairs its mask keeps, "
    "q x (kv - q) + q (q + 1) / 2 per sequence and head; decode counts every key"
)

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


@dataclasses.dataclass(frozen=True)
class Tables:
    """The work tables the roofline reads (``rules/work_ops.toml``, ``rules/attention_ops.toml``)."""

    work: WorkOps
    attention: AttentionOps

    @classmethod
    def load(cls, work: WorkOps | None = None, attention: AttentionOps | None = None) -> Tables:
        return cls(work or load_work_ops(), attention or load_attention_ops())


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
    table = input_shape(dims, op.table)
    if not table:
        return None
    el = _bytes_of(_type(types, op.table))
    dtype = hardware.normalize_dtype(_type(types, op.table)) or "bf16"
    row = _numel(table[1:]) if len(table) > 1 else 1
    if op.select == "elements":
        idx = input_shape(dims, op.index)
        if not idx:
            return None
        picked = _numel(idx)
        return OpWork(0.0, (min(picked, _numel(table)) + picked) * el, dtype, op.id)
    if op.select == "rows":
        idx = input_shape(dims, op.index)
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


def composed_causal_share(got: tuple[GemmOp, GemmDims] | None) -> float:
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
