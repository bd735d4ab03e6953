"""Global (camera) motion between two frames: a similarity transform (shift, zoom, rotation) by tracked corners and
RANSAC, with phase correlation as the fallback where a frame has too few corners.

``estimate(a, b)`` returns the 2x3 matrix ``M`` with ``b(M @ [x, y, 1]) ~ a(x, y)``: :func:`warp_to` of ``b`` by
``M`` brings ``b`` into ``a``'s coordinates. Corners: Shi-Tomasi (``cv2.goodFeaturesToTrack``), tracked by pyramidal
Lucas-Kanade (``cv2.calcOpticalFlowPyrLK``), fitted by ``cv2.estimateAffinePartial2D`` (RANSAC, 4 degrees of
freedom): a subject covering less than half of the tracked corners is an outlier, not the camera. Phase correlation
(``cv2.phaseCorrelate``, Hann window) gives a translation where fewer than ``min_corners`` are tracked.
This is not a quality metric: it has no direction (``higher_is_better`` None).
"""

from __future__ import annotations

import numpy as np

higher_is_better = None
MIN_CORNERS = 12


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8) if x.dtype != np.uint8 else x


def estimate(a: np.ndarray, b: np.ndarray, min_corners: int = MIN_CORNERS) -> np.ndarray:
    """2x3 float64 similarity ``M`` mapping ``a``'s pixel coordinates to ``b``'s (luma frames of one shape)."""
    import cv2

    a8, b8 = _u8(np.asarray(a)), _u8(np.asarray(b))
    h, w = a8.shape
    pts = cv2.goodFeaturesToTrack(a8, maxCorners=200, qualityLevel=0.01, minDistance=max(3, min(h, w) // 32),
                                  blockSize=5)
    if pts is not None and len(pts) >= min_corners:
        moved, status, _ = cv2.calcOpticalFlowPyrLK(a8, b8, pts, None, winSize=(15, 15), maxLevel=3)
        good = status.ravel() == 1
        if good.sum() >= min_corners:
            m, inliers = cv2.estimateAffinePartial2D(pts[good], moved[good], method=cv2.RANSAC,
                                                     ransacReprojThreshold=1.0, maxIters=500, confidence=0.99,
                                                     refineIters=10)
            if m is not None and inliers is not None and inliers.sum() >= min_corners:
                return m.astype(np.float64)
    window = cv2.createHanningWindow((w, h), cv2.CV_64F)
    (dx, dy), _ = cv2.phaseCorrelate(a8.astype(np.float64), b8.astype(np.float64), window)
    return np.array([[1.0, 0.0, dx], [0.0, 1.0, dy]])


def warp_to(b: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``b`` sampled at ``M @ [x, y, 1]`` for every pixel (x, y): ``b`` in the coordinates of the frame ``M`` was
    estimated from (bilinear, borders replicated); float32."""
    import cv2

    h, w = b.shape[:2]
    return cv2.warpAffine(np.asarray(b, np.float32), np.asarray(m, np.float64), (w, h),
                          flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE)


def compose(m_ab: np.ndarray, m_bc: np.ndarray) -> np.ndarray:
    """The map from ``a`` to ``c`` given ``a -> b`` and ``b -> c`` (2x3 each)."""
    full = lambda m: np.vstack([m, [0.0, 0.0, 1.0]])  # noqa: E731
    return (full(m_bc) @ full(m_ab))[:2]
