"""Seeded LoRA generators: the tiny preset's demo LoRA (``@tiny``, :func:`write_tiny_lora`) and a random LoRA in the
published turbo LoRA's format (:func:`write_random_turbo_lora`, what ``h3 seeded-lora`` writes for the turbo recipes
on a random preset). Random factors stand in for a trained LoRA in cost and in format, not in quality: the tests and
the rehearsals without the real LoRA use them."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from h3.levers.lora_files import save_lora_file

TINY_LORA_SEED = 9001
TINY_LORA_RANK = 4
TINY_LORA_ALPHA = 2.0
"""The tiny demo LoRA records alpha 2 at rank 4 in its ``__metadata__``: scale 0.5, so a loader that ignores the
metadata (scale 1.0) is caught by the tests."""


def tiny_lora_state_dict(transformer: torch.nn.Module, rank: int = TINY_LORA_RANK, seed: int = TINY_LORA_SEED,
                         misnamed: bool = False) -> dict[str, torch.Tensor]:
    """A seeded LoRA in diffusers' format for every Linear of the transformer blocks (``misnamed``: names that match
    nothing, as seed 001's 5-step LoRA did)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, module in transformer.named_modules():
        if not name.startswith("transformer_blocks.") or not isinstance(module, torch.nn.Linear):
            continue
        key = name.replace("transformer_blocks.", "layers.").replace("attn.", "attention.") if misnamed else name
        a = torch.randn(rank, module.in_features, generator=gen) / module.in_features**0.5
        b = torch.randn(module.out_features, rank, generator=gen) * 0.05
        state[f"transformer.{key}.lora_A.weight"] = a.contiguous()
        state[f"transformer.{key}.lora_B.weight"] = b.contiguous()
    return state


def write_tiny_lora(path: Path, transformer: torch.nn.Module, misnamed: bool = False,
                    alpha: float | None = TINY_LORA_ALPHA) -> Path:
    metadata = {"format": "pt"}
    if alpha is not None:
        metadata["alpha"] = str(alpha)
    return save_lora_file(path, tiny_lora_state_dict(transformer, misnamed=misnamed), metadata)


TURBO_RANK, TURBO_ADALN_RANK = 64, 16
"""Published H3 LoRAs are "alpha-less and mixed-rank (64 on attention and FFN, 16 on the AdaLN projections)"
(diffusers' MiniMaxH3LoraLoaderMixin)."""
RANDOM_LORA_SEED = 4004
# The original checkpoint's module names (what every published H3 LoRA is trained against), and the diffusers
# modules each stands for (diffusers' _convert_non_diffusers_minimax_h3_lora_to_diffusers, read backwards).
_STANDALONE = {
    "video_patch_proj": "proj_in", "audio_patch_proj": "audio_proj_in", "condition_proj": "context_embedder",
    "time_embedder.proj_in": "time_embedder.linear_1", "time_embedder.proj_out": "time_embedder.linear_2",
    "final_layer.adaln_proj.linear": "norm_out.linear", "final_layer.video_out": "proj_out",
    "final_layer.audio_out": "audio_proj_out",
}


def turbo_lora_targets(transformer: torch.nn.Module) -> dict[str, tuple[int, int, int]]:
    """The modules a turbo (step-distillation) LoRA adapts, by their original names, with (in, out, rank): every
    block's fused ``attn.qkv_proj``, ``attn.out_proj``, ``mlp.fc1``, ``mlp.fc2`` and ``adaln_proj.linear``, the token
    refiner blocks' first four, and the eight projections outside the stacks (266 modules for the released DiT: seed
    001's "0 of 266 layers")."""
    def dims(name: str) -> tuple[int, int]:
        module = transformer.get_submodule(name)
        return module.in_features, module.out_features

    targets: dict[str, tuple[int, int, int]] = {}
    stacks = [("blocks", "transformer_blocks", len(transformer.transformer_blocks), True),
              ("token_refiner.blocks", "token_refiner.refiner_blocks",
               len(transformer.token_refiner.refiner_blocks), False)]
    for source, target, count, adaln in stacks:
        for i in range(count):
            q_in, q_out = dims(f"{target}.{i}.attn.to_q")
            qkv_out = q_out + dims(f"{target}.{i}.attn.to_k")[1] + dims(f"{target}.{i}.attn.to_v")[1]
            targets[f"{source}.{i}.attn.qkv_proj"] = (q_in, qkv_out, TURBO_RANK)
            targets[f"{source}.{i}.attn.out_proj"] = (*dims(f"{target}.{i}.attn.to_out.0"), TURBO_RANK)
            targets[f"{source}.{i}.mlp.fc1"] = (*dims(f"{target}.{i}.ff.net.0.proj"), TURBO_RANK)
            targets[f"{source}.{i}.mlp.fc2"] = (*dims(f"{target}.{i}.ff.net.2"), TURBO_RANK)
            if adaln:
                targets[f"{source}.{i}.adaln_proj.linear"] = (*dims(f"{target}.{i}.adaln_proj.linear"),
                                                               TURBO_ADALN_RANK)
    for source, target in _STANDALONE.items():
        rank = TURBO_ADALN_RANK if "adaln" in source else TURBO_RANK
        targets[source] = (*dims(target), rank)
    return targets


def random_turbo_lora_state_dict(transformer: torch.nn.Module, seed: int = RANDOM_LORA_SEED,
                                 dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """A seeded random LoRA in the published turbo LoRA's format: ai-toolkit's layout (``diffusion_model.`` prefix,
    the original module names, ``lora_A``/``lora_B``, no alphas), the turbo targets and ranks
    (:func:`turbo_lora_targets`). Drawn on the CPU, so the same seed gives the same file on any machine; the full-size
    one is about 0.7 GB in bf16. Random factors change the output like a real LoRA changes it in cost (the fused
    weights have the same shapes), not in quality."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, (fan_in, fan_out, rank) in turbo_lora_targets(transformer).items():
        a = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
        b = torch.randn(fan_out, rank, generator=gen) * 0.02
        state[f"diffusion_model.{name}.lora_A.weight"] = a.to(dtype).contiguous()
        state[f"diffusion_model.{name}.lora_B.weight"] = b.to(dtype).contiguous()
    return state


def write_random_turbo_lora(path: str | os.PathLike, transformer: torch.nn.Module, seed: int = RANDOM_LORA_SEED,
                            dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write :func:`random_turbo_lora_state_dict` to ``path`` atomically (for rehearsals without the real LoRA:
    ``h3-random``, where ``$H3_LORA_DIR/minimax-h3-turbo-4step.safetensors`` is this file)."""
    return save_lora_file(path, random_turbo_lora_state_dict(transformer, seed, dtype),
                          {"format": "pt", "h3_random_lora_seed": str(seed)})
