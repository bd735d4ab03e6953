"""Sharpness (higher is better): the variance of the 4-neighbour Laplacian of the luma (0..255 scale), borders
reflected (OpenCV's BORDER_REFLECT_101). :func:`sharpness` scores one frame with OpenCV; :func:`sharpness_torch` a
batch of float64 luma frames on a torch device, the same formula."""

from __future__ import annotations

import numpy as np

higher_is_better = True


def sharpness(gray: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of one luma frame (float, 0..255), borders reflected (OpenCV's
    BORDER_REFLECT_101)."""
    import cv2

    lap = cv2.Laplacian(np.asarray(gray, np.float64), cv2.CV_64F, ksize=1, borderType=cv2.BORDER_REFLECT_101)
    return float(lap.var())


def sharpness_torch(g):
    """:func:`sharpness` of each float64 luma frame of ``g`` (N, H, W) on a torch device: (N,) float64."""
    import torch.nn.functional as F

    # 4-neighbour Laplacian, borders reflected without repeating the edge (BORDER_REFLECT_101)
    p = F.pad(g[:, None], (1, 1, 1, 1), mode="reflect")[:, 0]
    lap = p[:, :-2, 1:-1] + p[:, 2:, 1:-1] + p[:, 1:-1, :-2] + p[:, 1:-1, 2:] - 4.0 * g
    return lap.var(dim=(1, 2), unbiased=False)
