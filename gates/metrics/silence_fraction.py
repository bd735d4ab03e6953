"""Silence fraction (lower is better): the share of 50 ms windows whose RMS (all channels together) is below -60 dBFS
(the integrity gate's silence level)."""

from __future__ import annotations

import numpy as np

higher_is_better = False


SILENCE_DBFS = -60.0


def silence_fraction(audio: np.ndarray, sample_rate: int, window_s: float = 0.05) -> float:
    mono = np.asarray(audio, np.float64)
    n = max(1, int(round(window_s * sample_rate)))
    count = mono.shape[-1] // n
    if count == 0:
        return 1.0
    blocks = mono[..., : count * n].reshape(*mono.shape[:-1], count, n)
    rms = np.sqrt((blocks**2).mean(axis=-1))
    if rms.ndim == 2:
        rms = np.sqrt((rms**2).mean(axis=0))  # the level of all channels together
    return float(np.mean(rms < 10 ** (SILENCE_DBFS / 20)))
