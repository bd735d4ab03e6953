"""Audio clicks: impulsive sample-level discontinuities (a dropped or corrupted sample, a splice).

The mono mix's third difference ``x[n] - 3 x[n-1] + 3 x[n-2] - x[n-3]`` as the residual: a high-pass whose gain at
1 kHz and 32 kHz is 0.0075 (tones and smooth sounds leave a small residual) while an impulse keeps its size.
``click_score`` is the largest |residual| over the residual's robust scale in a ``scale_ms``
neighbourhood (1.4826 MAD), in units of that scale (higher is worse); flagged above ``THRESHOLD`` (calibrated:
bench/artifact_detectors/results/artifact_detectors.md).
"""

from __future__ import annotations

import numpy as np

from gates.metrics.detection import Detection

higher_is_better = False
NAME = "click_score"
THRESHOLD = 660.0
SCALE_MS = 64.0


def residual(x: np.ndarray) -> np.ndarray:
    """The third difference of a 1-D float64 signal (length N - 3)."""
    return np.diff(x, n=3)


def audio_clicks(audio: np.ndarray, sample_rate: int, threshold: float = THRESHOLD,
                 scale_ms: float = SCALE_MS) -> Detection:
    x = np.asarray(audio, np.float64)
    x = x.mean(axis=0) if x.ndim == 2 else x
    if not np.isfinite(x).all():
        raise ValueError("the audio track has NaN/Inf samples")
    if len(x) < 64:
        raise ValueError(f"a track of {len(x)} samples is too short")
    r = np.abs(residual(x))
    m = max(16, int(round(scale_ms * sample_rate / 1000.0)))
    count = len(r) // m
    blocks = r[: count * m].reshape(count, m)
    scale = 1.4826 * np.median(blocks, axis=1)  # |residual| is half-normal: its median is 0.6745 sigma
    floor = 1e-6 + 1e-3 * float(np.median(scale)) if count else 1e-6
    z = blocks / np.maximum(scale, floor)[:, None]
    idx = int(np.argmax(z))
    stat = float(z.ravel()[idx]) if count else 0.0
    return Detection(stat, float(threshold), stat > threshold,
                     {"at_s": round(idx / sample_rate, 4)})
