"""The clip record: what one request asked for, what ran, and what it cost.

Written next to every clip as ``<clip>.json``. It is a versioned pydantic schema so that any later step (gates,
statistics, the dashboard, an outside script) can read a run without the process that wrote it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from h3.schema import FINITE_NUMBERS

CLIP_RECORD_VERSION = 1


class _Strict(BaseModel):
    # A record with a NaN or infinite timing or shape is not a finished record (h3/schema.py).
    model_config = ConfigDict(extra="forbid", **FINITE_NUMBERS)


class ConditioningImage(_Strict):
    """An image that conditioned the request (h3.conditioning): its role and the sha256 of its bytes as given.

    The run store keeps the image itself under that hash (``RunStore.input_path``)."""

    role: Literal["first_frame", "last_frame", "reference"]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    width: int = Field(gt=0)
    height: int = Field(gt=0)
    media_type: str = "image/png"


class RequestSpec(_Strict):
    """A generation request as it was asked (before snapping)."""

    prompt: str
    """The prompt text."""
    prompt_id: str | None = None
    """Stable id of the prompt within its suite, when the request came from one."""
    seed: int = Field(ge=0)
    """Seed of the request's generator."""
    num_frames: int | None = None
    """Requested frame count (snapped up to H3's 17n+5), or None when ``seconds`` is given."""
    seconds: float | None = None
    """Requested duration in seconds, or None when ``num_frames`` is given."""
    height: int
    """Requested height in pixels (a multiple of 32)."""
    width: int
    """Requested width in pixels (a multiple of 32)."""
    workflow: Literal["t2va", "fl2va", "ref2va"] = "t2va"
    """MiniMax-H3's workflow: text only, first/last keyframes, or a reference image (diffusers' MiniMaxH3Blocks)."""
    conditioning: list[ConditioningImage] = Field(default_factory=list)
    """The image inputs of an fl2va or ref2va request, in role order (first_frame, last_frame, reference)."""


class ResolvedShape(_Strict):
    """The shape that was actually generated."""

    num_frames: int
    height: int
    width: int
    fps: int
    duration_s: float
    """num_frames / fps."""
    num_latent_frames: int
    num_audio_latents: int
    audio_sample_rate: int
    audio_channels: int
    num_audio_samples: int
    """Samples per channel of the generated soundtrack."""
    num_text_tokens: int
    sequence_length: int
    """Rows of the packed DiT sequence (text + audio + video)."""


class StageAnatomy(_Strict):
    """Device-synchronized wall time of each stage of a request, in seconds."""

    text_encode: float
    denoise_steps: list[float]
    """One entry per DiT forward (denoising step)."""
    denoise: float
    """Whole denoising stage (prepare + loop + unpack)."""
    video_decode: float
    audio_decode: float
    frame_prep_d2h: float
    """Frames to uint8 on the device and copy to the host; PCM likewise."""
    mux_save: float
    """MP4 encoding, muxing and the atomic move onto disk."""
    other: float = 0.0
    """Time of the pipeline not attributed to a stage above (block glue)."""


class Executed(_Strict):
    """What actually ran, for the configured-versus-executed check."""

    forward_passes: int
    """Transformer forward calls of the request."""
    attention_backends: list[str]
    """Attention backends diffusers' dispatcher resolved during the request (sorted, unique)."""
    torch_dtype: str
    vae_tiling: bool
    vae_tile: list[int] | None = None
    """[height, width] of the VAE's spatial tile when tiling is on."""
    levers: dict[str, Any] = Field(default_factory=dict)
    """Per-lever telemetry reported by the levers of later recipes (quantized modules, cache hits, ...)."""


class Timings(_Strict):
    stage_anatomy: StageAnatomy
    generation_side_latency_s: float
    """Seed 000's definition: text encode, DiT, both decodes, frame prep and D2H; excludes MP4 mux/save."""
    request_to_file_latency_s: float
    """Seed 002's definition: from the request entering ``generate`` to the finished file on disk."""


class ClipRecord(_Strict):
    """The record of one generated clip."""

    version: int = CLIP_RECORD_VERSION
    """Schema version of this record."""
    request: RequestSpec
    shape: ResolvedShape
    recipe_name: str
    recipe: dict[str, Any]
    """The recipe as resolved (every lever explicit)."""
    recipe_sha256: str
    model: str
    """The preset that ran (``tiny-trained``, ``tiny-random``, ``h3-random``, ...: never the alias ``tiny``, see
    h3.runtime.canonical_model; ``tiny`` in records made before issue 17's switch is the random preset) or the
    checkpoint path."""
    model_sha256: str
    """Hash that identifies the model weights (the tiny preset's config + seed, or the checkpoint's index files)."""
    weights: str | None = None
    """Where the weights came from: ``"random"`` for seeded random weights (the ``h3-random`` presets: speed and memory
    are real, quality is not; ``tiny-random``), ``"checkpoint"`` for a checkpoint directory (the trained tiny preset
    ships as one); None in records written before the field existed."""
    frames_sha256: str
    """sha256 of the raw uint8 frames, (T, H, W, 3) C-order, before encoding."""
    pcm_sha256: str
    """sha256 of the raw int16 PCM, (samples, channels) interleaved, before encoding."""
    mp4_sha256: str
    """sha256 of the MP4 file on disk."""
    mp4_bytes: int
    timings: Timings
    peak_memory_bytes: int | None
    """Peak device memory of the request (CUDA), or None on the CPU where it is not measured."""
    device: str
    executed: Executed
    versions: dict[str, str]
    hardware: dict[str, Any]
    created_at: str
    """UTC ISO-8601 time the record was written."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific fields (e.g. the server's ``inference_time_s`` for the http backend)."""
