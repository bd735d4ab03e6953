"""Ghosting gate, fine lag-0 pass (GhostingConfig.fine_lag0, opt-in): a lag-0 copy displaced by 2 working pixels,
the coarse fit's weak spot (bench/ghosting/results/ghosting_calibration.md, 'Lag-0 copies by displacement'), is found at its
strength and flagged, where the default detector (no fine pass) misses it; a benign re-encode stays unflagged; the
torch path equals the numpy one. The pass is off by default because its null does not hold out of sample
(bench/ghosting/results/ghosting_calibration_fine_lag0.md)."""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest

from bench.lib.ghosting import plant_ghost, procedural_scene
from gates.ghosting import GhostingConfig, downsample_factor, ghost_scores, is_flagged, pair_p_value
from tests.test_gate_ghosting import roundtrip  # through the runtime's codec, decoded back

# The fine pass on, at the gate's frame_stride 2, as its record measured it: without the motion mask (motion_rms 0;
# the plant is a copy of the whole frame, static parts included, which the mask leaves out on purpose).
CONFIG = dataclasses.replace(GhostingConfig(), fine_lag0=True, motion_rms=0.0)
COARSE_ONLY = GhostingConfig()  # the shipped default: no fine pass
ALPHA = 0.10
SHIFT = (0, 4)  # full-resolution pixels: 2 working pixels at the clip's downsampling factor 2


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> dict[str, np.ndarray]:
    """A 32-frame procedural scene (smooth textures, moving shapes) at 240x448, analysed at factor 2 (one window of
    16 scored frames); candidates through the runtime's codec (CRF 18) as in a real run."""
    tmp = tmp_path_factory.mktemp("ghosting_small_shift")
    src = procedural_scene(36, seed=0, height=120, width=224, scale=2)
    base = src[4:]
    raw = {"base": base, "lag0_2px": plant_ghost(src, 4, len(base), ALPHA, 0, *SHIFT),
           "crf28": roundtrip(tmp, base, 28, "crf28")}
    return {name: roundtrip(tmp, frames, 18, name) for name, frames in raw.items()}


def test_the_clip_is_analysed_at_factor_2(clip):
    h, w = clip["base"].shape[1:3]
    assert downsample_factor(h, w, CONFIG.work_long_side) == 2


def test_lag0_copy_two_working_pixels_away_is_flagged_at_its_strength(clip):
    fs = ghost_scores(clip["base"], clip["lag0_2px"], CONFIG)
    (win,) = fs.windows
    assert is_flagged(fs, CONFIG) and win.p_value <= CONFIG.flag_p, win
    assert (win.lag, win.dy, win.dx) == (0, *SHIFT) and win.factor == 1  # found by the fine pass, at full resolution
    assert win.score == pytest.approx(ALPHA, abs=0.015)


def test_the_coarse_detector_alone_misses_it(clip):
    """The planted defect the fine pass exists for: without it (the default) the copy is mostly absorbed by the
    one-pixel nuisance, its strength underestimated and the pair not flagged."""
    fs = ghost_scores(clip["base"], clip["lag0_2px"], COARSE_ONLY)
    (win,) = fs.windows
    assert not is_flagged(fs, COARSE_ONLY), win
    assert win.factor == 2 and win.score < 0.6 * ALPHA


def test_benign_reencode_stays_unflagged(clip):
    fs = ghost_scores(clip["base"], clip["crf28"], CONFIG)
    assert not is_flagged(fs, CONFIG) and pair_p_value(fs) > 0.01, fs.windows


def test_identical_pair_scores_zero_with_the_fine_pass(clip):
    fs = ghost_scores(clip["base"], clip["base"].copy(), CONFIG)
    assert [(w.score, w.evidence, w.p_value) for w in fs.windows] == [(0.0, 0.0, 1.0)]


@pytest.mark.parametrize("name", ["lag0_2px", "crf28"])
def test_torch_path_equals_numpy_with_the_fine_pass(clip, name):
    pytest.importorskip("torch")
    a = ghost_scores(clip["base"], clip[name], CONFIG)
    b = ghost_scores(clip["base"], clip[name], CONFIG, device="torch:cpu")
    for wa, wb in zip(a.windows, b.windows, strict=True):
        assert (wa.lag, wa.dy, wa.dx, wa.factor, wa.blocks) == (wb.lag, wb.dy, wb.dx, wb.factor, wb.blocks)
        assert wa.score == pytest.approx(wb.score, rel=1e-5, abs=1e-7)
        assert wa.evidence == pytest.approx(wb.evidence, rel=1e-5, abs=1e-7)
