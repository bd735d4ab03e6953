"""Where a loaded model's weights come from, so that they can be put back exactly.

A process that runs several recipes on one loaded model (``H3Runtime(shared=True)``: one DiT, one text encoder, the
VAEs) applies one recipe's levers, removes them, and applies the next recipe's. A lever that changes weights in place
(a fused LoRA) cannot be undone by arithmetic: ``W + s·BA - s·BA`` is not ``W`` in floating point. Keeping a copy of
every changed weight would cost a second DiT (62 GiB in bf16 at full size). Instead the weights are re-read from where
they came from, which gives the loaded bits again:

- :class:`CheckpointWeights`: the checkpoint directory's safetensors files, cast as diffusers/transformers cast them
  when loading (``tensor.to(dtype)``: round to nearest even, the same bits every time);
- :class:`SeededWeights`: the seeded random presets (``h3.random_model``): every parameter is drawn from its own
  generator, seeded by the preset's seed and the parameter's name, on the device it lives on, so drawing it again gives
  the same bits (same device type, same torch build).

``restore(component, root, names)`` overwrites the named parameters of ``root`` (a component: ``transformer``...) in
place, keeping each tensor object (compiled graphs and hooks that hold it stay valid).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Iterable, Protocol

import torch

logger = logging.getLogger(__name__)


class WeightSource(Protocol):
    """What a loaded model's weights can be read from again."""

    description: str

    def restore(self, component: str, root: torch.nn.Module, names: Iterable[str]) -> int:
        """Overwrite the parameters ``names`` (state-dict names within ``component``) of ``root`` in place with their
        loaded values; returns how many were restored."""


def _parameter(root: torch.nn.Module, name: str) -> torch.Tensor:
    module_name, _, attr = name.rpartition(".")
    module = root.get_submodule(module_name) if module_name else root
    tensor = getattr(module, attr)
    if not isinstance(tensor, torch.Tensor):
        raise KeyError(f"{name} is not a tensor of {type(root).__name__}")
    return tensor


# -- seeded random weights -------------------------------------------------------------------------------------------

def parameter_seed(seed: int, component: str, name: str) -> int:
    """The seed of one parameter's generator: the preset's seed, the component and the parameter's name (so that any
    one parameter can be drawn again on its own)."""
    digest = hashlib.sha256(f"{seed}/{component}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def draw_parameter(tensor: torch.Tensor, seed: int, component: str, name: str) -> None:
    """Fill ``tensor`` in place with the seeded random value of parameter ``name``.

    The distribution keeps activations in range through a deep random network (it is not a trained model's): biases
    zero, one-dimensional scales (norm weights) one, every other weight normal with standard deviation
    ``1 / sqrt(fan_in)`` (fan_in: the elements of one output row). Drawn in the tensor's own dtype on its own device.
    """
    if tensor.device.type == "meta":
        return
    if name.endswith("bias"):
        tensor.zero_()
    elif tensor.ndim <= 1:
        tensor.fill_(1.0)
    else:
        fan_in = max(1, tensor[0].numel())
        generator = torch.Generator(device=tensor.device).manual_seed(parameter_seed(seed, component, name))
        tensor.normal_(0.0, fan_in**-0.5, generator=generator)


class SeededWeights:
    """The weights of a seeded random preset: each parameter drawn again from its own seed."""

    def __init__(self, seed: int):
        self.seed = seed
        self.description = f"seeded random weights (seed {seed}), drawn again on the device"

    def fill(self, component: str, root: torch.nn.Module) -> None:
        """Draw every parameter of ``root`` (at build time)."""
        for name, param in root.named_parameters():
            draw_parameter(param, self.seed, component, name)

    def restore(self, component: str, root: torch.nn.Module, names: Iterable[str]) -> int:
        count = 0
        for name in names:
            draw_parameter(_parameter(root, name), self.seed, component, name)
            count += 1
        return count


# -- a checkpoint directory ------------------------------------------------------------------------------------------

WEIGHT_FILES = ("diffusion_pytorch_model.safetensors", "model.safetensors")


class CheckpointWeights:
    """The weights of a checkpoint directory (the Hugging Face layout), read again from its safetensors files."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.description = f"checkpoint {self.root} (re-read from its safetensors files)"
        self._index: dict[str, dict[str, Path]] = {}

    def files(self, component: str) -> dict[str, Path]:
        """Tensor name -> the safetensors file that holds it, for one component folder."""
        if component not in self._index:
            folder = self.root / component
            mapping: dict[str, Path] = {}
            for single in WEIGHT_FILES:
                index = folder / f"{single}.index.json"
                if (folder / single).is_file():
                    from safetensors import safe_open

                    with safe_open(str(folder / single), framework="pt") as handle:
                        mapping.update({key: folder / single for key in handle.keys()})
                elif index.is_file():
                    weight_map = json.loads(index.read_text()).get("weight_map", {})
                    mapping.update({key: folder / file for key, file in weight_map.items()})
            if not mapping:
                raise FileNotFoundError(f"no safetensors weights under {folder} to restore {component} from")
            self._index[component] = mapping
        return self._index[component]

    @torch.no_grad()
    def restore(self, component: str, root: torch.nn.Module, names: Iterable[str]) -> int:
        from safetensors import safe_open

        files = self.files(component)
        by_file: dict[Path, list[str]] = {}
        for name in names:
            if name not in files:
                raise KeyError(f"{name} is not in the {component} weights of {self.root}; cannot restore it")
            by_file.setdefault(files[name], []).append(name)
        count = 0
        for path, keys in by_file.items():
            with safe_open(str(path), framework="pt") as handle:
                for key in keys:
                    target = _parameter(root, key)
                    # The loaders' own cast (to the parameter's loaded dtype), then onto its device.
                    target.copy_(handle.get_tensor(key).to(target.dtype))
                    count += 1
        return count
