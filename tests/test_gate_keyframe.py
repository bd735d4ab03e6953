"""The keyframe gate (issue 25): keyframes placed as diffusers places them, planted keyframe mismatches of known size,
planted identity changes of the reference's subject, and the gate through the suite's runner on real MP4s."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gates.base import GateResult
from gates.keyframe import KeyframeGate, ReferenceProfile, adherence, identity_distances, keyframe_targets
from gates.fidelity import load_lpips
from h3.conditioning import image_from_array
from h3.media import decode_video
from h3eval.gaterun import run_gates
from h3eval.store import RunStore
from h3eval.synth import make_synthetic_run, tone_pcm

N, H, W = 24, 128, 128


def smooth_image(seed: int, h: int = H, w: int = W) -> np.ndarray:
    """A smooth RGB image with values in [50, 200] (so a +40 planted block never clips)."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 6.28, 3)
    channels = [125 + 75 * np.sin(2 * np.pi * (1.3 + c) * x + 4 * y + phase[c]) for c in range(3)]
    return np.rint(np.stack(channels, axis=-1)).astype(np.uint8)


def disc_scene(colour, shape: str = "circle", centre=(64, 64), background=(40, 36, 48), stripes: bool = False):
    frame = np.empty((H, W, 3), np.uint8)
    frame[:] = background
    if stripes:  # a two-tone background 20 levels apart, as the world's striped backgrounds are
        frame[:, ::16] = np.array(background) + 20
    y, x = np.mgrid[0:H, 0:W]
    if shape == "circle":
        mask = (y - centre[0]) ** 2 + (x - centre[1]) ** 2 <= 14**2
    else:
        mask = (abs(y - centre[0]) <= 12) & (abs(x - centre[1]) <= 12)
    frame[mask] = colour
    return frame, mask


def test_keyframes_are_placed_exactly_as_diffusers_resize_step_places_them(tiny_random_runtime):
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3ResizeStep
    from diffusers.modular_pipelines.modular_pipeline import PipelineState

    first = image_from_array(smooth_image(1, 96, 160))
    last = image_from_array(smooth_image(2, 200, 100))
    for images in ({"first_frame": first, "last_frame": last}, {"last_frame": last}, {"first_frame": first}):
        state = PipelineState()
        state.set("image", images["first_frame"].pil() if "first_frame" in images else None)
        state.set("last_image", images["last_frame"].pil() if "last_frame" in images else None)
        state.set("height", H)
        state.set("width", W)
        _, state = MiniMaxH3ResizeStep()(tiny_random_runtime.pipe, state)
        ours = keyframe_targets(images, H, W)
        assert list(ours) == list(state.get("keyframe_anchors"))
        for anchor, theirs in zip(ours, state.get("keyframes")):
            assert np.array_equal(ours[anchor], np.asarray(theirs)), (list(images), anchor)


def test_a_planted_keyframe_mismatch_of_known_size_reads_its_psnr_ssim_and_lpips():
    from skimage.metrics import structural_similarity

    target = smooth_image(3)
    frames = np.repeat(target[None], 3, axis=0)
    frames[-1, 40:72, 16:48] += 40  # 32x32 pixels, every channel, +40 levels
    model = load_lpips("rand", "cpu")
    result = adherence(frames, {"first": target, "last": target}, model, 1.0, "cpu")
    # The exact MSE of the plant: 40^2 over 32*32 of the 128*128 pixels.
    mse = 40.0**2 * (32 * 32) / (H * W)
    assert result["last"]["psnr"] == pytest.approx(10 * np.log10(255.0**2 / mse), abs=1e-9)
    assert result["first"]["psnr"] == 60.0 and result["first"]["lpips"] == 0.0 and result["first"]["ssim"] == 1.0
    luma = lambda f: f.astype(np.float64) @ np.array([0.299, 0.587, 0.114])  # noqa: E731
    expected = structural_similarity(luma(target), luma(frames[-1]), gaussian_weights=True, sigma=1.5,
                                     use_sample_covariance=False, data_range=255)
    assert result["last"]["ssim"] == pytest.approx(expected, abs=2e-5)
    assert result["last"]["lpips"] > 0.0


def test_reference_identity_reads_planted_colour_and_shape_changes():
    import cv2

    red = (230, 30, 30)
    reference, ref_mask = disc_scene(red)
    profile = ReferenceProfile(reference)
    assert profile.separable and profile.subject_fraction == pytest.approx(ref_mask.mean())
    moving = np.stack([disc_scene(red, centre=(64, 30 + 3 * i), stripes=True)[0] for i in range(N)])
    colour, shape = identity_distances(moving, profile)
    # The same flat colour and the same disc (translated) on a striped background: the colours coincide exactly and
    # the Hu moments are translation invariant (I1 distance 0 up to pixel rasterization: the same disc).
    assert np.array_equal(colour, np.zeros(N)) and np.allclose(shape, 0.0, atol=1e-9)
    blue = np.stack([disc_scene((30, 30, 230), centre=(64, 30 + 3 * i))[0] for i in range(N)])
    assert np.array_equal(identity_distances(blue, profile)[0], np.ones(N))  # 283 levels from red
    square, square_mask = disc_scene(red, shape="square")
    colour, shape = identity_distances(square[None], profile)
    expected = cv2.matchShapes(ref_mask.astype(np.uint8) * 255, square_mask.astype(np.uint8) * 255,
                               cv2.CONTOURS_MATCH_I1, 0.0)
    assert colour[0] == 0.0 and shape[0] == pytest.approx(expected, rel=1e-12) and expected > 1e-3
    empty = np.repeat(disc_scene(red)[0][:1, :1], H, 0).repeat(W, 1)[None]  # background only
    colour, shape = identity_distances(empty, profile)
    assert colour[0] == 1.0 and np.isnan(shape[0])


def _keyframe_run(tmp_path, planted: bool, images_fn):
    target = smooth_image(4)

    def frames(recipe, pid, seed):
        clip = np.repeat(target[None], N, axis=0)
        if recipe == "candidate" and planted:
            clip[0, 40:72, 16:48] += 40
        return clip

    return make_synthetic_run(tmp_path / "run", frames_fn=frames, audio_fn=lambda *a: tone_pcm(N / 24),
                              prompt_ids=["p0"], images_fn=images_fn), target


def test_the_gate_through_the_runner_scores_both_sides_on_the_decoded_clips(tmp_path):
    target = smooth_image(4)
    store, _ = _keyframe_run(tmp_path, True, lambda pid: {"first_frame": image_from_array(target)})
    summary = run_gates(store.root, ["keyframe"], options={"lpips_trunk": "rand"}, progress=False)
    assert not summary.errors, summary.errors
    result = json.loads(store.gate_result_path("keyframe", "candidate", "p0", 0).read_text())
    metrics = {k: v["value"] for k, v in result["metrics"].items()}
    assert result["info"]["workflow"] == "fl2va" and result["status"] == "ok"
    # The reference: PSNR in float64 of each decoded first frame against the keyframe.
    for side, name in (("baseline", "keyframe_psnr.baseline"), ("candidate", "keyframe_psnr")):
        decoded = decode_video(store.clip_path(side, "p0", 0))[0][0].astype(np.float64)
        mse = np.mean((decoded - target) ** 2)
        assert metrics[name] == pytest.approx(min(60.0, 10 * np.log10(255**2 / mse)), abs=1e-9)
    # The plant (PSNR 26.0 dB against the keyframe) is what the candidate lost, through the codec.
    assert metrics["keyframe_psnr.baseline"] - metrics["keyframe_psnr"] > 8.0
    assert metrics["keyframe_lpips"] > metrics["keyframe_lpips.baseline"]
    assert set(metrics) == {f"keyframe_{m}{s}" for m in ("lpips", "ssim", "psnr") for s in ("", ".baseline")}
    assert not KeyframeGate.declaration_problems(GateResult.model_validate(result))
    assert (store.root / result["artifacts"][0]).is_file()


def test_t2va_pairs_are_not_applicable_and_mismatched_inputs_are_an_error(tmp_path):
    store, _ = _keyframe_run(tmp_path, False, None)
    run_gates(store.root, ["keyframe"], options={"lpips_trunk": "rand"}, progress=False)
    result = json.loads(store.gate_result_path("keyframe", "candidate", "p0", 0).read_text())
    assert result["status"] == "not_applicable" and "t2va" in result["info"]["reason"]

    store2, _ = _keyframe_run(tmp_path / "b", False, lambda pid: {"first_frame": image_from_array(smooth_image(5))})
    record_path = store2.record_path("candidate", "p0", 0)
    record = json.loads(record_path.read_text())
    record["request"]["conditioning"][0]["sha256"] = "f" * 64
    record_path.write_text(json.dumps(record))
    summary = run_gates(store2.root, ["keyframe"], options={"lpips_trunk": "rand"}, progress=False)
    assert len(summary.errors) == 1 and "not a pair for the keyframe gate" in summary.errors[0]["error"]

    # The baseline's keyframe file removed from the run: the error names it.
    store3, _ = _keyframe_run(tmp_path / "c", False, lambda pid: {"last_frame": image_from_array(smooth_image(6))})
    for path in (store3.root / "inputs").iterdir():
        path.unlink()
    summary = run_gates(store3.root, ["keyframe"], options={"lpips_trunk": "rand"}, progress=False)
    assert len(summary.errors) == 1 and "inputs/" in summary.errors[0]["error"] and "missing" in \
        summary.errors[0]["error"]


def test_ref2va_identity_lost_by_the_candidate_shows_against_the_baseline(tmp_path):
    red, blue = (230, 30, 30), (30, 30, 230)
    reference = disc_scene(red)[0]

    def frames(recipe, pid, seed):
        colour = red if recipe == "baseline" else [red, blue][seed % 2]
        return np.stack([disc_scene(colour if i >= N // 2 else red, centre=(64, 30 + 3 * i), stripes=True)[0]
                         for i in range(N)])

    store = make_synthetic_run(tmp_path / "run", frames_fn=frames, audio_fn=lambda *a: tone_pcm(N / 24),
                               seeds=[0, 1], images_fn=lambda pid: {"reference": image_from_array(reference)})
    run_gates(store.root, ["keyframe"], options={"lpips_trunk": "rand"}, progress=False)
    kept = json.loads(store.gate_result_path("keyframe", "candidate", "p0", 0).read_text())["metrics"]
    lost = json.loads(store.gate_result_path("keyframe", "candidate", "p0", 1).read_text())["metrics"]
    # Seed 0: the candidate keeps the red disc, as the baseline does; what remains is the codec's edge blending
    # (chroma subsampling mixes the disc's rim with the background) on both sides alike.
    base = kept["reference_colour_distance.baseline"]["value"]
    assert kept["reference_colour_distance"]["value"] == pytest.approx(base, abs=0.01) and base < 0.25
    # Seed 1: the disc turns blue for the second half of the clip: those frames lose every colour, so the candidate
    # loses half of what the baseline keeps, 0.5 * (1 - base).
    assert lost["reference_colour_distance"]["value"] - lost["reference_colour_distance.baseline"]["value"] == \
        pytest.approx(0.5 * (1 - base), abs=0.03)
    assert lost["reference_shape_distance"]["value"] is not None
