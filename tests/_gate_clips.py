"""Helpers of the gate tests: small synthetic runs and pair contexts over real MP4s (PyAV, via h3.media)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gates.base import ClipSide, PairContext, PairRef
from h3.atomic import atomic_write_json, sha256_file
from h3.media import encode_mp4
from h3eval.store import RunStore
from h3eval.synth import make_synthetic_run, moving_square_frames, tone_pcm

FPS, RATE = 24, 32000
NUM_FRAMES, SIZE = 24, 64


def noise_pcm(seconds: float = NUM_FRAMES / FPS, amplitude: float = 0.1, seed: int = 0) -> np.ndarray:
    """Broadband stereo noise, int16 (N, 2): every band of every spectrum has energy."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((int(round(seconds * RATE)), 2)) * amplitude
    return np.ascontiguousarray(np.clip(np.rint(x * 32767), -32768, 32767).astype(np.int16))


def make_run(root: Path, candidates=("candidate",), prompt_ids=("p0",), seeds=(0,), frames_fn=None, audio_fn=None):
    return make_synthetic_run(
        root, candidates=list(candidates), prompt_ids=list(prompt_ids), seeds=list(seeds),
        frames_fn=frames_fn or (lambda recipe, pid, seed: moving_square_frames(NUM_FRAMES, SIZE, seed)),
        audio_fn=audio_fn or (lambda recipe, pid, seed: noise_pcm(seed=seed)),
    )


def rewrite_clip(store: RunStore, recipe: str, prompt_id: str, seed: int, frames, pcm) -> None:
    """Replace one clip's MP4 and keep its record's mp4 hash in step (a clip that was made this way)."""
    mp4 = store.clip_path(recipe, prompt_id, seed)
    encode_mp4(mp4, frames, pcm)
    record_path = store.record_path(recipe, prompt_id, seed)
    record = json.loads(record_path.read_text())
    record["mp4_sha256"] = sha256_file(mp4)
    record["mp4_bytes"] = mp4.stat().st_size
    atomic_write_json(record_path, record)


def pair_context(store: RunStore, candidate: str = "candidate", prompt_id: str = "p0", seed: int = 0,
                 gate: str = "test", options=None) -> PairContext:
    manifest = store.read_manifest()

    def side(recipe):
        return ClipSide(recipe=recipe, mp4=store.clip_path(recipe, prompt_id, seed),
                        record=json.loads(store.record_path(recipe, prompt_id, seed).read_text()))

    artifact_dir = store.gate_dir(gate) / candidate
    artifact_dir.mkdir(parents=True, exist_ok=True)
    return PairContext(
        run_dir=store.root, pair=PairRef(baseline=manifest.baseline, candidate=candidate, prompt_id=prompt_id, seed=seed),
        baseline=side(manifest.baseline), candidate=side(candidate), artifact_dir=artifact_dir,
        options=dict(options or {}),
    )


__all__ = ["make_run", "rewrite_clip", "pair_context", "noise_pcm", "moving_square_frames", "tone_pcm", "FPS", "RATE",
           "NUM_FRAMES", "SIZE"]


def copy_clip(store: RunStore, src: str, dst: str, prompt_id: str = "p0", seed: int = 0) -> None:
    """Give ``dst`` a byte-identical copy of ``src``'s MP4, keeping ``dst``'s raw-frame and PCM hashes.

    The runner then sees two different generations (no identical-pair short cut) whose decoded media are equal:
    what a gate computes from the decoded media must be exactly zero difference.
    """
    mp4 = store.clip_path(dst, prompt_id, seed)
    mp4.write_bytes(store.clip_path(src, prompt_id, seed).read_bytes())
    record_path = store.record_path(dst, prompt_id, seed)
    record = json.loads(record_path.read_text())
    record["mp4_sha256"] = sha256_file(mp4)
    record["mp4_bytes"] = mp4.stat().st_size
    atomic_write_json(record_path, record)


def blip_split_opening_frames() -> np.ndarray:
    """Session 28's still opening, planted: still for frames 0-16, then the square moves; half of frame 4 one level up
    (about 0.5 levels of mean change, like the tiny VAE's blip every 4 frames), which splits the still so that its
    frozen run starts at frame 5."""
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[0:17] = frames[0]
    blip = frames[4].astype(np.int16)
    blip[: SIZE // 2] += 1
    frames[4] = np.clip(blip, 0, 255).astype(np.uint8)
    return frames
