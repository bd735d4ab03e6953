"""Sharpness drop: a sudden loss of sharpness (blur) within one clip, labelled as blur (never a lag-0 ghost).

Per frame the variance of the 4-neighbour Laplacian of the luma (the reference-free gate's ``sharpness``). For each
frame t, ``log(before / after)`` with ``before`` the median over the ``span`` frames before t and ``after`` the
median over t and the ``span - 1`` frames after it: a clip that goes soft at t and stays soft scores the log of the
ratio (a blur of sigma 1 px on the tiny's frames: about 1.5). ``sharpness_drop`` is the largest over t, higher is
worse; flagged above ``THRESHOLD`` (calibrated: bench/artifact_detectors/results/artifact_detectors.md). A clip
that is soft throughout has no drop (``reference_free``'s ``sharpness`` and ``blur`` judge that against the
baseline).
"""

from __future__ import annotations

import numpy as np

from gates.metrics.detection import Detection, to_luma

higher_is_better = False
NAME = "sharpness_drop"
THRESHOLD = 1.3
SPAN = 6


def laplacian_variance(frames) -> np.ndarray:
    import cv2

    g = to_luma(frames)
    return np.array([cv2.Laplacian(x.astype(np.float64), cv2.CV_64F, ksize=1,
                                   borderType=cv2.BORDER_REFLECT_101).var() for x in g])


def sharpness_drop(frames, span: int = SPAN, threshold: float = THRESHOLD) -> Detection:
    s = laplacian_variance(frames)
    if len(s) < 2 * span:
        raise ValueError(f"a clip of {len(s)} frames is too short for a {span}-frame span")
    eps = 1e-6 + 1e-6 * float(np.median(s))
    best, at = -np.inf, span
    for t in range(span, len(s) - span + 1):
        v = float(np.log((np.median(s[t - span:t]) + eps) / (np.median(s[t:t + span]) + eps)))
        if v > best:
            best, at = v, t
    return Detection(best, float(threshold), best > threshold, {"frame": at})
