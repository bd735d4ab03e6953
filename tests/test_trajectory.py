"""Latent trajectory recording and the trajectory gate on the tiny preset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gates.base import ClipSide, PairContext, PairRef, get_gate
from gates.trajectory import common_steps, rel_l2, trajectory_divergence
from h3.recipe import recipe_from_dict
from h3.runtime import GenerateRequest, H3Runtime
from h3.trajectory import load_trajectory, trajectory_path
from tests.conftest import FAST_RECIPE

REQUEST = dict(prompt="A person is squat", seed=0, prompt_id="squat")


@pytest.fixture(scope="module")
def base_clip(tiny_random_runtime, tmp_path_factory):
    out = tmp_path_factory.mktemp("traj") / "base.mp4"
    record = tiny_random_runtime.generate(GenerateRequest(**REQUEST), out, trajectory=True)
    return out, record


def test_recording_does_not_change_the_clip(tiny_random_runtime, base_clip, tmp_path):
    out, record = base_clip
    plain = tiny_random_runtime.generate(GenerateRequest(**REQUEST), tmp_path / "plain.mp4")
    assert (tmp_path / "plain.mp4").read_bytes() == out.read_bytes()
    assert plain.frames_sha256 == record.frames_sha256
    traj = load_trajectory(trajectory_path(out))
    assert traj["video_t"].shape == (2,) and traj["audio_t"].shape == (2,)
    assert traj["video_t"][0] == 0.0  # the first step is pure noise: t = 1 - sigma = 0
    # Rows: 37 latent frames x (128/16/2)^2 patch rows; 24 channels x (1,2,2) patch = 96.
    assert traj["video_xt"].shape == (2, 37 * 16, 96)
    assert traj["audio_xt"].shape == (2, 2 * 207, 32)


def test_x0_is_what_the_scheduler_computes(base_clip):
    """x0 = x_t + (1 - t) v, so the next x_t is the scheduler's Euler blend of x_t and x0 (float64 reference)."""
    out, _ = base_clip
    traj = load_trajectory(trajectory_path(out))
    sigma = 1.0 - traj["video_t"]  # t = 1 - sigma
    ratio = sigma[1] / sigma[0]
    expected = ratio * traj["video_xt"][0].astype(np.float64) + (1 - ratio) * traj["video_x0"][0].astype(np.float64)
    np.testing.assert_allclose(traj["video_xt"][1], expected, rtol=1e-5, atol=1e-5)


def test_identical_candidate_has_zero_divergence(tiny_random_runtime, base_clip, tmp_path):
    out, record = base_clip
    tiny_random_runtime.generate(GenerateRequest(**REQUEST), tmp_path / "cand.mp4", trajectory=True)
    result = trajectory_divergence(load_trajectory(trajectory_path(out)),
                                   load_trajectory(trajectory_path(tmp_path / "cand.mp4")), 37)
    for name, values in result["series"].items():
        assert values == [0.0] * len(values), name
    assert all(v == 0.0 for v in result["metrics"].values())
    assert result["info"]["video_first_divergent_step"] is None and not result["growth_flag"]


def test_noise_injected_at_one_step_diverges_from_that_step(fast_recipe, tmp_path, base_clip):
    """A 3-step run; the velocity of step 1 is perturbed: x0 diverges at step 1, x_t only after it."""
    recipe = recipe_from_dict({**FAST_RECIPE, "steps": 3})
    runtime = H3Runtime.load("tiny-random", recipe, "cpu")
    runtime.generate(GenerateRequest(**REQUEST), tmp_path / "base.mp4", trajectory=True)
    calls = {"n": 0}

    def perturb(module, args, kwargs, output):
        calls["n"] += 1
        if calls["n"] == 2:  # the second denoising step (index 1)
            video, audio = output
            noise = torch.randn(video.shape, generator=torch.Generator().manual_seed(0), dtype=video.dtype)
            return (video + 0.05 * noise, audio)
        return output

    handle = runtime.pipe.transformer.register_forward_hook(perturb, with_kwargs=True)
    try:
        runtime.generate(GenerateRequest(**REQUEST), tmp_path / "cand.mp4", trajectory=True)
    finally:
        handle.remove()
    result = trajectory_divergence(load_trajectory(trajectory_path(tmp_path / "base.mp4")),
                                   load_trajectory(trajectory_path(tmp_path / "cand.mp4")), 37)
    xt, x0 = result["series"]["video_xt_rel_l2"], result["series"]["video_x0_rel_l2"]
    assert xt[0] == 0.0 and xt[1] == 0.0 and xt[2] > 0.0
    assert x0[0] == 0.0 and x0[1] > 0.0 and x0[2] > 0.0
    assert result["info"]["video_first_divergent_step"] == 1
    # Audio was not perturbed at step 1 but feels it through attention from step 2 on.
    assert result["series"]["audio_x0_rel_l2"][1] == 0.0 and result["series"]["audio_x0_rel_l2"][2] > 0.0


def test_fewer_steps_compare_on_common_noise_levels(tmp_path, base_clip):
    out, _ = base_clip  # 2 steps: sigma grid linspace(1, 0, 3) shifted
    runtime = H3Runtime.load("tiny-random", recipe_from_dict({**FAST_RECIPE, "steps": 4}), "cpu")
    runtime.generate(GenerateRequest(**REQUEST), tmp_path / "c4.mp4", trajectory=True)
    base, cand = load_trajectory(trajectory_path(out)), load_trajectory(trajectory_path(tmp_path / "c4.mp4"))
    # linspace(1,0,3) and linspace(1,0,5) share sigma 1 and 0.5: two common noise levels.
    assert common_steps(base["video_t"], cand["video_t"]) == [(0, 0), (1, 2)]
    result = trajectory_divergence(base, cand, 37)
    assert "common noise level" in result["info"]["video_note"]
    assert result["series"]["video_xt_rel_l2"][0] == 0.0 and result["series"]["video_xt_rel_l2"][1] > 0.0
    assert result["metrics"]["video_x0_rel_l2_final"] > 0.0


def test_rel_l2_matches_float64_definition():
    rng = np.random.default_rng(0)
    b = rng.standard_normal((50, 8)).astype(np.float32)
    c = b + 0.01 * rng.standard_normal((50, 8)).astype(np.float32)
    expected = np.sqrt(sum((float(x) - float(y)) ** 2 for x, y in zip(c.ravel(), b.ravel()))) / np.sqrt(
        sum(float(y) ** 2 for y in b.ravel()))
    assert rel_l2(c, b) == pytest.approx(expected, rel=1e-12)


def test_growth_flag_on_compounding_divergence():
    rng = np.random.default_rng(1)
    steps = 4
    base = {"video_t": np.linspace(0, 0.9, steps), "video_xt": rng.standard_normal((steps, 16, 4)),
            "video_x0": rng.standard_normal((steps, 16, 4))}
    cand = {k: v.copy() for k, v in base.items()}
    for k, scale in enumerate([1e-4, 1e-3, 1e-2, 1e-1]):  # 10x per step
        cand["video_x0"][k] += scale * rng.standard_normal((16, 4))
    assert trajectory_divergence(base, cand)["growth_flag"]
    flat = {k: v.copy() for k, v in base.items()}
    for k in range(steps):
        flat["video_x0"][k] += 0.05 * rng.standard_normal((16, 4))
    assert not trajectory_divergence(base, flat)["growth_flag"]


def test_gate_result_and_missing_trajectory(base_clip, tmp_path):
    out, record = base_clip
    gate = get_gate("trajectory")
    ctx = PairContext(run_dir=out.parent, pair=PairRef(baseline="b", candidate="c", prompt_id="squat", seed=0),
                      baseline=ClipSide("b", out, json.loads(record.model_dump_json())),
                      candidate=ClipSide("c", out, json.loads(record.model_dump_json())),
                      artifact_dir=out.parent)
    result = gate.evaluate(ctx)
    assert result.error is None and result.metrics["video_x0_rel_l2_final"].value == 0.0
    assert result.metrics["video_x0_rel_l2_final"].higher_is_better is False
    assert result.artifacts and (out.parent / result.artifacts[0]).exists()
    ctx.candidate = ClipSide("c", tmp_path / "none.mp4", {})
    missing = gate.evaluate(ctx)
    assert missing.status == "error" and "none.traj.npz" in missing.error and not missing.metrics
