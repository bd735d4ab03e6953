"""Linear quantization of the transformer: INT8 weight-only, INT8 W8A8 and FP8 W8A8.

Weights get one scale per output channel, activations (W8A8) one scale per token, both symmetric absmax. The matmuls
are PyTorch's own kernels, which run on the CPU and on Hopper alike: ``torch._weight_int8pack_mm`` (weight-only),
``torch._int_mm`` (INT8 x INT8 -> INT32) and ``torch._scaled_mm`` (FP8 e4m3 with row/column scales). torchao's
configs wrap the same kernels but pull in a package whose releases track torch nightly; these three calls are what
the lever needs, so it uses them directly.

Modules whose name matches an ``exclude`` pattern stay in floating point (the float32 input/output projections and
time embedder, and the norms, by default). FP8 W8A8 is refused on the CPU: ``_scaled_mm`` there is an emulation with
none of the speed the lever exists for, so a recipe asking for it fails at load rather than quietly running slow.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

import torch
from torch import nn

from pydantic import Field

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, mark_applied, unmark_applied

logger = logging.getLogger(__name__)

MODES = ("int8_weight_only", "int8_w8a8", "fp8_w8a8")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT8_MAX = 127.0


class QuantizationConfig(LeverConfig):
    """Linear quantization of the transformer (per-channel weight scales, per-token activation scales); recipe
    section ``[quant]``."""

    name = "quant"

    mode: Literal["none", "int8_weight_only", "int8_w8a8", "fp8_w8a8"] = "none"
    exclude: list[str] = Field(
        default_factory=lambda: [r"(^|\.)proj_in$", r"(^|\.)audio_proj_in$", r"(^|\.)proj_out$",
                                 r"(^|\.)audio_proj_out$", r"time_embedder", r"norm"]
    )
    """Regular expressions (``re.search``) over module names that stay in floating point: by default the float32
    input/output projections and time embedder, and the norms (``norm_out``'s modulation)."""

    def is_on(self) -> bool:
        return self.mode != "none"

    def device_problems(self, device: str) -> list[str]:
        if self.mode == "fp8_w8a8" and not str(device).startswith("cuda"):
            return ["quant.mode = 'fp8_w8a8' needs a GPU with FP8 tensor cores (Hopper/Ada)"]
        return []

    def apply(self, pipe, ctx: ApplyContext) -> "QuantizationHandle":
        return apply_quantization(pipe.transformer, self, keep_originals=ctx.reversible, compute_device=ctx.device)


def quantize_per_channel(weight: torch.Tensor, qmax: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel quantization: (q, scale) with ``weight ~= q * scale[:, None]``."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / qmax
    scaled = w / scale[:, None]
    q = scaled.round().clamp(-qmax, qmax).to(dtype) if dtype == torch.int8 else scaled.clamp(-qmax, qmax).to(dtype)
    return q, scale


def quantize_per_token(x: torch.Tensor, qmax: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row quantization of a 2-D activation: (q, scale (rows, 1))."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / qmax
    scaled = xf / scale
    q = scaled.round().clamp(-qmax, qmax).to(dtype) if dtype == torch.int8 else scaled.clamp(-qmax, qmax).to(dtype)
    return q, scale


def _pad_rows(x: torch.Tensor, multiple: int, minimum: int) -> tuple[torch.Tensor, int]:
    rows = x.shape[0]
    target = max(minimum, -(-rows // multiple) * multiple)
    if target == rows:
        return x, rows
    return torch.cat([x, x.new_zeros(target - rows, x.shape[1])]), rows


class QuantizedLinear(nn.Module):
    """A Linear whose weight is stored quantized; ``forward`` computes with the quantized kernels."""

    def __init__(self, linear: nn.Linear, mode: str):
        super().__init__()
        if mode not in MODES:
            raise LeverError(f"unknown quantization mode {mode!r}; one of {', '.join(MODES)}")
        self.mode, self.in_features, self.out_features = mode, linear.in_features, linear.out_features
        self.compute_dtype = linear.weight.dtype
        # First floating tensor of the module, so diffusers' get_parameter_dtype(module) reports the compute dtype:
        # MiniMax-H3 casts an AdaLN projection's input to that dtype, and would otherwise read float8 off the FP8
        # weight (a lossy cast before quantization, and an FP8 output dtype _scaled_mm rejects on the H200).
        self.register_buffer("dtype_anchor", torch.empty(0, dtype=self.compute_dtype), persistent=False)
        qdtype, qmax = (FP8, FP8_MAX) if mode == "fp8_w8a8" else (torch.int8, INT8_MAX)
        q, scale = quantize_per_channel(linear.weight, qmax, qdtype)
        self.register_buffer("qweight", q)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.calls = 0

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, mode={self.mode}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Counted in eager mode only: an int attribute bumped inside a compiled region is a guard that recompiles on
        # every call (seen on the H200: recompile_limit hit), so compiled calls go uncounted (telemetry says so).
        if not torch.compiler.is_compiling():
            self.calls += 1
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.mode == "int8_weight_only" and x2.device.type == "cpu":
            # The CPU kernel takes bf16/fp16/fp32 activations and per-channel scales in the activation's dtype.
            y = torch._weight_int8pack_mm(x2.contiguous(), self.qweight, self.weight_scale.to(x2.dtype))
        elif self.mode == "int8_weight_only":
            # x @ (q * s).T == (x @ q.T) * s: the int8 weight is what crosses memory; the cast fuses under compile.
            y = nn.functional.linear(x2, self.qweight.to(x2.dtype)) * self.weight_scale.to(x2.dtype)
        elif self.mode == "int8_w8a8":
            xq, xs = quantize_per_token(x2, INT8_MAX, torch.int8)
            # cuBLAS's int8 GEMM wants more than 16 rows and a multiple of 8; the padding rows are zero and dropped.
            xq, rows = _pad_rows(xq, 8, 32)
            acc = torch._int_mm(xq, self.qweight.t())[:rows]
            y = (acc.float() * xs * self.weight_scale[None, :]).to(x.dtype)
        else:
            xq, xs = quantize_per_token(x2, FP8_MAX, FP8)
            xq, rows = _pad_rows(xq, 16, 16)
            xs_p, _ = _pad_rows(xs, 16, 16)
            # Row-wise scaled FP8 GEMM outputs bf16 on Hopper; float32 only where the module computes in float32.
            out_dtype = torch.float32 if self.compute_dtype == torch.float32 else torch.bfloat16
            y = torch._scaled_mm(
                xq, self.qweight.t(), scale_a=xs_p.contiguous(), scale_b=self.weight_scale[None, :].contiguous(),
                out_dtype=out_dtype,
            )[:rows].to(self.compute_dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)


def kernel_shape_ok(in_features: int | None, out_features: int | None, mode: str) -> bool:
    """Whether the lever quantizes a Linear of this shape (others stay in floating point): int8 GEMM and FP8 GEMM
    need K and N multiples of 8 / 16 respectively; weight-only int8 takes any shape."""
    if mode == "int8_weight_only":
        return True
    multiple = 16 if mode == "fp8_w8a8" else 8
    return all(f is not None and f % multiple == 0 for f in (in_features, out_features))


class QuantizationHandle(LeverHandle):
    name = "quant"

    def __init__(self, root, mode, replaced, excluded, skipped_shape, originals):
        super().__init__()
        self.root, self.mode = root, mode
        self.replaced, self.excluded, self.skipped_shape, self.originals = replaced, excluded, skipped_shape, originals

    def begin_request(self) -> None:
        for module in self.replaced.values():
            module.calls = 0

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "mode": self.mode,
            "quantized_modules": len(self.replaced),
            "excluded_modules": len(self.excluded),
            "skipped_shape": len(self.skipped_shape),
            "quantized_params": sum(m.qweight.numel() for m in self.replaced.values()),
            "quantized_linear_calls": None if self.compiled else sum(m.calls for m in self.replaced.values()),
        }

    def _remove(self) -> None:
        if len(self.originals) != len(self.replaced):
            raise LeverError("quantization dropped the float weights (keep_originals=False); reload the model")
        for name, original in self.originals.items():
            # Back where the quantized layer computed (the float copy was parked on the CPU).
            _set_submodule(self.root, name, original.to(self.replaced[name].weight_scale.device))
        unmark_applied(self.root, "quant")


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


@torch.no_grad()
def apply_quantization(module: nn.Module, config: QuantizationConfig, *, keep_originals: bool = True,
                       compute_device: str | None = None, allow_cpu_fp8: bool = False) -> QuantizationHandle:
    """Replace every ``nn.Linear`` of ``module`` not matched by ``config.exclude`` with a QuantizedLinear.

    ``keep_originals`` keeps the float modules (on the CPU) so that ``remove()`` can restore them; the runtime drops
    them. ``compute_device``: where the quantized linears will compute (the runtime's device; parameters may sit on
    the CPU under offloading); None: the module's own device. ``allow_cpu_fp8`` (tests only) lets FP8 run through
    the CPU's emulated ``_scaled_mm`` to check its numerics.
    """
    if config.mode not in MODES:
        raise LeverError(f"unknown quantization mode {config.mode!r}; one of {', '.join(MODES)}")
    device = next(module.parameters()).device
    compute = torch.device(compute_device) if compute_device else device
    if config.mode == "fp8_w8a8":
        if compute.type == "cpu" and not allow_cpu_fp8:
            raise LeverError(
                "quant.mode = 'fp8_w8a8' needs a GPU with FP8 tensor cores (Hopper/Ada); this runtime is on the CPU. "
                "Refusing to fall back silently."
            )
        if compute.type == "cuda" and torch.cuda.get_device_capability(compute) < (8, 9):
            raise LeverError(f"quant.mode = 'fp8_w8a8' needs compute capability 8.9+, {compute} has "
                             f"{torch.cuda.get_device_capability(compute)}")
    patterns = [re.compile(p) for p in config.exclude]
    mark_applied(module, "quant")
    replaced, excluded, skipped, originals = {}, [], [], {}
    for name, child in list(module.named_modules()):
        if not isinstance(child, nn.Linear) or "lora_" in name:
            continue
        if any(p.search(name) for p in patterns):
            excluded.append(name)
            continue
        if not kernel_shape_ok(child.in_features, child.out_features, config.mode):
            skipped.append(name)
            continue
        quantized = QuantizedLinear(child, config.mode).to(device)
        if keep_originals:
            originals[name] = child.to("cpu")
        replaced[name] = quantized
        _set_submodule(module, name, quantized)
    if not replaced:
        unmark_applied(module, "quant")
        raise LeverError(f"quantization {config.mode}: no Linear left to quantize after exclude={config.exclude}")
    logger.info("quantization %s: %d linears quantized, %d excluded, %d skipped for kernel shape",
                config.mode, len(replaced), len(excluded), len(skipped))
    return QuantizationHandle(module, config.mode, replaced, excluded, skipped, originals)
