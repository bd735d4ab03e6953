"""Contrast (higher is better): RMS contrast, the standard deviation of the luma on a 0..1 scale."""

from __future__ import annotations

import numpy as np

higher_is_better = True


def contrast(gray: np.ndarray) -> float:
    return float(np.std(np.asarray(gray, np.float64) / 255.0))


def contrast_torch(g):
    """:func:`contrast` of each float64 luma frame of ``g`` (N, H, W) on a torch device: (N,) float64."""
    return (g / 255.0).std(dim=(1, 2), unbiased=False)
