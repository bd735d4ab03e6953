"""Recipes: TOML files that name every lever of a configuration explicitly.

A recipe is a strict schema: an unknown key or a wrong type is an error that names the key. Shipped recipes live
in ``h3/recipes/<name>.toml``; any path to a ``.toml`` file works too.

Step semantics: ``steps`` is the number of DiT forward passes (denoising steps) of a request, the number the field
reports count ("29 to 4 DiT executions", seed 000). diffusers' ``num_inference_steps`` counts sigma grid points
including the terminal zero, so the runtime passes ``steps + 1``.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

RECIPES_DIR = Path(__file__).parent / "recipes"


class RecipeError(ValueError):
    """A recipe could not be found, parsed or validated."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AttentionConfig(_Section):
    """Attention backend, through diffusers' attention dispatcher."""

    backend: Literal["native", "_native_math", "_native_flash", "_native_efficient", "_native_cudnn", "flex",
                     "sage", "flash", "_flash_3"] = "native"
    """diffusers ``AttentionBackendName``; ``native`` is PyTorch SDPA."""


class VaeConfig(_Section):
    """Video VAE spatial tiling. MiniMax-H3 ships with tiling on at 256×256 tiles (64 px minimum overlap)."""

    tiling: bool = True
    tile_height: int = Field(default=256, ge=32)
    tile_width: int = Field(default=256, ge=32)
    tile_overlap: int = Field(default=64, ge=0)

    @field_validator("tile_height", "tile_width", "tile_overlap")
    @classmethod
    def _multiple_of_16(cls, value: int) -> int:
        if value % 16:
            raise ValueError(f"must be a multiple of 16 (the VAE's spatial compression), got {value}")
        return value


class Recipe(_Section):
    """One configuration of the runtime."""

    name: str
    """Short name; also the clip folder name inside a run."""
    description: str = ""
    steps: int = Field(ge=1, le=200)
    """DiT forward passes per request (diffusers' num_inference_steps = steps + 1)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Compute dtype of the transformer, the VAEs and the text encoder (modules the checkpoint keeps in float32 stay
    float32)."""
    attention: AttentionConfig = Field(default_factory=AttentionConfig)
    vae: VaeConfig = Field(default_factory=VaeConfig)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        from h3eval.store import SAFE_NAME

        if not SAFE_NAME.match(value) or ".." in value:
            raise ValueError(f"recipe name {value!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        return value

    def resolved(self) -> dict[str, Any]:
        """Every lever explicit, as plain data."""
        return self.model_dump(mode="json")

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.resolved(), sort_keys=True).encode()).hexdigest()

    @property
    def num_inference_steps(self) -> int:
        return self.steps + 1


def _format_validation_error(source: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key '{key}'")
        elif err["type"] == "missing":
            parts.append(f"missing key '{key}'")
        else:
            parts.append(f"key '{key}': {err['msg']} (got {err.get('input')!r})")
    return f"invalid recipe {source}: " + "; ".join(parts)


def known_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def recipe_from_dict(data: dict[str, Any], source: str = "<dict>") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_validation_error(source, exc)) from None


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A shipped recipe by name, or a recipe file by path."""
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith(".toml") or "/" in text or path.exists()):
        path = RECIPES_DIR / f"{text}.toml"
        if not path.exists():
            raise RecipeError(f"unknown recipe {text!r}; shipped recipes: {', '.join(known_recipes())} (or give a path)")
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(f"recipe file {path} is not valid TOML: {exc}") from None
    return recipe_from_dict(data, source=str(path))
