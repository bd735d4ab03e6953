"""A MiniMax-H3 checkpoint directory in the Hugging Face layout: what it must hold (:data:`CHECKPOINT_LAYOUT`,
:func:`check_checkpoint_dir`), its identity (:func:`checkpoint_identity`), and saving pipeline components into it
(:func:`save_components`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

# The components of the t2va workflow and the files each must have in the checkpoint directory.
_WEIGHTS = {
    "diffusers": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"),
    "transformers": ("model.safetensors", "model.safetensors.index.json"),
}
CHECKPOINT_LAYOUT: dict[str, tuple[str, ...]] = {
    "transformer": ("config.json", "@diffusers"),
    "vae": ("config.json", "@diffusers"),
    "audio_vae": ("config.json", "@diffusers"),
    "text_encoder": ("config.json", "@transformers"),
    "tokenizer": ("tokenizer_config.json", "tokenizer.json|vocab.json"),
    "processor": ("processor_config.json|preprocessor_config.json",),
    "scheduler": ("scheduler_config.json",),
    "audio_scheduler": ("scheduler_config.json",),
}


class CheckpointError(FileNotFoundError):
    """A checkpoint directory is missing or incomplete; the message names what is missing and where."""


def check_checkpoint_dir(path: str | os.PathLike) -> Path:
    """Raise CheckpointError naming every missing file of a MiniMax-H3 checkpoint directory (t2va workflow)."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint directory {root} does not exist; put the Hugging Face layout of MiniMaxAI/MiniMax-H3 there "
            "(modular_model_index.json, transformer/, vae/, audio_vae/, text_encoder/, tokenizer/, processor/, "
            "scheduler/, audio_scheduler/)"
        )
    missing: list[str] = []
    if not (root / "modular_model_index.json").is_file():
        missing.append(str(root / "modular_model_index.json"))
    for component, needs in CHECKPOINT_LAYOUT.items():
        folder = root / component
        if not folder.is_dir():
            missing.append(f"{folder}/ (the {component} component)")
            continue
        for need in needs:
            if need.startswith("@"):
                single, index = _WEIGHTS[need[1:]]
                if (folder / single).is_file():
                    continue
                if (folder / index).is_file():
                    shards = sorted(set(json.loads((folder / index).read_text()).get("weight_map", {}).values()))
                    missing.extend(str(folder / s) for s in shards if not (folder / s).is_file())
                    continue
                missing.append(f"{folder / single} (or {index} with its shards)")
            elif not any((folder / alt).is_file() for alt in need.split("|")):
                missing.append(str(folder / need.split("|")[0]))
    if missing:
        raise CheckpointError(f"checkpoint {root} is incomplete; missing: " + "; ".join(missing))
    return root


def checkpoint_identity(root: Path) -> str:
    """Hash of the files that identify a checkpoint's weights: configs, indexes and weight file sizes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        digest.update(rel.encode())
        if path.suffix in (".json", ".txt", ".model"):
            digest.update(path.read_bytes())
        else:
            digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "float64": torch.float64}[name]


def save_components(components: dict[str, Any], directory: str | os.PathLike) -> None:
    """Save pipeline components in the Hugging Face layout (ModularPipeline.save_pretrained)."""
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**components)
    pipe.save_pretrained(str(directory))
    _relativize_index(Path(directory))


def _relativize_index(directory: Path) -> None:
    """save_pretrained writes the absolute save path into the index; make the folder relocatable."""
    index_path = directory / "modular_model_index.json"
    index = json.loads(index_path.read_text())
    for value in index.values():
        if isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict):
            if value[2].get("pretrained_model_name_or_path"):
                value[2]["pretrained_model_name_or_path"] = None
    index_path.write_text(json.dumps(index, indent=2) + "\n")


def ref_partition_is_transformer(root: Path) -> bool:
    """Whether the checkpoint index points ``transformer_ref`` at the ``transformer/`` folder (one DiT for all)."""
    try:
        entry = json.loads((root / "modular_model_index.json").read_text()).get("transformer_ref")
    except (OSError, ValueError):
        return False
    return isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], dict) and \
        entry[2].get("subfolder") == "transformer"
