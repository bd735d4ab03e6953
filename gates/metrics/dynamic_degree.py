"""Dynamic degree (higher is better, % of the frame diagonal per frame): VBench's statistic with classical flow: per
consecutive pair the mean of the top 5% flow magnitudes, averaged over the clip (continuous, not VBench's 0/1 label).
A recipe that freezes the scene scores lower."""

from __future__ import annotations

import math

import numpy as np

higher_is_better = True


def dynamic_degree(flows: list[np.ndarray], height: int, width: int) -> float | None:
    """Mean over consecutive pairs of the mean of the top 5% flow magnitudes, in % of the frame diagonal."""
    if not flows:
        return None
    diagonal = math.hypot(height, width)
    values = []
    for f in flows:
        mag = np.sort(np.hypot(f[..., 0], f[..., 1]).ravel())
        top = mag[int(len(mag) * 0.95):]
        values.append(float(top.mean()))
    return 100.0 * float(np.mean(values)) / diagonal
