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
    """Video VAE spatial tiling and residency. MiniMax-H3 ships with tiling on at 256×256 tiles (64 px minimum
    overlap)."""

    tiling: bool = True
    tile_height: int = Field(default=256, ge=32)
    tile_width: int = Field(default=256, ge=32)
    tile_overlap: int = Field(default=64, ge=0)
    tiles: dict[str, list[int]] = Field(default_factory=dict)
    """Per-resolution tile size, ``"HEIGHTxWIDTH" = [tile_height, tile_width]`` (seed 000: 304×320 at 768×1344 cut
    video decode 39.5%); resolutions not listed use ``tile_height``/``tile_width``. Empty: the lever is off."""
    resident: bool = True
    """Keep both VAEs on the device across requests; False parks them on the CPU between decodes."""

    @field_validator("tile_height", "tile_width", "tile_overlap")
    @classmethod
    def _multiple_of_16(cls, value: int) -> int:
        if value % 16:
            raise ValueError(f"must be a multiple of 16 (the VAE's spatial compression), got {value}")
        return value

    @field_validator("tiles")
    @classmethod
    def _tiles(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        for key, tile in value.items():
            parts = key.split("x")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise ValueError(f"tile key {key!r} must be 'HEIGHTxWIDTH', e.g. '768x1344'")
            if len(tile) != 2 or any(t < 32 or t % 16 for t in tile):
                raise ValueError(f"tile for {key} must be [height, width], multiples of 16 and >= 32, got {tile}")
        return value


class LoraConfig(_Section):
    """Step distillation: a few-step LoRA loaded through diffusers' MiniMax-H3 LoRA loader."""

    enabled: bool = False
    path: str | None = None
    """LoRA file (.safetensors, diffusers/PEFT or original MiniMax-H3 names); ``$VARS`` are expanded. ``@tiny`` is
    the seeded demo LoRA of the tiny preset (refused on a real checkpoint)."""
    scale: float | None = None
    """Adapter weight on top of the file's own ``alpha / rank``; None keeps the file's (alpha or metadata) scale."""
    fuse: bool = False
    """Fuse the adapter into the base weights at load time (no per-step LoRA matmuls) instead of running it unfused."""
    adapter_name: str = "distill"


class AdalnConfig(_Section):
    """AdaLN modulation precompute: per-block modulation tables for the recipe's schedule, ``adaln_proj`` dropped."""

    precompute: bool = False
    disk_cache: bool = True
    """Keep the tables under ``$H3_CACHE_DIR/adaln/`` keyed by checkpoint, LoRA and schedule."""


class QuantConfig(_Section):
    """Linear quantization of the transformer (per-channel weight scales, per-token activation scales)."""

    mode: Literal["none", "int8_weight_only", "int8_w8a8", "fp8_w8a8"] = "none"
    exclude: list[str] = Field(
        default_factory=lambda: [r"(^|\.)proj_in$", r"(^|\.)audio_proj_in$", r"(^|\.)proj_out$",
                                 r"(^|\.)audio_proj_out$", r"time_embedder", r"norm"]
    )
    """Regular expressions (``re.search``) over module names that stay in floating point: by default the float32
    input/output projections and time embedder, and the norms (``norm_out``'s modulation)."""


class SparseAttentionConfig(_Section):
    """Content-based block-sparse attention on the transformer blocks (flex_attention block masks)."""

    enabled: bool = False
    block_size: int = Field(default=128, ge=16)
    """Query and key block, in tokens; routing mean-pools each block."""
    sparsity: float = Field(default=0.5, ge=0.0, lt=1.0)
    """Target fraction of key blocks each query block skips (top-k keeps ``ceil((1 - sparsity) * n_blocks)``)."""
    dense_steps: int = Field(default=1, ge=0)
    """The first N denoising steps run dense (seed 001: "only the first denoising step run with full attention")."""
    dense_layers: list[int] = Field(default_factory=list)
    """Transformer block indices that always run dense."""


class BucketingConfig(_Section):
    """Shape bucketing: pad the packed sequence to a multiple of ``multiple`` rows; attention runs on the real rows only."""

    enabled: bool = False
    multiple: int = Field(default=64, ge=1)
    """Bucket granularity in rows (seed 001: SGLang's 64-token-aligned length)."""


class CacheConfig(_Section):
    """Step caches from diffusers' hooks, through ``transformer.enable_cache``."""

    kind: Literal["none", "fbc", "mag", "taylorseer"] = "none"
    threshold: float = Field(default=0.05, ge=0.0)
    """FirstBlockCache / MagCache threshold."""
    mag_ratios: list[float] | None = None
    """MagCache: the checkpoint's magnitude ratios (required unless ``calibrate``)."""
    calibrate: bool = False
    max_skip_steps: int = Field(default=3, ge=1)
    retention_ratio: float = Field(default=0.2, ge=0.0, le=1.0)
    cache_interval: int = Field(default=5, ge=1)
    """TaylorSeer: full computation every N steps."""
    disable_cache_before_step: int = Field(default=3, ge=0)
    """TaylorSeer: warm-up steps always computed."""
    max_order: int = Field(default=1, ge=0)


class CompileConfig(_Section):
    """Regional torch.compile of the DiT blocks (one region per block; see h3/levers/compile.py)."""

    enabled: bool = False
    backend: str = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None


class OffloadConfig(_Section):
    """diffusers' group offloading of the transformer at block level, for GPUs that cannot hold the model."""

    enabled: bool = False
    num_blocks_per_group: int = Field(default=1, ge=1)
    use_stream: bool = True
    """Prefetch the next group on a side CUDA stream while the current one runs (pinned host memory)."""
    record_stream: bool = False
    text_encoder: bool = False
    """Also keep the text encoder on the CPU, onloaded only while it encodes."""
    resident_top_level: bool = True
    """Keep the transformer's modules outside its DiT blocks (token refiner, embedders, output norm: 0.84 B of 33 B
    parameters) on the device; only the blocks stream. diffusers moves that group synchronously through pageable
    memory at every forward (5.9 s of a 7.3 s transfer-bound request on the H200)."""


class ParallelSection(_Section):
    """One request on several GPUs (h3/levers/parallel.py): sequence-parallel DiT through diffusers' context
    parallelism, tile-parallel video VAE decode, replicated text encoder. Degree 1 (the default) is one process."""

    degree: int = Field(default=1, ge=1)
    """Ranks of one request (``h3 generate/serve --nproc N`` sets it); any N the work divides."""
    kind: Literal["ulysses", "ring", "ulysses_anything"] = "ulysses_anything"
    """``ulysses_anything`` (the default): Ulysses all-to-all for any packed length and head count (uneven shards);
    ``ulysses``: equal shards only, so every packed length must divide by the degree (bucketing with a multiple of
    it), a request that does not is refused; ``ring``: keys passed around the ranks, for an attention backend that
    returns the log-sum-exp (all CUDA)."""
    vae: Literal["tiles", "replicated"] = "tiles"
    """``tiles``: the video VAE's spatiotemporal tiles scattered over the ranks and gathered (seed 000);
    ``replicated``: every rank decodes the whole video."""
    text_encoder: Literal["replicated", "tensor_parallel"] = "replicated"
    """Every rank encodes the prompt; ``tensor_parallel`` is refused (see h3/levers/parallel.py)."""


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
    lora: LoraConfig = Field(default_factory=LoraConfig)
    adaln: AdalnConfig = Field(default_factory=AdalnConfig)
    quant: QuantConfig = Field(default_factory=QuantConfig)
    sparse_attention: SparseAttentionConfig = Field(default_factory=SparseAttentionConfig)
    bucketing: BucketingConfig = Field(default_factory=BucketingConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    compile: CompileConfig = Field(default_factory=CompileConfig)
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    parallel: ParallelSection = Field(default_factory=ParallelSection)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        from h3eval.store import SAFE_NAME

        if not SAFE_NAME.match(value) or ".." in value:
            raise ValueError(f"recipe name {value!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        return value

    def resolved(self) -> dict[str, Any]:
        """Every lever explicit, as plain data. A single-process ``parallel`` section (the default) is left out, so
        that recipes written before the section existed keep their hash."""
        data = self.model_dump(mode="json")
        if self.parallel == ParallelSection():
            data.pop("parallel")
        return data

    def at_degree(self, degree: int) -> "Recipe":
        """This recipe run on ``degree`` ranks (``--nproc``); its other levers unchanged."""
        return self.model_copy(update={"parallel": self.parallel.model_copy(update={"degree": int(degree)})})

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
