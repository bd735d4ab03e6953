"""Colourfulness (higher is better): Hasler & Suesstrunk 2003, ``sqrt(var(rg) + var(yb)) + 0.3 sqrt(mean(rg)^2 +
mean(yb)^2)`` with ``rg = R - G``, ``yb = (R + G) / 2 - B`` on 0..255. :func:`colourfulness` scores one uint8 RGB
frame exactly (integer moments); :func:`colourfulness_torch` a batch on a torch device in float64."""

from __future__ import annotations

import math

import numpy as np

higher_is_better = True


def colourfulness(frame: np.ndarray) -> float:
    """Hasler & Suesstrunk 2003 colourfulness of one uint8 RGB frame (population statistics, 0..255 scale). The
    opponent channels of 8-bit pixels are integers (``yb`` a half-integer): their sums and sums of squares are exact in
    int64, so the moments come out exact up to the final division (no float64 copies of the frame)."""
    f = np.asarray(frame)
    r, g, b = (f[..., c].astype(np.int32) for c in range(3))
    rg = r - g
    yb2 = r + g - 2 * b  # 2 * yb
    n = rg.size
    s_rg, ss_rg = int(rg.sum(dtype=np.int64)), int(np.square(rg, dtype=np.int64).sum())
    s_yb2, ss_yb2 = int(yb2.sum(dtype=np.int64)), int(np.square(yb2, dtype=np.int64).sum())
    var_rg = (ss_rg * n - s_rg * s_rg) / (n * n)
    var_yb = (ss_yb2 * n - s_yb2 * s_yb2) / (4 * n * n)
    mean_rg, mean_yb = s_rg / n, s_yb2 / (2 * n)
    return float(math.sqrt(var_rg + var_yb) + 0.3 * math.sqrt(mean_rg ** 2 + mean_yb ** 2))


def colourfulness_torch(frames):
    """:func:`colourfulness` of each uint8 RGB frame of ``frames`` (N, H, W, 3) on a torch device: (N,) float64."""
    import torch

    f = frames.double()
    rg = f[..., 0] - f[..., 1]
    yb = 0.5 * (f[..., 0] + f[..., 1]) - f[..., 2]
    return (torch.sqrt(rg.var(dim=(1, 2), unbiased=False) + yb.var(dim=(1, 2), unbiased=False))
            + 0.3 * torch.sqrt(rg.mean(dim=(1, 2)) ** 2 + yb.mean(dim=(1, 2)) ** 2))
