"""MP4 encoding: a fixed libx264 thread count by frame size, deterministic bytes at both, quality against the source."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bench.x264_determinism import textured_frames as _frames
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
    decoded, fps = decode_video(paths[0])
    assert fps == 24 and decoded.shape == frames.shape
    # CRF 18 on a pattern with strong colour detail (4:2:0 chroma bounds it): measured 36.3-36.5 dB at both sizes
    assert _psnr(decoded, frames) > 35.0
