"""Clipping fraction (lower is better): the share of samples at |x| >= 0.99 (the integrity gate's clip level)."""

from __future__ import annotations

import numpy as np

higher_is_better = False


CLIP_LEVEL = 0.99


def clipping_fraction(audio: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(audio)) >= CLIP_LEVEL))
