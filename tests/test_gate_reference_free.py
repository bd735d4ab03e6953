"""The reference-free gate: every dimension against a reference (the original package, scipy, pyloudnorm, a slow
float64 loop of the definition, or a planted defect of known size), and the gate on a run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.ndimage

from gates import reference_free as rf
from gates.base import get_gate

RNG = np.random.default_rng(18)


# -- NIQE against scikit-video's own computation ---------------------------------------------------------------------
def _skvideo_niqe(gray: np.ndarray) -> float:
    """scikit-video 1.1.11's niqe() itself, with the two names numpy 2 / scipy >= 1.3 removed put back exactly as
    they were (np.int = int; scipy.misc.imresize(img, 0.5, 'bicubic', mode='F') = PIL's float-mode bicubic resize of
    (w * 0.5, h * 0.5) truncated, scipy 1.2's code path)."""
    import warnings

    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # scipy.misc's own notice that it is going away
        import scipy.misc

    def imresize(arr, size, interp="bilinear", mode=None):
        assert isinstance(size, float) and interp == "bicubic" and mode == "F"
        im = Image.frombytes("F", (arr.shape[1], arr.shape[0]), np.asarray(arr, np.float32).tobytes())
        new = tuple((np.array(im.size) * size).astype(int))
        return np.array(im.resize(new, resample=Image.BICUBIC))

    patched = {"imresize": not hasattr(scipy.misc, "imresize"), "int": not hasattr(np, "int")}
    if patched["imresize"]:
        scipy.misc.imresize = imresize
    if patched["int"]:
        np.int = int  # type: ignore[attr-defined]
    try:
        from skvideo.measure import niqe

        return float(niqe(gray[None, :, :, None])[0])
    finally:
        if patched["imresize"]:
            del scipy.misc.imresize
        if patched["int"]:
            del np.int  # type: ignore[attr-defined]


@pytest.mark.parametrize("image", ["camera", "astronaut_blurred", "noise_544x960"])
def test_niqe_matches_scikit_video(image):
    """Our NIQE fits every patch's AGGD at once (float64 moments); scikit-video loops over patches in float32."""
    import skimage.data

    if image == "camera":
        gray = skimage.data.camera()[100:400, 50:330].astype(np.float32)
    elif image == "noise_544x960":  # production frame size: 50 + 50 patches
        gray = scipy.ndimage.gaussian_filter(np.random.default_rng(5).normal(128, 50, (544, 960)), 1.0)
        gray = np.clip(gray, 0, 255).astype(np.float32)
    else:
        gray = rf.luma(skimage.data.astronaut()[:300, 100:400])
        gray = scipy.ndimage.gaussian_filter(gray, 2.0)
    ours, theirs = rf.niqe_frame(gray), _skvideo_niqe(gray)
    assert ours == pytest.approx(theirs, rel=1e-4), (ours, theirs)


def test_niqe_sees_a_planted_blur_and_noise():
    import skimage.data

    # The whole 512x512 image (25 patches): NIQE is a statistic over patches and is weak on few of them.
    gray = skimage.data.camera().astype(np.float32)
    clean = rf.niqe_frame(gray)
    assert rf.niqe_frame(scipy.ndimage.gaussian_filter(gray, 3.0)) > clean + 5
    assert rf.niqe_frame(np.clip(gray + RNG.normal(0, 25, gray.shape), 0, 255).astype(np.float32)) > clean + 5
    with pytest.raises(ValueError, match="194"):
        rf.niqe_frame(gray[:128, :128])
    assert rf.niqe_upscale_factor(128, 128) == 2 and rf.niqe_upscale_factor(768, 1344) == 1


# -- image statistics ------------------------------------------------------------------------------------------------
def test_sharpness_is_the_laplacian_variance_scipy_computes():
    gray = RNG.uniform(0, 255, (40, 52))
    reference = scipy.ndimage.laplace(gray, mode="mirror").var()  # mirror = OpenCV's BORDER_REFLECT_101
    assert rf.sharpness(gray) == pytest.approx(reference, rel=1e-12)
    assert rf.sharpness(scipy.ndimage.gaussian_filter(gray, 1.5)) < 0.2 * rf.sharpness(gray)


def _slow_blur(gray: np.ndarray) -> float:
    """Crete-Roffet 2007 written out pixel by pixel in float64 (9-tap box re-blur, edges clamped)."""
    h, w = gray.shape
    worst = 0.0
    for axis in (0, 1):
        n_along = h if axis == 0 else w
        s_f = s_v = 0.0
        for i in range(h):
            for j in range(w):
                k = i if axis == 0 else j
                if k == 0:
                    continue

                def px(kk):
                    kk = min(max(kk, 0), n_along - 1)
                    return gray[kk, j] if axis == 0 else gray[i, kk]

                def blurred(kk):
                    return sum(px(kk + o) for o in range(-4, 5)) / 9.0

                d_f = abs(px(k) - px(k - 1))
                d_b = abs(blurred(k) - blurred(k - 1))
                s_f += d_f
                s_v += max(0.0, d_f - d_b)
        worst = max(worst, (s_f - s_v) / s_f)
    return worst


def test_blur_matches_the_definition_and_rises_with_a_planted_blur():
    gray = RNG.uniform(0, 255, (18, 23))
    assert rf.blur(gray) == pytest.approx(_slow_blur(gray), abs=1e-12)
    big = RNG.uniform(0, 255, (64, 64))
    assert rf.blur(scipy.ndimage.gaussian_filter(big, 2.0)) > rf.blur(big) + 0.2
    assert rf.blur(np.full((8, 8), 7.0)) == 0.0


def test_luma_frame_by_frame_is_the_whole_array_formula_bit_for_bit():
    frames = RNG.integers(0, 256, (2, 3, 7, 9, 3), dtype=np.uint8)
    f = frames.astype(np.float32)
    whole = 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]
    assert rf.luma(frames).dtype == np.float32 and np.array_equal(rf.luma(frames), whole)
    assert np.array_equal(rf.luma(frames[0]), whole[0]) and np.array_equal(rf.luma(frames[0, 0]), whole[0, 0])


def test_colourfulness_matches_the_paper_formula():
    frame = RNG.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    rg, yb = [], []
    for y in range(6):
        for x in range(5):
            r, g, b = (float(v) for v in frame[y, x])
            rg.append(r - g)
            yb.append(0.5 * (r + g) - b)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    var = lambda v: sum((x - mean(v)) ** 2 for x in v) / len(v)  # noqa: E731
    expected = math.sqrt(var(rg) + var(yb)) + 0.3 * math.sqrt(mean(rg) ** 2 + mean(yb) ** 2)
    assert rf.colourfulness(frame) == pytest.approx(expected, rel=1e-12)
    assert rf.colourfulness(np.full((4, 4, 3), 90, np.uint8)) == 0.0


def test_exposure_clipping_and_contrast():
    gray = np.array([[0.0, 2.0, 3.0, 128.0], [252.0, 253.0, 255.0, 60.0]])
    assert rf.exposure_clipping(gray) == pytest.approx(4 / 8)
    assert rf.contrast(gray) == pytest.approx(np.std(gray / 255.0), rel=1e-12)


# -- motion ----------------------------------------------------------------------------------------------------------
def _texture(h=96, w=96, seed=0):
    return scipy.ndimage.gaussian_filter(np.random.default_rng(seed).uniform(0, 255, (h, w * 2)), 2.0)


def _translating(velocity_px: float, frames: int = 13, jitter: np.ndarray | None = None) -> np.ndarray:
    tex = _texture()
    out = []
    for t in range(frames):
        shift = velocity_px * t + (0.0 if jitter is None else jitter[t])
        moved = scipy.ndimage.shift(tex, (0, shift), order=1, mode="nearest")[:, 20:116]
        out.append(np.repeat(moved[..., None], 3, axis=-1))
    return np.clip(np.array(out), 0, 255).round().astype(np.uint8)


def test_dynamic_degree_reads_a_planted_translation():
    frames = _translating(3.0)
    flows = rf.consecutive_flows(rf.luma(frames))
    expected = 100.0 * 3.0 / math.hypot(96, 96)
    assert rf.dynamic_degree(flows, 96, 96) == pytest.approx(expected, rel=0.1)
    still = rf.consecutive_flows(rf.luma(np.repeat(frames[:1], 5, axis=0)))
    assert rf.dynamic_degree(still, 96, 96) < 0.01 * expected  # Farneback reads a still picture within 0.03 px


def test_motion_smoothness_is_vbench_interpolation_score():
    # Static clip: zero flow, so the interpolated frame is the mean of the neighbours (VBench's formula, float64).
    frames = RNG.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    frames[1:] = frames[0]
    frames[3] = np.clip(frames[0].astype(int) + 30, 0, 255)
    gray = rf.luma(frames)
    expected = []
    for t in (1, 3):
        middle = 0.5 * (frames[t - 1].astype(np.float64) + frames[t + 1])
        expected.append((255 - np.abs(middle - frames[t]).mean()) / 255)
    # Flow on a frame that only brightens is not exactly zero; the score matches within a fraction of a level.
    assert rf.motion_smoothness(frames, gray) == pytest.approx(np.mean(expected), abs=2e-3)
    # Constant velocity interpolates almost perfectly; a planted +-3 px jitter on odd frames does not.
    smooth = rf.motion_smoothness(_translating(2.0), rf.luma(_translating(2.0)))
    jitter = np.where(np.arange(13) % 2 == 1, 3.0, 0.0)
    jerky_frames = _translating(2.0, jitter=jitter)
    jerky = rf.motion_smoothness(jerky_frames, rf.luma(jerky_frames))
    assert smooth > 0.99 and jerky < smooth - 0.01


# -- audio -----------------------------------------------------------------------------------------------------------
def test_loudness_is_pyloudnorm_and_silence_reads_the_absolute_gate():
    import pyloudnorm

    t = np.arange(32000 * 2) / 32000
    tone = np.stack([0.2 * np.sin(2 * np.pi * 440 * t)] * 2)
    assert rf.loudness_lufs(tone, 32000) == pytest.approx(pyloudnorm.Meter(32000).integrated_loudness(tone.T),
                                                          abs=1e-9)
    assert rf.loudness_lufs(np.zeros_like(tone), 32000) == rf.LUFS_FLOOR
    half = tone.copy()
    half[:, 32000:] = 0
    assert rf.silence_fraction(half, 32000) == pytest.approx(0.5)
    planted = tone.copy()
    planted[:, :640] = 1.0
    assert rf.clipping_fraction(planted) == pytest.approx(640 / tone.shape[1])


def test_onsets_find_planted_clicks_and_sync_is_an_f1():
    rate = 32000
    audio = np.zeros(rate * 3)
    audio += 0.1 * np.sin(2 * np.pi * 400 * np.arange(len(audio)) / rate)
    times = [0.5, 1.25, 2.2]
    for t0 in times:
        i = int(t0 * rate)
        n = np.arange(640)
        audio[i:i + 640] += 0.5 * np.exp(-n / 128) * np.sin(2 * np.pi * 3000 * n / rate)
    onsets = rf.audio_onsets(np.stack([audio, audio]), rate)
    assert len(onsets) == 3 and np.allclose(onsets, times, atol=0.02)
    assert rf.sync_f1([0.5, 1.25], [0.51, 1.3, 2.0], 0.083) == pytest.approx(2 * 2 / 5)
    assert rf.sync_f1([], [], 0.083) == 1.0 and rf.sync_f1([1.0], [], 0.083) == 0.0
    assert rf.sync_f1([1.0], [1.2], 0.083) == 0.0


def test_av_sync_on_world_clips_and_a_planted_delay():
    from h3.world.render import render_audio, render_video
    from h3.world.scene import FPS, SAMPLE_RATE, sample_scene

    scene = next(s for s in (sample_scene(7, i, num_frames=56) for i in range(80)) if len(s.events()) >= 1)
    frames = render_video([scene])[0].numpy()
    audio = render_audio([scene])[0].numpy()
    options = rf.ReferenceFreeOptions(niqe_frame_stride=62)
    scores, info = rf.score_clip(frames, float(FPS), audio, SAMPLE_RATE, options)
    truth = [e["t"] for e in scene.events()]
    assert np.allclose(sorted(info["motion_events_s"]), truth, atol=2 / FPS)
    assert scores["av_sync"] == 1.0
    late = np.roll(audio, int(0.25 * SAMPLE_RATE), axis=1)  # planted: the soundtrack 250 ms late
    assert rf.score_clip(frames, float(FPS), late, SAMPLE_RATE, options)[0]["av_sync"] == 0.0


# -- the torch (GPU) path against the CPU path --------------------------------------------------------------------
def _world_clip(num_frames: int = 40):
    from h3.world.render import render_audio, render_video
    from h3.world.scene import FPS, SAMPLE_RATE, sample_scene

    scene = next(s for s in (sample_scene(7, i, num_frames=num_frames) for i in range(80)) if len(s.events()) >= 1)
    return render_video([scene])[0].numpy(), render_audio([scene])[0].numpy(), float(FPS), SAMPLE_RATE


@pytest.mark.parametrize("size", [None, (208, 240)])
def test_torch_path_computes_the_cpu_paths_scores(size):
    """The GPU path's torch code, run on the CPU (``torch:cpu``), against the numpy/scipy/OpenCV path on a world clip
    (moving shapes with synchronized clicks) at its 128x128 (NIQE upscaled x2) and on a textured 208x240 crop-free
    resize of it plus noise (NIQE at 1x): every dimension equal to float rounding; NIQE within 1e-4 (measured 1e-8 on
    this VM's Intel CPU; torch's float64 convolution on the CPU goes through BLAS, whose summation order depends on the
    CPU, so a stored float32 may differ by an ulp elsewhere. Its AGGD fit picks the nearest of a 0.001-step grid of
    shapes: were the torch path's roundings not scipy's, flat patches, whose normalised values are rounding residue,
    would tip to other grid points; measured 6% apart then, which this bound fails)."""
    frames, audio, fps, rate = _world_clip()
    if size is not None:
        import cv2

        frames = np.stack([cv2.resize(f, size[::-1], interpolation=cv2.INTER_CUBIC) for f in frames])
        noise = RNG.normal(0, 6, frames.shape)
        frames = np.clip(frames + noise, 0, 255).astype(np.uint8)
    options = rf.ReferenceFreeOptions(niqe_frame_stride=8)
    cpu, cpu_info = rf.score_clip(frames, fps, audio, rate, options)
    tor, tor_info = rf.score_clip(frames, fps, audio, rate, options, device="torch:cpu")
    assert cpu_info["motion_events_s"] == tor_info["motion_events_s"] and tor_info["device"] == "torch:cpu"
    for name in rf.DIMENSIONS:
        assert cpu[name] is not None and math.isfinite(cpu[name])
        rtol = 1e-4 if name == "niqe" else 1e-9
        assert tor[name] == pytest.approx(cpu[name], rel=rtol, abs=1e-12), name
    # The artifact detectors (on the torch path run in threads beside the device work): the same numbers and flags,
    # which are each detector's on the RGB frames (both paths hand the detectors one luma computed for all).
    assert {n: tor[n] for n in rf.ARTIFACTS} == {n: cpu[n] for n in rf.ARTIFACTS}
    direct = {n: (d(frames) if kind == "video" else d(audio, rate)).statistic
              for n, (kind, d) in rf._artifact_detectors().items()}
    assert direct == {n: cpu[n] for n in rf.ARTIFACTS}
    assert tor_info["artifacts"] == cpu_info["artifacts"] and len(cpu_info["artifacts"]) == len(rf.ARTIFACTS)
    assert cpu["niqe"] != pytest.approx(rf.score_clip(frames[:, ::-1].copy(), fps, audio, rate, options)[0]["niqe"]
                                        + 1.0)  # sanity: the comparison is not between two constants


def test_flow_threads_give_the_one_thread_scores():
    frames, audio, fps, rate = _world_clip(24)
    one = rf.score_clip(frames, fps, audio, rate, rf.ReferenceFreeOptions(niqe_frame_stride=30, flow_workers=1))
    three = rf.score_clip(frames, fps, audio, rate, rf.ReferenceFreeOptions(niqe_frame_stride=30, flow_workers=3))
    assert one[0] == three[0] and one[1]["motion_events_s"] == three[1]["motion_events_s"]
    assert one[0]["dynamic_degree"] > 0.1  # the shapes move: the flows are not trivially zero


# -- the gate --------------------------------------------------------------------------------------------------------
def test_gate_writes_both_sides_with_declared_directions(tmp_path):
    from h3eval.gaterun import run_gates
    from h3eval.synth import make_synthetic_run

    frames_by_recipe = {"base": _translating(2.0, frames=8)}
    blurred = scipy.ndimage.gaussian_filter(frames_by_recipe["base"].astype(float), (0, 2, 2, 0))
    frames_by_recipe["soft"] = np.clip(blurred, 0, 255).round().astype(np.uint8)
    t = np.arange(16000) / 32000
    pcm = (np.stack([0.2 * np.sin(2 * np.pi * 440 * t)] * 2, axis=1) * 32767).astype(np.int16)
    make_synthetic_run(tmp_path, candidates=["soft"], prompt_ids=["p0"], seeds=[0], baseline="base",
                       frames_fn=lambda r, p, s: frames_by_recipe[r], audio_fn=lambda r, p, s: pcm)
    summary = run_gates(tmp_path, ["reference_free"], options={"niqe_frame_stride": "4"}, progress=False)
    assert not summary.errors
    result = json.loads((tmp_path / "gates" / "reference_free" / "soft" / "p0-s0.json").read_text())
    metrics = result["metrics"]
    gate = get_gate("reference_free")
    for name, dim in rf.DIMENSIONS.items():
        for key in (name, name + ".baseline"):
            assert metrics[key]["higher_is_better"] is dim.higher_is_better
            assert gate.metrics[key].higher_is_better is dim.higher_is_better
    # The planted blur, read from the decoded MP4s: sharper baseline, blurrier candidate.
    assert metrics["sharpness"]["value"] < 0.5 * metrics["sharpness.baseline"]["value"]
    assert metrics["blur"]["value"] > metrics["blur.baseline"]["value"]
    assert metrics["loudness_lufs"]["value"] == pytest.approx(metrics["loudness_lufs.baseline"]["value"], abs=1e-9)


def test_an_identical_pair_scores_the_baseline_once_and_equals_the_full_evaluation(tmp_path, monkeypatch):
    """A bit-identical pair (same frames and PCM hashes in the records): the gate scores the baseline's clip and gives
    the candidate the same scores (every paired delta 0), marked identical; the full evaluation of both decoded clips
    (the shortcut taken away) gives the same values."""
    import shutil

    from h3eval.gaterun import run_gates
    from h3eval.synth import make_synthetic_run

    frames = _translating(2.0, frames=8)
    t = np.arange(16000) / 32000
    pcm = (np.stack([0.2 * np.sin(2 * np.pi * 440 * t)] * 2, axis=1) * 32767).astype(np.int16)
    make_synthetic_run(tmp_path / "a", candidates=["same"], prompt_ids=["p0"], seeds=[0], baseline="base",
                       frames_fn=lambda r, p, s: frames, audio_fn=lambda r, p, s: pcm)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    options = {"niqe_frame_stride": "4"}
    scored = []
    original = rf.score_mp4
    monkeypatch.setattr(rf, "score_mp4",
                        lambda path, *a, **k: (scored.append(path.parent.name), original(path, *a, **k))[1])
    rf.clear_cache()
    assert not run_gates(tmp_path / "a", ["reference_free"], options=options, progress=False).errors
    assert scored == ["base"]  # the candidate's clip is not scored
    short = json.loads((tmp_path / "a" / "gates" / "reference_free" / "same" / "p0-s0.json").read_text())
    assert short["identical"] and "short_circuit" in short["info"]
    for name in rf.DIMENSIONS:
        assert short["metrics"][name]["value"] == short["metrics"][name + ".baseline"]["value"], name
    rf.clear_cache()
    monkeypatch.delattr(rf.ReferenceFreeGate, "identical_result")
    # the scores are memoized by the file's bytes, which the two clips share: forget them before each, so both are
    # scored from their frames
    monkeypatch.setattr(rf, "score_mp4", lambda path, *a, **k: (rf.clear_cache(), scored.append(path.parent.name),
                                                                 original(path, *a, **k))[2])
    assert not run_gates(tmp_path / "b", ["reference_free"], options=options, progress=False).errors
    full = json.loads((tmp_path / "b" / "gates" / "reference_free" / "same" / "p0-s0.json").read_text())
    assert "short_circuit" not in full["info"] and sorted(scored[1:]) == ["base", "same"]
    for key, value in full["metrics"].items():
        a, b = short["metrics"][key]["value"], value["value"]
        assert (a is None and b is None) or a == pytest.approx(b, rel=1e-12, abs=1e-12), key
    rf.clear_cache()


def test_scores_are_memoized_by_the_files_bytes(tmp_path, monkeypatch):
    """A copy of a scored clip at another path (a new-seed floor's copy of a run's clip) is not scored again; a file
    whose bytes differ is. The copy's scores are the original's."""
    import shutil

    from h3eval.synth import make_synthetic_run

    make_synthetic_run(tmp_path / "a", candidates=["moved"], prompt_ids=["p0"], seeds=[0], baseline="base",
                       frames_fn=lambda r, p, s: _translating(2.0 if r == "base" else 3.0, frames=8))
    base = next((tmp_path / "a").rglob("base/*.mp4"))
    other = next((tmp_path / "a").rglob("moved/*.mp4"))
    copy = tmp_path / "copy.mp4"
    shutil.copyfile(base, copy)
    calls = []
    original = rf.score_clip
    monkeypatch.setattr(rf, "score_clip", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    options = rf.ReferenceFreeOptions(niqe_frame_stride=4)
    rf.clear_cache()
    first, _ = rf.score_mp4(base, options)
    again, _ = rf.score_mp4(copy, options)
    assert len(calls) == 1 and again == first
    moved, _ = rf.score_mp4(other, options)
    assert len(calls) == 2 and moved["dynamic_degree"] != first["dynamic_degree"]
    rf.clear_cache()
