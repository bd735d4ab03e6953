"""Sparse-attention compensation: a second LoRA that sits on the step-distillation one and makes up for the attention
that block-sparse routing drops (seed 000's SLA recipe: 85 % sparsity "uses a specially trained LoRA to compensate for
sparsification"; with it the DiT's latency fell a further 32 %).

The adapter loads through diffusers' MiniMax-H3 LoRA loader as the ``lora`` lever's does (the same code, adapter name
``compensation``), with the same matched-module, fuse and adapter-weight checks. A compensation LoRA is trained for one
routing and one distilled LoRA, so the recipe is refused unless it runs that: sparse attention on, at the block size,
sparsity and dense steps the file states (``h3_sparse_*`` in its ``__metadata__``, written by ``python -m h3.train``'s
compensate stage), on top of the LoRA it names (by its tensors' sha256). diffusers 0.42.1 cannot inject a second
adapter while the first is live unfused (peft's NoMatchingPeftModuleError), so the ``lora`` lever must fuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from h3.levers.base import ApplyContext, LeverError
from h3.levers.lora import LoraConfig, LoraHandle, apply_lora, resolve_lora_path
from h3.levers.lora_presets import TRAINED_LORAS, trained_lora_file

ROUTING_KEYS = {"block_size": "h3_sparse_block_size", "sparsity": "h3_sparse_sparsity",
                "dense_steps": "h3_sparse_dense_steps"}
"""The sparse_attention settings a compensation LoRA was trained under, by their ``__metadata__`` keys."""
STREAMS_KEY = "h3_sparse_streams"
"""The token streams whose queries the routing sparsified in training (comma-separated, ``video,audio``). Files
written before ``sparse_attention.streams`` existed do not state it: their routing sparsified every stream."""
COMPENSATES_KEY = "h3_compensates_tensors_sha256"
"""The distillation LoRA a compensation LoRA sits on, by :func:`lora_tensors_sha256` (its tensors and metadata, not its
file's bytes: the same adapter written again can order its ``__metadata__`` otherwise)."""


class CompensationLoraConfig(LoraConfig):
    """A sparse-attention compensation LoRA beside the step-distillation one (recipe section ``[compensation_lora]``;
    ``@sparse85-tiny`` is the trained tiny preset's, for 85 % in 32-token blocks on every step over
    ``@turbo4-tiny``)."""

    name = "compensation_lora"
    signoff_kind = "resample"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "a LoRA trained to compensate sparsification changes the weights: another sample"
    omitted_when_default: ClassVar[bool] = True  # added after recipes were hashed: an off section keeps their hash

    adapter_name: str = "compensation"

    def composition_problems(self, recipe: Any) -> list[str]:
        if not self.enabled:
            return []
        problems = []
        sparse, lora = recipe.sparse_attention, recipe.lora
        if not sparse.enabled:
            problems.append("compensation_lora needs sparse_attention on: it compensates for the blocks that routing "
                            "drops")
        if lora.enabled and not lora.fuse:
            problems.append("compensation_lora needs lora.fuse = true: diffusers 0.42.1 cannot load a second adapter "
                            "while the first is live unfused")
        stated = file_metadata(self.path)
        if stated is None:
            return problems  # no file (check_inputs names it) or one that states nothing: nothing to compare
        for field, key in ROUTING_KEYS.items():
            if key not in stated or not sparse.enabled:
                continue
            try:
                trained = float(stated[key])
            except ValueError:
                problems.append(f"compensation_lora {self.path!r} states {key} = {stated[key]!r}, not a number")
                continue
            if trained != float(getattr(sparse, field)):
                problems.append(f"compensation_lora {self.path!r} was trained for sparse_attention.{field} = "
                                f"{stated[key]}, the recipe runs {getattr(sparse, field)}")
        if STREAMS_KEY in stated and sparse.enabled:
            trained = [s.strip() for s in stated[STREAMS_KEY].split(",") if s.strip()]
            if sorted(trained) != sorted(sparse.streams):
                problems.append(f"compensation_lora {self.path!r} was trained with the {trained} queries sparse, the "
                                f"recipe sparsifies {list(sparse.streams)}")
        if COMPENSATES_KEY in stated:
            base = lora_tensors_sha256(_file(lora.path)) if lora.enabled else None
            if base != stated[COMPENSATES_KEY]:
                problems.append(f"compensation_lora {self.path!r} was trained on the LoRA with sha256 "
                                f"{stated[COMPENSATES_KEY][:16]}..., the recipe's [lora] is "
                                f"{'off' if not lora.enabled else (base or '?')[:16] + '...'}")
        return problems

    def executed_flags(self, telemetry: dict[str, Any], executed: Any, recipe: Any = None) -> list[str]:
        """The LoRA's own flags (scale, partial include), and a file that does not state the token streams it was
        trained for (written before ``sparse_attention.streams``: trained with every stream's queries sparse) under a
        recipe that sparsifies fewer: another routing than it was trained for."""
        flags = super().executed_flags(telemetry, executed, recipe)
        sparse = getattr(recipe, "sparse_attention", None)
        stated = file_metadata(self.path) if sparse is not None and sparse.enabled else None
        if stated is not None and STREAMS_KEY not in stated and set(sparse.streams) != {"video", "audio", "text"}:
            flags.append(f"{self.path!r} does not state the token streams it was trained for (written before "
                         f"sparse_attention.streams: every stream's queries sparse); the recipe sparsifies "
                         f"{list(sparse.streams)} only, another routing than its training")
        return flags

    def apply(self, pipe, ctx: ApplyContext) -> LoraHandle:
        # Its fused form is undone from its own copies (weight_source would read back the weights without the
        # distillation LoRA fused under it).
        return apply_lora(pipe, self, is_tiny=ctx.is_tiny, device=ctx.device, reversible=ctx.reversible,
                          keep_on=ctx.keep_on, weight_source=None)


def _file(path: str | None) -> Path | None:
    """The file a recipe's path names, when that is known without the model (None for ``@tiny`` or no path)."""
    if not path or path.startswith("@") and path not in TRAINED_LORAS:
        return None
    if path in TRAINED_LORAS:
        return trained_lora_file(path)
    try:
        return resolve_lora_path(path, is_tiny=False)  # the lora lever's expansion of $VARS and ~
    except LeverError:  # unset variable or no such file: check_inputs names it
        return None


def file_metadata(path: str | None) -> dict[str, str] | None:
    """The ``__metadata__`` of the LoRA file ``path`` names (None when it is not there)."""
    target = _file(path)
    if target is None or not target.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(target), framework="pt") as handle:
            return handle.metadata() or {}
    except Exception as exc:  # a file safetensors cannot read
        raise LeverError(f"LoRA file {target}: not a readable safetensors file ({exc})") from None


def lora_tensors_sha256(path: Path | None) -> str | None:
    """sha256 over a safetensors file's ``__metadata__`` (sorted by key: the network alpha is part of the adapter)
    and its tensors (name, dtype, shape, bytes, in name order), not over the file's bytes, whose metadata order can
    differ for the same adapter; None when there is no such file."""
    if path is None or not Path(path).is_file():
        return None
    import hashlib
    import json

    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(path), framework="pt") as handle:
        digest.update(json.dumps(sorted((handle.metadata() or {}).items())).encode())
        for name in sorted(handle.keys()):
            tensor = handle.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
