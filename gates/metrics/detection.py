"""The result of an artifact detector: a per-clip statistic, the threshold it is compared with, and the flag.

Not a metric itself (``higher_is_better`` None); every detector module returns one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

higher_is_better = None


@dataclass(frozen=True)
class Detection:
    statistic: float
    """The per-clip statistic (finite; direction declared by the detector module's ``higher_is_better``)."""
    threshold: float
    flagged: bool
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("statistic", "threshold"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"detection {name} must be a finite number, got {value!r}")


def check_frames(frames, minimum: int = 3):
    """uint8 (T, H, W, 3) or float/uint8 luma (T, H, W) frames as a numpy array; ValueError on anything else."""
    import numpy as np

    f = np.asarray(frames)
    if f.ndim not in (3, 4) or (f.ndim == 4 and f.shape[-1] != 3):
        raise ValueError(f"expected frames (T, H, W, 3) or luma (T, H, W), got shape {f.shape}")
    if len(f) < minimum:
        raise ValueError(f"a clip of {len(f)} frame(s): at least {minimum} are needed")
    if f.dtype != np.uint8 and not np.isfinite(f).all():
        raise ValueError("frames hold NaN/Inf values")
    return f


def to_luma(frames, max_side: int | None = None):
    """BT.601 luma, float32 on 0..255 (T, H, W), area-downscaled so that the longer side is at most ``max_side``."""
    import cv2
    import numpy as np

    f = check_frames(frames, minimum=1)
    if f.ndim == 4:
        g = np.empty(f.shape[:3], np.float32)
        for t in range(len(f)):
            x = f[t].astype(np.float32)
            g[t] = 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]
    else:
        g = f.astype(np.float32)
    h, w = g.shape[1:]
    if max_side and max(h, w) > max_side:
        scale = max_side / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        g = np.stack([cv2.resize(x, size, interpolation=cv2.INTER_AREA) for x in g])
    return g
