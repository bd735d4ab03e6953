"""Dense optical flow for the motion metrics (a helper, no quality metric): OpenCV's Farneback flow with its documented
example parameters, area downscaling and bilinear warping."""

from __future__ import annotations

import numpy as np

higher_is_better = None


FARNEBACK = dict(pyr_scale=0.5, levels=3, winsize=15, iterations=3, poly_n=5, poly_sigma=1.2, flags=0)
"""OpenCV's documented example parameters of calcOpticalFlowFarneback."""


def flow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dense Farneback flow (H, W, 2) from luma frame ``a`` to ``b`` (float 0..255): ``b(x + f(x)) ~ a(x)``."""
    import cv2

    return cv2.calcOpticalFlowFarneback(np.clip(a, 0, 255).astype(np.uint8), np.clip(b, 0, 255).astype(np.uint8),
                                        None, **FARNEBACK)


def downscale(frames: np.ndarray, max_side: int) -> np.ndarray:
    """Frames (T, H, W[, C]) area-averaged so that the longer side is at most ``max_side``."""
    import cv2

    t, h, w = frames.shape[:3]
    scale = max_side / max(h, w)
    if scale >= 1:
        return frames
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames])


def warp(image: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """``image`` sampled at ``x + offset(x)`` (bilinear, borders replicated); image (H, W[, C]) float32."""
    import cv2

    h, w = image.shape[:2]
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return cv2.remap(np.asarray(image, np.float32), gx + offset[..., 0].astype(np.float32),
                     gy + offset[..., 1].astype(np.float32), interpolation=cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_REPLICATE)


def consecutive_flows(gray: np.ndarray) -> list[np.ndarray]:
    return [flow(gray[t], gray[t + 1]) for t in range(len(gray) - 1)]
