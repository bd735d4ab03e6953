"""Motion smoothness (higher is better, 0..1): VBench's definition with classical flow instead of AMT: each odd
frame is interpolated from its two neighbours along their Farneback flow, ``(255 - mean |interpolated - real|) / 255``
averaged over the interpolated frames. Jerky or incoherent motion interpolates badly."""

from __future__ import annotations

import numpy as np

from gates.metrics.flow import flow, warp

higher_is_better = True


def motion_smoothness(frames: np.ndarray, gray: np.ndarray) -> float | None:
    """VBench's frame-interpolation score with Farneback flow: each odd frame t from frames t-1 and t+1 (module
    docstring). ``frames`` (T, H, W, 3) uint8 and their luma ``gray`` (T, H, W) at the same size."""
    scores = []
    for t in range(1, len(frames) - 1, 2):
        f = flow(gray[t - 1], gray[t + 1])  # frame t+1 at x + f(x) shows what frame t-1 shows at x
        before = warp(frames[t - 1].astype(np.float32), -0.5 * f)
        after = warp(frames[t + 1].astype(np.float32), 0.5 * f)
        middle = 0.5 * (before + after)
        scores.append((255.0 - float(np.mean(np.abs(middle - frames[t].astype(np.float32))))) / 255.0)
    return float(np.mean(scores)) if scores else None
