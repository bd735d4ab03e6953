"""Echo: a faint lagged copy of the moving subject inside one clip, without a reference (seed 001's ghost).

A ghost of strength ``a`` at lag ``L`` frames is ``c_t = (1 - a) x_t + a x_{t-L}`` where the subject moves (a stale
copy, in image coordinates). Its signature in the clip alone is in the camera-compensated temporal differences at a
stride of ``STRIDE`` frames, ``D_t = c_t - W_t(c_{t-s})`` (``W_t``: the global similarity transform,
:mod:`gates.metrics.global_motion`): ``D_t = (1 - a) e_t + a e_{t-L}``, so ``D_t`` carries an exact copy of the
motion pattern of ``L`` frames before at the *same* pixels, while natural motion moves that pattern by ``L`` times the
subject's velocity. The stride (5, larger than every lag searched) keeps ``D_t`` and ``D_{t-L}`` from sharing a frame,
whose imprint would correlate them at every lag.

Statistic. For each lag ``l`` in (1, 2, 3, 4, 6) the pooled coherence of ``D_t`` with ``D_{t-l}`` (cross-spectrum
over the pooled spectra, Hann-windowed frames) at displacement 0, ``r_l``: a correlation in [-1, 1]. Natural motion
makes ``r_l`` a smooth function of the lag (slow content overlaps itself more at short lags); an echo adds about
``0.45 a`` at its own lag only. The echo score of lag ``L`` in 2..4 is ``r_L`` less the linear interpolation of its
neighbours (``r_3`` and ``r_6`` for lag 4); ``echo_score`` is the largest (higher is worse), flagged above
``THRESHOLD`` (1.25x the largest score of the clean fit clips: bench/artifact_detectors/results/artifact_detectors.md).
A lag-1 echo is not scored: at lag 1 the natural curve's convexity (up to 0.5 on a slow pan) swamps it; it is a
slight motion blur there, and ``info["lag1_score"]`` reports its extrapolated score for reference.

Computed on luma area-downscaled to a long side of at most ``max_side``.
"""

from __future__ import annotations

import numpy as np

from gates.metrics import global_motion
from gates.metrics.detection import Detection, to_luma

higher_is_better = False
NAME = "echo_score"
THRESHOLD = 0.12
"""Calibrated on the fit set (bench/artifact_detectors/results/artifact_detectors.md)."""
STRIDE = 5
LAGS = (1, 2, 3, 4, 6)
MAX_SIDE = 192


def compensated_differences(frames, stride: int = STRIDE, max_side: int = MAX_SIDE) -> np.ndarray:
    """``D_t`` for t = stride..T-1 (Hann-windowed, float32), the camera's motion from frame t-stride compensated."""
    g = to_luma(frames, max_side)
    t_count, h, w = g.shape
    window = np.outer(np.hanning(h), np.hanning(w)).astype(np.float32)
    out = np.empty((t_count - stride, h, w), np.float32)
    for t in range(stride, t_count):
        m = global_motion.estimate(g[t], g[t - stride])
        out[t - stride] = (g[t] - global_motion.warp_to(g[t - stride], m)) * window
    return out


def lag_coherence(frames, lags=LAGS, stride: int = STRIDE, max_side: int = MAX_SIDE) -> np.ndarray:
    """``r_l`` for each lag in ``lags``: the pooled coherence of ``D_t`` with ``D_{t-l}`` at displacement 0."""
    f = np.asarray(frames)
    if len(f) < stride + max(lags) + 8:
        raise ValueError(f"a clip of {len(f)} frames is too short for the echo (at least {stride + max(lags) + 8})")
    diffs = compensated_differences(f, stride, max_side)
    spectra = np.fft.rfft2(diffs)
    power = np.abs(spectra) ** 2
    h, w = diffs.shape[1:]
    out = []
    for lag in lags:
        cross = (spectra[lag:] * np.conj(spectra[:-lag])).sum(axis=0)
        norm = np.sqrt(power[lag:].sum(axis=0) * power[:-lag].sum(axis=0))
        coherence = cross / np.maximum(norm, 1e-12 * max(float(norm.max()), 1e-30))
        # The inverse FFT's value at displacement 0: the mean of the coherence over the full (Hermitian) spectrum.
        out.append(float(np.fft.irfft2(coherence, s=(h, w))[0, 0]))
    return np.array(out)


def lag_scores(r: np.ndarray) -> dict[int, float]:
    """Echo scores of lags 1..4 from ``r`` at LAGS (1, 2, 3, 4, 6); lag 1 extrapolated (not used in the statistic)."""
    r1, r2, r3, r4, r6 = (float(v) for v in r)
    return {1: r1 - (2 * r2 - r3), 2: r2 - (r1 + r3) / 2, 3: r3 - (r2 + r4) / 2, 4: r4 - (r3 + (r6 - r3) / 3)}


def echo(frames, threshold: float = THRESHOLD, max_side: int = MAX_SIDE) -> Detection:
    """The clip's echo detection: ``statistic`` the largest echo score of lags 2..4, ``info`` its lag, every lag's
    score and the coherences."""
    r = lag_coherence(frames, LAGS, STRIDE, max_side)
    scores = lag_scores(r)
    lag = max((2, 3, 4), key=lambda k: scores[k])
    stat = scores[lag]
    return Detection(stat, float(threshold), stat > threshold,
                     {"lag": lag, "lag_scores": {k: round(v, 5) for k, v in scores.items() if k > 1},
                      "lag1_score": round(scores[1], 5), "coherence": [round(float(v), 5) for v in r]})
