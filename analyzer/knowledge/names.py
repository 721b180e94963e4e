"""Kernel-name normalization and decoding: raw profiler names -> ``norm_name``, tile / split-K, ``group_key``.

Contract (spec: rules/README.md, "Tile decoding and `group_key`"; the name families: docs/coverage.md):

* :func:`normalize_name` is pure and total: any string in, a string out, never an exception. It demangles
  Itanium names (``_Z...``) with the maintained ``cpp_demangle`` package, keeps the raw text when that
  fails (clang's ``Tn`` template-parameter mangling defeats every demangler, which is why the rule table
  also matches the raw name), strips rocprof's ``.kd`` / `` [clone .kd]`` suffixes and surrounding double
  quotes, maps nsys' demangler spellings (``<unnamed>``, ``[lambda() (instance 1)]``) onto the cxxabi ones
  (``(anonymous namespace)``, ``{lambda()#1}``) and collapses whitespace.
* **Truncated names.** A name cut by its profiler (``nsys stats`` / table printers cut long names at a
  column width, often ending them with ``…`` or ``...``) keeps its visible text and ends in exactly one
  ``…`` (:data:`ELLIPSIS`): a trailing ``...`` / ``…`` becomes ``…``, and a name without one whose
  ``<`` / ``(`` outnumber their closers (a cut inside the template arguments or the parameter list)
  gets one. The ellipsis keeps ``$``-anchored patterns and tile decoders from matching at the cut;
  :func:`is_truncated` tells such a name (the rule table then refuses to be confident about what only
  the tail could decide: ``analyzer/knowledge/kernel_rules.py``).
* :func:`decode_name` reads the tile and split-K that a library spells into its kernel names. Unknown
  stays ``None``. ``split_k`` encoding: ``None`` = the name does not say; ``1`` = the naming scheme says
  "no split-K"; ``N > 1`` = split-K by N; ``-1`` = split-K with a factor the name does not give
  (nvjet ``splitK``, aiter ``_splitk``, cuBLAS ``segment_k_on``).
* :func:`group_key` is the one grouping key used everywhere: ``norm_name`` plus the decoded tile / split-K.

Every regular expression here is linear-time: no nested quantifiers, no backreferences.
"""

from __future__ import annotations

import re
from typing import Any

try:  # the project depends on it; the fallback only keeps normalization total without it
    import cpp_demangle as _cpp_demangle
except ImportError:  # pragma: no cover - exercised only in broken environments
    _cpp_demangle = None

__all__ = ["DECODED_KEYS", "ELLIPSIS", "decode_name", "group_key", "is_truncated", "normalize_name"]

DECODED_KEYS = ("tile_m", "tile_n", "tile_k", "split_k", "mi")

_KD_SUFFIX = re.compile(r"(?: \[clone \.kd\]|\.kd)$")
_WS = re.compile(r"\s+")
_NSYS_LAMBDA = re.compile(r"\[lambda\(([^()\[\]]*)\) \(instance (\d+)\)\]")
# mangled names in real traces stay far below this; longer input is kept raw rather than demangled
_MAX_DEMANGLE_INPUT = 20_000
#: the mark a truncated name ends with once normalized
ELLIPSIS = "\u2026"
_CUT_MARK = re.compile(r"\s*(?:\.\.\.|\u2026)$")
# spellings whose angle brackets / parentheses are no bracket pair (operator<<, operator(), ->)
_NOT_BRACKETS = re.compile(r"operator\s*(?:<<=?|>>=?|<=>|<=?|>=?|->\*?|\(\s*\))|->")


def normalize_name(name: str) -> str:
    """Return the normalized form of a raw kernel name (see the module docstring)."""
    s = name
    while True:  # quotes and .kd suffixes may nest ('"foo.kd"', 'foo.kd [clone .kd]'): peel until stable
        t = s.strip()
        if len(t) >= 2 and t[0] == '"' and t[-1] == '"':
            t = t[1:-1]
        t = _KD_SUFFIX.sub("", t)
        if t == s:
            break
        s = t
    if s.startswith("_Z") and _cpp_demangle is not None and len(s) <= _MAX_DEMANGLE_INPUT:
        try:
            s = _cpp_demangle.demangle(s)
        except (KeyboardInterrupt, SystemExit):  # pragma: no cover
            raise
        except BaseException:  # noqa: BLE001 - a failure (even a Rust panic) means "keep the raw name"
            pass
    s = _WS.sub(" ", s).strip()
    if "<unnamed>" in s:
        s = s.replace("<unnamed>", "(anonymous namespace)")
    if "(instance " in s:
        s = _NSYS_LAMBDA.sub(r"{lambda(\1)#\2}", s)
    if "operator ()" in s:  # nsys spells the call operator with a space
        s = s.replace("operator ()", "operator()")
    if s.endswith(("...", ELLIPSIS)):
        s = _CUT_MARK.sub("", s) + ELLIPSIS
    elif ("<" in s or "(" in s) and _cut_inside_brackets(s):
        s += ELLIPSIS
    return s


def _cut_inside_brackets(s: str) -> bool:
    """Whether more ``<`` or ``(`` open than close: the name was cut inside them."""
    t = _NOT_BRACKETS.sub("", s) if "operator" in s or "->" in s else s
    return t.count("<") > t.count(">") or t.count("(") > t.count(")")


def is_truncated(norm_name: str) -> bool:
    """Whether a normalized name is a truncated one (it ends with :data:`ELLIPSIS`)."""
    return norm_name.endswith(ELLIPSIS)


# --- decoding -------------------------------------------------------------------------------------------

# Tensile / hipBLASLt: _MT<MacroTile0>x<MacroTile1>x<DepthU>, _MI<M>x<N>x<B> (hipBLASLt) or
# _MI<M>x<N>x<K>x<B> (rocBLAS Tensile), _GSU<n> GlobalSplitU (0 = chosen at run time, 1 = none).
_TENSILE = re.compile(r"^Cijk_")
_TENSILE_MT = re.compile(r"_MT(\d+)x(\d+)x(\d+)(?:_|$)")
_TENSILE_MI = re.compile(r"_MI(\d+x\d+x\d+(?:x\d+)?)(?:_|$)")
_TENSILE_GSU = re.compile(r"_GSU(\d+)(?:_|$)")
# cuBLAS >= 12.8 nvjet: nvjet_[smXY_]<type>_<M>x<N>_<K>x<stages>_<cluster>_..._splitK_...
_NVJET = re.compile(r"^nvjet_(?:sm\d+_)?[a-z0-9]+_(\d+)x(\d+)_(\d+)x\d+_")
_NVJET_SPLITK = re.compile(r"_splitK(?:_|$)")
# cuBLAS / cuDNN xmma: ..._tilesize<M>x<N>x<K>_...; segment_k_on = split along K with a runtime factor
_XMMA_TILE = re.compile(r"_tilesize(\d+)x(\d+)x(\d+)")
_XMMA_SEGK = re.compile(r"_segment_k_(on|off)")
# pre-Hopper cuBLAS: ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn, volta_sgemm_128x64_nn
_LEGACY_CUBLAS = re.compile(
    r"^(?:maxwell|pascal|volta|turing|ampere|ada)_[a-z0-9_]*?gemm_[a-z0-9]*?_?(\d+)x(\d+)_"
)
_LEGACY_STAGES = re.compile(r"_stages_(\d+)x\d+_")
# CUTLASS 2 names (also inside cuBLAS / cuDNN): cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4
_CUTLASS2 = re.compile(r"cutlass_[a-z0-9_]*?_(\d+)x(\d+)_(\d+)x\d+_")
# cuDNN runtime-fusion engines: cudnn_generated_..._knob_35_16x128x128_1x4x1_cga1x1x1_kernel0_0
_CUDNN_GEN = re.compile(r"^cudnn_generated_[a-z0-9_]*?_(\d+)x(\d+)x(\d+)_\d+x\d+x\d+_cga")
# OpenAI triton_kernels matmul: _matmul_ogs_<layouts>_<dtypes>_<BLOCK_M>x<BLOCK_N>x<BLOCK_K>x<SPLIT_K>
_TRITON_MATMUL = re.compile(r"^_p?_?matmul(?:_ogs)?_\w*?_(\d+)x(\d+)x(\d+)x(\d+)(?:_|$)")
# TRT-LLM-gen batched / dense GEMM cubins: bmm_E4m3_E4m3E4m3_Fp32_t128x8x128u2_s6_...
_TRTLLM_GEN = re.compile(r"^(?:bmm|gemm)_[A-Z][A-Za-z0-9]*_\w*?_t(\d+)x(\d+)x(\d+)")
# aiter assembly GEMM / fused-MoE kernels end in their M x N tile: aiter::fmoe_..._32x256,
# aiter::bf16gemm_fp32bf16_tn_128x64_bshuffle_splitk
_AITER_ASM = re.compile(r"^aiter::[A-Za-z0-9_]*?(?:gemm|fmoe)[A-Za-z0-9_]*?_(\d+)x(\d+)(?:_|$)")
_AITER_SPLITK = re.compile(r"_splitk(?:_|$)", re.IGNORECASE)


def _empty() -> dict[str, Any]:
    return dict.fromkeys(DECODED_KEYS)


def decode_name(norm_name: str) -> dict[str, Any]:
    """Decode tile M/N/K, split-K and (Tensile) matrix-instruction shape from a normalized name.

    Returns a dict with keys ``tile_m``, ``tile_n``, ``tile_k``, ``split_k`` (int or None) and ``mi``
    (str or None, e.g. ``"16x16x1"``). Names with no known scheme decode to all ``None``.
    """
    out = _empty()
    n = norm_name
    if _TENSILE.match(n):
        if m := _TENSILE_MT.search(n):
            out["tile_m"], out["tile_n"], out["tile_k"] = (int(g) for g in m.groups())
        if m := _TENSILE_MI.search(n):
            out["mi"] = m.group(1)
        if m := _TENSILE_GSU.search(n):
            gsu = int(m.group(1))
            out["split_k"] = gsu if gsu >= 1 else None
        return out
    if n.startswith("nvjet_"):
        if m := _NVJET.match(n):
            out["tile_m"], out["tile_n"], out["tile_k"] = (int(g) for g in m.groups())
            out["split_k"] = -1 if _NVJET_SPLITK.search(n) else 1
        return out
    if m := _XMMA_TILE.search(n):
        out["tile_m"], out["tile_n"], out["tile_k"] = (int(g) for g in m.groups())
        if s := _XMMA_SEGK.search(n):
            out["split_k"] = -1 if s.group(1) == "on" else 1
        return out
    if m := _CUDNN_GEN.match(n):
        out["tile_m"], out["tile_n"], out["tile_k"] = (int(g) for g in m.groups())
        return out
    if m := _LEGACY_CUBLAS.match(n):
        out["tile_m"], out["tile_n"] = int(m.group(1)), int(m.group(2))
        if s := _LEGACY_STAGES.search(n):
            out["tile_k"] = int(s.group(1))
        return out
    if "cutlass_" in n and (m := _CUTLASS2.search(n)):
        out["tile_m"], out["tile_n"], out["tile_k"] = (int(g) for g in m.groups())
        return out
    if "matmul" in n and (m := _TRITON_MATMUL.match(n)):
        out["tile_m"], out["tile_n"], out["tile_k"], out["split_k"] = (int(g) for g in m.groups())
        return out
    if m := _TRTLLM_GEN.match(n):
        out["tile_m"], out["tile_n"], out["tile_k"] = (int(g) for g in m.groups())
        return out
    if n.startswith("aiter::") and (m := _AITER_ASM.match(n)):
        out["tile_m"], out["tile_n"] = int(m.group(1)), int(m.group(2))
        if _AITER_SPLITK.search(n):
            out["split_k"] = -1
        return out
    return out


def group_key(norm_name: str, decoded: dict[str, Any] | None = None) -> str:
    """The grouping key: ``norm_name``, plus `` [tile MxNxK split_k S]`` when anything was decoded.

    Unknown tile dimensions print as ``?``; ``split_k`` is printed only when known (``-1`` = split-K with
    an unknown factor). The norm_name already carries the template parameters, so two kernels with equal
    keys ran the same compiled configuration.
    """
    if not decoded:
        return norm_name
    dims = (decoded.get("tile_m"), decoded.get("tile_n"), decoded.get("tile_k"))
    parts = []
    if any(d is not None for d in dims):
        parts.append("tile " + "x".join("?" if d is None else str(d) for d in dims))
    if decoded.get("split_k") is not None:
        parts.append(f"split_k {decoded['split_k']}")
    if not parts:
        return norm_name
    return f"{norm_name} [{' '.join(parts)}]"
