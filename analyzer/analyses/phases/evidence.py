"""Per-kernel phase evidence from the kernel rules, and what a step's own kernels say of its phase.

Contract: the per-kernel columns are numpy arrays aligned with the kernels table, computed once per
distinct rule id or name (never per row in Python): the phase a kernel's family runs in (PHS025) or
its query tiles (PHS030), the sequences (PHS031) and token rows (PHS034) its launch grid counts, the
key length its name carries (PHS033), a GEMM's M regime (PHS032), buffer fills, name codes and the
LM head's rows. The per-step readers (:func:`_evidence_phase`, :func:`_fresh_context`,
:func:`_step_regime`) take a step's kernel positions and the columns; they decide nothing alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses.phases.registry import (
    BETWEEN,
    DECODE_EVIDENCE,
    FRESH_CONTEXT,
    GRID_QUERY_TILES,
    KERNEL_EVIDENCE,
    KNOWLEDGE,
    LARGE,
    NO_EVIDENCE,
    NO_REGIME,
    PREFILL_EVIDENCE,
    PREFILL_GRID_EVIDENCE,
    SKINNY,
)
from analyzer.knowledge.kernel_rules import PhaseEvidence
from analyzer.knowledge.structure_rules import Thresholds
from analyzer.knowledge.work_ops import load_work_ops
from analyzer.tables import launches
from analyzer.tables.dictionaries import dict_isin, dict_strings

_FILL_WORDS = KNOWLEDGE.words("fill_words")
_LAYOUT_COPY_WORDS = KNOWLEDGE.words("layout_copy_words")
WORK_OPS = load_work_ops()  # the GEMM layouts (rules/work_ops.toml): an LM head's rows

# GEMM roles whose rows are not the step's tokens: the LM head scores sampled rows only, the router's
# N is the expert count
_NOT_TOKEN_ROWS = ("lm_head_gemm", "moe_gate_gemm")


def _as_evidence(facts: PhaseEvidence | Mapping[str, str] | None) -> PhaseEvidence:
    if isinstance(facts, PhaseEvidence):
        return facts
    return PhaseEvidence(families=dict(facts or {}))


def _rule_codes(kernels: pa.Table, values: Mapping[str, Any]) -> tuple[np.ndarray, list[Any]]:
    """Per kernel: the index (from 1) of its rule's value among the distinct values returned, 0 where
    its rule has none; looked up once per distinct rule id, so per-kernel work stays integer."""
    opts = list(dict.fromkeys(values.values()))
    n = kernels.num_rows
    if not opts or "rule_id" not in kernels.column_names:
        return np.zeros(n, np.int16), opts
    index = {v: i + 1 for i, v in enumerate(opts)}
    ids = dict_strings(kernels["rule_id"])
    words = ids.dictionary.to_pylist()
    lut = np.asarray([index.get(values.get(x or ""), 0) for x in words] + [0], np.int16)
    return lut[ids.indices.fill_null(len(words)).to_numpy(zero_copy_only=False)], opts


def _grid_axis(kernels: pa.Table, axis: str) -> np.ndarray:
    """The launch grid along ``axis`` (x / y / z) per kernel; 0 where the trace has none."""
    col = f"grid_{axis}"
    if col not in kernels.column_names:
        return np.zeros(kernels.num_rows, np.int64)
    return kernels[col].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _along(kernels: pa.Table, axes: Mapping[str, str]) -> np.ndarray | None:
    """Per kernel: its grid along the axis its rule names in ``axes`` (rule id -> x / y / z), else 0;
    None (nothing allocated) where no kernel's rule names one."""
    code, opts = _rule_codes(kernels, axes)
    if not code.any():
        return None
    out = np.zeros(kernels.num_rows, np.int32)
    for i, a in enumerate(opts, start=1):
        on = code == i
        if on.any():
            out[on] = _grid_axis(kernels, a)[on]
    return out


def _kernel_evidence(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray:
    """Per kernel: DECODE_EVIDENCE / PREFILL_EVIDENCE where its rule's family runs in that phase only;
    PREFILL_GRID_EVIDENCE where its rule's ``query_tile_axes`` are all >= 2 in its grid (PHS030: a
    query longer than one tile); else NO_EVIDENCE."""
    phase_code = {"decode": DECODE_EVIDENCE, "prefill": PREFILL_EVIDENCE}
    code, opts = _rule_codes(kernels, facts.families)
    out = np.asarray([NO_EVIDENCE] + [phase_code[p] for p in opts], np.int8)[code]
    code, opts = _rule_codes(kernels, facts.query_tile_axes)
    for i, axes in enumerate(opts, start=1):
        on = (code == i) & (out == NO_EVIDENCE)
        for a in axes:
            on &= _grid_axis(kernels, a) >= 2
        out[on] = PREFILL_GRID_EVIDENCE
    return out


def _grid_sequences(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray | None:
    """Per kernel: the sequences its launch grid counts along its decode family's ``sequences_axis``
    (PHS031), else 0."""
    return _along(kernels, facts.sequences_axis)


def _norm_rows(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray | None:
    """Per kernel: the token rows its launch grid counts along its norm family's ``rows_axis``
    (PHS034), else 0."""
    return _along(kernels, facts.rows_axis)


def _key_lengths(kernels: pa.Table, facts: PhaseEvidence) -> np.ndarray | None:
    """Per kernel: the key length its name carries by its rule's ``key_length`` pattern (PHS033),
    read once per distinct (name, pattern); 0 where none (no pattern, no match, or length 0); None
    where no kernel's rule has a pattern."""
    code, opts = _rule_codes(kernels, facts.key_length)
    sel = np.flatnonzero(code)
    if not len(sel) or "norm_name" not in kernels.column_names:
        return None
    out = np.zeros(kernels.num_rows, np.int32)
    names = dict_strings(kernels["norm_name"])
    words = names.dictionary.to_pylist() + [None]
    at = names.indices.fill_null(len(words) - 1).to_numpy(zero_copy_only=False)[sel]
    pairs, inv = np.unique(np.stack([at, code[sel]], axis=1), axis=0, return_inverse=True)
    values = np.zeros(len(pairs), np.int64)
    for u, (j, c) in enumerate(pairs.tolist()):
        m = opts[c - 1].search(words[j] or "")
        values[u] = int(m.group(1)) if m else 0
    out[sel] = values[np.asarray(inv).reshape(-1)]
    return out


def _m_regimes(kernels: pa.Table, facts: PhaseEvidence, th: Thresholds) -> np.ndarray:
    """Per kernel: the M regime (SKINNY / LARGE / BETWEEN) of a GEMM whose rule says which decoded tile
    runs along the tokens (PHS032), NO_REGIME for every other kernel and for the LM head and router."""
    n = kernels.num_rows
    out = np.full(n, NO_REGIME, np.int8)
    if not facts.token_tile or "tile_m" not in kernels.column_names:
        return out
    code, opts = _rule_codes(kernels, facts.token_tile)
    tm = kernels["tile_m"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    tn = kernels["tile_n"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    tile = np.zeros(n, np.int64)
    for i, which in enumerate(opts, start=1):
        on = code == i
        tile[on] = (tm if which == "m" else tn if which == "n" else np.minimum(tm, tn))[on]
    known = (tile > 0) & ~dict_isin(kernels["stage"], _NOT_TOKEN_ROWS)
    out[known] = BETWEEN
    out[known & (tile <= th.skinny_token_tile)] = SKINNY
    out[known & (tile >= th.large_token_tile)] = LARGE
    return out


def _name_codes(kernels: pa.Table) -> np.ndarray:
    """One integer per distinct kernel name (-1: none), so steps compare their kernels by name."""
    names = dict_strings(kernels["norm_name"] if "norm_name" in kernels.column_names else kernels["name"])
    return names.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def _is_fill(kernels: pa.Table) -> np.ndarray:
    """Buffer fills: memsets and the framework's fill kernels."""
    names = dict_strings(kernels["norm_name"] if "norm_name" in kernels.column_names else kernels["name"])
    # matched once per distinct name: the names themselves are never expanded per row
    fill = pc.fill_null(pc.match_substring(names.dictionary, _FILL_WORDS[0]), False)
    for w in _FILL_WORDS[1:]:
        fill = pc.or_(fill, pc.fill_null(pc.match_substring(names.dictionary, w), False))
    fill = fill.take(names.indices)
    return pc.fill_null(fill, False).to_numpy(zero_copy_only=False) | dict_isin(kernels["kind"], ["memset"])


def _prologue_rows(kernels: pa.Table, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows the walk's ``rule`` (STR062) found to be a forward's input preparation, and those of
    them that are layout-only copies (every word of ``layout_copy_words`` in the name: no dtype
    cast); kept as row numbers, a few per step (no per-kernel mask on a 10 GB trace)."""
    if "stage_rule" not in kernels.column_names:
        empty = np.zeros(0, np.int64)
        return empty, empty
    rows = np.flatnonzero(dict_isin(kernels["stage_rule"], (rule,)))
    names = kernels["name"].take(pa.array(rows)).to_pylist() if len(rows) else []
    layout = [all(w in (n or "") for w in _LAYOUT_COPY_WORDS) for n in names]
    return rows, rows[np.asarray(layout, bool)] if len(rows) else rows


def _lm_head_rows(kernels: pa.Table, host_ops: pa.Table, join: launches.OpJoin | None = None) -> np.ndarray:
    """Per kernel: the rows an LM-head GEMM multiplies (its op's input rows, read by
    ``rules/work_ops.toml``), -1 elsewhere and where the shapes do not say."""
    out = np.full(kernels.num_rows, -1, np.int32)
    lm = np.flatnonzero(dict_isin(kernels["stage"], ["lm_head_gemm"]))
    if not len(lm) or host_ops.num_rows == 0:
        return out
    found = launches.joined(kernels, host_ops, join)
    if found is None:
        return out
    ops, pos = found
    at = pos.take(pa.array(lm))
    valid = at.is_valid().to_numpy(zero_copy_only=False)
    lm, at = lm[valid], at.filter(pa.array(valid))
    if not len(lm):
        return out
    op_rows = ops["row"].take(at)
    names = host_ops["name"].take(op_rows).to_pylist()
    dims = host_ops["input_dims"].take(op_rows).to_pylist()
    for r, nm, d in zip(lm.tolist(), names, dims, strict=True):
        out[r] = WORK_OPS.rows(nm, d)
    return out


def _fresh_context(seg: np.ndarray, df: Any) -> tuple[int, bool]:
    """The step's token rows (its first norm launch with a row axis; 0: none) and whether its
    attention attends only the step's own keys: every key length its launches name equals those
    rows, so no cached context exists and every token is a prompt token (PHS033)."""
    if df.get("rows") is None or not len(seg):
        return 0, False
    rows = df["rows"][seg]
    first = np.flatnonzero(rows > 0)
    tokens = int(rows[first[0]]) if len(first) else 0
    if df.get("keys") is None:
        return tokens, False
    keys = df["keys"][seg]
    keys = keys[keys > 0]
    return tokens, bool(tokens > 0 and len(keys) and (keys == tokens).all())


def _step_regime(members: np.ndarray, df: Any) -> str | None:
    """A step's M regime (PHS032): skinny / large where its regimed GEMMs show only that one, mixed
    where they show both; tiles between the thresholds say nothing."""
    if "regime" not in df:
        return None
    r = df["regime"][members]
    skinny, large = bool((r == SKINNY).any()), bool((r == LARGE).any())
    return "mixed" if skinny and large else "skinny" if skinny else "large" if large else None


def _evidence_phase(seg: np.ndarray, df: Any) -> tuple[str | None, str]:
    """The phase a step's own kernels say, and the rule that said it: decode families alone ->
    decode, prefill families, long-query grids or keys of the step's own tokens alone -> prefill,
    both -> mixed; None without any. The rule is PHS030 / PHS033 where a grid / the key lengths
    alone said it, else PHS025."""
    ev = df["evidence"][seg]
    dec = bool((ev == DECODE_EVIDENCE).any())
    by_family = bool((ev == PREFILL_EVIDENCE).any())
    by_grid = bool((ev == PREFILL_GRID_EVIDENCE).any())
    fresh = _fresh_context(seg, df)[1]
    if dec or by_family:
        rule = KERNEL_EVIDENCE
    else:
        rule = GRID_QUERY_TILES if by_grid else FRESH_CONTEXT
    if dec and (by_family or by_grid or fresh):
        return "mixed", rule
    return ("decode" if dec else "prefill" if by_family or by_grid or fresh else None), rule
