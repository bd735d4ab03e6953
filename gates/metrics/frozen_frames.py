"""Frozen or repeated frames: frames that repeat an earlier frame while the rest of the clip moves.

Per frame t the mean absolute luma difference to each of the ``window`` frames before it; a frame is a repeat when
the smallest of them is at most ``ratio`` times the clip's median consecutive difference and at most
``max_levels`` (a codec's skipped frame decodes as an exact copy; a moving clip's frames differ by a level or more).
A clip whose median consecutive difference is under ``min_motion`` levels does not move, and none of its frames is
counted (the integrity gate reports a clip that does not change at all). The first ``skip_start`` frames are not
judged (the trained tiny's clips start almost still: their first frames differ by 0.015 levels, a tenth of what their
frames differ by later). ``frozen_frames`` is the count, higher is worse; flagged at ``THRESHOLD`` or more.
"""

from __future__ import annotations

import numpy as np

from gates.metrics.detection import Detection, to_luma

higher_is_better = False
NAME = "frozen_frames"
THRESHOLD = 1
WINDOW = 4
RATIO = 0.1
MAX_LEVELS = 0.5
MIN_MOTION = 0.1
SKIP_START = 4


def frozen_frames(frames, window: int = WINDOW, ratio: float = RATIO, max_levels: float = MAX_LEVELS,
                  min_motion: float = MIN_MOTION, threshold: int = THRESHOLD,
                  skip_start: int = SKIP_START) -> Detection:
    g = to_luma(frames)[skip_start:]
    t = len(g)
    consecutive = np.array([np.abs(g[i] - g[i - 1]).mean(dtype=np.float64) for i in range(1, t)])
    motion = float(np.median(consecutive))
    repeats: list[list[int]] = []
    if motion >= min_motion:
        limit = min(max_levels, ratio * motion)
        for i in range(1, t):
            d = [consecutive[i - 1]] + [np.abs(g[i] - g[i - k]).mean(dtype=np.float64)
                                        for k in range(2, min(window, i) + 1)]
            k = int(np.argmin(d))
            if d[k] <= limit:
                repeats.append([i + skip_start, i - k - 1 + skip_start])
    count = len(repeats)
    return Detection(float(count), float(threshold), count >= threshold,
                     {"repeats": repeats[:32], "median_motion_levels": round(motion, 4)})
