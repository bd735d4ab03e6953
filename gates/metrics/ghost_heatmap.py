"""Pictures of a paired ghost: the local amplitude of the selected copy (a heatmap, not a calibrated score) and the
strip baseline | candidate | amplified difference | heatmap that the ghosting gate writes and the dashboard shows.
Not a metric (``higher_is_better`` None)."""

from __future__ import annotations

import math

import numpy as np

from gates.metrics.ghost import downsample_factor, to_luma
from gates.metrics.ghost_config import FrameScores, GhostingConfig

higher_is_better = None


def local_ghost_map(
    frames_base: np.ndarray, frames_cand: np.ndarray, t: int, lag: int, dy: int, dx: int, config: GhostingConfig
) -> np.ndarray:
    """Per-pixel amplitude (8-bit luma levels) of the selected copy at frame ``t``, at full resolution (heatmap).

    Windowed least squares of ``cand - base`` onto ``d = S - base`` (box window of 9 working pixels, same ridge per
    pixel as the frame fit) gives a local strength; times the local RMS of ``d`` it is how many levels the ghost
    adds there: a picture of where the displaced copy is visible, not a calibrated score.
    """
    import cv2

    h_full, w_full = frames_base.shape[1:3]
    # A copy found by the fine lag-0 pass can sit between working pixels: use the finest factor that holds it.
    factor = math.gcd(downsample_factor(h_full, w_full, config.work_long_side), dy, dx)
    lo, hi = max(0, t - lag), t + 1
    base = to_luma(frames_base[lo:hi], factor)
    cand = to_luma(frames_cand[t : t + 1], factor)[0]
    b = base[-1]
    copy = np.roll(base[0], (dy // factor, dx // factor), axis=(0, 1))
    d = copy - b
    r = cand - b
    num = cv2.boxFilter(r * d, -1, (9, 9))
    energy = np.maximum(cv2.boxFilter(d * d, -1, (9, 9)), 0.0)  # the running box sum can dip below 0 by rounding
    amplitude = np.clip(num / (energy + config.ridge_rms**2), 0.0, None) * np.sqrt(energy)
    return cv2.resize(amplitude, (w_full, h_full), interpolation=cv2.INTER_NEAREST)


def render_strip(
    frames_base: np.ndarray, frames_cand: np.ndarray, fs: FrameScores, indices: list[int], config: GhostingConfig,
    panel_width: int = 480, gain: float = 8.0, heat_max: float = 6.0,
) -> np.ndarray:
    """RGB uint8 image: one row per frame index, panels baseline | candidate | amplified difference | heatmap.

    The difference is ``128 + gain * (cand - base)``; the heatmap maps the local ghost amplitude
    (:func:`local_ghost_map`) 0..``heat_max`` levels onto the inferno colormap.
    """
    import cv2

    h_full, w_full = frames_base.shape[1:3]
    panel_height = max(2, round(h_full * panel_width / w_full))
    rows = []
    for t in indices:
        b, c = frames_base[t], frames_cand[t]
        diff = np.clip(128.0 + gain * (c.astype(np.float32) - b.astype(np.float32)), 0, 255).astype(np.uint8)
        if fs.lag[t] >= 0:
            alpha = local_ghost_map(frames_base, frames_cand, t, int(fs.lag[t]), int(fs.dy[t]), int(fs.dx[t]), config)
        else:
            alpha = np.zeros((h_full, w_full))
        heat = np.clip(alpha / heat_max * 255.0, 0, 255).astype(np.uint8)
        heat = cv2.applyColorMap(heat, cv2.COLORMAP_INFERNO)[..., ::-1]
        panels = [cv2.resize(p, (panel_width, panel_height), interpolation=cv2.INTER_AREA) for p in (b, c, diff, heat)]
        rows.append(np.concatenate(panels, axis=1))
    return np.concatenate(rows, axis=0)


def png_bytes(rgb: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()
