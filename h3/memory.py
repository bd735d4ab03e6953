"""Memory accounting of a loaded model: bytes by component and by where they live (a device, the host).

Counted from the tensors themselves (parameters and buffers of each component, each storage once), plus what the
active levers keep outside the model (:meth:`h3.levers.LeverHandle.held_tensors`: the float weights a reversible
quantization replaced). On the ``meta`` device the same code gives the sizes without any memory (the full-size plan
of :func:`plan_shared`, tested on the CPU).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

import torch

COMPONENTS = ("transformer", "text_encoder", "vae", "audio_vae")
GIB = 2**30


def _key(tensor: torch.Tensor) -> tuple:
    if tensor.device.type == "meta":
        return ("meta", id(tensor))
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def _nbytes(tensor: torch.Tensor) -> int:
    if tensor.device.type == "meta":
        return tensor.numel() * tensor.element_size()
    return tensor.untyped_storage().nbytes()


def _count(tensors: Iterable[torch.Tensor], seen: set) -> dict[str, int]:
    out: dict[str, int] = {}
    for tensor in tensors:
        key = _key(tensor)
        if key in seen:
            continue
        seen.add(key)
        where = tensor.device.type
        out[where] = out.get(where, 0) + _nbytes(tensor)
    return out


def account(pipe: Any, levers: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"components": {name: {device type: bytes}}, "levers_held": {lever: {...}}, "total": {...}}``."""
    seen: set = set()
    components = {}
    for name in COMPONENTS:
        module = getattr(pipe, name, None)
        if module is not None:
            components[name] = _count(itertools.chain(module.parameters(), module.buffers()), seen)
    held = {name: _count(handle.held_tensors(), seen) for name, handle in (levers or {}).items()}
    total: dict[str, int] = {}
    for part in [*components.values(), *held.values()]:
        for where, nbytes in part.items():
            total[where] = total.get(where, 0) + nbytes
    return {"components": components, "levers_held": {k: v for k, v in held.items() if v}, "total": total}


def gib(nbytes: int | float) -> float:
    return nbytes / GIB
