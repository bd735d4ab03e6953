"""Where the text encoder lives: on the device (``resident``) or streamed from host memory while it encodes
(``offload``). A setting of the loaded model, not of a recipe: every recipe that shares the model shares it, and every
clip record names it (``extra["text_encoder"]``).

Why ``offload`` exists. At full size the DiT (33.1 B parameters, 61.7 GiB in bf16) and the Qwen3-VL conditioner
(33.4 B, 62.1 GiB) together fill an H200 (140 GiB): a process that A/B-tests an FP8 candidate beside the bf16
baseline on one card (``H3Runtime(shared=True)``) must also hold the candidate's FP8 weights (31 GiB) and the
activations. Streamed, the conditioner's 64 decoder layers stay in pinned host memory and pass through the device one
layer at a time (diffusers' group offloading, the next layer prefetched on a side CUDA stream): about 59 GiB of
host-to-device copy per request, ~1.1 s at the H200's measured 54 GB/s pinned rate
(``bench/results/h200_speed_stock.json``), paid inside the ``text_encode`` stage and so measured, not assumed. Its
embeddings, final norm, vision tower and LM head (unused by MiniMax-H3) stay on the device.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

TextEncoderResidency = Literal["resident", "offload"]
TEXT_ENCODER_RESIDENCY = ("resident", "offload")


def _language_model(text_encoder: torch.nn.Module) -> torch.nn.Module:
    model = getattr(text_encoder, "model", text_encoder)
    language = getattr(model, "language_model", None)
    if language is None or not hasattr(language, "layers"):
        raise ValueError(f"{type(text_encoder).__name__} has no language_model.layers to stream")
    return language


def stream_text_encoder(text_encoder: torch.nn.Module, device: str | torch.device) -> dict[str, Any]:
    """Keep the conditioner's decoder layers in host memory and stream them through ``device`` one at a time; the
    rest of it stays on ``device``. Returns what the records report."""
    from diffusers.hooks import apply_group_offloading

    from h3.levers.offload import _groups, is_top_level_group, release_module_buffers

    device = torch.device(device)
    language = _language_model(text_encoder)
    text_encoder.to(device)
    stream = device.type == "cuda"
    apply_group_offloading(language, onload_device=device, offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1, use_stream=stream,
                           non_blocking=stream)
    groups = _groups(language)
    for group in groups:
        if is_top_level_group(group, language):
            # Embeddings and final norm: small, used at every request; put on the device now and never moved again.
            # Now, not at the first forward: Qwen3-VL looks up ``embed_tokens`` in its outer model before the language
            # model's forward (whose hook would onload this group) runs, so a lazy onload leaves the lookup table on
            # the host beside device ids (the 2026-12-01 H200 run failed every request on it).
            group.onload_()
            if group.stream is not None:
                group.stream.synchronize()
            group.onload_ = lambda *args, **kwargs: None
            group.offload_ = lambda *args, **kwargs: None
        elif group.stream is not None:
            offload = group.offload_

            def offload_with_buffers(*args, _offload=offload, _group=group, **kwargs):
                result = _offload(*args, **kwargs)
                release_module_buffers(_group)
                return result

            group.offload_ = offload_with_buffers
    streamed = sum(p.numel() for layer in language.layers for p in layer.parameters())
    logger.info("text encoder: %d decoder layers streamed from host memory (%.1f B parameters)",
                len(language.layers), streamed / 1e9)
    return {"residency": "offload", "streamed_layers": len(language.layers), "streamed_params": streamed,
            "use_stream": stream}


def place_text_encoder(text_encoder: torch.nn.Module, device: str | torch.device,
                       residency: TextEncoderResidency) -> dict[str, Any]:
    """Put the conditioner where ``residency`` says; returns what the records report."""
    if residency not in TEXT_ENCODER_RESIDENCY:
        raise ValueError(f"text encoder residency must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, "
                         f"got {residency!r}")
    if residency == "offload":
        return stream_text_encoder(text_encoder, device)
    text_encoder.to(device)
    return {"residency": "resident"}
