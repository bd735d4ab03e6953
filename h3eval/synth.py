"""Synthetic run directories: real MP4s and valid records made from given frames, without the model.

For tests and benchmarks of everything downstream of generation (gates, statistics, dashboard) that need a run of
a known content (a planted ghost, a known delay) or of a size the tiny model would not make quickly.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path
from typing import Callable

import numpy as np

from h3.atomic import atomic_write_json, sha256_file
from h3.media import encode_mp4
from h3.record import ClipRecord, Executed, RequestSpec, ResolvedShape, StageAnatomy, Timings
from h3eval.store import PromptSuiteRef, RunManifest, RunStore, utc_now

FramesFn = Callable[[str, str, int], np.ndarray]
AudioFn = Callable[[str, str, int], np.ndarray]
TimingFn = Callable[[str, str, int], float]


def synthetic_record(
    recipe: str,
    prompt_id: str,
    seed: int,
    frames: np.ndarray,
    pcm: np.ndarray,
    mp4: Path,
    latency_s: float = 1.0,
    fps: int = 24,
    sample_rate: int = 32000,
    prompt: str | None = None,
) -> ClipRecord:
    """A valid record for a clip made outside the runtime; the stage anatomy splits ``latency_s`` plausibly."""
    num_frames, height, width, _ = frames.shape
    steps = 4
    anatomy = StageAnatomy(
        text_encode=0.02 * latency_s,
        denoise_steps=[0.85 * latency_s / steps] * steps,
        denoise=0.85 * latency_s,
        video_decode=0.08 * latency_s,
        audio_decode=0.01 * latency_s,
        frame_prep_d2h=0.04 * latency_s,
        mux_save=0.05 * latency_s,
    )
    return ClipRecord(
        request=RequestSpec(prompt=prompt or f"synthetic prompt {prompt_id}", prompt_id=prompt_id, seed=seed,
                            num_frames=num_frames, height=height, width=width),
        shape=ResolvedShape(
            num_frames=num_frames, height=height, width=width, fps=fps, duration_s=num_frames / fps,
            num_latent_frames=0, num_audio_latents=0, audio_sample_rate=sample_rate, audio_channels=2,
            num_audio_samples=int(pcm.shape[0]), num_text_tokens=0, sequence_length=0,
        ),
        recipe_name=recipe,
        recipe={"name": recipe, "synthetic": True},
        recipe_sha256=hashlib.sha256(recipe.encode()).hexdigest(),
        model="synthetic",
        model_sha256="0" * 64,
        frames_sha256=hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest(),
        pcm_sha256=hashlib.sha256(np.ascontiguousarray(pcm).tobytes()).hexdigest(),
        mp4_sha256=sha256_file(mp4),
        mp4_bytes=mp4.stat().st_size,
        timings=Timings(
            stage_anatomy=anatomy,
            generation_side_latency_s=latency_s * 0.95,
            request_to_file_latency_s=latency_s,
        ),
        peak_memory_bytes=None,
        device="synthetic",
        executed=Executed(forward_passes=steps, attention_backends=["native"], torch_dtype="float32", vae_tiling=True),
        versions={},
        hardware={"machine": platform.machine()},
        created_at=utc_now(),
    )


def make_synthetic_run(
    root: str | Path,
    baseline: str = "baseline",
    candidates: list[str] | tuple[str, ...] = ("candidate",),
    prompt_ids: list[str] | tuple[str, ...] = ("p0",),
    seeds: list[int] | tuple[int, ...] = (0,),
    frames_fn: FramesFn | None = None,
    audio_fn: AudioFn | None = None,
    latency_fn: TimingFn | None = None,
    prompt_fn: Callable[[str], str] | None = None,
    images_fn: Callable[[str], dict] | None = None,
) -> RunStore:
    """Write a complete run: manifest and every (recipe, prompt, seed) clip with a valid record.

    ``images_fn(prompt_id)``: the prompt's image inputs by role (h3.conditioning.ImageInput), kept in the run and
    named in each record, as if the clips were fl2va / ref2va generations."""
    store = RunStore(root)
    recipes = [baseline, *candidates]
    frames_fn = frames_fn or _default_frames
    audio_fn = audio_fn or _default_audio
    latency_fn = latency_fn or (lambda recipe, pid, seed: 2.0 if recipe == baseline else 1.0)
    now = utc_now()
    manifest = RunManifest(
        kind="generate", created_at=now, updated_at=now, model="synthetic", backend="folder",
        baseline=baseline, candidates=list(candidates),
        recipes={r: {"name": r, "synthetic": True} for r in recipes},
        recipe_sha256={r: hashlib.sha256(r.encode()).hexdigest() for r in recipes},
        prompts=PromptSuiteRef(path="synthetic", sha256="0" * 64, ids=list(prompt_ids)),
        seeds=list(seeds),
    )
    store.write_manifest(manifest)
    for pid in prompt_ids:
        for seed in seeds:
            for recipe in recipes:
                frames = frames_fn(recipe, pid, seed)
                pcm = audio_fn(recipe, pid, seed)
                mp4 = store.clip_path(recipe, pid, seed)
                encode_mp4(mp4, frames, pcm)
                record = synthetic_record(recipe, pid, seed, frames, pcm, mp4, latency_s=latency_fn(recipe, pid, seed),
                                          prompt=prompt_fn(pid) if prompt_fn else None)
                if images_fn is not None:
                    from h3.runtime import GenerateRequest

                    request = GenerateRequest(prompt="synthetic", seed=seed, **images_fn(pid))
                    for image in request.images().values():
                        store.save_input(image)
                    record.request.workflow = request.workflow
                    record.request.conditioning = request.conditioning_spec()
                atomic_write_json(store.record_path(recipe, pid, seed), record.model_dump(mode="json"))
    manifest.status = "complete"
    store.write_manifest(manifest)
    return store


def moving_square_frames(num_frames: int = 24, size: int = 64, seed: int = 0) -> np.ndarray:
    """A textured square moving over a gradient: smooth, moving content like a generated clip's."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    background = (40 + 120 * xx / size + 40 * yy / size)[..., None] * np.array([1.0, 0.8, 0.6])
    texture = rng.integers(120, 255, size=(size // 4, size // 4, 3))
    frames = np.empty((num_frames, size, size, 3), dtype=np.uint8)
    for t in range(num_frames):
        frame = background.copy()
        x0 = (4 + 2 * t) % (size - size // 4)
        y0 = size // 3
        frame[y0 : y0 + size // 4, x0 : x0 + size // 4] = texture
        frames[t] = np.clip(frame, 0, 255).astype(np.uint8)
    return frames


def tone_pcm(seconds: float, freq: float = 440.0, amplitude: float = 0.25, sample_rate: int = 32000) -> np.ndarray:
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    left = amplitude * np.sin(2 * np.pi * freq * t)
    right = amplitude * np.sin(2 * np.pi * freq * 1.5 * t)
    return np.ascontiguousarray((np.stack([left, right], axis=1) * 32767).astype(np.int16))


def _default_frames(recipe: str, prompt_id: str, seed: int) -> np.ndarray:
    return moving_square_frames(seed=seed)


def _default_audio(recipe: str, prompt_id: str, seed: int) -> np.ndarray:
    return tone_pcm(24 / 24)
