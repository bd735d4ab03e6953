"""The ghosting gate's strip, labelled: the gate writes one bare RGB image (a row per frame, panels baseline |
candidate | amplified difference | heatmap, :func:`gates.ghosting.render_strip`); this draws it again with what each
row and panel is, pixel axes, and colour bars that say what a colour means.
"""

from __future__ import annotations

import inspect
import io

import numpy as np

PANELS = ("baseline", "candidate", "difference", "heatmap")


def strip_settings() -> tuple[float, float]:
    """(difference gain, heatmap full scale in luma levels) the gate draws its strips with (render_strip's
    defaults: the gate passes none)."""
    from gates.ghosting import render_strip

    params = inspect.signature(render_strip).parameters
    return float(params["gain"].default), float(params["heat_max"].default)


HEATMAP_MEANING = (
    "Heatmap cell: how many 8-bit luma levels the displaced copy adds at that pixel of the candidate frame, from a "
    "windowed least-squares fit (9-pixel box) of candidate - baseline onto the copy the gate found (frame t-lag of "
    "the baseline, shifted by (dy, dx) px). Black: no copy there; bright: the copy adds {heat_max:g} levels or more. "
    "It shows where the ghost is visible, not a calibrated score (the gate's p-value and strength are).")


def split_strip(strip: np.ndarray, frame_height: int, frame_width: int) -> list[list[np.ndarray]] | None:
    """The strip's panels, row by row (4 per row), or None when its size is not a whole number of rows of four
    panels of the frame's aspect (then it is not the gate's layout)."""
    if strip.ndim != 3 or strip.shape[1] % len(PANELS) or frame_height <= 0 or frame_width <= 0:
        return None
    panel_w = strip.shape[1] // len(PANELS)
    panel_h = max(2, round(frame_height * panel_w / frame_width))
    if strip.shape[0] % panel_h:
        return None
    return [[strip[r * panel_h:(r + 1) * panel_h, c * panel_w:(c + 1) * panel_w] for c in range(len(PANELS))]
            for r in range(strip.shape[0] // panel_h)]


def labelled_figure(strip: np.ndarray, frames: list[int] | None, frame_height: int, frame_width: int,
                    gain: float, heat_max: float):
    """A matplotlib Figure of the strip with titles, row labels (the frame each row shows), axes in the frame's
    pixels and colour bars for the difference and the heatmap; None when the strip is not the gate's layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    rows = split_strip(strip, frame_height, frame_width)
    if rows is None:
        return None
    aspect = frame_height / frame_width
    fig, axes = plt.subplots(len(rows), len(PANELS), squeeze=False,
                             figsize=(13.0, 0.6 + len(rows) * 3.0 * aspect), layout="constrained")
    titles = ("baseline", "candidate", f"difference: 128 + {gain:g} x (candidate - baseline)",
              f"ghost heatmap (0 to {heat_max:g} luma levels)")
    extent = (0, frame_width, frame_height, 0)
    for r, panels in enumerate(rows):
        label = f"frame {frames[r]}" if frames is not None and r < len(frames) else f"row {r + 1}"
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            ax.imshow(panel, extent=extent, interpolation="nearest")
            ax.tick_params(labelsize=7)
            if r == 0:
                ax.set_title(titles[c], fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{label}\ny (px)", fontsize=9)
            if r == len(rows) - 1:
                ax.set_xlabel("x (px)", fontsize=8)
    half = 128.0 / gain
    diff_bar = fig.colorbar(ScalarMappable(Normalize(-half, half), "gray"), ax=[row[2] for row in axes],
                            shrink=0.9, pad=0.01)
    diff_bar.set_label("candidate - baseline (8-bit levels; mid grey = 0)", fontsize=8)
    heat_bar = fig.colorbar(ScalarMappable(Normalize(0.0, heat_max), "inferno"), ax=[row[3] for row in axes],
                            shrink=0.9, pad=0.01, extend="max")
    heat_bar.set_label("levels the displaced copy adds", fontsize=8)
    return fig


def labelled_png(strip: np.ndarray, frames: list[int] | None, frame_height: int, frame_width: int) -> bytes | None:
    """The labelled strip as PNG bytes (the gate's own gain and full scale), or None when not the gate's layout."""
    import matplotlib.pyplot as plt

    gain, heat_max = strip_settings()
    fig = labelled_figure(strip, frames, frame_height, frame_width, gain, heat_max)
    if fig is None:
        return None
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
