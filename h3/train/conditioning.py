"""The text encoder's conditioning, computed the way the pipeline computes it, for many requests at once.

Each function mirrors one diffusers block: :func:`t2va_tokens` the t2va text encoder step (the prompt verbatim, no
special tokens), :func:`fl2va_tokens` the fl2va one (``"<Picture i>: "`` and a vision block per keyframe, vision rows
tagged video), :func:`ref2va_tokens` the ref2va one (its own ``_build_presentation``). :func:`encode` runs the frozen
Qwen3-VL over many presentations of equal length in one batch and returns ``hidden_states[50]`` per presentation,
exactly what ``get_qwen3vl_prompt_embeds`` returns for each (tests/test_train.py compares the two), and
:func:`keyframe_latents` is ``encode_vae_condition`` for a batch of frames (one posterior draw under seed 42, the same
for every frame, as the pipeline draws it per frame).
"""

from __future__ import annotations

import torch

TEXT_TAG, VIDEO_TAG = 1, 0


def t2va_tokens(tokenizer, prompt: str) -> tuple[list[int], list[int]]:
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return ids, [TEXT_TAG] * len(ids)


def image_features(processor, images: list[torch.Tensor]) -> dict:
    """The conditioner's vision inputs for ``images``, uint8 (3, H, W) tensors (what the pipeline's PIL images become
    inside the image processor)."""
    vision = processor.image_processor(images=images, return_tensors="pt")
    return {"pixel_values": vision["pixel_values"], "image_grid_thw": vision["image_grid_thw"]}


def image_token_counts(processor, vision: dict) -> list[int]:
    merge = processor.image_processor.merge_size ** 2
    return [int(g.prod()) // merge for g in vision["image_grid_thw"]]


def fl2va_tokens(tokenizer, prompt: str, image_tokens: list[int]) -> tuple[list[int], list[int]]:
    """MiniMaxH3FL2VATextEncoderStep's presentation: a ``"<Picture i>: "`` label and a vision block (tagged video) per
    keyframe, then the prompt."""
    ids, tags = [], []
    for index, n in enumerate(image_tokens):
        label = tokenizer(f"<Picture {index + 1}>: ", add_special_tokens=False)["input_ids"]
        block = ([tokenizer.convert_tokens_to_ids("<|vision_start|>")]
                 + [tokenizer.convert_tokens_to_ids("<|image_pad|>")] * n
                 + [tokenizer.convert_tokens_to_ids("<|vision_end|>")])
        ids += label + block
        tags += [TEXT_TAG] * len(label) + [VIDEO_TAG] * len(block)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return ids + prompt_ids, tags + [TEXT_TAG] * len(prompt_ids)


def ref2va_tokens(tokenizer, prompt: str, image_tokens: int) -> tuple[list[int], list[int]]:
    """MiniMaxH3Ref2VATextEncoderStep's presentation of one image reference (its own ``_build_presentation``)."""
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VATextEncoderStep
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

    ref = MiniMaxH3ImageReference(image=torch.zeros(3, 8, 8))
    return MiniMaxH3Ref2VATextEncoderStep._build_presentation(
        tokenizer, prompt, [ref], [image_tokens], [], [], text_tag=TEXT_TAG, video_tag=VIDEO_TAG)


@torch.no_grad()
def encode(text_encoder, processor, items: list[tuple[list[int], dict | None]], layer: int = 50,
           max_batch: int = 256) -> list[torch.Tensor]:
    """``hidden_states[layer]`` of every presentation (float32, (T, hidden), on the encoder's device)."""
    device = next(text_encoder.parameters()).device
    out: list[torch.Tensor | None] = [None] * len(items)
    groups: dict[tuple, list[int]] = {}
    for i, (ids, vision) in enumerate(items):
        key = (len(ids), None if vision is None else tuple(vision["image_grid_thw"].flatten().tolist()))
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        for start in range(0, len(members), max_batch):
            chunk = members[start:start + max_batch]
            ids = [items[i][0] for i in chunk]
            input_ids = torch.tensor(ids, dtype=torch.long, device=device)
            kwargs = {}
            if items[chunk[0]][1] is not None:
                kwargs["pixel_values"] = torch.cat([items[i][1]["pixel_values"] for i in chunk]).to(
                    device, text_encoder.dtype)
                kwargs["image_grid_thw"] = torch.cat([items[i][1]["image_grid_thw"] for i in chunk]).to(device)
            mm = torch.tensor(processor.create_mm_token_type_ids(ids), dtype=torch.long, device=device)
            hidden = text_encoder.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                        mm_token_type_ids=mm, use_cache=False, output_hidden_states=True,
                                        **kwargs).hidden_states[layer].float()
            for j, i in enumerate(chunk):
                out[i] = hidden[j]
    return out  # type: ignore[return-value]


_EPS42: dict[tuple, torch.Tensor] = {}


@torch.no_grad()
def keyframe_latents(vae, frames: torch.Tensor, encode_seed: int = 42) -> torch.Tensor:
    """``encode_vae_condition`` for a batch of single frames: frames uint8 (B, 3, H, W) -> normalized latents
    (B, C, 1, h, w) float32 on the frames' device."""
    from diffusers.utils.torch_utils import randn_tensor

    device = frames.device
    mean = torch.tensor((0.485, 0.456, 0.406), device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225), device=device).view(1, -1, 1, 1, 1)
    pixels = (frames[:, :, None].float().div(255.0) - mean) / std
    posterior = vae.encode(pixels, return_dict=False)[0]
    shape = (1, *posterior.mean.shape[1:])
    key = (shape, str(device), encode_seed)
    if key not in _EPS42:
        _EPS42[key] = randn_tensor(shape, generator=torch.Generator().manual_seed(encode_seed), device=device,
                                   dtype=posterior.mean.dtype)
    latents = (posterior.mean + posterior.std * _EPS42[key]).to(torch.float16).float()
    lm = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    ls = torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    return (latents - lm) / ls
