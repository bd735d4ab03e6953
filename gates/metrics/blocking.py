"""Blocking: an 8x8 block grid in the frames (a codec or a quantised stage gone coarse).

Per frame and axis, the mean absolute luma difference across each column (row) boundary, folded by position modulo
``block``: a block grid concentrates differences on one phase. A frame's blocking is, on the worse axis, the
strongest phase's excess over the median of the other phases, relative to that median plus one level
(``(strongest - median) / (median + 1)``: about 0 without a grid; a grid of steps of ``h`` levels on flat content
reads ``h``). ``blocking`` is the 75th percentile over frames (a quarter of the clip blocky is enough; higher is worse);
flagged above ``THRESHOLD`` (calibrated: bench/artifact_detectors/results/artifact_detectors.md). The grid's phase is
not assumed (a clip resized after coding keeps a grid at another offset).
"""

from __future__ import annotations

import numpy as np

from gates.metrics.detection import Detection, to_luma

higher_is_better = False
NAME = "blocking"
THRESHOLD = 2.0
BLOCK = 8


def frame_blocking(gray: np.ndarray, block: int = BLOCK) -> float:
    worst = 0.0
    for axis in (0, 1):
        d = np.abs(np.diff(gray.astype(np.float64), axis=axis)).mean(axis=1 - axis)
        n = len(d) // block * block
        if n < 2 * block:
            continue
        phases = d[:n].reshape(-1, block).mean(axis=0)
        k = int(np.argmax(phases))
        others = float(np.median(np.delete(phases, k)))
        worst = max(worst, (float(phases[k]) - others) / (others + 1.0))
    return worst


def blocking(frames, block: int = BLOCK, threshold: float = THRESHOLD) -> Detection:
    g = to_luma(frames)
    per_frame = np.array([frame_blocking(x, block) for x in g])
    stat = float(np.percentile(per_frame, 75))
    return Detection(stat, float(threshold), stat > threshold, {"max_frame": round(float(per_frame.max()), 4)})
