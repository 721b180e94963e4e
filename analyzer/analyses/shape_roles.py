"""GEMM roles from recorded shapes: a projection's weight dimensions against the model's sizes.

Contract (pure over the kernels and host_ops tables):

* :func:`model_dims` finds the sizes from the trace alone: the hidden size ``H`` and the vocabulary
  ``V`` from the embedding table (the ``[V, H]`` input of ``aten::embedding``), kept only where the
  ``H -> V`` GEMM runs once per forward (embedding lookup); the MLP's intermediate size ``I``: a width
  ``c`` that one GEMM per layer projects back to ``H`` (down) while ``H -> c`` runs twice as often
  (gate and up) or ``H -> 2c`` as often (fused gate_up). Shapes whose op counts fit no role stay
  undecided (a tiny model whose vocabulary equals its MLP width). With ``--model`` the architecture
  gives the sizes, the attention's query width too.
* :func:`roles_from_shapes` gives each dense GEMM kernel the role its op's ``(K, N)`` names uniquely
  (``H -> V`` the LM head, ``I -> H`` down, ``H -> I`` / ``H -> 2I`` gate/up, ``q -> H`` o, ...), None
  where the shapes name no role or several (Llama's q and o are both ``H x H``).

The classification takes a role from shapes where the layer walk gave none or the same one
(``stage_source`` ``by_shapes``), and reports where the two disagree instead of guessing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.analyses.layers import GEMM_STAGES, gemm_shape
from analyzer.model import dict_isin
from analyzer.tables.launches import distinct_op_shapes, launching_op_rows

__all__ = ["GemmShapes", "ModelDims", "gemm_shapes", "model_dims", "roles_from_shapes"]


@dataclasses.dataclass(frozen=True)
class ModelDims:
    hidden: int
    vocab: int | None  # None: the LM head's shape is not told apart in this trace
    intermediate: int | None = None
    query: int | None = None  # the attention's query width (heads x head size); only from --model
    fused_mlp: bool | None = None  # gate and up in one GEMM (H -> 2I); None: either


def _embedding_table(host_ops: pa.Table, trace: int | None = None) -> tuple[int, int, int] | None:
    """(V, H, lookups) of the token embedding table: its ``[V, H]`` shape and how many forwards
    looked it up."""
    mask = dict_isin(host_ops["name"], ["aten::embedding"])
    if trace is not None:
        mask &= host_ops["trace_id"].to_numpy(zero_copy_only=False) == trace
    rows = np.flatnonzero(mask)
    if not len(rows) or "input_dims" not in host_ops.column_names:
        return None
    tables: Counter = Counter()
    for dims in host_ops["input_dims"].take(pa.array(rows)).to_pylist():
        if dims and dims[0] and len(dims[0]) == 2:
            tables[tuple(dims[0])] += 1
    if not tables:
        return None
    (v, h), k = max(tables.items(), key=lambda kv: kv[0][0])  # the token table: the most rows
    return (int(v), int(h), int(k)) if v > h > 0 else None


@dataclasses.dataclass(frozen=True)
class GemmShapes:
    """Dense GEMM kernels with a launching op: their ``rows``, the distinct (K, N) ``shapes``
    (None: not readable), each kernel's index into them (``inverse``) and its op's row (``op_rows``)."""

    rows: np.ndarray
    shapes: list[Any]
    inverse: np.ndarray
    op_rows: np.ndarray


def gemm_shapes(
    kernels: pa.Table, host_ops: pa.Table, stage: list[str], trace: int | None = None
) -> GemmShapes:
    """The :class:`GemmShapes` of ``trace`` (None: every input), each distinct shape read once."""
    empty = np.empty(0, np.int64)
    none = GemmShapes(empty, [], empty, empty)
    found = launching_op_rows(kernels, host_ops)
    if found is None or "input_dims" not in host_ops.column_names:
        return none
    ops, pos = found
    is_gemm = {x: x in GEMM_STAGES for x in set(stage)}
    mask = np.fromiter(map(is_gemm.__getitem__, stage), bool, len(stage))
    if trace is not None:
        mask &= kernels["trace_id"].to_numpy(zero_copy_only=False) == trace
    rows = np.flatnonzero(mask)
    if not len(rows):
        return none
    at = pos.take(pa.array(rows))
    valid = at.is_valid().to_numpy(zero_copy_only=False)
    rows = rows[valid]
    if not len(rows):
        return none
    op_rows = ops["row"].take(at.filter(pa.array(valid))).to_numpy(zero_copy_only=False).astype(np.int64)
    group_names, first, inverse = distinct_op_shapes(host_ops, op_rows)
    dims = host_ops["input_dims"].take(pa.array(op_rows[first])).to_pylist()
    shapes = [
        gemm_shape(nm, [list(x) for x in d] if d else None) for nm, d in zip(group_names, dims, strict=True)
    ]
    return GemmShapes(rows, shapes, inverse, op_rows)


def model_dims(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    arch: Any = None,
    trace: int | None = None,
    shapes: GemmShapes | None = None,
) -> ModelDims | None:
    """The model's sizes, from ``arch`` (``--model``) or from the trace (``trace``: one input's
    id, when the tables hold several; ``shapes``: its :func:`gemm_shapes`, read here when not
    given); None when neither tells."""
    if arch is not None:
        return ModelDims(arch.hidden_size, arch.vocab_size, arch.intermediate_size, arch.q_dim)
    table = _embedding_table(host_ops, trace)
    if table is None:
        return None
    vocab, hidden, forwards = table
    got = shapes if shapes is not None else gemm_shapes(kernels, host_ops, stage, trace)
    shapes_of, inverse, op_rows = got.shapes, got.inverse, got.op_rows
    # count GEMM ops (not kernels: a split-K op launches two) per weight shape
    per_shape: Counter = Counter()
    if len(op_rows):
        _, one = np.unique(op_rows, return_index=True)
        for k, c in zip(*np.unique(inverse[one], return_counts=True), strict=True):
            if shapes_of[int(k)] is not None:
                per_shape[shapes_of[int(k)]] += int(c)
    # the trace fixes a role's shape only where the op counts fit it: the LM head runs once per
    # forward; an MLP's down once per layer, its gate and up twice as often (or fused, as often)
    lm = vocab if per_shape.get((hidden, vocab), 0) == forwards else None
    inter = fused = None
    for c in sorted({k for k, n in per_shape if n == hidden and k not in (hidden, vocab)}):
        down = per_shape[(c, hidden)]
        if down % forwards:
            continue
        up, both = per_shape.get((hidden, c), 0), per_shape.get((hidden, 2 * c), 0)
        if both == down and up != 2 * down:
            inter, fused = c, True
        elif up == 2 * down and both != down:
            inter, fused = c, False
        else:
            continue
        break
    return ModelDims(hidden, lm, inter, None, fused)


def roles_from_shapes(
    kernels: pa.Table,
    host_ops: pa.Table,
    stage: list[str],
    dims: ModelDims,
    trace: int | None = None,
    shapes: GemmShapes | None = None,
) -> dict[int, str]:
    """Kernel row -> the role its dense GEMM's recorded (K, N) names uniquely (rows shapes cannot
    decide are absent); ``trace``: only that input's kernels (``shapes`` as for :func:`model_dims`)."""
    h = dims.hidden
    table: dict[tuple[int, int], set[str]] = {}

    def add(k_in: int, n_out: int, role: str) -> None:
        table.setdefault((k_in, n_out), set()).add(role)

    if dims.vocab:
        add(h, dims.vocab, "lm_head_gemm")
    if dims.intermediate:
        i = dims.intermediate
        if dims.fused_mlp is not True:
            add(h, i, "gate_up_gemm")
        if dims.fused_mlp is not False:
            add(h, 2 * i, "gate_up_gemm")
        add(i, h, "down_gemm")
    if dims.query:
        add(h, dims.query, "qkv_gemm")
        add(dims.query, h, "o_gemm")
    got = shapes if shapes is not None else gemm_shapes(kernels, host_ops, stage, trace)
    rows, inverse = got.rows, got.inverse
    if not len(rows):
        return {}
    named = []
    for sh in got.shapes:
        roles = table.get(sh) if sh is not None else None
        named.append(next(iter(roles)) if roles and len(roles) == 1 else None)
    decided = np.array([x is not None for x in named], bool)[inverse]
    return {int(r): named[int(k)] for r, k in zip(rows[decided], inverse[decided], strict=True)}
