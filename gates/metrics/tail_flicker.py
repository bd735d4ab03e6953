"""Tail flicker: brightness flicker concentrated in the last frames of one clip.

Per frame the mean luma of each cell of a ``grid`` x ``grid`` partition; the flicker of frame t is the median over
cells of ``|m_{t+1} - 2 m_t + m_{t-1}|`` (the second temporal difference: a smooth fade or a moving subject's slow
drift barely registers, an alternating brightness step of A levels gives 2A to 4A). ``tail_flicker`` is the mean
flicker of the last ``tail_frames`` frames over a robust scale of the rest (their median plus
``FLOOR_LEVELS``), higher is worse; flagged above ``THRESHOLD`` (calibrated:
bench/artifact_detectors/results/artifact_detectors.md).
"""

from __future__ import annotations

import numpy as np

from gates.metrics.detection import Detection, to_luma

higher_is_better = False
NAME = "tail_flicker"
THRESHOLD = 1.5
TAIL_FRAMES = 12
"""Half a second at 24 fps."""
FLOOR_LEVELS = 0.25
GRID = 4


def flicker_series(frames, grid: int = GRID) -> np.ndarray:
    """Per-frame flicker (levels) of frames 1..T-2."""
    g = to_luma(frames)
    t, h, w = g.shape
    hs, ws = h // grid, w // grid
    cells = g[:, : hs * grid, : ws * grid].reshape(t, grid, hs, grid, ws).mean(axis=(2, 4), dtype=np.float64)
    second = np.abs(cells[2:] - 2 * cells[1:-1] + cells[:-2]).reshape(t - 2, -1)
    return np.median(second, axis=1)


def tail_flicker(frames, tail_frames: int = TAIL_FRAMES, threshold: float = THRESHOLD) -> Detection:
    series = flicker_series(frames)
    if len(series) < 2 * tail_frames:
        raise ValueError(f"a clip of {len(series) + 2} frames is too short for a {tail_frames}-frame tail")
    tail, rest = series[-tail_frames:], series[:-tail_frames]
    stat = float(tail.mean() / (np.median(rest) + FLOOR_LEVELS))
    return Detection(stat, float(threshold), stat > threshold,
                     {"tail_mean_levels": round(float(tail.mean()), 4),
                      "rest_median_levels": round(float(np.median(rest)), 4)})
