"""The runtime on the tiny presets: which preset each name loads, streams of a generated clip, determinism,
save/load round trip, records (on the random preset, ``tiny-random``: byte-level facts that a retrained checkpoint
would change)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from h3.media import decode_audio, decode_video, probe
from h3.record import ClipRecord
from h3.runtime import (
    CheckpointError,
    GenerateRequest,
    H3Runtime,
    RequestError,
    check_checkpoint_dir,
    resolve_request,
    canonical_model,
    snap_num_frames,
)


def test_tiny_is_the_trained_preset_and_every_record_says_which_preset_ran(tiny_random_runtime, fast_recipe,
                                                                             tmp_path):
    """``tiny`` (the default) and its alias ``tiny-trained`` load the shipped trained checkpoint; ``tiny-random`` the
    seeded one. A runtime, and so every record and server id, names the preset that ran, never the alias."""
    from h3 import tiny
    from h3.tiny_trained import trained_identity

    assert [canonical_model(m) for m in ("tiny", "tiny-trained", "tiny-random", "h3-random", "/ckpt")] == [
        "tiny-trained", "tiny-trained", "tiny-random", "h3-random", "/ckpt"]
    trained = H3Runtime.load("tiny", fast_recipe, "cpu")
    assert trained.model == "tiny-trained" and trained.model_sha256 == trained_identity()
    assert trained.weights == "checkpoint" and trained.default_size == (128, 128)
    assert H3Runtime.load("tiny-trained", fast_recipe, "cpu").model_sha256 == trained.model_sha256
    assert tiny_random_runtime.model == "tiny-random" and tiny_random_runtime.weights == "random"
    assert tiny_random_runtime.model_sha256 == tiny.tiny_identity() != trained.model_sha256
    record = trained.generate(GenerateRequest(prompt="a red circle moves left to right while a low tone hums; the "
                                                     "background is plain", seed=0), tmp_path / "t.mp4")
    assert (record.model, record.weights, record.model_sha256) == ("tiny-trained", "checkpoint", trained.model_sha256)


@pytest.fixture(scope="module")
def raw_and_clip(tiny_random_runtime, tmp_path_factory):
    """One clip, and the raw uint8 frames and int16 PCM the runtime handed to the muxer (captured on the way)."""
    import h3.runtime as runtime_module

    out = tmp_path_factory.mktemp("clip") / "a.mp4"
    raw = {}
    encode = runtime_module.encode_mp4

    def capture(path, frames, pcm, **kwargs):
        raw["frames"], raw["pcm"] = np.array(frames, copy=True), np.array(pcm, copy=True)
        return encode(path, frames, pcm, **kwargs)

    runtime_module.encode_mp4 = capture
    try:
        record = tiny_random_runtime.generate(GenerateRequest(prompt="A person is squat", seed=0, prompt_id="squat"),
                                              out)
    finally:
        runtime_module.encode_mp4 = encode
    return out, record, raw


@pytest.fixture(scope="module")
def clip(raw_and_clip):
    out, record, _ = raw_and_clip
    return out, record


def test_tiny_clip_streams(clip):
    out, record = clip
    info = probe(out)
    # 5 s is the shortest H3 request: 120 frames snap up to 17*7+5 = 124.
    assert info["num_frames"] == 124 == record.shape.num_frames
    assert info["fps"] == 24.0
    assert (info["height"], info["width"]) == (128, 128)
    assert info["audio_sample_rate"] == 32000 and info["audio_channels"] == 2
    assert abs(info["duration_s"] - 124 / 24) < 1e-9
    # Audio length matches the video within one frame (AAC pads to whole 1024-sample frames).
    assert abs(info["num_audio_samples"] - 32000 * 124 / 24) <= 32000 / 24
    # The generated PCM is 40 audio latents per second at a hop of 800 samples.
    assert record.shape.num_audio_samples == record.shape.num_audio_latents * 800
    assert record.shape.num_audio_latents == round(124 / 24 * 40)


def test_record_matches_file(clip):
    out, record = clip
    on_disk = ClipRecord.model_validate_json(out.with_suffix(".json").read_text())
    assert on_disk == record
    assert on_disk.mp4_sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    assert on_disk.mp4_bytes == out.stat().st_size
    assert on_disk.request.seed == 0 and on_disk.request.prompt_id == "squat"


def test_stage_anatomy_is_consistent(clip):
    _, record = clip
    anatomy, timings = record.timings.stage_anatomy, record.timings
    assert len(anatomy.denoise_steps) == record.executed.forward_passes == 2
    assert anatomy.denoise >= sum(anatomy.denoise_steps)
    stages = anatomy.text_encode + anatomy.denoise + anatomy.video_decode + anatomy.audio_decode
    assert all(v > 0 for v in (anatomy.text_encode, anatomy.video_decode, anatomy.audio_decode, anatomy.mux_save))
    # Generation side excludes mux/save; request-to-file includes it.
    assert stages + anatomy.frame_prep_d2h <= timings.generation_side_latency_s + 1e-6
    assert timings.generation_side_latency_s + anatomy.mux_save <= timings.request_to_file_latency_s + 1e-6
    assert record.executed.attention_backends == ["native"]
    assert record.executed.torch_dtype == "float32"


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255.0**2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def test_decoded_frames_are_close_to_the_hashed_raw_frames(raw_and_clip):
    """The MP4 is a faithful encoding of the raw frames the record hashes: codec noise only, within stated bounds.

    Bounds (x264 CRF 18 yuv420p, AAC 192 kb/s; measured on this clip: 19.4 dB, 37.3 dB after 4x4 averaging, mean
    error -1.0 to -1.4 levels per channel, audio SNR 40.7 dB). The tiny preset's random-weight frames are close to
    noise, so the full-resolution PSNR is low while the 4x4-averaged picture, which carries the content, is near
    exact; a frame shifted by one (another raw frame) is at 14.5 dB."""
    out, record, raw = raw_and_clip
    frames, pcm = raw["frames"], raw["pcm"]
    assert hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest() == record.frames_sha256
    assert hashlib.sha256(np.ascontiguousarray(pcm).tobytes()).hexdigest() == record.pcm_sha256
    decoded, _ = decode_video(out)
    assert decoded.shape == frames.shape == (124, 128, 128, 3)
    assert _psnr(decoded, frames) >= 18.0

    def box4(x):
        t, h, w, c = x.shape
        return x.astype(np.float64).reshape(t, h // 4, 4, w // 4, 4, c).mean(axis=(2, 4))

    assert _psnr(box4(decoded), box4(frames)) >= 35.0
    bias = (decoded.astype(np.float64) - frames).mean(axis=(0, 1, 2))
    assert np.all(np.abs(bias) <= 2.0), bias
    # Every decoded frame is nearest to its own raw frame: none dropped, duplicated or reordered.
    d, f = (x.reshape(len(x), -1).astype(np.float32) for x in (decoded, frames))
    distances = (d * d).sum(1)[:, None] - 2 * d @ f.T + (f * f).sum(1)[None, :]
    assert np.array_equal(distances.argmin(axis=1), np.arange(len(frames)))

    audio, rate = decode_audio(out)
    reference = pcm.T.astype(np.float32) / 32768.0
    n = reference.shape[1]
    assert rate == 32000 and audio.shape[0] == 2 and n <= audio.shape[1] <= n + 1024  # AAC pads the last frame
    snr = 10 * np.log10(np.mean(reference**2) / np.mean((audio[:, :n] - reference) ** 2))
    assert snr >= 35.0, snr


def test_same_request_is_byte_identical(tiny_random_runtime, tmp_path, clip):
    out, record = clip
    again = tiny_random_runtime.generate(GenerateRequest(prompt="A person is squat", seed=0, prompt_id="squat"),
                                         tmp_path / "b.mp4")
    assert (tmp_path / "b.mp4").read_bytes() == out.read_bytes()
    assert (again.frames_sha256, again.pcm_sha256) == (record.frames_sha256, record.pcm_sha256)
    other = tiny_random_runtime.generate(GenerateRequest(prompt="A person is squat", seed=1), tmp_path / "c.mp4")
    assert other.frames_sha256 != record.frames_sha256 and other.pcm_sha256 != record.pcm_sha256


def test_save_load_round_trip_is_byte_identical(tiny_random_runtime, fast_recipe, tmp_path, clip):
    out, _ = clip
    tiny_random_runtime.save_pretrained(tmp_path / "ckpt")
    for name in ("transformer", "vae", "audio_vae", "text_encoder", "tokenizer", "processor", "scheduler",
                 "audio_scheduler"):
        assert (tmp_path / "ckpt" / name).is_dir()
    reloaded = H3Runtime.from_pretrained(tmp_path / "ckpt", fast_recipe, "cpu", _default_size=(128, 128))
    reloaded.generate(GenerateRequest(prompt="A person is squat", seed=0, prompt_id="squat"), tmp_path / "r.mp4")
    assert (tmp_path / "r.mp4").read_bytes() == out.read_bytes()


def test_missing_checkpoint_file_is_named(tiny_random_runtime, fast_recipe, tmp_path):
    tiny_random_runtime.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"vae/diffusion_pytorch_model\.safetensors"):
        H3Runtime.from_pretrained(tmp_path / "ckpt", fast_recipe, "cpu")
    with pytest.raises(CheckpointError, match="does not exist"):
        check_checkpoint_dir(tmp_path / "nowhere")


def test_sharded_checkpoint_names_missing_shard(tiny_random_runtime, tmp_path):
    tiny_random_runtime.save_pretrained(tmp_path / "ckpt")
    folder = tmp_path / "ckpt" / "transformer"
    (folder / "diffusion_pytorch_model.safetensors").rename(folder / "part-00001.safetensors")
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "part-00001.safetensors", "b": "part-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="part-00002.safetensors") as excinfo:
        check_checkpoint_dir(tmp_path / "ckpt")
    assert "part-00001" not in str(excinfo.value)


@pytest.mark.parametrize("num_frames,expected", [(1, None), (120, 124), (124, 124), (125, 141), (345, 345), (346, None)])
def test_frame_snapping_and_duration_limits(num_frames, expected):
    request = GenerateRequest(prompt="x", seed=0, num_frames=num_frames)
    if expected is None:
        with pytest.raises(RequestError, match="5 to 15 s"):
            resolve_request(request, (64, 64))
    else:
        assert resolve_request(request, (64, 64))[0] == expected == snap_num_frames(num_frames)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(seed=-1), "non-negative"),
        (dict(height=70, width=64), "multiple of 32"),
        (dict(height=64, width=0), "multiple of 32"),
        (dict(height=64), "together"),
        (dict(seconds=3.0), "5 to 15 s"),
        (dict(seconds=16.0), "5 to 15 s"),
        (dict(seconds=5.0, num_frames=124), "not both"),
        (dict(height=32, width=256), "aspect ratio"),
    ],
)
def test_bad_requests(kwargs, match):
    base = dict(prompt="x", seed=0)
    base.update(kwargs)
    with pytest.raises(RequestError, match=match):
        resolve_request(GenerateRequest(**base), (64, 64))


def test_seconds_resolve_like_frames():
    # 10 s -> 240 frames -> 17*14+5 = 243.
    assert resolve_request(GenerateRequest(prompt="x", seed=0, seconds=10.0), (64, 64))[0] == 243


def test_records_carry_the_one_time_model_load_by_part(tmp_path):
    """Every record says where the process's one-time load went (``extra["model_load_s"]``: reading the weights,
    placing the components, applying the levers): parts that are finite, non-negative and sum to no more than the
    load's wall time measured around it here."""
    import math
    import time

    from h3.recipe import load_recipe
    from h3.runtime import GenerateRequest, H3Runtime

    t0 = time.perf_counter()
    runtime = H3Runtime.load("tiny-random", load_recipe("baseline"), "cpu")
    wall = time.perf_counter() - t0
    record = runtime.generate(GenerateRequest(prompt="a cat", seed=0, num_frames=120), tmp_path / "a.mp4")
    parts = record.extra["model_load_s"]
    assert set(parts) == {"read_weights_s", "placement_s", "levers_s"}
    assert all(math.isfinite(v) and v >= 0 for v in parts.values())
    assert 0 < sum(parts.values()) <= wall + 0.01 and parts["read_weights_s"] > 0
