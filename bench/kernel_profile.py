"""Where a GPU forward's time goes, by kernel family: one call of a function under torch.profiler.

:func:`kernel_breakdown` runs ``run`` once under the profiler and sums the device time of every kernel it launched
into families read from the kernel's name (:func:`family`): matrix multiplies (cuBLAS / CUTLASS / Triton GEMMs),
attention (FlashAttention-3, Sage, cuDNN and PyTorch's flash / efficient kernels), fused Triton elementwise and
reduction kernels (inductor's output), eager elementwise / reduction / copy kernels, and the rest. The share of each
family and the longest kernels are what an engineer reads to find where a forward loses against its physical floor
(bench/results/h200_goals.md: FP8 linears at the fp8 ceiling plus FP8 attention). bench/h200_recipes_speed.py calls
it with ``--profile``.
"""

from __future__ import annotations

import re
from typing import Callable

FAMILIES = ("gemm", "attention", "triton_fused", "elementwise", "reduction", "copy", "other")
"""Kernel families, in the order a name is tested against them (the first match wins)."""

_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|attn|sage|sdpa|softmax_warp", re.I)),
    # inductor's fused kernels before the GEMMs: "triton_red_fused__scaled_mm_..." is the fused quantization prologue
    # of a scaled_mm (its name lists the graph's ops), not the GEMM, which is cuBLASLt's own kernel
    ("triton_fused", re.compile(r"^triton_(poi|per|red)_", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|matmul|_mm_|\bmm_|scaled_mm|cublas|nvjet|sm90_.*(e4m3|bf16|f16)|triton_tem",
                        re.I)),
    ("copy", re.compile(r"^Memcpy|^Memset|copy_kernel|CatArrayBatchedCopy|direct_copy", re.I)),
    ("reduction", re.compile(r"reduce_kernel|reduction|welford|norm_kernel|amax", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled_elementwise|pointwise", re.I)),
)


def family(kernel_name: str) -> str:
    """The family of a kernel, read from its name (:data:`FAMILIES`)."""
    for name, pattern in _PATTERNS:
        if pattern.search(kernel_name):
            return name
    return "other"


def summarize(kernels: list[tuple[str, int, float]], top: int = 12) -> dict:
    """``kernels``: (name, calls, device microseconds) per kernel name. Returns the total, each family's time and share,
    and the ``top`` longest kernels (time in milliseconds)."""
    total_us = sum(us for _, _, us in kernels)
    families = {f: {"ms": 0.0, "calls": 0, "share": 0.0} for f in FAMILIES}
    for name, calls, us in kernels:
        entry = families[family(name)]
        entry["ms"] += us / 1000.0
        entry["calls"] += calls
    for entry in families.values():
        entry["share"] = entry["ms"] * 1000.0 / total_us if total_us > 0 else 0.0
    longest = sorted(kernels, key=lambda k: -k[2])[:top]
    return {"device_ms": total_us / 1000.0, "families": families,
            "top": [{"kernel": name[:160], "family": family(name), "calls": calls, "ms": us / 1000.0}
                    for name, calls, us in longest]}


def kernel_breakdown(run: Callable[[], object], top: int = 12) -> dict:
    """Profile one call of ``run`` on the GPU and :func:`summarize` its kernels (CUDA device time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = []
    for evt in prof.key_averages():
        if "cuda" not in str(getattr(evt, "device_type", "")).lower():
            continue
        us = float(getattr(evt, "self_device_time_total", 0.0) or getattr(evt, "device_time_total", 0.0) or 0.0)
        if us > 0:
            kernels.append((evt.key, int(evt.count), us))
    return summarize(kernels, top)
