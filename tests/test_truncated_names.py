"""Names cut by the profiler (`nsys stats` and table printers end them with `…` / `...` at a column
width): the family the visible prefix decides is kept, what only the tail could say is not claimed.

The names are real: cut from `../shared/traces/nsys-stats-csv-deepseek-ocr-rtx5090` (whose own CSV keeps
full names) at the widths a column printer uses, and as public nsys / torch-profiler tables print them.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from analyzer.knowledge.kernel_rules import TRUNCATED_RULE_ID, default_rules
from analyzer.knowledge.names import ELLIPSIS, is_truncated, normalize_name
from tests.conftest import shared

RS = default_rules()


def _match(raw: str):
    return RS.match(normalize_name(raw), raw)


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        (
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits...",
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits…",
        ),
        (
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits…",
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits…",
        ),
        # cut without a mark, inside the template arguments: the open `<` tells
        (
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<(int)128, (int)64",
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<(int)128, (int)64…",
        ),
        # balanced, an operator, a variadic parameter list: not truncated
        (
            "void at::native::elementwise_kernel<128, 4>(int, T3)",
            "void at::native::elementwise_kernel<128, 4>(int, T3)",
        ),
        ("bool operator<(Foo const&, Foo const&)", "bool operator<(Foo const&, Foo const&)"),
        ("void printf_kernel(char const*, ...)", "void printf_kernel(char const*, ...)"),
    ],
)
def test_truncation_is_marked_with_one_ellipsis(raw: str, norm: str) -> None:
    got = normalize_name(raw)
    assert got == norm
    assert is_truncated(got) == norm.endswith(ELLIPSIS)
    assert normalize_name(got) == got  # idempotent


@pytest.mark.parametrize(
    ("raw", "rule_id", "stage", "provider"),
    [
        # the prefix decides the family
        (
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<(int)128, (int)64, (int)128, (i…",
            "ATT002",
            "paged_attention",
            "flash_attn",
        ),
        (
            "std::enable_if<!T7, void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, __nv_bfloat16…",
            "GEM013",
            "gemm",
            "cublas",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(T1::P…",
            "GEM012",
            "gemm",
            "cublas",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<(int)4, at::native::GeluCUDAKernelImpl(at::TensorIt…",
            "ATN008",
            "activation",
            "pytorch",
        ),
        (
            "vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, (bool)1>(T1 *, cons…",
            "ACT003",
            "activation",
            "vllm",
        ),
        # cuBLAS's xmma GEMMs end `_cublas`; cuDNN's xmma kernels are convolutions (`fprop`, `dgrad`,
        # `wgrad`, GEM010), so the visible `sm90_xmma_gemm_` decides cuBLAS (a public nsys table of
        # vLLM on H100)
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_of…",
            "GEM012",
            "gemm",
            "cublas",
        ),
        # hipBLASLt's markers were cut: a Tensile kernel, library unknown; visible markers still decide
        ("Cijk_Alik_Bljk_BBS_B...", "GEM004", "gemm", "unknown"),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT320...", "GEM003", "gemm", "hipblaslt"),
        # the tail would have decided the stage (ForGen: decode, HQk576: MLA): no confident stage
        ("fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCa...", TRUNCATED_RULE_ID, "other", "trtllm"),
        # a `$`-anchored rule cannot match at the cut
        ("reduce_segments...", "UNCLASSIFIED", "other", "unknown"),
        # a generic ATen kernel cut before its functor: elementwise, which claims no role
        ("void at::native::vectorized_elementwise_kernel<(int)4, at::…", "ATN099", "elementwise", "pytorch"),
    ],
)
def test_truncated_names_keep_what_the_prefix_decides(
    raw: str, rule_id: str, stage: str, provider: str
) -> None:
    m = _match(raw)
    assert (m.rule_id, m.stage, m.provider) == (rule_id, stage, provider)


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_cut_real_names_are_never_confidently_wrong(width: int) -> None:
    # GIVEN every kernel name of a real nsys stats table, cut at a column width
    path = shared("nsys-stats-csv-deepseek-ocr-rtx5090/all-stage/summary_cuda_gpu_kern_sum.csv")
    with open(path, newline="", encoding="utf-8") as f:
        names = [r["Name"] for r in csv.DictReader(f)]
    decided = 0
    for n in names:
        if len(n) <= width:
            continue
        full = _match(n)
        cut = _match(n[: width - 1] + ELLIPSIS)
        # THEN a stage it names is the full name's (or the generic elementwise / the unclassified
        # abstention), and a provider it names is the full name's
        assert cut.stage in (full.stage, "elementwise", "other"), (n[:width], cut, full)
        assert cut.provider in (full.provider, "unknown"), (n[:width], cut, full)
        decided += (cut.stage, cut.provider) == (full.stage, full.provider)
    # AND most cut names still get their family
    assert decided >= 0.7 * sum(len(n) > width for n in names)


# --- every name of the kernel tables, cut as nsys cuts it ---------------------------------------------

KERNEL_TABLES = Path(__file__).parent / "data" / "kernel_tables"


def _table_names() -> list[str]:
    names: dict[str, None] = {}
    for path in sorted(KERNEL_TABLES.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if not is_truncated(normalize_name(row["name"])):
                    names.setdefault(row["name"], None)
    return list(names)


# the share of classified names that keep a stage when cut (benchmarks/truncation.py; docs/coverage.md)
DECIDED_FLOOR = {80: 0.915, 100: 0.975}


@pytest.mark.parametrize("width", sorted(DECIDED_FLOOR))
def test_kernel_table_names_cut_at_a_column_width_are_never_confidently_wrong(width: int) -> None:
    # GIVEN every full name of the kernel tables, clipped as `nsys stats` column / table output clips
    # an auto-width column (100 characters by default, the last one `…`) and at a narrower 80
    decided = classified = 0
    for n in _table_names():
        if len(n) <= width:
            continue
        full = _match(n)
        if full.stage == "other":
            continue
        classified += 1
        cut = _match(n[: width - 1] + ELLIPSIS)
        # THEN a stage that claims something (not the abstentions `other` / a generic `elementwise`)
        # is the full name's
        if cut.stage == "other" or cut.stage == "elementwise" != full.stage:
            continue
        assert cut.stage == full.stage, (n[:width], cut, full)
        decided += 1
    # AND the share that keeps its stage does not fall back
    assert decided / classified >= DECIDED_FLOOR[width], decided / classified


@pytest.mark.parametrize(
    ("raw", "rule_id", "stage"),
    [
        # one visible character meeting a grafted example's tail by chance (`…at::nat` + `ensorrt_llm`)
        # is no sign of a TRT-LLM all-reduce
        (
            "void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, (int)4, void at::nat…",
            "ATN005",
            "sampling",
        ),
        # the visible kernel class decides; a split-KV combine's example contradicts the visible text
        (
            "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFm…",
            "ATT726",
            "flash_attention",
        ),
    ],
)
def test_visible_text_that_decides_keeps_its_stage(raw: str, rule_id: str, stage: str) -> None:
    m = _match(raw)
    assert (m.rule_id, m.stage) == (rule_id, stage)
