"""bench/lib/speed.py: kernel families read from real kernel names, and the breakdown's arithmetic."""

from __future__ import annotations

import pytest
import torch

from bench.lib.speed import FAMILIES, family, kernel_breakdown, summarize

# Kernel names as torch.profiler reports them on an H200 (cuBLAS / CUTLASS GEMMs, FlashAttention-3, Sage, cuDNN,
# PyTorch's own kernels and inductor's Triton kernels).
NAMES = {
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "gemm",
    "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, float_e4m3_t> >(...)": "gemm",
    "triton_tem_fused_mm_0": "gemm",
    "nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT": "gemm",
    "triton_red_fused__scaled_mm__to_copy_abs_amax_clamp_div_mul_silu_split_t_unsqueeze_view_1": "triton_fused",
    "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(...)": "attention",
    "void cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0": "attention",
    "qk_int8_sv_f8_accum_f32_attn_inst_buf_kernel": "attention",
    "triton_poi_fused_add_mul_native_layer_norm_0": "triton_fused",
    "triton_red_fused_abs_amax_1": "triton_fused",
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float> >(...)": "elementwise",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float> > >(...)": "reduction",
    "Memcpy DtoD (Device -> Device)": "copy",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>(...)": "copy",
    "some_custom_kernel_xyz": "other",
}


@pytest.mark.parametrize("name,expected", sorted(NAMES.items()))
def test_kernel_family_from_its_name(name, expected):
    assert family(name) == expected


def test_summary_sums_each_family_and_orders_the_longest():
    kernels = [("triton_tem_fused_mm_0", 10, 3000.0), ("void flash::flash_fwd_kernel<x>", 5, 1500.0),
               ("triton_poi_fused_mul_0", 20, 400.0), ("Memcpy HtoD (Pageable -> Device)", 2, 100.0),
               ("sm90_xmma_gemm_e4m3", 4, 1000.0)]
    out = summarize(kernels, top=2)
    total = 3000.0 + 1500.0 + 400.0 + 100.0 + 1000.0
    assert out["device_ms"] == pytest.approx(total / 1000.0)
    assert set(out["families"]) == set(FAMILIES)
    assert out["families"]["gemm"] == {"ms": pytest.approx(4.0), "calls": 14, "share": pytest.approx(4000.0 / total)}
    assert out["families"]["attention"]["share"] == pytest.approx(1500.0 / total)
    assert sum(f["share"] for f in out["families"].values()) == pytest.approx(1.0)
    assert [t["kernel"] for t in out["top"]] == ["triton_tem_fused_mm_0", "void flash::flash_fwd_kernel<x>"]
    assert summarize([])["device_ms"] == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_breakdown_of_a_matmul_is_mostly_gemm():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out = kernel_breakdown(lambda: a @ a)
    assert out["families"]["gemm"]["share"] > 0.9 and out["device_ms"] > 0
