"""Kernel-name normalization and decoding, on real names from the sample traces and library sources."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.knowledge.names import DECODED_KEYS, decode_name, group_key, normalize_name

# --- normalize_name --------------------------------------------------------------------------------------


def test_demangles_aiter_bf16_names():
    # aiter's DF16b (std::bfloat16_t) is read by cpp_demangle (libstdc++'s demangler does not)
    raw = "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib"
    norm = normalize_name(raw)
    assert norm.startswith(
        "void aiter::add_rmsnorm_quant_kernel<std::bfloat16_t, std::bfloat16_t, 256, 16, true, false, true, 1>("
    )


def test_demangles_aiter_asm_pseudo_mangled_names():
    assert normalize_name("_ZN5aiter24fmha_fwd_hd128_bf16_rtneE") == "aiter::fmha_fwd_hd128_bf16_rtne"
    assert (
        normalize_name("_ZN5aiter50fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_ps_32x256E")
        == "aiter::fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_ps_32x256"
    )


def test_strips_rocprof_kd_suffixes_and_demangles():
    assert normalize_name("_Z23ncclDevKernel_Generic_124ncclDevKernelArgsStorageILm4096EE.kd") == (
        "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<(unsigned long)4096>)"
    )
    assert normalize_name("__amd_rocclr_fillBufferAligned.kd") == "__amd_rocclr_fillBufferAligned"
    assert normalize_name("attn_fwd.kd") == "attn_fwd"
    clone = "void rms_norm_f32<1024, true, false>(float const*, float*, int) [clone .kd]"
    assert normalize_name(clone) == "void rms_norm_f32<1024, true, false>(float const*, float*, int)"


def test_strips_surrounding_quotes_rocprof_db():
    raw = '"void mul_mat_q<(ggml_type)2, 128, false>(char const*, int const*) [clone .kd]"'
    assert normalize_name(raw) == "void mul_mat_q<(ggml_type)2, 128, false>(char const*, int const*)"


def test_keeps_raw_name_when_demangling_fails():
    # clang's `Tn` template-parameter mangling (sgl-kernel on ROCm) defeats the demangler
    raw = "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i"
    assert normalize_name(raw) == raw
    assert normalize_name("_Zbad") == "_Zbad"


def test_maps_nsys_spellings_to_cxxabi():
    nsys = (
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::<unnamed>::silu_kernel("
        "at::TensorIteratorBase &)::[lambda() (instance 1)]::operator ()() const::[lambda(c10::BFloat16) "
        "(instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)"
    )
    norm = normalize_name(nsys)
    assert "<unnamed>" not in norm and "(anonymous namespace)::silu_kernel" in norm
    assert "{lambda()#1}::operator()() const::{lambda(c10::BFloat16)#1}" in norm
    assert normalize_name("<unnamed>::nvfuser_none_f0_c0_r0_g0(int)") == (
        "(anonymous namespace)::nvfuser_none_f0_c0_r0_g0(int)"
    )


def test_collapses_whitespace_and_passes_plain_names_through():
    assert (
        normalize_name("  nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT \n")
        == "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    )
    assert normalize_name("Memcpy   DtoD\t(Device -> Device)") == "Memcpy DtoD (Device -> Device)"
    assert normalize_name("") == ""


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_normalize_is_total_and_idempotent_on_plain_text(s):
    out = normalize_name(s)
    assert isinstance(out, str)
    if not out.startswith("_Z"):
        assert normalize_name(out) == out


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="_ZNKILEvST0123456789abcdefgklmnstuxyz", max_size=150))
def test_normalize_never_raises_on_mangled_looking_input(s):
    assert isinstance(normalize_name("_Z" + s), str)


# --- decode_name -----------------------------------------------------------------------------------------


def _tile(d):
    return d["tile_m"], d["tile_n"], d["tile_k"], d["split_k"]


def test_decodes_hipblaslt_tensile_names():
    name = (
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1"
        "_CLR1_CADS0_DTLA0_DTLB0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMBSK_GLS0_ISA942_IU1_K1"
    )
    d = decode_name(name)
    assert _tile(d) == (256, 32, 64, None) and d["mi"] == "16x16x1"
    # GSU0 = chosen at run time (None), GSU1 = no split, GSU4 = split-K by 4; GSUAMB is not a GSU value
    assert (
        decode_name("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x256_MI16x16x1_SN_GSU0_GSUAMB_GLS0")[
            "split_k"
        ]
        is None
    )
    assert decode_name("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_GSU1_GSUASB")["split_k"] == 1
    rb = decode_name("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_GSU4_GSUASB_ISA90a")
    assert _tile(rb) == (128, 128, 32, 4) and rb["mi"] == "32x32x8x1"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", (64, 8, 64, -1)),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", (256, 128, 64, 1)),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT", (256, 128, 64, 1)),
        ("nvjet_sm103_tst_64x16_64x16_2x1_2cta_v_bz_splitK_TNT", (64, 16, 64, -1)),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
            "_kernel__5x_cublas",
            (128, 128, 64, 1),
        ),
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute"
            "_kernel__5x_cublas",
            (32, 32, 8, None),
        ),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", (128, 128, 32, None)),
        ("volta_sgemm_128x64_nn", (128, 64, None, None)),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8>(T1::Params)",
            (256, 128, 32, None),
        ),
        ("cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(Params)", (256, 64, 16, None)),
        (
            "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>(T1::Params)",
            (16, 16, 128, None),
        ),
        (
            "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128_1x4x1_cga1x1x1_kernel0_0",
            (16, 128, 128, None),
        ),
        ("aiter::fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_ps_32x256", (32, 256, None, None)),
        ("aiter::bf16gemm_fp32bf16_tn_128x64_bshuffle_splitk", (128, 64, None, -1)),
        ("aiter::f4gemm_bf16_per1x32Fp4_tn_256x256", (256, 256, None, None)),
        ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", (16, 128, 256, 1)),
        ("_p_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x128x2", (128, 256, 128, 2)),
        (
            "bmm_E4m3_E4m3E4m3_Fp32_t128x8x128u2_s6_et64x8_m128x8x32_cga1x1x1_16dp256b_rM_TN_transOut",
            (128, 8, 128, None),
        ),
    ],
)
def test_decodes_library_tiles(name, expected):
    assert _tile(decode_name(name)) == expected


@pytest.mark.parametrize(
    "name",
    [
        "Memset (Device)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>, std::array<char*, 1ul> >"
        "(int, at::native::FillFunctor<long>, std::array<char*, 1ul>)",
        "aiter::mla_dec_stage1_bf16_a16w16_subQ128_mqa128",
        "kernel_unified_attention_3d",
    ],
)
def test_names_without_a_tile_scheme_decode_to_none(name):
    assert decode_name(name) == dict.fromkeys(DECODED_KEYS)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_decode_is_total(s):
    d = decode_name(s)
    assert set(d) == set(DECODED_KEYS)
    assert all(d[k] is None or isinstance(d[k], int) for k in ("tile_m", "tile_n", "tile_k", "split_k"))


# --- group_key -------------------------------------------------------------------------------------------


def test_group_key_adds_the_decoded_configuration():
    name = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT"
    assert group_key(name, decode_name(name)) == f"{name} [tile 64x8x64 split_k -1]"
    volta = "volta_sgemm_128x64_nn"
    assert group_key(volta, decode_name(volta)) == f"{volta} [tile 128x64x?]"
    plain = "kernel_unified_attention_3d"
    assert group_key(plain, decode_name(plain)) == plain
    assert group_key(plain) == plain


def test_group_key_separates_configurations_of_one_family():
    a = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    b = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT"
    assert group_key(a, decode_name(a)) != group_key(b, decode_name(b))
