"""Fidelity gate: SSIM and PSNR against scikit-image, LPIPS against the lpips package called directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _gate_clips import NUM_FRAMES, SIZE, copy_clip, make_run, moving_square_frames, noise_pcm, pair_context, rewrite_clip
from pathlib import Path

from PIL import Image
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from gates import fidelity
from gates.base import get_gate
from gates.common import GateInputError


def _frames_pair(n=3, h=48, w=80, noise=8, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack(
        [np.stack([(xx * 3 + 5 * t) % 256, (yy * 4) % 256, ((xx + yy) * (t + 1)) % 256], -1) for t in range(n)]
    ).astype(np.uint8)
    cand = np.clip(base.astype(int) + rng.integers(-noise, noise + 1, base.shape), 0, 255).astype(np.uint8)
    return base, cand


def test_ssim_matches_scikit_image_on_luma():
    base, cand = _frames_pair()
    ours = fidelity.ssim_per_frame(base, cand)
    ya, yb = fidelity.luma(base), fidelity.luma(cand)
    reference = [
        structural_similarity(ya[i], yb[i], data_range=255, gaussian_weights=True, sigma=1.5,
                              use_sample_covariance=False)
        for i in range(len(base))
    ]
    np.testing.assert_allclose(ours, reference, atol=2e-6)
    assert ours.min() < 0.99  # the planted noise is visible to the metric
    # Frames split over threads: the same numbers, frame by frame, as one thread.
    for workers in (1, 2, 3, 8):
        assert np.array_equal(fidelity.ssim_per_frame(base, cand, workers=workers), fidelity._ssim_cpu(base, cand))


def test_psnr_matches_scikit_image_and_caps_identical_frames():
    base, cand = _frames_pair(noise=20)
    psnr, mse = fidelity.psnr_per_frame(base, cand)
    reference = [peak_signal_noise_ratio(base[i], cand[i], data_range=255) for i in range(len(base))]
    np.testing.assert_allclose(psnr, reference, rtol=1e-12)
    np.testing.assert_allclose(mse, ((base.astype(np.float64) - cand) ** 2).mean(axis=(1, 2, 3)), rtol=1e-12)
    same, same_mse = fidelity.psnr_per_frame(base, base)
    assert same.tolist() == [fidelity.PSNR_CAP_DB] * len(base) and same_mse.tolist() == [0.0] * len(base)


def _rand_model(spatial=False):
    import lpips

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(fidelity.RAND_TRUNK_SEED)
        return lpips.LPIPS(net="alex", version="0.1", pnet_rand=True, spatial=spatial, verbose=False).eval()


def test_lpips_matches_the_package_called_directly():
    import lpips

    base, cand = _frames_pair(n=2, h=64, w=96)
    model = fidelity.load_lpips("rand", "cpu")
    ours = fidelity.lpips_per_frame(model, base, cand, scale=1.0)
    reference_model = _rand_model()
    with torch.no_grad():
        reference = [float(reference_model(lpips.im2tensor(base[i]), lpips.im2tensor(cand[i]))) for i in range(2)]
    np.testing.assert_allclose(ours, reference, rtol=1e-5)
    assert fidelity.lpips_per_frame(model, base, base, scale=1.0).tolist() == [0.0, 0.0]

    # The spatial map is the package's own spatial=True output.
    spatial = fidelity.lpips_map(model, base[0], cand[0], 1.0, "cpu")
    with torch.no_grad():
        ref_map = _rand_model(spatial=True)(lpips.im2tensor(base[0]), lpips.im2tensor(cand[0]))[0, 0].numpy()
    np.testing.assert_allclose(spatial, ref_map, rtol=1e-5, atol=1e-7)
    assert model.spatial is False


def _package_lpips_area(model, base, cand, size):
    """The lpips package's forward on frames area-downsampled by torch (the definition the gate computes)."""
    import torch.nn.functional as F

    def prep(f):
        x = torch.from_numpy(f.copy()).permute(0, 3, 1, 2).float() / 127.5 - 1
        return F.interpolate(x, size=size, mode="area") if size != tuple(f.shape[1:3]) else x

    with torch.no_grad():
        return model(prep(base), prep(cand)).reshape(-1).double().numpy()


@pytest.mark.parametrize("scale", [0.5, 0.25, 0.3])
def test_lpips_per_frame_matches_the_package_at_each_scale(scale):
    """The gate's LPIPS (OpenCV area downsampling at an integer factor, torch's otherwise; both sides through the
    trunk in one batch; the head's sums reordered) equals the package's forward on torch-downsampled frames. (At
    distances far below any decision, ~1e-5, the two area implementations' float32 rounding of the inputs alone moves
    LPIPS by ~1e-5 relative; the noise here gives distances of the size a gate decides on.)"""
    base, cand = _frames_pair(n=3, h=192, w=320, noise=24, seed=3)
    model = fidelity.load_lpips("rand", "cpu")
    size = (round(192 * scale), round(320 * scale))
    ours = fidelity.lpips_per_frame(model, base, cand, scale=scale, batch=2)
    reference = _package_lpips_area(_rand_model(), base, cand, size)
    np.testing.assert_allclose(ours, reference, rtol=1e-5)
    assert ours.min() > 0
    assert fidelity.lpips_per_frame(model, base, base, scale=scale).tolist() == [0.0] * len(base)


def test_cv2_area_downsampling_equals_torch_area():
    base, _ = _frames_pair(n=3, h=96, w=160, seed=4)
    ours = fidelity._to_lpips_input(base, 0.5, "cpu")
    x = torch.from_numpy(base.copy()).permute(0, 3, 1, 2).float() / 127.5 - 1
    reference = torch.nn.functional.interpolate(x, size=(48, 80), mode="area")
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    # Both are float32 roundings of the exact block mean (float64).
    exact = base.astype(np.float64).reshape(3, 48, 2, 80, 2, 3).mean(axis=(2, 4)).transpose(0, 3, 1, 2) / 127.5 - 1
    for x in (ours, reference):
        np.testing.assert_allclose(x.numpy(), exact, rtol=0, atol=2.5e-7)
    # A torch tensor on the CPU (the gate's device path run there) takes the same route: the same numbers.
    assert torch.equal(fidelity._to_lpips_input(torch.from_numpy(base.copy()), 0.5, "cpu"), ours)


def test_psnr_sum_of_squares_is_exact_at_the_extremes():
    """The CPU path's integer sum of squares (uint16 squares summed in uint64) is exact where a float32 or an int32
    sum would not be: a 1080x1920 frame of 0 against one of 255, and random frames against Python's integers."""
    black, white = np.zeros((1, 1080, 1920, 3), np.uint8), np.full((1, 1080, 1920, 3), 255, np.uint8)
    _, mse = fidelity.psnr_per_frame(black, white)
    assert mse.tolist() == [255.0 * 255.0]
    rng = np.random.default_rng(7)
    base = rng.integers(0, 256, (3, 270, 480, 3), dtype=np.uint8)
    cand = rng.integers(0, 256, (3, 270, 480, 3), dtype=np.uint8)
    _, mse = fidelity.psnr_per_frame(base, cand, batch=2)
    exact = [sum(int(v) * int(v) for v in (base[i].astype(np.int64) - cand[i]).ravel()) for i in range(3)]
    assert mse.tolist() == [e / base[0].size for e in exact]


def test_missing_alexnet_weights_names_file_folder_and_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torchhome"))
    with pytest.raises(GateInputError) as info:
        fidelity.load_lpips("alexnet", "cpu")
    message = str(info.value)
    assert "alexnet-owt-7be5be79.pth" in message
    assert str(tmp_path / "torchhome" / "hub" / "checkpoints") in message
    assert "torchvision.models.alexnet(weights='IMAGENET1K_V1')" in message
    assert not (tmp_path / "torchhome").exists()  # nothing was downloaded or created


def test_gate_on_planted_defect(tmp_path):
    store = make_run(tmp_path / "run")
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[7, 8:40, 8:40] = 255 - frames[7, 8:40, 8:40]  # a strong local defect in one frame
    rewrite_clip(store, "candidate", "p0", 0, frames, noise_pcm(seed=1))
    ctx = pair_context(store, gate="fidelity", options={"lpips_trunk": "rand", "lpips_scale": "1", "lpips_stride": "1"})
    result = get_gate("fidelity").evaluate(ctx)
    assert result.error is None
    m = {k: v.value for k, v in result.metrics.items()}
    assert result.info["lpips_worst_frame"] == 7 and result.info["ssim_worst_frame"] == 7
    assert result.info["psnr_worst_frame"] == 7
    lp = np.array(result.series["lpips"])
    # Other frames differ only by codec noise (the encoder's choices change around the defect): far smaller.
    assert np.delete(lp, 7).max() < lp[7] / 5
    assert m["lpips_worst"] == lp.max() and m["lpips_mean"] == pytest.approx(lp.mean(), rel=1e-12)
    assert m["lpips_p95"] == pytest.approx(np.percentile(lp, 95), rel=1e-12)
    assert m["psnr_worst"] < 30 and m["ssim_worst"] < 0.9 and m["psnr_mean"] < fidelity.PSNR_CAP_DB
    assert result.metrics["lpips_mean"].higher_is_better is False
    assert result.metrics["ssim_mean"].higher_is_better is True
    assert result.info["lpips_trunk"].startswith("random")
    [png] = result.artifacts
    assert png == f"gates/fidelity/candidate/p0-s0-lpips-worst.png"
    image = Image.open(store.root / png)
    assert image.size == (3 * SIZE, SIZE)


def test_gate_identical_decoded_frames_give_exact_zero(tmp_path):
    # Different generations (no short cut by the runner) in byte-identical MP4s: exactly zero, from decoded frames.
    store = make_run(tmp_path / "run", audio_fn=lambda recipe, pid, seed: noise_pcm(seed=0 if recipe == "baseline" else 5))
    copy_clip(store, "baseline", "candidate")
    ctx = pair_context(store, gate="fidelity", options={"lpips_trunk": "rand"})
    result = get_gate("fidelity").evaluate(ctx)
    m = {k: v.value for k, v in result.metrics.items()}
    assert m == {"lpips_mean": 0.0, "lpips_p95": 0.0, "lpips_worst": 0.0, "ssim_mean": 1.0, "ssim_worst": 1.0,
                 "psnr_mean": fidelity.PSNR_CAP_DB, "psnr_worst": fidelity.PSNR_CAP_DB}
    assert result.artifacts == []


def test_lpips_scale_and_stride_are_applied_and_recorded(tmp_path):
    store = make_run(tmp_path / "run", frames_fn=lambda recipe, pid, seed: moving_square_frames(
        NUM_FRAMES, SIZE, 0 if recipe == "baseline" else 1))
    ctx = pair_context(store, gate="fidelity", options={"lpips_trunk": "rand", "lpips_scale": "0.5", "lpips_stride": "3"})
    result = get_gate("fidelity").evaluate(ctx)
    assert result.info["lpips_resolution"] == [SIZE // 2, SIZE // 2] and result.info["lpips_stride"] == 3
    lp = result.series["lpips"]
    assert [i for i, v in enumerate(lp) if v is not None] == list(range(0, NUM_FRAMES, 3))
    # Against the package on area-downsampled frames, for a sampled frame.
    from gates.media_cache import load_video

    base, _ = load_video(ctx.baseline.mp4)
    cand, _ = load_video(ctx.candidate.mp4)
    model = fidelity.load_lpips("rand", "cpu")
    down = lambda f: torch.nn.functional.interpolate(  # noqa: E731
        torch.from_numpy(f.copy()).permute(2, 0, 1)[None].float() / 127.5 - 1, size=(SIZE // 2, SIZE // 2), mode="area")
    with torch.no_grad():
        reference = float(model(down(base[3]), down(cand[3])))
    assert lp[3] == pytest.approx(reference, rel=1e-5)


def test_different_resolution_is_a_clear_error(tmp_path):
    store = make_run(tmp_path / "run")
    rewrite_clip(store, "candidate", "p0", 0, moving_square_frames(NUM_FRAMES, SIZE + 16, 0), noise_pcm())
    ctx = pair_context(store, gate="fidelity", options={"lpips_trunk": "rand"})
    with pytest.raises(GateInputError, match=r"resolution 64x64 vs 80x80"):
        get_gate("fidelity").evaluate(ctx)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    base, cand = _frames_pair(n=4, h=64, w=96)
    np.testing.assert_allclose(fidelity.ssim_per_frame(base, cand, "cuda"), fidelity.ssim_per_frame(base, cand), atol=1e-6)
    cpu = fidelity.lpips_per_frame(fidelity.load_lpips("rand", "cpu"), base, cand, 0.5, "cpu")
    gpu = fidelity.lpips_per_frame(fidelity.load_lpips("rand", "cuda"), base, cand, 0.5, "cuda")
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4)


def test_ssim_torch_path_matches_scikit_image():
    # The path a GPU takes, run here on the CPU.
    base, cand = _frames_pair()
    ya, yb = fidelity.luma(base), fidelity.luma(cand)
    reference = [structural_similarity(ya[i], yb[i], data_range=255, gaussian_weights=True, sigma=1.5,
                                       use_sample_covariance=False) for i in range(len(base))]
    np.testing.assert_allclose(fidelity._ssim_torch(base, cand, "cpu", 2), reference, atol=2e-6)


def test_default_lpips_stride_is_two_and_ssim_psnr_score_every_frame(tmp_path):
    """LPIPS on every second frame by default (its effect on real footage: bench/fidelity_stride/results/fidelity_stride.md); SSIM
    and PSNR still score every frame, so a defect confined to an unscored frame is still seen there."""
    store = make_run(tmp_path / "run")
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[7, 8:40, 8:40] = 255 - frames[7, 8:40, 8:40]
    rewrite_clip(store, "candidate", "p0", 0, frames, noise_pcm(seed=1))
    result = get_gate("fidelity").evaluate(pair_context(store, gate="fidelity", options={"lpips_trunk": "rand"}))
    assert fidelity.DEFAULT_LPIPS_STRIDE == 2 and result.info["lpips_stride"] == 2
    assert [i for i, v in enumerate(result.series["lpips"]) if v is not None] == list(range(0, NUM_FRAMES, 2))
    assert result.info["ssim_worst_frame"] == 7 and result.info["psnr_worst_frame"] == 7


def test_gpu_path_run_on_the_cpu_equals_the_cpu_path(tmp_path):
    """The gate's device path (frames from the clip cache's device copy; torch SSIM and PSNR), run on the CPU
    ("torch:cpu"), gives the CPU path's numbers: LPIPS and PSNR exactly, SSIM to float32 rounding."""
    store = make_run(tmp_path / "run")
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[7, 8:40, 8:40] = 255 - frames[7, 8:40, 8:40]
    frames[9:12] = np.clip(frames[9:12].astype(int) + 9, 0, 255).astype(np.uint8)
    rewrite_clip(store, "candidate", "p0", 0, frames, noise_pcm(seed=1))
    results = {}
    for device in ("cpu", "torch:cpu"):
        ctx = pair_context(store, gate="fidelity", options={"lpips_trunk": "rand", "lpips_stride": "1"})
        ctx.device = device
        results[device] = get_gate("fidelity").evaluate(ctx)
    cpu, dev = results["cpu"], results["torch:cpu"]
    assert dev.series["lpips"] == cpu.series["lpips"]
    assert dev.series["psnr"] == cpu.series["psnr"]
    np.testing.assert_allclose(dev.series["ssim"], cpu.series["ssim"], atol=2e-6)
    assert dev.info["identical_frames"] == cpu.info["identical_frames"]
    assert dev.metrics["lpips_mean"].value == cpu.metrics["lpips_mean"].value > 0


def test_psnr_torch_path_is_the_exact_integer_one():
    import torch

    base, cand = _frames_pair(n=5)
    cand[2] = base[2]  # an identical frame: capped
    numpy_psnr, numpy_mse = fidelity.psnr_per_frame(base, cand, batch=2)
    torch_psnr, torch_mse = fidelity.psnr_per_frame(torch.from_numpy(base), torch.from_numpy(cand), batch=2)
    assert np.array_equal(numpy_mse, torch_mse) and np.array_equal(numpy_psnr, torch_psnr)
    assert torch_psnr[2] == fidelity.PSNR_CAP_DB


def test_threaded_decode_gives_the_same_frames_and_a_pair_decodes_once(tmp_path, monkeypatch):
    """h3.media.decode_video with FFmpeg's frame threads and with the RGB conversion in a thread pool (the clip
    cache's choices on many cores) decodes the same frames; and the four per-pair gates together decode each side's video and audio once (the cache keeps both
    sides of the pair per kind)."""
    import h3.media
    from gates import media_cache
    from h3.media import decode_video
    from h3eval.gaterun import run_gates

    store = make_run(tmp_path / "run")
    path = store.clip_path("candidate", "p0", 0)
    one, fps1 = decode_video(path)
    auto, fps0 = decode_video(path, threads=0)
    assert np.array_equal(one, auto) and fps1 == fps0
    pooled, fps2 = decode_video(path, threads=0, convert_threads=3)
    assert np.array_equal(one, pooled) and fps2 == fps1

    calls = []
    for name in ("decode_video", "decode_audio"):
        original = getattr(h3.media, name)

        def counted(p, *args, _original=original, _name=name, **kwargs):
            calls.append((_name, Path(p).parent.name))
            return _original(p, *args, **kwargs)

        monkeypatch.setattr(h3.media, name, counted)
    media_cache.clear()
    summary = run_gates(store.root, ["integrity", "fidelity", "audio", "ghosting"], device="cpu",
                        options={"fidelity.lpips_trunk": "rand"}, progress=False)
    assert not summary.errors, summary.errors
    assert sorted(calls) == [("decode_audio", "baseline"), ("decode_audio", "candidate"),
                             ("decode_video", "baseline"), ("decode_video", "candidate")]
