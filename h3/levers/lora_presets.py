"""The LoRAs a recipe names with ``@``: the tiny presets' own. ``@tiny`` is the seeded demo LoRA (written on first use
into the cache folder, by h3.train.seeded_lora); ``@turbo4-tiny`` and the others are the trained tiny preset's LoRAs,
shipped with it (h3.tiny_trained) and loadable only into it."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from h3.levers.base import LeverError

TINY_LORA = "@tiny"
TURBO4_TINY_LORA = "@turbo4-tiny"
"""The trained tiny preset's distilled 4-step LoRA (h3/assets/tiny/lora/turbo4-tiny.safetensors, made by
``python -m h3.train``), in the MiniMax-H3 format the real turbo LoRAs use."""
SPARSE85_TINY_LORA = "@sparse85-tiny"
"""The trained tiny preset's sparse-attention compensation LoRA (lora/sparse85-tiny.safetensors, made by
``python -m h3.train``'s compensate stage), loaded by the ``compensation_lora`` lever."""
TURBO4_RUN13_TINY_LORA = "@turbo4-tiny-run13"
"""Run 13's distilled LoRA (x0 regression), turbo4-tiny until session 18: the one the compensation LoRAs sit on."""
TRAINED_LORAS = {TURBO4_TINY_LORA: "TURBO4_LORA_FILE", TURBO4_RUN13_TINY_LORA: "TURBO4_RUN13_LORA_FILE",
                 SPARSE85_TINY_LORA: "SPARSE85_LORA_FILE"}
"""The trained tiny preset's LoRAs by recipe name: the h3.tiny_trained constant holding each file's path."""


def trained_lora_file(name: str) -> Path:
    """The file a trained-tiny LoRA name (``@turbo4-tiny``) stands for."""
    import h3.tiny_trained

    return getattr(h3.tiny_trained, TRAINED_LORAS[name])


def preset_lora_path(path: str, *, is_tiny: bool, transformer: torch.nn.Module | None = None,
                     section: str = "lora") -> Path | None:
    """The file a preset LoRA name (``@tiny``, ``@turbo4-tiny``, ...) stands for, or a LeverError saying why it cannot
    load here; None for a name that is not a preset's (a path)."""
    if path == TINY_LORA:
        if not is_tiny:
            raise LeverError("lora.path '@tiny' is the tiny preset's demo LoRA; it cannot load into a real checkpoint")
        from h3.train.seeded_lora import TINY_LORA_RANK, TINY_LORA_SEED, write_tiny_lora

        cache = Path(os.environ.get("H3_CACHE_DIR", Path.home() / ".cache" / "h3")) / "lora"
        # Keyed by the transformer's shapes too: the random and the trained tiny presets differ.
        target = cache / f"tiny-distill-r{TINY_LORA_RANK}-s{TINY_LORA_SEED}-{_shape_key(transformer)}.safetensors"
        if not target.is_file():
            write_tiny_lora(target, transformer)
        return target
    if path in TRAINED_LORAS:
        from h3.tiny_trained import shipped_transformer_config

        shipped = shipped_transformer_config()  # the shape its LoRAs were trained on (a run may widen the DiT)
        config = dict(getattr(transformer, "config", None) or {})
        same = all(list(config[k]) == list(v) if isinstance(v, tuple) else config[k] == v
                   for k, v in shipped.items() if k in config) and set(shipped) <= set(config)
        if not (is_tiny and same):
            raise LeverError(f"{section}.path '{path}' is a LoRA of the trained tiny preset (--model tiny); it cannot "
                             "load into another model")
        target = trained_lora_file(path)
        if not target.is_file():
            raise LeverError(f"LoRA file {target} (recipe key {section}.path = '{path}') does not exist; it ships "
                             "with the trained tiny preset (python -m h3.train exports it)")
        return target
    return None


def _shape_key(transformer: torch.nn.Module | None) -> str:
    import hashlib

    if transformer is None:
        return "none"
    shapes = [(n, tuple(m.weight.shape)) for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)]
    return hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]
