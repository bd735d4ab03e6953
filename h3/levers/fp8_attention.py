"""FP8 attention: q, k and v quantized to e4m3 per (batch item, head), attention at FlashAttention-3's FP8 speed.

Each head's absolute maximum over its rows and channels is mapped to 448 (e4m3's largest finite value) and the descale
goes to the kernel with the tensor (issue 23: a plain cast, descale 1, measured 0.27 relative error at H3's shape;
per-head scaling 0.18, bench/attention_kernels/results/attention_kernels_h200.md). Two kernels:

- ``fa3``: FlashAttention-3's FP8 forward (``flash_attn_3``, Hopper; bench/device/build_fa3.sh builds it for head
  dimension 128, the released DiT's). At 5 s 768x1344 one call took 45.7 ms (903 TFLOP/s) against Sage 2.2's 53.0 and
  cuDNN's 72.3 ms; with the quantization of q, k and v in eager PyTorch ops, 53.0 ms. A profiled forward
  (bench/kernel_profile/results/h200_kernel_profile_s10.md) put that eager quantization at ~560 ms of the 4.2 s forward (abs, amax,
  a float32 copy, multiply, clamp and the e4m3 cast as separate passes over q, k and v), so by default it runs as one
  inductor-compiled graph (``quantize = "compiled"``: a reduction and a cast per tensor).
- ``emulate``: the same per-head scales and e4m3 rounding of q, k and v, then attention in their own dtype through
  PyTorch's SDPA, on any device: the input-rounding part of the FP8 error (not the kernel's own rounding of the
  softmax probabilities), so that its quality cost can be measured by the suite's gates where FA3 cannot run (the
  tiny presets' 24-wide heads, the CPU).

The whole attention call runs outside compiled graphs (a graph break per block, as block-sparse attention's), on the
real rows of a bucketed sequence. It replaces the dispatcher's backend, so the recipe's ``[attention]`` backend must
stay ``native``; it does not compose with block-sparse attention or context parallelism (both own the attention call).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, unmark_applied
from h3.levers.bucketing import PaddingState, output_projection, project_qkv

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)

E4M3_MAX = 448.0
FA3_MODULE = "flash_attn_interface"
FA3_HEAD_DIMS = (128,)
"""Head dimensions the carried FA3 build compiles (bench/device/build_fa3.sh: HDIM128 only)."""


class Fp8AttentionConfig(LeverConfig):
    """FP8 e4m3 attention with per-head scales (recipe section ``[fp8_attention]``)."""

    name = "fp8_attention"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "q, k and v rounded to e4m3: the same sample with attention's inputs rounded"
    omitted_when_default: ClassVar[bool] = True  # added after recipes were hashed: an off section keeps their hash

    enabled: bool = False
    kernel: Literal["fa3", "emulate"] = "fa3"
    """``fa3``: FlashAttention-3's FP8 forward (Hopper, flash_attn_3 installed); ``emulate``: e4m3 rounding of q, k and
    v with the same scales, attention through SDPA (any device; for measuring the quality cost)."""
    quantize: Literal["compiled", "eager"] = "compiled"
    """How the fa3 kernel's inputs are quantized: ``compiled``, :func:`per_head_e4m3` of q, k and v as one
    inductor-compiled graph, dynamic in the sequence length (compiled once, on the first call); ``eager``, the same
    operations one PyTorch kernel at a time (the measured baseline). ``emulate`` always quantizes eagerly."""

    def is_on(self) -> bool:
        return self.enabled

    def device_problems(self, device: str) -> list[str]:
        if not self.enabled or self.kernel != "fa3":
            return []
        if not str(device).startswith("cuda"):
            return ["fp8_attention.kernel = 'fa3' needs a Hopper GPU (kernel = 'emulate' runs anywhere)"]
        if importlib.util.find_spec(FA3_MODULE) is None:
            return [f"fp8_attention.kernel = 'fa3' needs FlashAttention-3 ({FA3_MODULE!r}, flash_attn_3; "
                    "bench/device/build_fa3.sh builds it)"]
        return []

    def composition_problems(self, recipe: Any) -> list[str]:
        if not self.enabled:
            return []
        problems = []
        if recipe.sparse_attention.enabled:
            problems.append("fp8_attention does not compose with sparse_attention: both own the attention call")
        if recipe.attention.backend != "native":
            problems.append(f"fp8_attention replaces the attention backend: leave [attention] backend native, not "
                            f"{recipe.attention.backend!r}")
        if recipe.parallel.is_on():
            problems.append("fp8_attention does not compose with context parallelism (parallel.degree > 1)")
        return problems

    def apply(self, pipe, ctx: ApplyContext) -> "Fp8AttentionHandle":
        return apply_fp8_attention(pipe.transformer, self)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """Every attention call of every DiT forward went through the FP8 path with the configured kernel."""
        (calls, layers, forwards), problems = counts(telemetry, "fp8_calls", "layers", "forwards")
        if problems:
            return problems
        if telemetry.get("kernel") != self.kernel:
            problems.append(f"ran kernel {telemetry.get('kernel')!r}, configured {self.kernel!r}")
        if executed.forward_passes and forwards != executed.forward_passes:
            problems.append(f"counted {forwards} DiT forwards, the request ran {executed.forward_passes}")
        if forwards and calls != layers * forwards:
            problems.append(f"{calls} FP8 attention calls over {forwards} forwards of {layers} blocks "
                            f"(expected {layers * forwards}: some attention ran another way)")
        if executed.forward_passes and not calls:
            problems.append("no attention call went through the FP8 path")
        return problems


def per_head_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S, H, D) -> e4m3 values with each (batch item, head)'s absolute maximum at :data:`E4M3_MAX`, and the float32
    descale (B, H) that multiplies them back (an all-zero head gets descale 1)."""
    amax = x.detach().abs().amax(dim=(1, 3)).float()
    scale = torch.where(amax > 0, E4M3_MAX / amax, torch.ones_like(amax))
    quantized = (x.float() * scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return quantized, (1.0 / scale).contiguous()


def fake_e4m3(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded through :func:`per_head_e4m3` and back, in its own dtype."""
    quantized, descale = per_head_e4m3(x)
    return (quantized.float() * descale[:, None, :, None]).to(x.dtype)


def quantize_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """:func:`per_head_e4m3` of each of q, k and v."""
    return tuple(per_head_e4m3(t) for t in (query, key, value))


_compiled_quantize_qkv = None


def compiled_quantize_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """:func:`quantize_qkv` compiled by inductor (dynamic shapes: one graph for every sequence length), built on the
    first call. It is called from the attention call that runs outside the transformer's compiled graph, so it is
    compiled on its own, recipe compile or not."""
    global _compiled_quantize_qkv
    if _compiled_quantize_qkv is None:
        _compiled_quantize_qkv = torch.compile(quantize_qkv, dynamic=True, fullgraph=True)
    return _compiled_quantize_qkv(query, key, value)


def fp8_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kernel: str,
                  quantize: str = "compiled") -> torch.Tensor:
    """Attention (B, S, H, D) -> (B, S, H, D) with per-head e4m3 q, k and v."""
    if kernel == "emulate":
        q, k, v = (fake_e4m3(t).transpose(1, 2) for t in (query, key, value))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    from flash_attn_interface import flash_attn_func

    quantizer = compiled_quantize_qkv if quantize == "compiled" else quantize_qkv
    (q8, dq), (k8, dk), (v8, dv) = quantizer(query, key, value)
    out = flash_attn_func(q8, k8, v8, q_descale=dq, k_descale=dk, v_descale=dv)
    out = out[0] if isinstance(out, tuple) else out
    return out.to(query.dtype)


class Fp8AttnProcessor:
    """MiniMax-H3 attention with FP8 q, k and v (one per block; the previous processor is restored on removal)."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, handle: "Fp8AttentionHandle"):
        self.handle = handle

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        query, key, value = project_qkv(attn, hidden_states, rotary_emb)
        return output_projection(attn, self.handle.attend(query, key, value), query)


class Fp8AttentionHandle(LeverHandle):
    name = "fp8_attention"

    def __init__(self, transformer, config: Fp8AttentionConfig):
        super().__init__()
        self.transformer, self.config = transformer, config
        self.previous = [block.attn.processor for block in transformer.transformer_blocks]
        self.fp8_calls = self.forwards = 0
        for block in transformer.transformer_blocks:
            block.attn.set_processor(Fp8AttnProcessor(self))
        # Counted on the (never compiled) transformer and in the graph-broken attention call: they hold under compile.
        self._post = transformer.register_forward_hook(self._advance, always_call=True)

    @torch.compiler.disable
    def attend(self, query, key, value):
        padding: PaddingState | None = getattr(self.transformer, "_h3_padding", None)
        seq = query.shape[1]
        valid = padding.real_rows(seq) if padding is not None else None
        if valid is not None:
            query, key, value = query[:, :valid], key[:, :valid], value[:, :valid]
        out = fp8_attention(query, key, value, self.config.kernel, self.config.quantize)
        self.fp8_calls += 1
        if valid is not None:
            out = torch.nn.functional.pad(out, (0, 0, 0, 0, 0, seq - valid))
        return out

    def _advance(self, *_):
        self.forwards += 1

    def begin_request(self) -> None:
        self.fp8_calls = self.forwards = 0

    def telemetry(self) -> dict[str, Any]:
        return {"applied": not self.removed, "kernel": self.config.kernel, "scaling": "per_head",
                "quantize": "eager" if self.config.kernel == "emulate" else self.config.quantize,
                "fp8_calls": self.fp8_calls, "forwards": self.forwards,
                "layers": len(self.transformer.transformer_blocks)}

    def _remove(self) -> None:
        self._post.remove()
        for block, prev in zip(self.transformer.transformer_blocks, self.previous):
            block.attn.set_processor(prev)
        unmark_applied(self.transformer, "fp8_attention")


def apply_fp8_attention(transformer, config: Fp8AttentionConfig) -> Fp8AttentionHandle:
    if config.kernel == "fa3":
        head_dim = transformer.transformer_blocks[0].attn.head_dim
        if head_dim not in FA3_HEAD_DIMS:
            raise LeverError(f"fp8_attention.kernel = 'fa3': the carried FlashAttention-3 build has head dimension(s) "
                             f"{FA3_HEAD_DIMS}, this transformer's heads are {head_dim} wide (kernel = 'emulate' "
                             "measures the rounding's cost on any head)")
    mark_applied(transformer, "fp8_attention")
    return Fp8AttentionHandle(transformer, config)
