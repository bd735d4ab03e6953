"""Backends: what produces a clip for a (recipe, request).

Every backend writes the MP4 and its :class:`~h3.record.ClipRecord` (same name, ``.json``) atomically and returns
the record; a failure leaves no file behind and raises :class:`BackendError` (or the runtime's own error).

- ``inprocess``: the h3 runtime in this process (``inprocess.py``).
- ``http``: any server of the OpenAI-style videos API with SGLang's field names, ours included (``http.py``).
- ``folder``: clips made by another stack, imported with ``h3eval import`` (``folder.py``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Protocol

from h3.atomic import atomic_write_json, sha256_file
from h3.record import ClipRecord, Executed, RequestSpec, ResolvedShape, StageAnatomy, Timings
from h3.recipe import Recipe
from h3.runtime import GenerateRequest


class BackendError(RuntimeError):
    """A backend could not produce a clip (server unreachable, job failed, download cut short, timeout...)."""


class Backend(Protocol):
    name: str
    concurrency: int
    """How many requests this backend can usefully have in flight (one per server for ``http``)."""

    def generate(self, recipe: Recipe, request: GenerateRequest, out: Path, extra: dict | None = None) -> ClipRecord:
        """Write ``out`` (.mp4) and ``out.with_suffix('.json')`` (its record) atomically; return the record."""

    def close(self) -> None:
        """Release what the backend holds (runtimes, connections)."""


def remove_clip(out: Path) -> None:
    """Remove a clip and its record (a clip that must not count, e.g. it ran something other than its recipe)."""
    Path(out).with_suffix(".json").unlink(missing_ok=True)
    Path(out).with_suffix(".traj.npz").unlink(missing_ok=True)
    Path(out).unlink(missing_ok=True)


def foreign_record(
    mp4: Path,
    *,
    recipe_name: str,
    recipe: dict[str, Any],
    request: RequestSpec,
    model: str,
    generation_side_latency_s: float | None,
    request_to_file_latency_s: float | None,
    peak_memory_bytes: int | None,
    device: str,
    extra: dict[str, Any],
) -> ClipRecord:
    """A record for a clip whose producer did not report a record of its own (a foreign server, a folder).

    The producer's raw frames are not visible, so the frame and PCM hashes are of the *decoded* MP4
    (``extra["hash_source"] = "decoded"``): comparable between two foreign clips, never with a raw hash. Fields
    the producer did not report are listed in ``extra["unreported"]``; ClipRecord requires them, so they hold
    zeros that no summary reads (speed summaries skip unreported anatomy; the configured-versus-executed check
    reports such a record as unverified, never as passing).
    """
    import numpy as np

    from h3 import provenance
    from h3.media import decode_audio, decode_video

    frames, fps = decode_video(mp4)
    audio, rate = decode_audio(mp4)
    pcm = np.ascontiguousarray(np.rint(np.clip(audio, -1, 1) * 32767.0).astype(np.int16).T)
    unreported = ["stage_anatomy", "executed", "shape.num_latent_frames", "shape.num_audio_latents",
                  "shape.num_text_tokens", "shape.sequence_length"]
    if generation_side_latency_s is None:
        unreported.append("timings.generation_side_latency_s")
    if request_to_file_latency_s is None:
        unreported.append("timings.request_to_file_latency_s")
    return ClipRecord(
        request=request,
        shape=ResolvedShape(
            num_frames=int(frames.shape[0]), height=int(frames.shape[1]), width=int(frames.shape[2]),
            fps=int(round(fps)), duration_s=frames.shape[0] / fps if fps else 0.0, num_latent_frames=0,
            num_audio_latents=0, audio_sample_rate=int(rate), audio_channels=int(pcm.shape[1]),
            num_audio_samples=int(pcm.shape[0]), num_text_tokens=0, sequence_length=0,
        ),
        recipe_name=recipe_name,
        recipe=recipe,
        recipe_sha256=hashlib.sha256(repr(sorted(recipe.items())).encode()).hexdigest(),
        model=model,
        model_sha256="",
        frames_sha256=hashlib.sha256(frames.tobytes()).hexdigest(),
        pcm_sha256=hashlib.sha256(pcm.tobytes()).hexdigest(),
        mp4_sha256=sha256_file(mp4),
        mp4_bytes=os.path.getsize(mp4),
        timings=Timings(
            stage_anatomy=StageAnatomy(text_encode=0.0, denoise_steps=[], denoise=0.0, video_decode=0.0,
                                       audio_decode=0.0, frame_prep_d2h=0.0, mux_save=0.0),
            generation_side_latency_s=generation_side_latency_s or 0.0,
            request_to_file_latency_s=request_to_file_latency_s or 0.0,
        ),
        peak_memory_bytes=peak_memory_bytes,
        device=device,
        executed=Executed(forward_passes=0, attention_backends=[], torch_dtype="unreported", vae_tiling=False),
        versions=provenance.versions(),
        hardware={},
        created_at=provenance.utc_now(),
        extra={"hash_source": "decoded", "unreported": unreported, **extra},
    )


def is_unreported(record: ClipRecord, field: str) -> bool:
    return field in (record.extra or {}).get("unreported", [])


def write_record(out: Path, record: ClipRecord) -> None:
    atomic_write_json(Path(out).with_suffix(".json"), record.model_dump(mode="json"))
