"""The video VAE's ViT decoder at speed: its transformer blocks compiled one region each, and its linears quantized.

At 15 s 768x1344 the stock decode is eager and takes 14.3 s (331 TFLOP/s, 43 % of the H200's bf16 ceiling;
bench/full_size_speed/results/h200_goals.md) against issue 23's 6 s goal. The decoder (``AutoencoderKLMiniMaxH3.decoder``, a
``MiniMaxH3VideoViTDecoder3d``) is a plain transformer over one token per latent voxel of a tile: 36 blocks of width
2048 whose residual stream and norms run in float32 around bf16 projections. Two levers from the DiT apply to it as
they are:

- ``compile``: each ``MiniMaxH3VideoTransformerBlock`` compiled as its own region (as the ``compile`` lever does the
  DiT's blocks), which fuses the float32 norms, casts, RoPE and gating around the matmuls. Tiles of one resolution
  share a few shapes (interior and edge tiles), each compiled once.
- ``quant``: the blocks' linears replaced by the quantization lever's ``QuantizedLinear`` (per-channel weight and
  per-token activation scales; FP8 on Hopper, INT8 anywhere); the decoder's float32-pinned ``proj_in`` and its
  ``proj_out`` stay in floating point.

The decode's quality cost is the suite's to measure (the fidelity gates on a same-seed pair: the lever changes only
the decode). Recipe section ``[vae_decoder]``; off, it leaves every recipe's hash as it was.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, unmark_applied

if TYPE_CHECKING:
    from h3.levers.quantization import QuantizationHandle
    from h3.record import Executed

logger = logging.getLogger(__name__)

DECODER_BLOCKS = ("MiniMaxH3VideoTransformerBlock",)


class VaeDecoderConfig(LeverConfig):
    """Regional compile and linear quantization of the video VAE's ViT decoder (recipe section ``[vae_decoder]``)."""

    name = "vae_decoder"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "the VAE decoder compiled or quantized: the same latents, a small numerical error"
    omitted_when_default: ClassVar[bool] = True  # added after recipes were hashed: an off section keeps their hash

    compile: bool = False
    backend: str = "inductor"
    quant: Literal["none", "int8_w8a8", "fp8_w8a8"] = "none"
    exclude: list[str] = Field(default_factory=lambda: [r"(^|\.)proj_in$", r"(^|\.)proj_out$", r"norm"])
    """Module names (``re.search``) that stay in floating point when ``quant`` is on: the float32-pinned input
    projection, the output projection to pixels, and the norms."""

    @field_validator("exclude")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        from h3.levers.quantization import regular_expressions

        return regular_expressions(value)

    def is_on(self) -> bool:
        return self.compile or self.quant != "none"

    def device_problems(self, device: str) -> list[str]:
        if self.quant == "fp8_w8a8" and not str(device).startswith("cuda"):
            return ["vae_decoder.quant = 'fp8_w8a8' needs a GPU with FP8 tensor cores (Hopper/Ada)"]
        return []

    def apply(self, pipe, ctx: ApplyContext) -> "VaeDecoderHandle":
        vae = getattr(pipe, "vae", None)
        if vae is None:
            raise LeverError("vae_decoder: this pipeline has no video VAE")
        return apply_vae_decoder(vae, self, keep_originals=ctx.reversible, compute_device=ctx.device,
                                 keep_on=ctx.keep_on)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """Every decoder block compiled (when asked), with the configured backend; every quantized linear ran exactly
        once per decoder call (a tile) of the request, so none was bypassed."""
        (decodes,), problems = counts(telemetry, "decoder_calls")
        if problems:
            return problems
        if self.compile:
            (regions, blocks), missing = counts(telemetry, "compiled_regions", "decoder_blocks")
            problems += missing
            if not missing and (regions < 1 or regions != blocks):
                problems.append(f"{regions} of the decoder's {blocks} blocks compiled")
            if telemetry.get("backend") != self.backend:
                problems.append(f"recipe asks for backend {self.backend!r}, the decoder compiled with "
                                f"{telemetry.get('backend')!r}")
        if self.quant != "none":
            if telemetry.get("quant_mode") != self.quant:
                problems.append(f"recipe asks for quant {self.quant!r}, the decoder ran {telemetry.get('quant_mode')!r}")
            (modules, calls), missing = counts(telemetry, "quantized_modules", "quantized_linear_calls")
            problems += missing
            if not missing and modules < 1:
                problems.append("no decoder linear was quantized")
            elif not missing and executed.forward_passes > 0 and calls != modules * decodes:
                problems.append(f"{calls} quantized-linear calls in {decodes} decoder calls of {modules} modules "
                                f"(expected {modules * decodes}: some ran another way)")
        if executed.forward_passes > 0 and decodes < 1:
            problems.append("the request decoded no video through the decoder")
        return problems


def decoder_blocks(decoder: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in decoder.modules() if m.__class__.__name__ in DECODER_BLOCKS]


class VaeDecoderHandle(LeverHandle):
    name = "vae_decoder"

    def __init__(self, decoder, config: VaeDecoderConfig, backend, regions: int,
                 quant: "QuantizationHandle | None"):
        super().__init__()
        self.decoder, self.config, self.backend, self.regions, self.quant = decoder, config, backend, regions, quant
        self.decoder_calls = 0
        self._graphs_at_start = backend.graphs if backend is not None else 0
        self._hook = decoder.register_forward_hook(self._count, always_call=True)

    def _count(self, *_):
        self.decoder_calls += 1

    def begin_request(self) -> None:
        self.decoder_calls = 0
        self._graphs_at_start = self.backend.graphs if self.backend is not None else 0
        if self.quant is not None:
            self.quant.begin_request()

    def telemetry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"applied": not self.removed, "decoder_calls": self.decoder_calls,
                               "decoder_blocks": len(decoder_blocks(self.decoder))}
        if self.backend is not None:
            out.update(backend=self.config.backend, compiled_regions=self.regions,
                       graphs_compiled_total=self.backend.graphs,
                       graphs_compiled_this_request=self.backend.graphs - self._graphs_at_start)
        if self.quant is not None:
            q = self.quant.telemetry()
            out.update(quant_mode=q["mode"], quantized_modules=q["quantized_modules"],
                       quantized_linear_calls=q["quantized_linear_calls"],
                       quantized_modules_called=q["quantized_modules_called"])
        return out

    def held_tensors(self) -> list[torch.Tensor]:
        return self.quant.held_tensors() if self.quant is not None else []

    def _remove(self) -> None:
        self._hook.remove()
        for module in decoder_blocks(self.decoder):
            module.__dict__.pop("_compiled_call_impl", None)
        if self.quant is not None:
            self.quant.remove()
        unmark_applied(self.decoder, "vae_decoder")


_BACKENDS: dict[str, Any] = {}
"""One counting backend per backend name in this process (as h3.levers.compile keeps its own): applying the lever
again finds the graphs compiled before."""


def apply_vae_decoder(vae, config: VaeDecoderConfig, *, keep_originals: bool = True, compute_device: str | None = None,
                      keep_on: str | None = "cpu", allow_cpu_fp8: bool = False) -> VaeDecoderHandle:
    """Quantize (first) and compile the ViT decoder of ``vae`` as ``config`` says."""
    from h3.levers.compile import CountingBackend
    from h3.levers.quantization import QuantizationConfig, apply_quantization

    decoder = getattr(vae, "decoder", None)
    blocks = decoder_blocks(decoder) if decoder is not None else []
    if not blocks:
        raise LeverError(f"vae_decoder found no {'/'.join(DECODER_BLOCKS)} in {type(vae).__name__}'s decoder")
    backend = None
    if config.compile:
        try:
            if config.backend not in _BACKENDS:  # the decoder's own: its graph counts are not the DiT's
                _BACKENDS[config.backend] = CountingBackend(config.backend, None)
            backend = _BACKENDS[config.backend]
        except Exception as exc:  # dynamo raises InvalidBackend with the list of known ones
            raise LeverError(f"vae_decoder.backend {config.backend!r} is not available: {exc}") from exc
    mark_applied(decoder, "vae_decoder")
    quant = None
    if config.quant != "none":
        try:
            quant = apply_quantization(decoder, QuantizationConfig(mode=config.quant, exclude=config.exclude),
                                       keep_originals=keep_originals, compute_device=compute_device, keep_on=keep_on,
                                       allow_cpu_fp8=allow_cpu_fp8)
        except BaseException:
            unmark_applied(decoder, "vae_decoder")
            raise
    if backend is not None:
        for module in blocks:
            module.compile(backend=backend)
    return VaeDecoderHandle(decoder, config, backend, len(blocks) if backend is not None else 0, quant)
