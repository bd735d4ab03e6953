"""LoRA files: writing one with the same bytes for the same tensors (:func:`save_lora_file`), and reading the scale a
file itself gives each module it adapts (:func:`file_scales`), for the lora lever's telemetry."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def file_scales(path: str | os.PathLike) -> tuple[dict[str, float], bool]:
    """The file's own scale of each module it adapts (by the file's module names): its ``alpha / rank``, the alpha
    being the module's ``.alpha`` tensor, else the ``__metadata__`` ``alpha`` (only when no module has its own: the
    rule diffusers' MiniMax-H3 loader follows), else the rank (alpha-less: 1.0). Read from the file itself, not from
    what the loader made of it, so that a loader that drops the alpha is seen. Also whether per-module ``.alpha``
    tensors are present (diffusers folds those into the factors, so peft's own scaling then carries only the
    recipe's ``scale``)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        keys = list(handle.keys())
        alphas = {k[: -len(".alpha")]: float(handle.get_tensor(k).float()) for k in keys if k.endswith(".alpha")}
        ranks = {k.split(".lora_")[0]: handle.get_slice(k).get_shape()[0] for k in keys
                 if k.endswith((".lora_A.weight", ".lora_down.weight"))}
        network = (handle.metadata() or {}).get("alpha")
    try:
        network_alpha = float(network) if network is not None and not alphas else None
    except ValueError:
        network_alpha = None
    scales = {}
    for module, rank in ranks.items():
        alpha = alphas.get(module, network_alpha if network_alpha is not None else float(rank))
        scales[module] = alpha / rank
    return scales, bool(alphas)


def save_lora_file(path: str | os.PathLike, state: dict[str, torch.Tensor], metadata: dict[str, str]) -> Path:
    """Write a safetensors file atomically, the same bytes for the same tensors and metadata.

    Why not ``save_file`` alone: safetensors 0.8 writes the metadata from a Rust HashMap whose order changes from one
    call to the next (two keys come out in either order within one process), so the file's bytes, and the hash that
    names a LoRA (:attr:`LoraHandle.weights_tag`), changed between writes of the same adapter. The metadata object
    is written again with its keys sorted: the same keys and values, so the same length, and every data offset
    holds."""
    import json
    import struct

    from safetensors.torch import save

    from h3.atomic import atomic_write_bytes

    data = save(state, metadata=metadata)
    (size,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + size].decode("utf-8")
    key = '"__metadata__":'
    at = header.find(key)
    if at >= 0:
        start = at + len(key)
        found, end = json.JSONDecoder().raw_decode(header, start)
        ordered = json.dumps(dict(sorted(found.items())), separators=(",", ":"), ensure_ascii=False)
        if len(ordered) == end - start:  # else (an escape written differently) keep safetensors' own bytes
            header = header[:start] + ordered + header[end:]
            data = data[:8] + header.encode("utf-8") + data[8 + size:]
    path = Path(path)
    atomic_write_bytes(path, data)
    return path
