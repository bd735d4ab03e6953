"""gates.metrics.global_motion and gates.metrics.echo against planted references: a known camera transform, a clip
whose compensated differences repeat exactly, and seed 001's ghost (a lagged blended copy of the moving subject) of
known strength and lag, over a still and a panning camera."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from scipy import ndimage

from gates.metrics import echo, global_motion


def _texture(h, w, seed, sigma=1.5, level=110.0, spread=40.0):
    x = ndimage.gaussian_filter(np.random.default_rng(seed).normal(0, 1, (h, w)), sigma)
    return level + spread * x / x.std()


def _scene(frames=72, h=72, w=112, speed=3, pan=(0, 0), seed=0):
    """A textured 20x20 subject moving ``speed`` px a frame over a textured background the camera pans over."""
    bg = _texture(h + 200, w + 200, seed)
    sub = _texture(20, 20, seed + 1, sigma=1.0, level=180.0)
    out = np.empty((frames, h, w))
    for i in range(frames):
        oy, ox = 100 + pan[0] * i, 100 + pan[1] * i
        f = bg[oy:oy + h, ox:ox + w].copy()
        x = (4 + speed * i) % (w - 24)
        f[26:46, x:x + 20] = sub
        out[i] = f
    return out


def _ghost(x, alpha, lag):
    out = x.copy()
    out[lag:] = (1 - alpha) * x[lag:] + alpha * x[:-lag]
    return out


def _u8(x):
    return np.repeat(np.clip(np.rint(x), 0, 255).astype(np.uint8)[..., None], 3, axis=-1)


def test_global_motion_recovers_a_planted_similarity():
    img = _texture(120, 160, 3, sigma=1.2, level=128.0, spread=50.0).astype(np.float32)
    planted = cv2.getRotationMatrix2D((80.0, 60.0), 1.0, 1.02)
    planted[:, 2] += (2.5, -1.25)
    moved = cv2.warpAffine(img, planted, (160, 120), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    # moved(planted @ p) = img(p): the estimate maps img's coordinates to moved's.
    m = global_motion.estimate(img, moved)
    corners = np.array([[20, 20, 1], [140, 20, 1], [20, 100, 1], [140, 100, 1]], np.float64)
    assert np.abs(corners @ m.T - corners @ planted.T).max() < 0.15
    # warp_to brings the moved frame back onto the first one (interior, away from reflected borders)
    # (two bilinear resamplings of a fine texture smooth it: the residual is a fraction of the uncompensated one)
    back = global_motion.warp_to(moved, m)
    assert np.abs(back - img)[15:-15, 15:-15].mean() < 0.3 * np.abs(moved - img)[15:-15, 15:-15].mean()


def test_coherence_is_one_where_the_differences_repeat_exactly():
    cycle = [_texture(48, 64, s) for s in range(3)]
    clip = _u8(np.stack([cycle[i % 3] for i in range(40)]))
    r = echo.lag_coherence(clip, lags=(3, 6))
    assert r == pytest.approx([1.0, 1.0], abs=1e-5)  # D_t equals D_{t-3} and D_{t-6}: a period-3 clip


@pytest.mark.parametrize("pan", [(0, 0), (1, 1)])
def test_a_lagged_copy_of_the_moving_subject_is_flagged_with_its_lag(pan):
    clean = _scene(pan=pan)
    base = echo.echo(_u8(clean))
    assert not base.flagged and abs(base.statistic) < 0.03
    for lag in (2, 3, 4):
        found = echo.echo(_u8(_ghost(clean, 0.2, lag)))  # about 0.45 x 0.2 over the clean score
        assert found.info["lag"] == lag and found.statistic > base.statistic + 0.05, (lag, found)
        # the calibrated threshold (1.25x the largest clean fit clip) flags a copy of 0.4
        assert echo.echo(_u8(_ghost(clean, 0.4, lag))).flagged
    # the score grows with the copy's strength
    weak, strong = (echo.echo(_u8(_ghost(clean, a, 3))).statistic for a in (0.05, 0.2))
    assert strong > weak + 0.03


def test_a_blur_is_not_an_echo():
    clean = _scene()
    soft = clean.copy()
    soft[30:] = ndimage.gaussian_filter(clean[30:], (0, 1.5, 1.5))
    assert not echo.echo(_u8(soft)).flagged


def test_short_clip_is_one_clear_error():
    with pytest.raises(ValueError, match="too short"):
        echo.echo(_u8(_scene(frames=12)))
