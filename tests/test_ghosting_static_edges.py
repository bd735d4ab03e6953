"""The ghosting fit's motion mask (gates.metrics.ghost_fit.moving_blocks, GhostingConfig.motion_rms; issue 50): a
displaced copy carries evidence only where the baseline moves.

The real pair: session 28's fresh pool 7 (bench/recipe_signoff/results/older/recipe_signoff_s28.md), prompt heldout-b-06
(a blue square rising over a static striped background) at seed 77, turbo4-tiny and turbo4-tiny-int8 as the
recipe_signoff corpus made them (tests/data/ghost_int8_stripes/). INT8, a correct recipe by the world's ground truth,
moves a few of the static stripes' edges by a fraction of a pixel; without the mask the pair test read that as a copy
4 px aside (pair p 3.4e-5 in the record, with the displacement compensation the gate runs), and every 16-pair run
drawing this pair FAILed the near judge's ghost test (54 of pool 7's 100 INT8 runs). Detection of copies of moving
content under the mask: tests/test_gate_ghosting.py (planted ghosts on a moving texture) and the calibration's
published rates (bench/ghosting/results/ghosting_calibration.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gates.metrics import ghost_backend
from gates.metrics import ghost_fit as fit
from gates.metrics.ghost import downsample_factor, ghost_scores
from gates.metrics.ghost_config import GhostingConfig
from gates.metrics.ghost_motion import compensate
from gates.metrics.ghost_pvalue import pair_p_value
from h3.media import decode_video

PAIR = Path(__file__).parent / "data" / "ghost_int8_stripes"


def test_moving_blocks_equal_a_direct_float64_computation():
    """Per block: the largest sum of squared differences from a frame within max_lag (earlier or later, among the
    frames given) against motion_rms^2 x block^2, then a 3 x 3 dilation, computed here block by block."""
    rng = np.random.default_rng(3)
    config = GhostingConfig()
    t_count, h, w = 12, 56, 64
    base = rng.normal(0.0, 1.0, (t_count, h, w))
    for t in range(t_count):  # a bright square moving 2 px a frame to the right, over faint static noise
        base[t, 20:36, 8 + 2 * t : 24 + 2 * t] += 60.0
    g = fit.geometry(h, w, config)
    row_of = {t: t for t in range(t_count) if t != 9}  # a frame the search did not prepare is not used
    frames = [0, 4, 8, 10]
    got = fit.moving_blocks(ghost_backend.NumpyBackend(1), base, row_of, frames, config, g)
    nby, nbx = g.blocks
    bs = config.block
    want = np.zeros((len(frames), nby, nbx), dtype=bool)
    for j, t in enumerate(frames):
        raw = np.zeros((nby, nbx), dtype=bool)
        for by in range(nby):
            for bx in range(nbx):
                ys, xs = g.m + by * bs, g.m + bx * bs
                best = 0.0
                for u in row_of:
                    if u != t and abs(u - t) <= config.max_lag:
                        diff = base[t, ys : ys + bs, xs : xs + bs] - base[u, ys : ys + bs, xs : xs + bs]
                        best = max(best, float((diff * diff).sum()))
                raw[by, bx] = best >= config.motion_rms**2 * bs * bs
        for by in range(nby):
            for bx in range(nbx):
                want[j, by, bx] = raw[max(0, by - 1) : by + 2, max(0, bx - 1) : bx + 2].any()
    np.testing.assert_array_equal(got, want)
    assert 0 < got.sum() < got.size  # some blocks move, the static ones do not
    off = fit.moving_blocks(ghost_backend.NumpyBackend(1), base, row_of, frames,
                            dataclasses.replace(config, motion_rms=0.0), g)
    assert off.all()


@pytest.fixture(scope="module")
def int8_pair():
    base = decode_video(PAIR / "turbo4-tiny.mp4")[0]
    cand = decode_video(PAIR / "turbo4-tiny-int8.mp4")[0]
    assert base.shape == cand.shape == (124, 128, 128, 3)
    compensated = compensate(base, cand, downsample_factor(128, 128, GhostingConfig().work_long_side)).frames
    return compensated, cand


def test_int8_moving_static_stripe_edges_is_not_a_ghost(int8_pair):
    base, cand = int8_pair
    unmasked = pair_p_value(ghost_scores(base, cand, dataclasses.replace(GhostingConfig(), motion_rms=0.0,
                                                                         copy_share_min=0.0)))
    masked = pair_p_value(ghost_scores(base, cand, GhostingConfig()))
    # Without the mask (and the later copy-share rule): the session-28 false alarm (3.4e-5), far below a 16-pair
    # run's BH level (0.01 / 16).
    assert unmasked < 1e-4
    # With it: above 0.01, BH's largest bar at the near judge's 1 % rate, so never a discovery in any run.
    assert masked > 0.01
