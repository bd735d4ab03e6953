"""gates.metrics tail_flicker, frozen_frames, sharpness_drop and blocking against planted defects of known size and
float64 / scipy references."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from scipy import ndimage

from gates.metrics import blocking, frozen_frames, sharpness_drop, tail_flicker
from gates.metrics.detection import to_luma


def _moving(frames=60, h=64, w=80, speed=2, seed=0):
    """A textured background translating ``speed`` px a frame (uint8 RGB)."""
    x = ndimage.gaussian_filter(np.random.default_rng(seed).normal(0, 1, (h, w + speed * frames)), 1.2)
    x = 120 + 40 * x / x.std()
    clip = np.stack([x[:, speed * i: speed * i + w] for i in range(frames)])
    return np.repeat(np.clip(np.rint(clip), 0, 255).astype(np.uint8)[..., None], 3, axis=-1)


def test_tail_flicker_equals_its_float64_definition_and_flags_a_planted_flicker():
    clip = _moving()
    planted = clip.astype(np.float64)
    planted[-12:] *= (1 + 0.05 * np.where(np.arange(12) % 2 == 0, 1, -1))[:, None, None, None]
    planted = np.clip(np.rint(planted), 0, 255).astype(np.uint8)
    found = tail_flicker.tail_flicker(planted)
    # the reference: cell means of a 4x4 grid in float64, second differences, median over cells
    g = to_luma(planted).astype(np.float64)
    cells = np.array([[[g[t, i * 16:(i + 1) * 16, j * 20:(j + 1) * 20].mean() for j in range(4)] for i in range(4)]
                      for t in range(len(g))]).reshape(len(g), -1)
    series = np.median(np.abs(cells[2:] - 2 * cells[1:-1] + cells[:-2]), axis=1)
    expected = series[-12:].mean() / (np.median(series[:-12]) + tail_flicker.FLOOR_LEVELS)
    assert found.statistic == pytest.approx(expected, rel=1e-9)
    assert found.flagged and found.statistic > 10
    assert not tail_flicker.tail_flicker(clip).flagged


def test_frozen_frames_finds_the_planted_repeats_and_nothing_in_a_moving_clip():
    clip = _moving()
    assert frozen_frames.frozen_frames(clip).statistic == 0
    planted = clip.copy()
    planted[20] = planted[19]  # a frame shown twice
    planted[40] = planted[37]  # a frame of three frames before, repeated
    found = frozen_frames.frozen_frames(planted)
    assert found.flagged and found.statistic == 2 and found.info["repeats"] == [[20, 19], [40, 37]]
    still = np.repeat(clip[:1], 60, axis=0)  # a clip that does not move at all: the integrity gate's business
    assert frozen_frames.frozen_frames(still).statistic == 0


def test_sharpness_drop_is_the_log_ratio_of_laplacian_variances_at_the_planted_frame():
    clip = _moving()
    soft = clip.copy()
    soft[30:] = np.stack([cv2.GaussianBlur(f, (0, 0), 1.5) for f in clip[30:]])
    found = sharpness_drop.sharpness_drop(soft)
    g = to_luma(soft).astype(np.float64)
    lap = np.array([ndimage.laplace(x, mode="mirror").var() for x in g])  # scipy's 4-neighbour Laplacian
    span = sharpness_drop.SPAN
    assert found.info["frame"] == 30
    assert found.statistic == pytest.approx(math.log(np.median(lap[30 - span:30]) / np.median(lap[30:30 + span])),
                                            rel=1e-5)  # the detector adds 1e-6 relative to both
    assert found.flagged
    assert not sharpness_drop.sharpness_drop(clip).flagged


def test_blocking_reads_a_planted_grid_step_and_jpeg_blocks():
    flat = np.full((64, 96), 100.0)
    cols = (np.arange(96) // 8) % 2 * 6.0  # steps of 6 levels at every 8th column boundary
    assert blocking.frame_blocking(flat + cols) == pytest.approx(6.0, rel=1e-12)
    clip = _moving()
    assert not blocking.blocking(clip).flagged
    jpeg = clip.copy()
    for i in range(len(clip)):
        ok, buf = cv2.imencode(".jpg", clip[i], [cv2.IMWRITE_JPEG_QUALITY, 2])
        jpeg[i] = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    assert blocking.blocking(jpeg).flagged


def test_bad_frames_are_one_clear_error():
    with pytest.raises(ValueError, match="expected frames"):
        tail_flicker.tail_flicker(np.zeros((40, 8, 8, 4), np.uint8))
    with pytest.raises(ValueError, match="NaN"):
        sharpness_drop.sharpness_drop(np.full((40, 8, 8), np.nan))
