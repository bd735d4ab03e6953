"""Exposure clipping (lower is better): the share of pixels whose luma is crushed (<= 2) or blown out (>= 253)."""

from __future__ import annotations

import numpy as np

higher_is_better = False


EXPOSURE_LOW, EXPOSURE_HIGH = 2.0, 253.0


def exposure_clipping(gray: np.ndarray) -> float:
    g = np.asarray(gray)
    return float(np.mean((g <= EXPOSURE_LOW) | (g >= EXPOSURE_HIGH)))


def clipped_pixels(gray):
    """How many luma values of ``gray`` (numpy or torch, any shape) are crushed or blown out (the torch path sums
    them over a clip's chunks)."""
    return ((gray <= EXPOSURE_LOW) | (gray >= EXPOSURE_HIGH)).sum()
