"""Weight-only quantized linears' own work around their GEMM (STR053): dequantize, pad, rescale.

Contract: a pure pass over one segment of kernels in launch order, before the layer walk, like the
activation quantization (STR049). Around a GEMM op's first kernel:

* the generic kernels right before it launched by a cast of an integer tensor (``aten::copy_`` from
  ``signed char`` ...: an int8 weight-only linear casting its weight to the compute dtype) are
  ``quantize``, and so are the kernels right after the GEMM up to its per-channel rescale (an
  ``aten::mul`` by a vector, the scale's own cast before it) and a bias added by a vector after it;
* the generic fill / copy kernels right before a weight-only packed GEMM op
  (``weight_only_gemm_ops``: ``_weight_int4pack_mm`` ...) pad or cast its input to the packed
  kernel's layout, and where the op computes in fp32 (``float_out_gemm_ops``) the casts right after
  it take its output back to the compute dtype: ``quantize``.

Whatever region they sit in (RoPE, activation, norm, attention), they are the quantized linear's
work, never that region's. Needs host ops and their input types; without them nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses.mixers import ADD_OPS, BATCHED_OPS, LINEAR_OPS
from analyzer.analyses.walk.registry import KNOWLEDGE
from analyzer.tables import launches
from analyzer.tables.dictionaries import dict_isin

WEIGHT_DEQUANTIZE = KNOWLEDGE.code_of("weight-dequantize")
CAST_OPS = frozenset(KNOWLEDGE.set_of("cast_ops"))
INTEGER_TYPES = frozenset(KNOWLEDGE.set_of("integer_types"))
NARROW_FLOATS = frozenset(KNOWLEDGE.set_of("narrow_float_types"))
WIDE_FLOATS = frozenset(KNOWLEDGE.set_of("wide_float_types"))
MASK_TYPES = frozenset(KNOWLEDGE.set_of("mask_types"))
PACKED_GEMM_OPS = frozenset(KNOWLEDGE.set_of("weight_only_gemm_ops"))
PAD_OPS = frozenset(KNOWLEDGE.set_of("pad_fill_ops"))
FLOAT_OUT_OPS = frozenset(KNOWLEDGE.set_of("float_out_gemm_ops"))
SCALE_OPS = frozenset(KNOWLEDGE.set_of("scale_ops"))
GEMM_OPS = LINEAR_OPS | BATCHED_OPS | PACKED_GEMM_OPS
_PARTS = frozenset(KNOWLEDGE.set_of("quantize_parts"))


class OperandFacts(NamedTuple):
    """Per kernel row, what its launching op's operands say (:func:`operand_facts`)."""

    int_cast: np.ndarray  # a cast whose source is an integer tensor (a quantized weight)
    vec_scale: np.ndarray  # a multiply or add by a vector ([N] or [N, 1]: a per-channel scale, a bias)
    widen: np.ndarray  # a copy from a 16-bit float into a wider float (a residual kept in fp32)
    masked: np.ndarray  # a multiply by an integer or boolean tensor (a mask)
    narrow: np.ndarray  # a copy from a wider float into a 16-bit one (a cast back)
    scalar: np.ndarray  # a cast of a tensor with no dimension (a scalar's)


def operand_facts(
    kernels: pa.Table, host_ops: pa.Table, op_column: pa.Array, join: launches.OpJoin | None = None
) -> OperandFacts:
    """The :class:`OperandFacts` of every kernel row. ``op_column``: each kernel's launching op name
    (``classify.launching_ops``). Only the casts' and multiplies' input types and the multiplies'
    and adds' input shapes are read, vectorised; all False without host ops."""
    n = kernels.num_rows
    facts = OperandFacts(*(np.zeros(n, bool) for _ in range(6)))
    found = launches.joined(kernels, host_ops, join)
    if found is None or n == 0:
        return facts
    ops, pos = found

    def inputs(at: np.ndarray, column: str) -> Any:
        return host_ops[column].take(ops["row"].take(pos.take(pa.array(at))))

    def where(values: Any) -> np.ndarray:
        return pc.fill_null(values, False).to_numpy(zero_copy_only=False)

    casts = np.flatnonzero(dict_isin(op_column, sorted(CAST_OPS)))
    if len(casts):
        types = inputs(casts, "input_types")
        # copy_(dst, src) reads its second input; _to_copy / to their first
        copy = dict_isin(op_column.take(pa.array(casts)), ["aten::copy_"])
        src = pc.if_else(pa.array(copy), _element(types, 1), _element(types, 0))
        facts.int_cast[casts] = where(pc.is_in(src, pa.array(sorted(INTEGER_TYPES))))
        narrow, wide = pa.array(sorted(NARROW_FLOATS)), pa.array(sorted(WIDE_FLOATS))
        dst = _element(types, 0)
        facts.widen[casts] = copy & where(pc.and_(pc.is_in(src, narrow), pc.is_in(dst, wide)))
        facts.narrow[casts] = copy & where(pc.and_(pc.is_in(src, wide), pc.is_in(dst, narrow)))
        first = _element(inputs(casts, "input_dims"), 0)
        facts.scalar[casts] = where(pc.equal(pc.list_value_length(first), 0))
    scales = np.flatnonzero(dict_isin(op_column, sorted(SCALE_OPS | ADD_OPS)))
    if len(scales):
        second = _element(inputs(scales, "input_dims"), 1)
        shape = pc.list_value_length(second)
        last = _element(second, -1)
        vector = pc.or_(pc.equal(shape, 1), pc.and_(pc.equal(shape, 2), pc.equal(last, 1)))
        facts.vec_scale[scales] = where(vector)
    muls = np.flatnonzero(dict_isin(op_column, sorted(SCALE_OPS)))
    if len(muls):
        types = inputs(muls, "input_types")
        masks = pa.array(sorted(MASK_TYPES))
        facts.masked[muls] = where(
            pc.or_(pc.is_in(_element(types, 0), masks), pc.is_in(_element(types, 1), masks))
        )
    return facts


def _element(lists: Any, i: int) -> Any:
    """The i-th element of each list (null where the list is shorter or null); -1 is the last."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    idx = lengths - 1 if i < 0 else np.full(len(lengths), i)
    ok = (idx >= 0) & (idx < lengths) & ~lists.is_null().to_numpy(zero_copy_only=False)
    at = np.where(ok, lists.offsets.to_numpy()[:-1] + idx, 0)
    flat = lists.values
    if len(flat) == 0:
        return pa.nulls(len(at), flat.type)
    return pc.if_else(pa.array(ok), flat.take(pa.array(at)), pa.nulls(len(at), flat.type))


def mark_weight_dequantize(
    seq: np.ndarray,
    stage: list[str],
    op_names: Sequence[str | None],
    launch: np.ndarray,
    int_cast: np.ndarray,
    vec_scale: np.ndarray,
    why: Any,
    th: Any,
) -> int:
    """STR053 over one segment (kernel rows in launch order); returns the kernels relabelled."""
    rows = seq.tolist()
    window = int(th.dequantize_window)
    done = 0

    def put(r: int) -> None:
        nonlocal done
        stage[r] = "quantize"
        why[r] = WEIGHT_DEQUANTIZE
        done += 1

    for p, r in enumerate(rows):
        op = op_names[r]
        if op not in GEMM_OPS or (p and launch[rows[p - 1]] == launch[r]):
            continue  # not the first kernel of a GEMM op
        dequantized = False
        for q in range(p - 1, max(-1, p - 1 - window), -1):
            rq = rows[q]
            if stage[rq] not in _PARTS:
                break
            if int_cast[rq]:
                put(rq)
                dequantized = True
            elif op in PACKED_GEMM_OPS and op_names[rq] in PAD_OPS:
                put(rq)
            else:
                break
        k = p + 1
        while k < len(rows) and launch[rows[k]] == launch[r]:
            k += 1  # the GEMM's own further kernels (a split-K reduce)
        if op in FLOAT_OUT_OPS:  # its fp32 output cast back to the compute dtype
            end = min(len(rows), k + window)
            while k < end and op_names[rows[k]] in CAST_OPS and stage[rows[k]] in _PARTS:
                put(rows[k])
                k += 1
        if not dequantized:
            continue
        after = []
        for q in range(k, min(len(rows), k + window)):
            if stage[rows[q]] not in _PARTS:
                break
            after.append(rows[q])
            if vec_scale[rows[q]] and op_names[rows[q]] in SCALE_OPS:  # the per-channel rescale
                for rq in after:
                    put(rq)
                nxt = q + 1  # and the bias added after it
                if nxt < len(rows) and vec_scale[rows[nxt]] and op_names[rows[nxt]] in ADD_OPS:
                    put(rows[nxt])
                break
    return done
