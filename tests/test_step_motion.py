"""bench/step_motion/step_motion.py: latent motion against a float64 loop, and shares read from planted trajectories."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lib.tiny import latent_motion, run_motion


def test_latent_motion_matches_a_loop_and_reads_planted_motion():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5 * 4, 3))
    frames = x.reshape(5, 4, 3)
    loop = sum(((frames[i + 1] - frames[i]) ** 2).sum() for i in range(4)) / (4 * 4 * 3)
    assert latent_motion(x, 5) == pytest.approx(loop, rel=1e-12)
    still = np.tile(rng.normal(size=(1, 4, 3)), (5, 1, 1)).reshape(20, 3)
    assert latent_motion(still, 5) == 0.0
    ramp = (np.arange(5)[:, None, None] * 0.5 * np.ones((5, 4, 3))).reshape(20, 3)  # each frame 0.5 above the last
    assert latent_motion(ramp, 5) == pytest.approx(0.25, rel=1e-12)
    with pytest.raises(ValueError, match="do not split"):
        latent_motion(x, 6)


def test_step_shares_of_planted_trajectories(tmp_path):
    """A teacher clip moving 1.0 a frame and a student whose steps move 0.5, 1.0 and 1.5 a frame: shares 0.25, 1, 2.25
    (motion is squared), mixture their mean."""
    def traj(speeds):
        return np.stack([(np.arange(4)[:, None, None] * v * np.ones((4, 2, 3))).reshape(8, 3) for v in speeds])

    for name, speeds in (("baseline", [0.3, 1.0]), ("turbo4-tiny", [0.5, 1.0, 1.5])):
        (tmp_path / "clips" / name).mkdir(parents=True)
        np.savez(tmp_path / "clips" / name / "p-s0.traj.npz", video_x0=traj(speeds), video_row_stride=np.array(1))
    result = run_motion(tmp_path, "baseline", "turbo4-tiny", frames=4)
    assert result["teacher_mean"] == pytest.approx(1.0)
    assert result["step_shares"] == pytest.approx([0.25, 1.0, 2.25])
    assert result["mixture_share"] == pytest.approx((0.25 + 1.0 + 2.25) / 3)
