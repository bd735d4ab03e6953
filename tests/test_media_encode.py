"""MP4 encoding: a fixed libx264 thread count by frame size, deterministic bytes at both, quality against the source."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bench.lib.media import encode_mp4_one_thread
from bench.lib.media import textured_frames as _frames
from h3.media import ENCODE_THREADS_LARGE, ENCODE_THREADS_MIN_PIXELS, decode_video, encode_mp4, encode_threads


def _x264_threads(data: bytes) -> int:
    """The thread count x264 wrote into its settings SEI (``... threads=N ...``)."""
    match = re.search(rb"x264 - core \d+.*? threads=(\d+) ", data, re.S)
    assert match, "no x264 settings SEI in the stream"
    return int(match.group(1))


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0 ** 2 / mse))


def test_thread_count_is_fixed_by_frame_size_not_by_the_machine():
    assert encode_threads(128, 128) == 1
    assert encode_threads(544, 960) == ENCODE_THREADS_LARGE == 8
    side = int(np.sqrt(ENCODE_THREADS_MIN_PIXELS))
    assert encode_threads(side, side) == ENCODE_THREADS_LARGE and encode_threads(side - 2, side) == 1


@pytest.mark.parametrize("height,width,threads", [(128, 128, 1), (544, 960, 8)])
def test_encode_is_byte_identical_and_close_to_the_source(tmp_path, height, width, threads):
    """544x960 is a size at which x264 with macroblock-tree rate control gave another bitstream on some encodes of
    the same frames (2-4 distinct files in 4-6 encodes, one thread or eight); three encodes here must agree."""
    frames = _frames(24, height, width)
    pcm = np.zeros((32000, 2), np.int16)
    paths = [tmp_path / f"{i}.mp4" for i in range(3)]
    for path in paths:
        encode_mp4(path, frames, pcm)
    data = paths[0].read_bytes()
    assert all(path.read_bytes() == data for path in paths[1:])
    assert _x264_threads(data) == threads
    assert (b" mbtree=0 " in data) == (threads > 1)
    # The preset, read from x264's settings SEI: medium searches subpixels at subme=7 with 3 reference frames,
    # veryfast at subme=2 with 1 (x264's preset table, common/base.c).
    assert (b" subme=2 " in data and b" ref=1 " in data) == (threads > 1)
    assert (b" subme=7 " in data and b" ref=3 " in data) == (threads == 1)
    decoded, fps = decode_video(paths[0])
    assert fps == 24 and decoded.shape == frames.shape
    # CRF 18 on a pattern with strong colour detail (4:2:0 chroma bounds it): measured 36.3-36.5 dB at both sizes
    assert _psnr(decoded, frames) > 35.0


def test_audio_encoded_beside_the_video_gives_the_one_thread_bytes(tmp_path):
    """encode_mp4 encodes the AAC track in a second thread while the video encodes: the file must be the one the
    one-thread encode writes, byte for byte (a tone with clicks, so that the AAC encoder has work to do)."""
    frames = _frames(24, 128, 128)
    t = np.arange(32000) / 32000.0
    tone = 0.3 * np.sin(2 * np.pi * 440.0 * t) + 0.4 * (np.arange(32000) % 8000 < 40)
    pcm = np.ascontiguousarray(np.stack([tone, 0.5 * tone], axis=1) * 32767.0).astype(np.int16)
    encode_mp4(tmp_path / "threaded.mp4", frames, pcm)
    encode_mp4_one_thread(tmp_path / "reference.mp4", frames, pcm)
    assert (tmp_path / "threaded.mp4").read_bytes() == (tmp_path / "reference.mp4").read_bytes()


def test_an_audio_encode_error_is_raised_and_leaves_no_file(tmp_path, monkeypatch):
    """An error inside the audio thread reaches the caller, after the video finished, and nothing is written."""
    import av

    def broken(*args, **kwargs):
        raise ValueError("planted audio failure")

    monkeypatch.setattr(av.AudioFrame, "from_ndarray", broken)
    target = tmp_path / "clip.mp4"
    with pytest.raises(ValueError, match="planted audio failure"):
        encode_mp4(target, _frames(8, 64, 64), np.zeros((32000, 2), np.int16))
    assert list(tmp_path.iterdir()) == []


def test_conversion_threads_give_the_serial_conversions_bytes(tmp_path):
    """Large frames are converted to yuv420p by 8 threads ahead of the encoder (bounded look-ahead of 16): the file is
    the serial conversion's, byte for byte, with 40 frames (more than the look-ahead)."""
    frames = _frames(40, 544, 960)
    pcm = np.zeros((32000, 2), np.int16)
    encode_mp4(tmp_path / "threaded.mp4", frames, pcm)
    encode_mp4(tmp_path / "serial.mp4", frames, pcm, convert_threads=1)
    assert (tmp_path / "threaded.mp4").read_bytes() == (tmp_path / "serial.mp4").read_bytes()
    with pytest.raises(Exception, match="threads must be >= 1"):
        encode_mp4(tmp_path / "bad.mp4", frames[:2], pcm, convert_threads=0)
    assert not (tmp_path / "bad.mp4").exists()



@pytest.mark.parametrize("convert_threads", [1, 3])
def test_one_reformatter_per_thread_decodes_the_per_frame_conversions_bytes(tmp_path, convert_threads):
    """decode_video converts with one swscale context per converting thread, reused over the clip: the RGB frames are
    byte for byte PyAV's own per-frame frame.to_ndarray(format="rgb24") (a new context each frame)."""
    import av

    frames = _frames(12, 128, 160)
    path = tmp_path / "clip.mp4"
    encode_mp4(path, frames, np.zeros((16000, 2), np.int16))
    with av.open(str(path)) as container:
        per_frame = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    shared = decode_video(path, convert_threads=convert_threads)[0]
    assert shared.shape == frames.shape and np.array_equal(shared, per_frame)
    assert _psnr(shared, frames) > 30  # and they are the source frames, up to the codec
