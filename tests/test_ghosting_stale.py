"""The ghosting gate's in-place stale copy (seed 001's ghost) and the run-level test that pools it over a run's pairs
(gates.metrics.ghost_run): a planted stale copy of known strength is measured at that strength and lag, benign
noise and identical pairs score about 0, the run rule is the mean against the threshold, non-finite input refused."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from bench.lib.ghosting import plant_ghost
from gates.ghosting import GhostingConfig, ghost_scores
from gates.metrics import ghost_run
from tests.test_gate_ghosting import moving_texture

CONFIG = dataclasses.replace(GhostingConfig(), frame_stride=1)


@pytest.fixture(scope="module")
def src() -> np.ndarray:
    return moving_texture(num_frames=12, height=96, width=128, seed=7)


@pytest.mark.parametrize("lag", [2, 4])
def test_planted_stale_copy_is_measured_at_its_strength_and_lag(src, lag):
    cand = plant_ghost(src, 4, len(src) - 4, 0.05, lag, 0, 0)
    fs = ghost_scores(src[4:], cand, CONFIG)
    (win,) = fs.windows
    assert win.stale_lag == lag
    assert win.stale_strength == pytest.approx(0.05, abs=0.006)  # rounding to 8 bits is the only other change
    assert 0.03 < win.stale_evidence <= win.stale_strength
    assert ghost_run.pair_statistic(fs) == pytest.approx(win.stale_evidence)


def test_identical_and_noise_pairs_score_about_zero(src):
    same = ghost_scores(src[4:], src[4:].copy(), CONFIG)
    assert ghost_run.pair_statistic(same) == 0.0 and [w.stale_lag for w in same.windows] == [-1]
    rng = np.random.default_rng(3)
    noisy = np.clip(src[4:].astype(np.int16) + rng.integers(-1, 2, src[4:].shape), 0, 255).astype(np.uint8)
    assert abs(ghost_run.pair_statistic(ghost_scores(src[4:], noisy, CONFIG))) < 0.005


def test_run_rule_is_the_mean_against_the_threshold():
    assert ghost_run.run_statistic([0.0] * 15 + [0.16]) == pytest.approx(0.01)
    assert ghost_run.run_fails([0.012] * 16, threshold=0.01) is True
    assert ghost_run.run_fails([0.05] * 4 + [0.0] * 12, threshold=0.01) is True  # mean 0.0125: 4 ghosted pairs
    assert ghost_run.run_fails([0.03] * 4 + [-0.005] * 12, threshold=0.01) is False  # mean 0.00375
    assert ghost_run.run_fails([0.0] * 16, threshold=0.01) is False


@pytest.mark.parametrize("bad", [[], [0.1, float("nan")], [[0.1, 0.2]], [math.inf]])
def test_non_finite_or_malformed_pair_statistics_are_refused(bad):
    with pytest.raises(ValueError):
        ghost_run.run_fails(bad)


def test_fit_threshold_is_the_largest_kind_bound():
    a, b = [0.0, 0.002, 0.004], [0.01, 0.01, 0.013]
    expected = max(np.mean(v) + ghost_run.Z * np.std(v, ddof=1) / 4 for v in (a, b))
    assert ghost_run.fit_threshold({"a": a, "b": b}) == pytest.approx(expected)
    with pytest.raises(ValueError):
        ghost_run.fit_threshold({"a": [0.1]})
    with pytest.raises(ValueError):
        ghost_run.run_fails([0.0], threshold=float("nan"))
