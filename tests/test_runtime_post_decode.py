"""The request's path from the video decode to the MP4 (h3.post_decode): device rounding against the numpy reference,
the streaming decode against diffusers' own decode, the streaming writer against encode_mp4 byte for byte, and the
runtime's streamed clip against its whole-video clip (same MP4 bytes, same record hashes), a planted bad frame
falling back to the whole-video path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.lib.media import textured_frames
from h3.anatomy import StageClock
from h3.media import decode_video, encode_mp4, frames_to_uint8, pcm_to_int16
from h3.post_decode import (MAX_PAD_FRAMES, FrameStream, Mp4StreamWriter, _decode_mirror, frames_uint8, pcm_int16,
                            stream_refusal, streaming_decode)
from h3.request import GenerateRequest


def _exact_half_values(n: int) -> np.ndarray:
    """float32 values x with float32(x * 255) exactly k + 0.5 (k = 0..n-1): the ties that round half to even decides."""
    out = []
    for k in range(n):
        x = np.float32((k + 0.5) / 255.0)
        for _ in range(64):
            product = np.float32(x * np.float32(255.0))
            if product == k + 0.5:
                out.append(x)
                break
            x = np.nextafter(x, np.float32(np.inf) if product < k + 0.5 else np.float32(-np.inf), dtype=np.float32)
    return np.array(out, np.float32)


def test_device_rounding_is_frames_to_uint8_half_to_even():
    """frames_uint8 (torch, channel-first in, channel-last out) against h3.media.frames_to_uint8 (np.rint: half to
    even), on random values, planted exact ties and values outside [0, 1]."""
    halves = _exact_half_values(255)
    assert len(halves) >= 200  # most ties are representable; each found one is a tie for both paths
    rng = np.random.default_rng(0)
    values = np.concatenate([halves, rng.random(4 * 6 * 8 * 3 - len(halves) - 4, dtype=np.float32),
                             np.array([-0.3, 1.7, 0.0, 1.0], np.float32)])
    video = values.reshape(4, 6, 8, 3)  # (T, H, W, 3)
    expected = frames_to_uint8(video)
    got = frames_uint8(torch.from_numpy(video).permute(0, 3, 1, 2)).numpy()
    assert got.dtype == np.uint8 and got.shape == video.shape
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    ties = expected.reshape(-1)[:len(halves)].astype(int)
    assert np.all(ties % 2 == 0)  # every tie went to the even neighbour, so the planted ties did test the rule
    audio = np.array([[-1.2, -0.5, 0.25, 1.0, 0.5 / 32767], [0.9, -1.0, 3.0, 0.0, 1.5 / 32767]], np.float32)
    assert np.array_equal(pcm_int16(torch.from_numpy(audio)).numpy(), pcm_to_int16(audio))


@pytest.fixture(scope="module")
def tiny_vae():
    from diffusers import AutoencoderKLMiniMaxH3

    from h3.tiny import VAE_CONFIG

    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3(**VAE_CONFIG).eval()
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_min_overlap_height=16,
                      tile_sample_min_overlap_width=16)  # spatial tiles too, at 128x96
    return vae


@pytest.mark.parametrize("latent_frames", [7, 12, 32, 33])
def test_streaming_decode_is_diffusers_decode(tiny_vae, latent_frames):
    """The mirror returns diffusers' _decode output bit for bit; the runs it emits are that output in order, then at
    most the trailing pad the decode cuts off (7, 12, 32 and 33 latent frames: with and without pad, one chunk and
    several)."""
    assert stream_refusal(tiny_vae) is None  # the installed diffusers' _decode is the mirrored source
    z = torch.randn(1, 24, latent_frames, 8, 6, generator=torch.Generator().manual_seed(latent_frames))
    with torch.no_grad():
        reference = tiny_vae._decode(z)
        runs = []
        with streaming_decode(tiny_vae, runs.append):
            streamed = tiny_vae.decode(z, return_dict=False)[0]
    assert "_decode" not in vars(tiny_vae)
    assert torch.equal(streamed, reference)
    emitted = torch.cat(runs, dim=2)
    n = reference.shape[2]
    assert len(runs) >= 2 and 0 <= emitted.shape[2] - n <= MAX_PAD_FRAMES
    assert torch.equal(emitted[:, :, :n], reference)


def test_stream_refused_where_decode_is_not_the_mirrored_one(tiny_vae):
    tiny_vae._decode = lambda z: z
    try:
        assert "replaced on the instance" in stream_refusal(tiny_vae)
    finally:
        del tiny_vae._decode


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(int(32000 * seconds)) / 32000.0
    tone = 0.3 * np.sin(2 * np.pi * 440.0 * t) + 0.4 * (np.arange(len(t)) % 8000 < 40)
    return np.ascontiguousarray(np.stack([tone, 0.5 * tone], axis=1) * 32767.0).astype(np.int16)


@pytest.mark.parametrize("height,width,frames,chunks,early_audio", [(128, 128, 30, (17, 1, 12), False),
                                                                    (128, 128, 30, (17, 13), True),
                                                                    (544, 960, 24, (17, 7), True)])
def test_streaming_writer_writes_encode_mp4s_bytes(tmp_path, height, width, frames, chunks, early_audio):
    """Frames put in uneven chunks, the PCM given before the first frame or at the end: the file is encode_mp4's, byte
    for byte, at the one-thread size and at the large one (8 x264 frame threads, 8 conversion threads, 24 frames: past
    the conversion's look-ahead of 16)."""
    video, pcm = textured_frames(frames, height, width), _tone(frames / 24)
    writer = Mp4StreamWriter(tmp_path / "streamed.mp4", frames, height, width)
    if early_audio:
        writer.start_audio(pcm)
    start = 0
    for size in chunks:
        writer.put(video[start:start + size])
        start += size
    writer.finish(pcm)
    encode_mp4(tmp_path / "whole.mp4", video, pcm)
    assert (tmp_path / "streamed.mp4").read_bytes() == (tmp_path / "whole.mp4").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed.mp4", "whole.mp4"]


def test_streaming_writer_errors_leave_no_file(tmp_path, monkeypatch):
    import av

    video = textured_frames(8, 64, 64)
    writer = Mp4StreamWriter(tmp_path / "a.mp4", 8, 64, 64)
    writer.put(video[:5])
    with pytest.raises(ValueError, match="9 frames queued for a 8-frame clip"):
        writer.put(video[:4])
    with pytest.raises(Exception, match="5 of 8 frames were streamed"):
        writer.finish(_tone(0.5))

    def broken(*args, **kwargs):
        raise ValueError("planted audio failure")

    writer = Mp4StreamWriter(tmp_path / "b.mp4", 8, 64, 64)
    writer.put(video)
    monkeypatch.setattr(av.AudioFrame, "from_ndarray", broken)
    with pytest.raises(ValueError, match="planted audio failure"):
        writer.finish(_tone(0.5))
    monkeypatch.undo()
    writer = Mp4StreamWriter(tmp_path / "d.mp4", 8, 64, 64)
    writer.start_audio(_tone(0.5))
    writer.put(video)
    with pytest.raises(Exception, match="PCM differs"):
        writer.finish(_tone(0.5) // 2)
    writer = Mp4StreamWriter(tmp_path / "c.mp4", 8, 64, 64)
    writer.put(video[:3])
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_nested_interval_is_taken_out_of_the_outer_stage():
    clock = StageClock(device=torch.device("cpu"))
    clock.intervals = [("video_decode", 1.0, 5.0), ("frame_prep_d2h", 2.0, 2.5), ("frame_prep_d2h", 4.0, 4.25),
                       ("frame_prep_d2h", 6.0, 7.0)]  # the last one is outside the decode: not taken out
    assert clock.exclusive("video_decode", "frame_prep_d2h") == 4.0 - 0.75
    with clock.stage("video_decode"):
        with clock.nested("frame_prep_d2h"):
            pass
        assert clock.active == "video_decode"
    (name, start, end), (outer, o_start, o_end) = clock.intervals[-2:]
    assert (name, outer) == ("frame_prep_d2h", "video_decode") and o_start <= start <= end <= o_end


def _generate(runtime, path, stream_mux):
    runtime.stream_mux = stream_mux
    try:
        return runtime.generate(GenerateRequest(prompt="A person is squat", seed=0, prompt_id="squat"), path)
    finally:
        runtime.stream_mux = None


@pytest.fixture(scope="module")
def whole(tiny_random_runtime, tmp_path_factory):
    """The tiny preset's clip without the stream: its path and record."""
    path = tmp_path_factory.mktemp("whole") / "whole.mp4"
    return path, _generate(tiny_random_runtime, path, False)


def test_streamed_request_writes_the_whole_video_requests_bytes(tiny_random_runtime, tmp_path, whole):
    """The tiny preset's 124-frame clip (8 decode chunks), streamed and not: the same MP4 bytes and record hashes; the
    streamed record says so and its frame preparation is taken out of the decode's time."""
    audio_decode_before = vars(tiny_random_runtime.pipe.audio_vae).get("decode")
    whole_path, whole = whole
    streamed = _generate(tiny_random_runtime, tmp_path / "streamed.mp4", True)
    assert (tmp_path / "streamed.mp4").read_bytes() == whole_path.read_bytes()
    assert (streamed.frames_sha256, streamed.pcm_sha256, streamed.mp4_sha256) == (
        whole.frames_sha256, whole.pcm_sha256, whole.mp4_sha256)
    frames, _ = decode_video(tmp_path / "streamed.mp4")
    assert frames.shape == (124, 128, 128, 3)
    assert whole.extra["post_decode"] == {"streamed": False, "why_not": "H3_STREAM_MUX=0"}
    info = streamed.extra["post_decode"]
    assert info["streamed"] is True and info["chunks"] == 8 and info["audio_first"] is True and "fallback" not in info
    assert info["checked_frames"] == 16 and info["encode_busy_s"] > 0
    anatomy = streamed.timings.stage_anatomy
    assert anatomy.video_decode > 0 and anatomy.frame_prep_d2h > 0 and anatomy.mux_save > 0
    assert (streamed.timings.generation_side_latency_s + anatomy.mux_save
            <= streamed.timings.request_to_file_latency_s + 1e-6)
    stages = anatomy.text_encode + anatomy.denoise + anatomy.video_decode + anatomy.audio_decode
    assert stages + anatomy.frame_prep_d2h <= streamed.timings.generation_side_latency_s + 1e-6
    assert anatomy.denoise >= sum(anatomy.denoise_steps)
    assert list(tiny_random_runtime.pipe._blocks.sub_blocks["decode"].sub_blocks) == ["video", "audio"]  # restored
    assert vars(tiny_random_runtime.pipe.audio_vae).get("decode") is audio_decode_before  # the wrapper removed
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_bad_streamed_frame_falls_back_to_the_whole_video_path(tiny_random_runtime, tmp_path, monkeypatch, whole):
    """A planted defect (one streamed frame at a chunk boundary changed after its copy) fails the check: the streamed
    file is dropped and the whole-video path writes the same bytes as without streaming."""
    original = FrameStream.on_chunk

    def corrupt(self, chunk):
        original(self, chunk)
        if len(self.bounds) == 3:
            self.frames[self.bounds[-1]] ^= 1

    monkeypatch.setattr(FrameStream, "on_chunk", corrupt)
    planted = _generate(tiny_random_runtime, tmp_path / "planted.mp4", True)
    monkeypatch.undo()
    whole_path, whole = whole
    info = planted.extra["post_decode"]
    assert info["streamed"] is False and "differ from the pipeline's output" in info["fallback"]
    assert (tmp_path / "planted.mp4").read_bytes() == whole_path.read_bytes()
    assert planted.frames_sha256 == whole.frames_sha256


def test_a_different_early_pcm_falls_back_to_the_whole_video_path(tiny_random_runtime, tmp_path, monkeypatch, whole):
    """A planted defect in the PCM encoding since the audio decode (one sample changed) fails the check at the end: the
    clip is written by the whole-video path, the bytes of the unstreamed request."""
    original = Mp4StreamWriter.start_audio

    def perturbed(self, pcm):
        pcm = pcm.copy()
        pcm[100, 0] ^= 1
        original(self, pcm)

    monkeypatch.setattr(Mp4StreamWriter, "start_audio", perturbed)
    planted = _generate(tiny_random_runtime, tmp_path / "planted.mp4", True)
    monkeypatch.undo()
    assert "PCM encoding since the audio decode differs" in planted.extra["post_decode"]["fallback"]
    assert (tmp_path / "planted.mp4").read_bytes() == whole[0].read_bytes()
    assert planted.pcm_sha256 == whole[1].pcm_sha256


def test_auto_streams_only_where_a_device_decodes_large_frames(tiny_random_runtime, tmp_path, monkeypatch):
    """H3_STREAM_MUX: auto (None) streams on a GPU from 320x320 (on the CPU the decode competes with the encoder for
    the same cores); 1 and 0 force it; anything else is an error."""
    from h3.anatomy import StageClock
    from h3.runtime import _stream_mux_setting

    assert [_stream_mux_setting(v) for v in ("auto", "1", "0", " AUTO ")] == [None, True, False, None]
    with pytest.raises(ValueError, match="H3_STREAM_MUX must be auto, 0 or 1"):
        _stream_mux_setting("yes")
    clock = StageClock(device=torch.device("cpu"))
    runtime = tiny_random_runtime
    assert runtime.stream_mux is None
    stream, info = runtime._open_frame_stream(tmp_path / "a.mp4", 124, 544, 960, clock)
    assert stream is None and "decode runs on the CPU" in info["why_not"]
    monkeypatch.setattr(runtime, "device", torch.device("meta"))  # stands for a GPU: only the device's type is read
    stream, info = runtime._open_frame_stream(tmp_path / "a.mp4", 124, 128, 128, clock)
    assert stream is None and "128x128 frames encode in one thread" in info["why_not"]
    stream, info = runtime._open_frame_stream(tmp_path / "a.mp4", 124, 544, 960, clock)
    try:
        assert info == {"streamed": True} and stream.frames.shape == (124, 544, 960, 3)
    finally:
        stream.writer.abort()
        stream.close()
    assert list(tmp_path.iterdir()) == []
