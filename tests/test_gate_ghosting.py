"""Ghosting gate: planted ghosts of known strength are found, benign differences are not, identical pairs score 0."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import cv2
import numpy as np
import pytest
from scipy import ndimage

from gates.base import PairContext, PairRef, ClipSide, get_gate
from gates.ghosting import GhostingConfig, clip_evidence, ghost_frames, ghost_scores, is_flagged, pool_windows
from h3.media import decode_video, encode_mp4
from bench.ghosting_calibration import plant_ghost

# The calibrated defaults (bench/results/ghosting_calibration.md), scoring every frame as the calibration does.
CONFIG = dataclasses.replace(GhostingConfig(), frame_stride=1)


def moving_texture(num_frames: int = 12, height: int = 96, width: int = 128, seed: int = 0) -> np.ndarray:
    """A static textured background with a textured square moving 3 px right and 1 px down per frame."""
    rng = np.random.default_rng(seed)

    def texture(h, w, sigma):
        field = ndimage.gaussian_filter(rng.standard_normal((h, w, 3)), sigma=(sigma, sigma, 0))
        return field / field.std()

    size = min(32, height // 3)
    background = 128 + 40 * texture(height, width, 2.0)
    patch = 128 + 60 * texture(size, size, 1.2)
    frames = []
    for t in range(num_frames + 4):
        frame = background.copy()
        y, x = height // 5 + t, width // 12 + 3 * t
        frame[y : y + size, x : x + size] = patch
        frames.append(frame)
    return np.clip(np.rint(np.stack(frames)), 0, 255).astype(np.uint8)


def plant(src: np.ndarray, alpha: float, lag: int, dy: int = 0, dx: int = 0, start: int = 4) -> np.ndarray:
    """Frames ``start..`` of ``src`` with a ghost of strength alpha: copy of frame t - lag shifted by (dy, dx), planted
    as the calibration plants it."""
    return plant_ghost(src, start, len(src) - start, alpha, lag, dy, dx)


def roundtrip(tmp_path: Path, frames: np.ndarray, crf: int, name: str) -> np.ndarray:
    path = tmp_path / f"{name}.mp4"
    encode_mp4(path, frames, None, fps=24, crf=crf)
    return decode_video(path)[0]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> dict[str, np.ndarray]:
    """Baseline and candidates, each through the runtime's codec (CRF 18) as in a real run."""
    tmp = tmp_path_factory.mktemp("ghosting")
    src = moving_texture()
    base_src = src[4:]
    rng = np.random.default_rng(1)
    noisy = np.clip(base_src.astype(np.int16) + rng.integers(-1, 2, base_src.shape), 0, 255).astype(np.uint8)
    gamma = np.clip(np.rint(255.0 * (base_src / 255.0) ** (1 / 1.02)), 0, 255).astype(np.uint8)
    raw = {
        "base": base_src,
        "ghost_lag1": plant(src, 0.10, lag=1),
        "ghost_lag2_shift": plant(src, 0.10, lag=2, dy=1, dx=-2),
        "ghost_005_lag3": plant(src, 0.05, lag=3),
        "noise": noisy,
        "gamma": gamma,
        "crf28": roundtrip(tmp, base_src, 28, "crf28"),
    }
    return {name: roundtrip(tmp, frames, 18, name) for name, frames in raw.items()}


@pytest.mark.parametrize("name, alpha, lag, dy, dx", [
    ("ghost_lag1", 0.10, 1, 0, 0), ("ghost_lag2_shift", 0.10, 2, 1, -2), ("ghost_005_lag3", 0.05, 3, 0, 0)])
def test_planted_ghost_is_flagged_with_its_strength_copy_and_frames(clip, name, alpha, lag, dy, dx):
    fs = ghost_scores(clip["base"], clip[name], CONFIG)
    (win,) = fs.windows  # 12 frames <= pool_frames: one pooled fit
    assert is_flagged(fs, CONFIG) and clip_evidence(fs) == win.score
    # The pooled fit recovers the planted copy and its strength within the codec's blur.
    assert (win.lag, win.dy, win.dx) == (lag, dy, dx)
    assert win.score == pytest.approx(alpha, abs=0.01)
    # Frames t >= lag can hold the copy and carry it at the planted strength; earlier ones cannot be fitted at lag.
    np.testing.assert_allclose(fs.score[lag:], alpha, atol=0.02)
    assert np.all(fs.score[:lag] == 0.0) and np.all(fs.lag[:lag] == -1) and np.all(fs.lag[lag:] == lag)
    assert ghost_frames(fs, CONFIG) == list(range(lag, len(fs.score)))


@pytest.mark.parametrize("name", ["noise", "gamma", "crf28"])
def test_benign_differences_are_not_flagged(clip, name):
    fs = ghost_scores(clip["base"], clip[name], CONFIG)
    assert not is_flagged(fs, CONFIG), (name, fs.windows)
    assert clip_evidence(fs) < CONFIG.threshold
    assert ghost_frames(fs, CONFIG) == []


def test_identical_pair_scores_exactly_zero(clip):
    fs = ghost_scores(clip["base"], clip["base"].copy(), CONFIG)
    assert np.all(fs.score == 0.0) and np.all(fs.lag == -1)
    assert clip_evidence(fs) == 0.0 and [w.score for w in fs.windows] == [0.0]


@pytest.mark.parametrize("n, pool, expected", [
    (0, 16, []), (5, 16, [(0, 5)]), (16, 16, [(0, 16)]), (17, 16, [(0, 16), (1, 17)]),
    (62, 16, [(0, 16), (15, 31), (31, 47), (46, 62)]), (64, 16, [(0, 16), (16, 32), (32, 48), (48, 64)])])
def test_pool_windows_cover_every_scored_frame_with_full_windows(n, pool, expected):
    frames = list(range(0, 2 * n, 2))  # scored frames at stride 2
    windows = pool_windows(frames, pool)
    assert windows == [frames[a:b] for a, b in expected]
    assert sorted({t for w in windows for t in w}) == frames


def test_ghost_in_part_of_a_long_clip_flags_only_its_windows_and_frames(tmp_path):
    """A 40-frame clip whose frames 24.. carry a lag-1 copy: windows of 12 frames, only those over the ghost flag."""
    src = moving_texture(num_frames=40, height=128, width=224, seed=2)
    base = src[4:]
    cand = base.copy()
    cand[24:] = plant(src, 0.10, lag=1)[24:]
    base, cand = (roundtrip(tmp_path, f, 18, n) for f, n in ((base, "b"), (cand, "c")))
    config = dataclasses.replace(CONFIG, pool_frames=12)
    fs = ghost_scores(base, cand, config)
    assert [w.frames[0] for w in fs.windows] == [0, 9, 19, 28]
    flagged_windows = [w for w in fs.windows if w.score >= config.threshold]
    assert [w.frames[0] for w in flagged_windows] == [19, 28]
    assert all(w.lag == 1 and (w.dy, w.dx) == (0, 0) for w in flagged_windows)
    # 12 of 12 frames of the last window carry the copy, 7 of 12 of the one before: pooled 0.10 and about 7/12 of it.
    assert flagged_windows[-1].score == pytest.approx(0.10, abs=0.01)
    assert ghost_frames(fs, config) == list(range(24, 40))


def test_shape_mismatch_is_an_error(clip):
    with pytest.raises(ValueError, match="shape mismatch"):
        ghost_scores(clip["base"], clip["base"][:-1], CONFIG)


# --- slow readable reference --------------------------------------------------------------------------------------


def reference_pooled(frames_base, frames_cand, config: GhostingConfig, factor: int):
    """Exhaustive float64 definition of one pooled window over all frames. Per frame: luma, block mean by
    ``factor``, Gaussian blur; nuisance regressors 1, base, base^2 and base shifted by one pixel; residual and copy
    projected off them. For every lag, the shift whose pooled ridge least-squares fit (numerators and energies summed
    over the frames t >= lag, ridge per frame) explains most residual energy; for that copy, the ridge fit per block
    of every frame, blocks above ``block_alpha_max`` dropped, and the energy-weighted median of the rest; the window
    score is the largest of these over lags (at least 0), and each frame's score the same median over its own blocks
    at the winning copy. Returns (score, (lag, dy, dx) at working resolution, per-frame scores)."""
    weights = np.array([0.299, 0.587, 0.114])

    def luma(frames):
        y = frames.astype(np.float64) @ weights
        t, h, w = y.shape
        h, w = h // factor, w // factor
        y = y[:, : h * factor, : w * factor].reshape(t, h, factor, w, factor).mean(axis=(2, 4))
        sigma = (0, config.blur_sigma, config.blur_sigma)
        return ndimage.gaussian_filter(y, sigma=sigma, mode="reflect", truncate=4.0)

    def lower_weighted_median(values, weights):
        pairs = sorted(zip(values, weights), key=lambda p: p[0])
        total = sum(w for _, w in pairs)
        if not pairs or total <= 0:
            return 0.0
        running = 0.0
        for value, weight in pairs:
            running += weight
            if running >= 0.5 * total:
                return value
        return pairs[-1][0]

    base, cand = luma(frames_base), luma(frames_cand)
    n, h, w = base.shape
    m = config.max_shift + 1
    inner = (slice(m, h - m), slice(m, w - m))
    ih, iw = h - 2 * m, w - 2 * m
    bs = config.block if ih >= config.block and iw >= config.block else None
    designs = []
    for t in range(n):
        b = base[t]
        nuisance = [np.ones((ih, iw)), b[inner], b[inner] ** 2]
        for ey, ex in [(-1, 0), (1, 0), (0, -1), (0, 1)]:
            nuisance.append(np.roll(b, (ey, ex), axis=(0, 1))[inner])
        designs.append(np.stack([c.ravel() for c in nuisance], axis=1))

    def perp(t, v):
        coef, *_ = np.linalg.lstsq(designs[t], v, rcond=None)
        return v - designs[t] @ coef

    residuals = [perp(t, (cand[t] - base[t])[inner].ravel()) for t in range(n)]

    def copy(t, key):
        lag, dy, dx = key
        return perp(t, np.roll(base[t - lag], (dy, dx), axis=(0, 1))[inner].ravel())

    def block_alphas(t, s):
        rr, ss = residuals[t].reshape(ih, iw), s.reshape(ih, iw)
        if bs is None:
            blocks = [(rr, ss)]
        else:
            cells = [(slice(by * bs, (by + 1) * bs), slice(bx * bs, (bx + 1) * bs))
                     for by in range(ih // bs) for bx in range(iw // bs)]
            blocks = [(rr[cell], ss[cell]) for cell in cells]
        out = []
        for rb, sb in blocks:
            energy = float(np.sum(sb * sb))
            alpha = float(np.sum(rb * sb)) / (energy + rb.size * config.ridge_rms**2)
            if alpha <= config.block_alpha_max:
                out.append((alpha, energy))
        return out

    best = (0.0, None)
    for lag in range(0, min(config.max_lag, n - 1) + 1):
        best_energy, best_key = 0.0, None
        for dy in range(-config.max_shift, config.max_shift + 1):
            for dx in range(-config.max_shift, config.max_shift + 1):
                if lag == 0 and max(abs(dy), abs(dx)) < config.min_lag0_shift:
                    continue
                num = den = 0.0
                for t in range(lag, n):
                    s = copy(t, (lag, dy, dx))
                    num += float(residuals[t] @ s)
                    den += float(s @ s) + ih * iw * config.ridge_rms**2
                if num > 0 and num * num / den > best_energy:
                    best_energy, best_key = num * num / den, (lag, dy, dx)
        if best_key is None:
            continue
        pairs = [p for t in range(lag, n) for p in block_alphas(t, copy(t, best_key))]
        alpha = max(0.0, lower_weighted_median([p[0] for p in pairs], [p[1] for p in pairs]))
        if best[1] is None or alpha > best[0]:
            best = (alpha, best_key)
    alpha, key = best
    frame_scores = np.zeros(n)
    for t in range(key[0], n):
        pairs = block_alphas(t, copy(t, key))
        frame_scores[t] = max(0.0, lower_weighted_median([p[0] for p in pairs], [p[1] for p in pairs]))
    return alpha, key, frame_scores


@pytest.mark.parametrize(
    "height, width, work_long_side, top_k",
    [
        # On frames this small the ranking's edge approximations can miss the best shift, so the tiny cases fit
        # every shift exactly (checking the pooled fit, blocks and median); the 80x112 case runs the default search.
        (40, 56, 64, 10_000),  # working resolution = full
        (80, 112, 64, CONFIG.top_k),  # 2x2 box-downsampled; default (ranked + hill-climbing) search
        (40, 56, 32, 10_000),  # 2x2 box-downsampled to 20x28
    ],
)
def test_pooled_fit_agrees_with_exhaustive_float64_reference(height, width, work_long_side, top_k):
    src = moving_texture(num_frames=6, height=height, width=width, seed=3)
    cand = plant(src, 0.12, lag=1, dy=1, dx=2) if height == 40 else plant(src, 0.12, lag=1, dy=2, dx=4)
    rng = np.random.default_rng(5)
    cand = np.clip(cand.astype(np.int16) + rng.integers(-2, 3, cand.shape), 0, 255).astype(np.uint8)
    base = src[4:]
    config = dataclasses.replace(CONFIG, work_long_side=work_long_side, top_k=top_k)
    fs = ghost_scores(base, cand, config)
    assert fs.factor == -(-max(height, width) // work_long_side)
    ref_score, ref_key, ref_frames = reference_pooled(base, cand, config, fs.factor)
    (win,) = fs.windows
    assert (win.lag, win.dy // fs.factor, win.dx // fs.factor) == ref_key
    assert win.score == pytest.approx(ref_score, rel=1e-4, abs=1e-5)
    np.testing.assert_allclose(fs.score, ref_frames, rtol=1e-4, atol=1e-5)
    assert ref_score > 0.05  # the reference sees the planted copy: the comparison is not 0 == 0


def test_frame_stride_pools_only_scored_frames(clip):
    config = dataclasses.replace(CONFIG, frame_stride=2)
    fs = ghost_scores(clip["base"], clip["ghost_lag1"], config)
    assert fs.scored.tolist() == [t % 2 == 0 for t in range(len(fs.score))]
    assert [w.frames for w in fs.windows] == [list(range(0, 12, 2))]
    assert np.all(fs.score[~fs.scored] == 0.0) and np.all(fs.lag[~fs.scored] == -1)
    # Pooled over 6 frames instead of 12, same copy, same strength within the codec's blur.
    assert (fs.windows[0].lag, fs.windows[0].dy, fs.windows[0].dx) == (1, 0, 0)
    assert fs.windows[0].score == pytest.approx(0.10, abs=0.01)


# --- the gate ------------------------------------------------------------------------------------------------------


def make_ctx(tmp_path: Path, base: np.ndarray, cand: np.ndarray, options=None) -> PairContext:
    run = tmp_path / "run"
    paths = {}
    for recipe, frames in (("baseline", base), ("fast", cand)):
        paths[recipe] = run / "clips" / recipe / "p0-s0.mp4"
        paths[recipe].parent.mkdir(parents=True, exist_ok=True)
        encode_mp4(paths[recipe], frames, None, fps=24)
    artifact_dir = run / "gates" / "ghosting" / "fast"
    artifact_dir.mkdir(parents=True)
    return PairContext(
        run_dir=run,
        pair=PairRef(baseline="baseline", candidate="fast", prompt_id="p0", seed=0),
        baseline=ClipSide("baseline", paths["baseline"], {}),
        candidate=ClipSide("fast", paths["fast"], {}),
        artifact_dir=artifact_dir,
        options=options or {},
    )


def test_gate_flags_ghost_and_writes_strip(tmp_path):
    src = moving_texture()
    ctx = make_ctx(tmp_path, src[4:], plant(src, 0.10, lag=1))
    result = get_gate("ghosting").evaluate(ctx)
    assert result.status == "ok" and result.error is None
    assert result.flagged and result.flags
    assert result.metrics["ghost_strength"].value == pytest.approx(0.10, abs=0.01)
    assert result.metrics["ghost_strength"].higher_is_better is False
    assert result.metrics["ghost_score_max"].value == pytest.approx(0.10, abs=0.02)
    # default frame_stride 2: frames 2, 4, .., 10 can hold the lag-1 copy (frame 0's copy lies before the clip)
    assert result.info["ghost_frame_indices"] == [2, 4, 6, 8, 10]
    assert result.metrics["ghost_frames"].value == 5
    (window,) = result.info["windows"]
    assert (window["lag"], window["dy"], window["dx"], window["first_frame"], window["last_frame"]) == (1, 0, 0, 0, 10)
    assert "frames 0-10" in result.flags[0] and "t-1" in result.flags[0]
    assert len(result.series["ghost_score"]) == 12
    assert len(result.artifacts) == 1 and not Path(result.artifacts[0]).is_absolute()
    png = cv2.imread(str(ctx.run_dir / result.artifacts[0]))
    assert png.shape == (3 * 360, 4 * 480, 3)  # 3 worst frames x (baseline | candidate | difference | heatmap)


def test_gate_identical_pair_is_zero_and_not_flagged(tmp_path):
    src = moving_texture()
    result = get_gate("ghosting").evaluate(make_ctx(tmp_path, src[4:], src[4:]))
    assert not result.flagged
    assert result.metrics["ghost_score_max"].value == 0.0 and result.metrics["ghost_strength"].value == 0.0
    assert result.metrics["ghost_frames"].value == 0.0 and result.info["ghost_frame_indices"] == []
    assert result.artifacts == []


def test_gate_shape_mismatch_is_a_per_pair_error(tmp_path):
    src = moving_texture()
    result = get_gate("ghosting").evaluate(make_ctx(tmp_path, src[4:], src[5:]))
    assert result.status == "error"
    assert "shape mismatch" in result.error and "p0-s0.mp4" in result.error
    assert result.metrics == {}


def test_gate_unknown_option_is_an_error(tmp_path):
    src = moving_texture(num_frames=4)
    result = get_gate("ghosting").evaluate(make_ctx(tmp_path, src[4:], src[4:], options={"treshold": 0.1}))
    assert result.status == "error" and "treshold" in result.error


def test_gate_corrupt_clip_is_a_per_pair_error_naming_the_file(tmp_path):
    src = moving_texture(num_frames=4)
    ctx = make_ctx(tmp_path, src[4:], src[4:])
    data = ctx.candidate.mp4.read_bytes()
    ctx.candidate.mp4.write_bytes(data[: len(data) // 3])
    result = get_gate("ghosting").evaluate(ctx)
    assert result.status == "error"
    assert "p0-s0.mp4" in result.error and "fast" in result.error
    assert result.metrics == {} and not result.flagged


def test_gate_options_arrive_as_strings_from_the_cli(tmp_path):
    src = moving_texture()
    ghost = plant(src, 0.10, lag=1)
    strict = get_gate("ghosting").evaluate(make_ctx(tmp_path / "a", src[4:], ghost, {"threshold": "0.5"}))
    assert strict.status == "ok" and not strict.flagged
    assert strict.info["config"]["threshold"] == 0.5 and strict.info["ghost_frame_indices"] == []
    bad = get_gate("ghosting").evaluate(make_ctx(tmp_path / "b", src[4:], ghost, {"frame_stride": "two"}))
    assert bad.status == "error" and "frame_stride" in bad.error
    zero = get_gate("ghosting").evaluate(make_ctx(tmp_path / "c", src[4:], ghost, {"pool_frames": "0"}))
    assert zero.status == "error" and "pool_frames" in zero.error
