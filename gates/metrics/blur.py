"""Blur (lower is better, 0..1): the no-reference blur of Crete-Roffet et al. 2007 ("The blur effect"): how much of
the luma's neighbour differences a 9-tap re-blur removes, the worse of the two directions. :func:`blur` scores one
frame (numpy); :func:`blur_torch` a batch of float64 luma frames on a torch device."""

from __future__ import annotations

import numpy as np

higher_is_better = False


def blur(gray: np.ndarray) -> float:
    """Crete-Roffet et al. 2007 no-reference blur of one luma frame: 0 sharp .. 1 blurred.

    The re-blur is a 9-tap moving average with the edges repeated (scipy's ``uniform_filter1d(size=9,
    mode="nearest")``); its neighbour difference is computed in closed form, ``(f[i + 5] - f[i - 4]) / 9`` with the
    indices clamped to the frame, instead of filtering first (the same values to ~1e-15; tests compare with scipy)."""
    f = np.asarray(gray, np.float64)
    worst = 0.0
    for axis in (0, 1):
        n = f.shape[axis]
        d_f = np.abs(np.diff(f, axis=axis))
        s_f = d_f.sum()
        if s_f == 0:
            continue  # a flat frame has nothing to lose along this axis
        pad = [(0, 0), (0, 0)]
        pad[axis] = (4, 5)
        padded = np.pad(f, pad, mode="edge")  # padded[j] = f[clamp(j - 4)]
        hi = padded[9:n + 8] if axis == 0 else padded[:, 9:n + 8]
        lo = padded[:n - 1] if axis == 0 else padded[:, :n - 1]
        d_b = np.abs(hi - lo) / 9.0
        s_v = np.maximum(0.0, d_f - d_b).sum()
        worst = max(worst, float((s_f - s_v) / s_f))
    return worst


def blur_torch(g):
    """:func:`blur` of each float64 luma frame of ``g`` (N, H, W) on a torch device (the re-blur as a 9-tap average
    pool with the edges replicated): (N,) float64."""
    import torch
    import torch.nn.functional as F

    worst = torch.zeros(len(g), dtype=torch.float64, device=g.device)
    for axis in (1, 2):
        pad = (0, 0, 4, 4) if axis == 1 else (4, 4, 0, 0)
        kernel = (9, 1) if axis == 1 else (1, 9)
        reblurred = F.avg_pool2d(F.pad(g[:, None], pad, mode="replicate"), kernel, stride=1)[:, 0]
        d_f = torch.diff(g, dim=axis).abs_()
        d_b = torch.diff(reblurred, dim=axis).abs_()
        s_f = d_f.sum(dim=(1, 2))
        s_v = (d_f - d_b).clamp_(min=0.0).sum(dim=(1, 2))
        value = torch.where(s_f > 0, (s_f - s_v) / torch.where(s_f > 0, s_f, 1.0), 0.0)
        worst = torch.maximum(worst, value)
    return worst
