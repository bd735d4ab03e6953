"""Step distillation: a few-step LoRA through diffusers' MiniMax-H3 LoRA loader, unfused or fused into the weights.

Seed 001 hit two loader bugs: an adapter that matched 0 of 266 layers (different layer names) and loaded "without
complaint", and a scale 16x too strong. So this lever counts the modules the adapter matched against the modules the
file names, refuses a LoRA that matches none, and reports the per-module ``alpha / rank`` scaling it ended up with
(diffusers honours per-module alphas and a ``__metadata__`` ``alpha``; ``scale`` multiplies on top).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, mark_applied, unmark_applied

logger = logging.getLogger(__name__)

TINY_LORA = "@tiny"
TURBO4_TINY_LORA = "@turbo4-tiny"
"""The trained tiny preset's distilled 4-step LoRA (h3/assets/tiny/lora/turbo4-tiny.safetensors, made by
``python -m h3.train``), in the MiniMax-H3 format the real turbo LoRAs use."""
TINY_LORA_SEED = 9001
TINY_LORA_RANK = 4
TINY_LORA_ALPHA = 2.0
"""The tiny demo LoRA records alpha 2 at rank 4 in its ``__metadata__``: scale 0.5, so a loader that ignores the
metadata (scale 1.0) is caught by the tests."""


class LoraConfig(LeverConfig):
    """Step distillation: a few-step LoRA loaded through diffusers' MiniMax-H3 LoRA loader (recipe section
    ``[lora]``)."""

    name = "lora"

    enabled: bool = False
    path: str | None = None
    """LoRA file (.safetensors, diffusers/PEFT or original MiniMax-H3 names); ``$VARS`` are expanded. ``@tiny`` is
    the seeded demo LoRA of the tiny preset (refused on a real checkpoint)."""
    scale: float | None = None
    """Adapter weight on top of the file's own ``alpha / rank``; None keeps the file's (alpha or metadata) scale."""
    fuse: bool = False
    """Fuse the adapter into the base weights at load time (no per-step LoRA matmuls) instead of running it unfused."""
    adapter_name: str = "distill"

    def is_on(self) -> bool:
        return self.enabled

    def check_inputs(self) -> None:
        if not self.enabled or self.path == TINY_LORA:
            return
        if self.path == TURBO4_TINY_LORA:  # the model is checked at load; here only that the file shipped
            from h3.tiny_trained import TURBO4_LORA_FILE

            if not TURBO4_LORA_FILE.is_file():
                raise LeverError(f"LoRA file {TURBO4_LORA_FILE} (lora.path = '@turbo4-tiny') does not exist; it ships "
                                 "with the trained tiny preset (python -m h3.train exports it)")
            return
        resolve_lora_path(self.path, is_tiny=False)

    def apply(self, pipe, ctx: ApplyContext) -> "LoraHandle":
        return apply_lora(pipe, self, is_tiny=ctx.is_tiny)


def resolve_lora_path(path: str | None, *, is_tiny: bool, transformer: torch.nn.Module | None = None) -> Path:
    """The LoRA file a recipe names, or a LeverError naming the missing file."""
    if not path:
        raise LeverError("lora.enabled is true but lora.path is empty; name the few-step LoRA file")
    if path == TINY_LORA:
        if not is_tiny:
            raise LeverError("lora.path '@tiny' is the tiny preset's demo LoRA; it cannot load into a real checkpoint")
        cache = Path(os.environ.get("H3_CACHE_DIR", Path.home() / ".cache" / "h3")) / "lora"
        # Keyed by the transformer's shapes too: the random and the trained tiny presets differ.
        target = cache / f"tiny-distill-r{TINY_LORA_RANK}-s{TINY_LORA_SEED}-{_shape_key(transformer)}.safetensors"
        if not target.is_file():
            write_tiny_lora(target, transformer)
        return target
    if path == TURBO4_TINY_LORA:
        from h3.tiny_trained import TRANSFORMER_CONFIG, TURBO4_LORA_FILE

        config = dict(getattr(transformer, "config", None) or {})
        same = all(list(config[k]) == list(v) if isinstance(v, tuple) else config[k] == v
                   for k, v in TRANSFORMER_CONFIG.items() if k in config) and set(TRANSFORMER_CONFIG) <= set(config)
        if not (is_tiny and same):
            raise LeverError("lora.path '@turbo4-tiny' is the trained tiny preset's 4-step LoRA (--model tiny-trained); "
                             "it cannot load into another model")
        if not TURBO4_LORA_FILE.is_file():
            raise LeverError(f"LoRA file {TURBO4_LORA_FILE} (recipe key lora.path = '@turbo4-tiny') does not exist; "
                             "it ships with the trained tiny preset (python -m h3.train exports it)")
        return TURBO4_LORA_FILE
    expanded = os.path.expandvars(os.path.expanduser(path))
    if "$" in expanded:
        raise LeverError(
            f"LoRA path {path!r} (recipe key lora.path) names an environment variable that is not set "
            f"({expanded!r}); set it to the folder holding the few-step LoRA. Refusing to run the recipe without it."
        )
    resolved = Path(expanded)
    if not resolved.is_file():
        raise LeverError(
            f"LoRA file {resolved} (recipe key lora.path = {path!r}) does not exist; put the few-step LoRA "
            "(.safetensors) there or point lora.path at it. Refusing to run the recipe without it."
        )
    return resolved


def _shape_key(transformer: torch.nn.Module | None) -> str:
    import hashlib

    if transformer is None:
        return "none"
    shapes = [(n, tuple(m.weight.shape)) for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)]
    return hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]


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
    from safetensors.torch import save_file

    from h3.atomic import tmp_path_for

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_for(path)
    metadata = {"format": "pt"}
    if alpha is not None:
        metadata["alpha"] = str(alpha)
    save_file(tiny_lora_state_dict(transformer, misnamed=misnamed), str(tmp), metadata=metadata)
    os.replace(tmp, path)
    return path


def _lora_layers(transformer: torch.nn.Module, adapter: str) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in transformer.named_modules() if isinstance(m, LoraLayer) and adapter in m.lora_A}


class LoraHandle(LeverHandle):
    name = "lora"

    def __init__(self, pipe, config: LoraConfig, path: Path, file_modules: list[str], matched: list[str],
                 scalings: list[float]):
        super().__init__()
        self.pipe, self.config, self.path = pipe, config, path
        self.file_modules, self.matched, self.scalings = file_modules, matched, scalings
        self.calls = 0
        self._hooks = []
        if not config.fuse:
            for layer in _lora_layers(pipe.transformer, config.adapter_name).values():
                self._hooks.append(layer.register_forward_hook(self._count))

    def _count(self, *_):
        if not torch.compiler.is_compiling():  # see QuantizedLinear.forward
            self.calls += 1

    @property
    def weights_tag(self) -> str:
        """What this LoRA did to the weights (file hash, scale, fused), for caches keyed by the weights (AdaLN)."""
        from h3.atomic import sha256_file

        return f"lora={sha256_file(self.path)};scale={self.config.scale};fuse={self.config.fuse}"

    def begin_request(self) -> None:
        self.calls = 0

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "path": str(self.path),
            "file_modules": len(self.file_modules),
            "matched_modules": len(self.matched),
            "unmatched_modules": len(self.file_modules) - len(self.matched),
            "fused": self.config.fuse,
            "adapter_weight": 1.0 if self.config.scale is None else self.config.scale,
            "scaling": sorted(set(self.scalings)),
            "lora_layer_calls": None if self.compiled else self.calls,
        }

    def _remove(self) -> None:
        for h in self._hooks:
            h.remove()
        if self.config.fuse:
            raise LeverError("a fused LoRA is part of the weights now; reload the model to remove it")
        self.pipe.unload_lora_weights()
        unmark_applied(self.pipe.transformer, "lora")


def apply_lora(pipe, config: LoraConfig, *, is_tiny: bool = False) -> LoraHandle:
    """Load ``config.path`` into ``pipe.transformer``; fuse it when asked. Refuses a LoRA that matches no module."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    transformer = pipe.transformer
    path = resolve_lora_path(config.path, is_tiny=is_tiny, transformer=transformer)
    mark_applied(transformer, "lora")
    try:
        state, _ = MiniMaxH3LoraLoaderMixin.lora_state_dict(str(path), return_lora_metadata=True)
        file_modules = sorted({k.removeprefix("transformer.").split(".lora_")[0] for k in state if "lora_" in k})
        names = {n for n, _ in transformer.named_modules()}
        matched_names = [m for m in file_modules if m in names]
        if not matched_names:
            raise LeverError(
                f"LoRA {path} matches 0 of its {len(file_modules)} modules in the transformer (first names in the "
                f"file: {file_modules[:3]}; the transformer has e.g. 'transformer_blocks.0.attn.to_q'). Refusing to "
                "run without the adapter."
            )
        pipe.load_lora_weights(str(path), adapter_name=config.adapter_name)
        layers = _lora_layers(transformer, config.adapter_name)
        if not layers:
            raise LeverError(f"LoRA {path}: diffusers loaded it but no LoRA layer was created; refusing")
        if config.scale is not None:
            pipe.set_adapters([config.adapter_name], adapter_weights=[config.scale])
        # peft's per-module scaling: adapter weight x alpha / rank, what multiplies B @ A in the forward.
        scalings = [float(layer.scaling[config.adapter_name]) for layer in layers.values()]
        if config.fuse:
            pipe.fuse_lora(components=["transformer"], lora_scale=1.0, adapter_names=[config.adapter_name])
            # Drop the LoRA factors: the fused base weights carry the adapter now.
            pipe.unload_lora_weights()
        logger.info("LoRA %s: %d of %d modules matched, fused=%s", path, len(layers), len(file_modules), config.fuse)
    except BaseException:
        unmark_applied(transformer, "lora")
        raise
    return LoraHandle(pipe, config, path, file_modules, sorted(layers), scalings)


def save_fused_checkpoint(runtime, directory) -> None:
    """Fuse offline: write a runtime whose only lever is a fused LoRA as a plain checkpoint (HF layout), so that later
    loads need neither the LoRA file nor the fusing step. Refuses a runtime with any other lever applied (quantized
    or precomputed modules are not checkpoint weights)."""
    handles = getattr(runtime, "levers", {})
    lora = handles.get("lora")
    if lora is None or not lora.config.fuse:
        raise LeverError("save_fused_checkpoint needs a runtime whose recipe fuses a LoRA (lora.fuse = true)")
    others = sorted(name for name, handle in handles.items() if name != "lora" and handle.telemetry()["applied"])
    if others:
        raise LeverError(f"save_fused_checkpoint: levers {others} change modules, not weights; load with a recipe that "
                         "enables only the fused LoRA")
    runtime.save_pretrained(directory)
