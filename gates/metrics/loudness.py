"""Loudness (higher is better, LUFS): BS.1770-4 integrated loudness (``pyloudnorm``); a track gated out entirely
(silent) reads -70 LUFS, the standard's absolute gate, rather than minus infinity. A quieter track than the
baseline's is the failure (a fading or missing soundtrack); too loud shows as clipping."""

from __future__ import annotations

import math

import numpy as np

from gates.base import GateInputError

higher_is_better = True


LUFS_FLOOR = -70.0
"""BS.1770-4's absolute gate: blocks below it are not counted, so a track entirely below it has no loudness; it is
reported at the gate."""


def loudness_lufs(audio: np.ndarray, sample_rate: int) -> float:
    """BS.1770-4 integrated loudness of a (channels, N) track; a silent track reads :data:`LUFS_FLOOR`."""
    import pyloudnorm

    meter = pyloudnorm.Meter(sample_rate)
    data = np.asarray(audio, np.float64).T
    if data.shape[0] <= int(meter.block_size * sample_rate):
        raise GateInputError(f"the track is {data.shape[0] / sample_rate:.3f} s long: BS.1770 loudness needs more "
                             f"than one {meter.block_size} s block")
    value = float(meter.integrated_loudness(data))
    return value if math.isfinite(value) and value > LUFS_FLOOR else LUFS_FLOOR
