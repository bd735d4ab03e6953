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
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from pydantic import Field, field_validator

from h3.levers.base import (ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, new_counter,
                           unmark_applied)

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)

MODES = ("int8_weight_only", "int8_w8a8", "fp8_w8a8")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT8_MAX = 127.0


def regular_expressions(value: list[str]) -> list[str]:
    """``value`` if every item compiles as a regular expression (checked at load, not when a lever applies after the
    weights), else ValueError naming the first that does not."""
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a regular expression ({exc})") from None
    return value


class QuantizationConfig(LeverConfig):
    """Linear quantization of the transformer (per-channel weight scales, per-token activation scales); recipe
    section ``[quant]``."""

    name = "quant"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "8-bit or FP8 linears: the same sample with a small numerical error"

    mode: Literal["none", "int8_weight_only", "int8_w8a8", "fp8_w8a8"] = "none"
    exclude: list[str] = Field(
        default_factory=lambda: [r"(^|\.)proj_in$", r"(^|\.)audio_proj_in$", r"(^|\.)proj_out$",
                                 r"(^|\.)audio_proj_out$", r"time_embedder", r"norm"]
    )
    """Regular expressions (``re.search``) over module names that stay in floating point: by default the float32
    input/output projections and time embedder, and the norms (``norm_out``'s modulation)."""

    @field_validator("exclude")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        return regular_expressions(value)

    def is_on(self) -> bool:
        return self.mode != "none"

    def device_problems(self, device: str) -> list[str]:
        if self.mode == "fp8_w8a8" and not str(device).startswith("cuda"):
            return ["quant.mode = 'fp8_w8a8' needs a GPU with FP8 tensor cores (Hopper/Ada)"]
        return []

    def apply(self, pipe, ctx: ApplyContext) -> "QuantizationHandle":
        return apply_quantization(pipe.transformer, self, keep_originals=ctx.reversible, compute_device=ctx.device,
                                  keep_on=ctx.keep_on)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """The configured mode, on at least one module, with the configured exclusions; in a request, every quantized
        module ran (each is called at least once per forward: a module replaced but bypassed would show 0 calls) and
        no module more often than once per forward."""
        problems = []
        if telemetry.get("mode") != self.mode:
            problems.append(f"recipe asks for mode {self.mode!r}, the quantized modules ran {telemetry.get('mode')!r}")
        (modules,), missing = counts(telemetry, "quantized_modules")
        problems += missing
        if not missing and modules < 1:
            problems.append("no module was quantized")
        if "exclude" in telemetry and telemetry["exclude"] != list(self.exclude):
            problems.append(f"recipe excludes {list(self.exclude)}, the lever excluded {telemetry['exclude']}")
        if executed.forward_passes > 0 and not missing:
            (calls, called), missing = counts(telemetry, "quantized_linear_calls", "quantized_modules_called")
            problems += missing
            if not missing and called != modules:
                problems.append(f"{called} of the {modules} quantized modules ran in {executed.forward_passes} DiT "
                                "forwards (a quantized module that never runs was bypassed)")
            if not missing and calls > modules * executed.forward_passes:
                problems.append(f"{calls} quantized-linear calls in {executed.forward_passes} forwards of "
                                f"{modules} modules: more than one per module and forward")
        return problems


def quantize_per_channel(weight: torch.Tensor, qmax: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel quantization: (q, scale) with ``weight ~= q * scale[:, None]``."""
    w = weight.detach()
    # The row maxima read in the weight's own dtype (abs and max are exact, so the scale is the float32 one), then one
    # float32 copy divided, rounded and clamped in place: the layer's working memory is that copy and the result, not
    # the three float32 temporaries the out-of-place form made (the load's peak, h3.memory.QUANT_WORKING_BYTES_...).
    scale = w.abs().amax(dim=1).float().clamp(min=1e-12) / qmax
    scaled = w.float()
    if scaled.data_ptr() == w.data_ptr():
        scaled = scaled.clone()  # a float32 weight: .float() is the weight itself, which must not change
    scaled.div_(scale[:, None])
    if dtype == torch.int8:
        scaled.round_()
    q = scaled.clamp_(-qmax, qmax).to(dtype)
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
        self.calls = new_counter(linear.weight.device)
        """Calls of this module, counted in eager and compiled code alike (:func:`h3.levers.base.new_counter`); the
        lever puts it on the device the module computes on."""

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, mode={self.mode}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)  # a tensor bumped in place: counted inside compiled graphs too (see new_counter)
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

    def __init__(self, root, mode, replaced, excluded, skipped_shape, originals, exclude=()):
        super().__init__()
        self.root, self.mode, self.exclude = root, mode, list(exclude)
        self.replaced, self.excluded, self.skipped_shape, self.originals = replaced, excluded, skipped_shape, originals

    def begin_request(self) -> None:
        for module in self.replaced.values():
            module.calls.zero_()

    def telemetry(self) -> dict[str, Any]:
        calls = [int(m.calls) for m in self.replaced.values()]
        return {
            "applied": not self.removed,
            "mode": self.mode,
            "exclude": list(self.exclude),
            "quantized_modules": len(self.replaced),
            "excluded_modules": len(self.excluded),
            "skipped_shape": len(self.skipped_shape),
            "quantized_params": sum(m.qweight.numel() for m in self.replaced.values()),
            # Counted inside compiled graphs too (new_counter): every call since begin_request.
            "quantized_linear_calls": sum(calls),
            "quantized_modules_called": sum(1 for c in calls if c > 0),
        }

    def held_tensors(self) -> list[torch.Tensor]:
        return [t for module in self.originals.values() for t in (*module.parameters(), *module.buffers())]

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


def _shared_elsewhere(root: nn.Module, child: nn.Module) -> bool:
    """Whether ``child`` is still a submodule of ``root`` under another name (one Linear registered twice): then its
    weights stay."""
    return any(m is child for m in root.modules())


def select_linears(module: nn.Module, config: QuantizationConfig) -> tuple[dict[str, nn.Linear], list[str], list[str]]:
    """The Linears the lever quantizes (by name), those ``config.exclude`` keeps in floating point, and those whose
    shape the kernel does not take."""
    patterns = [re.compile(p) for p in config.exclude]
    chosen, excluded, skipped = {}, [], []
    for name, child in list(module.named_modules()):
        if not isinstance(child, nn.Linear) or "lora_" in name:
            continue
        if any(p.search(name) for p in patterns):
            excluded.append(name)
        elif not kernel_shape_ok(child.in_features, child.out_features, config.mode):
            skipped.append(name)
        else:
            chosen[name] = child
    return chosen, excluded, skipped


def quantized_bytes(module: nn.Module, config: QuantizationConfig) -> dict[str, int]:
    """Bytes of the quantized copies the lever would make of ``module`` (weights at one byte, per-channel float32
    scales, bias copies) and of the float weights they replace: the memory plan of a model the lever is applied to
    (works on the meta device)."""
    chosen, _, _ = select_linears(module, config)
    quantized = replaced = 0
    for child in chosen.values():
        bias = child.bias.numel() * child.bias.element_size() if child.bias is not None else 0
        quantized += child.weight.numel() + 4 * child.out_features + bias
        replaced += child.weight.numel() * child.weight.element_size() + bias
    return {"quantized_bytes": quantized, "replaced_float_bytes": replaced, "modules": len(chosen)}


@torch.no_grad()
def apply_quantization(module: nn.Module, config: QuantizationConfig, *, keep_originals: bool = True,
                       compute_device: str | None = None, allow_cpu_fp8: bool = False,
                       keep_on: str | None = "cpu") -> QuantizationHandle:
    """Replace every ``nn.Linear`` of ``module`` not matched by ``config.exclude`` with a QuantizedLinear.

    ``keep_originals`` keeps the float modules (on ``keep_on``, the CPU by default; None: where they are) so that
    ``remove()`` can restore them; the runtime of one recipe drops them. ``compute_device``: where the quantized
    linears will compute (the runtime's device; parameters may sit on the CPU under offloading); None: the module's
    own device. ``allow_cpu_fp8`` (tests only) lets FP8 run through the CPU's emulated ``_scaled_mm`` to check its
    numerics.
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
    chosen, excluded, skipped = select_linears(module, config)
    names = list(chosen)
    del chosen  # no list of the float layers outlives its turn below: each is freed as soon as its copy is made
    mark_applied(module, "quant")
    replaced, originals = {}, {}
    try:
        _quantize_layers(module, names, config, device, compute, keep_originals, keep_on, replaced, originals)
    except BaseException:
        # Half-way (a card out of memory): the layers done so far go back, so that no model is left half quantized
        # with no handle to undo it. Only possible when their float layers were kept; without them the model is lost.
        for name in replaced:
            if name in originals:
                _set_submodule(module, name, originals[name].to(device))
        unmark_applied(module, "quant")
        if len(originals) != len(replaced):
            logger.error("quantization failed after %d layers whose float weights were dropped: reload the model",
                         len(replaced))
        raise
    if not replaced:
        unmark_applied(module, "quant")
        raise LeverError(f"quantization {config.mode}: no Linear left to quantize after exclude={config.exclude}")
    logger.info("quantization %s: %d linears quantized, %d excluded, %d skipped for kernel shape",
                config.mode, len(replaced), len(excluded), len(skipped))
    return QuantizationHandle(module, config.mode, replaced, excluded, skipped, originals, config.exclude)


def _quantize_layers(module, names, config, device, compute, keep_originals, keep_on, replaced, originals) -> None:
    """Swap each named float Linear for its QuantizedLinear, filling ``replaced`` and ``originals`` as it goes (the
    caller undoes what is done when it fails half-way)."""
    for name in names:
        # Layer by layer: the float layer is looked up, quantized, swapped out and (kept or) freed before the next,
        # so the load peaks at the float model plus one layer's quantized copy, never at both whole copies (a 33 B
        # DiT's 62 GiB of bf16 plus its 31 GiB of FP8 fit no 80 GB card).
        child = module.get_submodule(name)
        quantized = QuantizedLinear(child, config.mode).to(device)
        quantized.calls = new_counter(compute)
        _set_submodule(module, name, quantized)
        if keep_originals:
            originals[name] = child.to(keep_on) if keep_on is not None else child
        elif not _shared_elsewhere(module, child):
            # Free the float weight now: a caller's own reference to the Linear (a hook, a test) would otherwise keep
            # it alive until the lever returns.
            child.to("meta")
        del child
        replaced[name] = quantized
