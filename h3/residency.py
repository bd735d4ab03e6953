"""Where the text encoder lives: on the device (``resident``) or streamed from host memory while it encodes
(``offload``). A setting of the loaded model, not of a recipe: every recipe that shares the model shares it, and every
clip record names it (``extra["text_encoder"]``).

Why ``offload`` exists. At full size the DiT (33.1 B parameters, 61.7 GiB in bf16) and the Qwen3-VL conditioner
(33.4 B, 62.1 GiB) together fill an H200 (140 GiB): a process that A/B-tests an FP8 candidate beside the bf16
baseline on one card (``H3Runtime(shared=True)``) must also hold the candidate's FP8 weights (31 GiB) and the
activations. Streamed, the conditioner's 64 decoder layers stay in pinned host memory and pass through the device one
layer at a time (diffusers' group offloading, the next layer prefetched on a side CUDA stream): about 59 GiB of
host-to-device copy per request, ~1.1 s at the H200's measured 54 GB/s pinned rate
(``bench/full_size_speed/results/h200_speed_stock.json``), paid inside the ``text_encode`` stage and so measured, not assumed. Its
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


_DIFFUSERS_OFFLOAD_HOOKS = ("group_offloading", "layer_execution_tracker", "lazy_prefetch_group_offloading")


def _streaming_intact(language: torch.nn.Module) -> bool:
    """Whether the layout :func:`_stream_layers` set up is still the one in place: diffusers' LoRA loading
    (``load_lora_weights`` with a pipeline) removes every group-offloading hook of every component and applies group
    offloading again at the component's top level, which for Qwen3-VL is one group holding the whole conditioner,
    onloaded only by the top-level ``forward`` that MiniMax-H3's text step never calls (it calls ``.model``)."""
    from h3.levers.offload import _groups, is_top_level_group

    return any(is_top_level_group(g, language) and getattr(g, "_h3_resident", False) for g in _groups(language))


def _stream_layers(text_encoder: torch.nn.Module, language: torch.nn.Module, device: torch.device) -> None:
    from diffusers.hooks import HookRegistry, apply_group_offloading

    from h3.levers.offload import _groups, is_top_level_group, release_module_buffers

    # Whatever group offloading is there (ours, or diffusers' re-application at the top level) goes first; the
    # tensors stay where they are (host memory) until the hooks below move them.
    for module in text_encoder.modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None:
            for name in _DIFFUSERS_OFFLOAD_HOOKS:
                if registry.get_hook(name) is not None:
                    registry.remove_hook(name, recurse=False)
    # Everything outside the decoder layers lives on the device (vision tower, embeddings, final norm, LM head: a
    # few GiB at full size), moved tensor by tensor so that the 62 GiB of layers never pass through the device at once.
    layers = {id(t) for layer in language.layers for t in (*layer.parameters(), *layer.buffers())}
    with torch.no_grad():
        for tensor in (*text_encoder.parameters(), *text_encoder.buffers()):
            if id(tensor) not in layers and tensor.device != device:
                tensor.data = tensor.data.to(device)
    stream = device.type == "cuda"
    apply_group_offloading(language, onload_device=device, offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1, use_stream=stream,
                           non_blocking=stream)
    for group in _groups(language):
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
            group._h3_resident = True
        elif group.stream is not None:
            offload = group.offload_

            def offload_with_buffers(*args, _offload=offload, _group=group, **kwargs):
                result = _offload(*args, **kwargs)
                release_module_buffers(_group)
                return result

            group.offload_ = offload_with_buffers


def stream_text_encoder(text_encoder: torch.nn.Module, device: str | torch.device) -> dict[str, Any]:
    """Keep the conditioner's decoder layers in host memory and stream them through ``device`` one at a time; the
    rest of it stays on ``device``. Returns what the records report.

    The layout survives diffusers' LoRA loading, which re-applies group offloading at the conditioner's top level
    (the 2026-12-01 H200 run: every LoRA candidate after the baseline failed on host embeddings): a pre-forward hook
    on ``text_encoder.model``, the module MiniMax-H3's text step calls, puts it back when it is gone."""
    device = torch.device(device)
    language = _language_model(text_encoder)
    _stream_layers(text_encoder, language, device)
    inner = getattr(text_encoder, "model", text_encoder)

    def restore(module, args, kwargs):
        if not _streaming_intact(language):
            logger.info("text encoder: group offloading was re-applied from outside (LoRA loading); streaming the "
                        "decoder layers again")
            _stream_layers(text_encoder, language, device)

    if not getattr(inner, "_h3_streaming_guard", False):
        inner.register_forward_pre_hook(restore, with_kwargs=True)
        inner._h3_streaming_guard = True
    streamed = sum(p.numel() for layer in language.layers for p in layer.parameters())
    logger.info("text encoder: %d decoder layers streamed from host memory (%.1f B parameters)",
                len(language.layers), streamed / 1e9)
    return {"residency": "offload", "streamed_layers": len(language.layers), "streamed_params": streamed,
            "use_stream": device.type == "cuda"}


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
