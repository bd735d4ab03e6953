"""The clip viewer's pure pieces: the synchronized players' page and the labelled ghosting strip (the browser test
drives the players; the AppTest tests place both on the page)."""

from __future__ import annotations

import base64
import re
from types import SimpleNamespace

import numpy as np
import pytest

from dashboard.views import ghost_strip, player


def test_player_page_embeds_both_clips_and_the_clock():
    base, cand = bytes(range(256)) * 3, b"\x00candidate\xff" * 5
    page = player.player_html(base, cand, 24.0, 96, "base · a-s0.mp4", "<fp8> & co")
    for element, payload in (("clipA", base), ("clipB", cand)):
        m = re.search(rf'<script id="{element}" type="application/octet-stream">([^<]*)</script>', page)
        assert m and base64.b64decode(m.group(1)) == payload
    assert 'data-fps="24.0" data-frames="96"' in page and 'max="95"' in page
    assert "B: candidate · &lt;fp8&gt; &amp; co" in page and "<fp8>" not in page  # labels are escaped
    assert "__" not in re.sub(r"<script id=\"clip[AB]\"[^>]*>[^<]*</script>", "", page)  # every placeholder filled
    # a label that looks like a placeholder is shown as typed, not substituted
    assert "A: baseline · __FPS__" in player.player_html(b"a", b"b", 25.0, 10, "__FPS__", "b")
    with pytest.raises(ValueError, match="fps must be positive"):
        player.player_html(b"a", b"b", 0.0, 10, "a", "b")


def test_player_embeds_only_pairs_under_the_limit(tmp_path, monkeypatch):
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    a.write_bytes(b"x" * 600)
    b.write_bytes(b"x" * 400)
    monkeypatch.setattr(player, "MAX_EMBED_BYTES", 1000)
    assert player.fits(a, b)
    b.write_bytes(b"x" * 401)
    assert not player.fits(a, b)


def _gate_strip(base: np.ndarray, cand: np.ndarray, indices: list[int]) -> np.ndarray:
    """The ghosting gate's own strip of these frames (no copy found: lag -1, so its heatmap is all zeros)."""
    from gates.ghosting import GhostingConfig, render_strip

    n = len(base)
    scores = SimpleNamespace(lag=np.full(n, -1), dy=np.zeros(n, int), dx=np.zeros(n, int))
    return render_strip(base, cand, scores, indices, GhostingConfig())


def test_strip_is_split_into_the_gates_panels_and_labelled():
    import cv2
    from matplotlib import colormaps

    rng = np.random.default_rng(3)
    base = rng.integers(0, 256, (8, 48, 64, 3), dtype=np.uint8)  # 64 wide, 48 high: the aspect matters
    cand = base.copy()
    cand[5] = np.clip(cand[5].astype(int) + 2, 0, 255).astype(np.uint8)
    strip = _gate_strip(base, cand, [2, 5])
    rows = ghost_strip.split_strip(strip, 48, 64)
    assert rows is not None and len(rows) == 2 and all(len(r) == 4 for r in rows)
    gain, heat_max = ghost_strip.strip_settings()
    assert np.array_equal(rows[0][0], cv2.resize(base[2], (480, 360), interpolation=cv2.INTER_AREA))
    assert np.array_equal(rows[1][1], cv2.resize(cand[5], (480, 360), interpolation=cv2.INTER_AREA))
    assert (rows[0][2] == 128).all()  # identical frames: difference at mid grey
    assert np.median(rows[1][2]) == 128 + gain * 2  # +2 levels (clipped only at the top of the range), amplified
    zero = (np.array(colormaps["inferno"](0.0)[:3]) * 255).round()
    assert np.abs(rows[0][3].reshape(-1, 3).astype(float) - zero).max() <= 1  # no copy: the colour map's zero
    assert ghost_strip.split_strip(strip[:-1], 48, 64) is None  # not whole rows: not the gate's layout
    assert ghost_strip.split_strip(strip, 64, 64) is None  # another aspect: not this clip's strip

    fig = ghost_strip.labelled_figure(strip, [2, 5], 48, 64, gain, heat_max)
    axes = fig.axes
    assert axes[0].get_title() == "baseline" and axes[1].get_title() == "candidate"
    assert axes[2].get_title() == f"difference: 128 + {gain:g} x (candidate - baseline)"
    assert axes[3].get_title() == f"ghost heatmap (0 to {heat_max:g} luma levels)"
    assert axes[0].get_ylabel() == "frame 2\ny (px)" and axes[4].get_ylabel() == "frame 5\ny (px)"
    assert axes[4].get_xlabel() == "x (px)" and axes[0].get_xlim() == (0.0, 64.0)
    assert axes[0].get_ylim() == (48.0, 0.0)  # the frame's own pixels, top row first
    bars = [ax.get_ylabel() for ax in axes[8:]]
    assert bars == ["candidate - baseline (8-bit levels; mid grey = 0)", "levels the displaced copy adds"]
    assert axes[9].get_ylim() == (0.0, heat_max)
    png = ghost_strip.labelled_png(strip, [2, 5], 48, 64)
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert ghost_strip.labelled_png(strip[:-1], [2, 5], 48, 64) is None
