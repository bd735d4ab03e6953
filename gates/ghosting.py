"""Ghosting gate: detects a faint displaced copy of moving content in the candidate that the baseline lacks.

Field report 001: a sparse-attention config passed the per-op gate and LPIPS, yet every frame carried a faint second
rendering of the moving subject; only side-by-side same-seed frames caught it. This gate automates that look.

Model. A ghost of strength ``alpha`` is ``cand = (1 - alpha) * base + alpha * S`` where ``S`` is a displaced copy of
the baseline: frame ``t - lag`` (lag 0..``max_lag``) translated by ``(dy, dx)`` pixels. So the residual
``r = cand - base`` equals ``alpha * (S - base)``. Per frame, on luma at a reduced working resolution, we fit

    r  ~  alpha * S  +  nuisance

by least squares, where the nuisance regressors are ``1, base, base**2`` (brightness, contrast and gamma changes are
smooth pointwise functions of ``base``) and ``base`` shifted by one pixel up/down/left/right (codec blur or
sharpening is a local linear filter of ``base``). Because ``r`` contains ``-alpha * base`` and ``base`` is a nuisance
regressor, the coefficient on ``S`` is the ghost strength itself; benign differences (codec noise, LSB noise, gamma)
correlate with ``base`` and its immediate neighbourhood, not with a displaced copy, so they are absorbed or average
out. The displacement search: the fit's exact numerator for every shift within ``max_shift`` is one
cross-correlation per lag (FFT); shifts are ranked with an approximate denominator (a second cross-correlation), the
exact fit is done for the ``top_k`` best per lag, then a hill climb over neighbouring shifts of the best one
(tests/test_gate_ghosting.py checks it against an exhaustive float64 reference). A ridge term ``ridge_rms`` keeps the
estimate from blowing up where the displaced copy barely differs from the baseline (static content: a ghost there is
invisible anyway), which is how the fit is restricted to moving, textured content without a hand-made mask.

The per-frame ``ghost_score`` is the estimated strength of the best-explaining displaced copy, clipped at 0 (a
negative coefficient is not a copy added to the frame). Identical frames score exactly 0 (the residual is zero).
A clip is flagged when enough frames reach ``frame_threshold`` (see :class:`GhostingConfig`); threshold and rule come
from planting ghosts of known strength into real footage: bench/ghosting_calibration.py, whose results are in
bench/results/ghosting_calibration.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from gates.base import Gate, GateResult, Metric, PairContext, register_gate

logger = logging.getLogger(__name__)

# Luma weights (ITU-R BT.601), the ones the H.264 yuv420p path of the runtime uses.
_LUMA = np.array([0.299, 0.587, 0.114])


@dataclass(frozen=True)
class GhostingConfig:
    """Detector settings. The defaults are the ones calibrated in bench/results/ghosting_calibration.md."""

    max_lag: int = 4
    """Largest temporal lag (frames) of the displaced copy searched."""
    max_shift: int = 4
    """Largest spatial displacement (pixels at working resolution, per axis) searched."""
    min_lag0_shift: int = 2
    """At lag 0 only displacements of at least this many pixels (Chebyshev) count; closer ones are codec blur."""
    work_long_side: int = 672
    """Frames are box-downsampled by an integer factor until the long side is at most this (speed)."""
    blur_sigma: float = 1.0
    """Gaussian low-pass (working pixels) before the fit. Film grain and sensor noise change from frame to frame and
    each encode smooths them differently over time, which reads as a faint lag copy (0.04-0.05 on bikes.mp4 for a
    +-1 LSB noise candidate); a displaced copy of moving structure survives the blur, the grain does not."""
    ridge_rms: float = 1.5
    """Ridge, as an RMS difference in 8-bit levels: a displaced copy differing from the base by less is shrunk to 0."""
    top_k: int = 2
    """Shifts per lag refitted exactly (ranked by an approximate explained energy)."""
    frame_stride: int = 2
    """Score every ``frame_stride``-th frame (0, s, 2s, ...); the others get no score (None), never zero. A frame's
    score does not depend on the stride (the calibration scores every frame); 2 keeps a 124-frame 768x1344 pair
    within the gate's time budget (bench/results/ghosting_speed.md)."""
    refine_steps: int = 2
    """Hill-climbing steps (8-neighbourhood, exact fits) from the best ranked shift of each lag."""
    block: int = 16
    """Block size (working pixels) of the robust per-block strength whose weighted median is the frame score."""
    block_alpha_max: float = 0.5
    """Blocks whose own strength exceeds this are replaced content, not a faint blend (an encoder that left a block
    stale for a few frames at CRF 28), and are left out of the median."""
    frame_threshold: float = 0.0772
    """A frame is a ghost frame when its ghost_score is at least this. Chosen by bench/ghosting_calibration.py
    (bench/results/ghosting_calibration.md): <= 1% of 138 benign windows flagged, 100% of planted ghosts with
    alpha >= 0.10 detected, but only 2.9% at alpha 0.05 (0.045 detects 98.6% there, with 5% false alarms, all on
    CRF 23/28 re-encodes)."""
    clip_min_frames: int = 3
    """A clip is flagged when at least max(clip_min_frames, ceil(clip_min_fraction * scored frames)) frames are ghost
    frames. The calibration windows (16 frames) exercise the floor of 3; the fraction keeps the chance that codec
    noise alone pushes enough frames over the threshold from growing with clip length (124 frames: 13)."""
    clip_min_fraction: float = 0.1


@dataclass
class FrameScores:
    """Per-frame output of :func:`ghost_scores` (arrays of length T)."""

    score: np.ndarray
    """Estimated ghost strength alpha-hat per frame (>= 0)."""
    lag: np.ndarray
    """Temporal lag of the selected displaced copy (-1 where nothing was selected)."""
    dy: np.ndarray
    """Vertical displacement of the selected copy, in pixels at full resolution."""
    dx: np.ndarray
    """Horizontal displacement of the selected copy, in pixels at full resolution."""
    scored: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """True where the frame was scored (see ``frame_stride``); ``score`` is 0 and meaningless elsewhere."""
    factor: int = 1
    """Downsampling factor used (working resolution = full / factor)."""


def downsample_factor(height: int, width: int, work_long_side: int) -> int:
    return max(1, math.ceil(max(height, width) / work_long_side))


def to_luma(frames: np.ndarray, factor: int, blur_sigma: float = 0.0) -> np.ndarray:
    """uint8 (T, H, W, 3) -> float64 luma (T, H // factor, W // factor), box-averaged over factor x factor blocks."""
    import cv2

    t, h, w, _ = frames.shape
    hh, ww = h // factor, w // factor
    weights = _LUMA.astype(np.float32)
    out = np.empty((t, hh, ww), dtype=np.float64)
    for i in range(t):
        y = frames[i, : hh * factor, : ww * factor].astype(np.float32) @ weights
        if factor > 1:
            # INTER_AREA with an integer factor is the exact block mean (and much faster than a numpy reduction).
            y = cv2.resize(y, (ww, hh), interpolation=cv2.INTER_AREA)
        if blur_sigma > 0:
            y = cv2.GaussianBlur(y, (0, 0), blur_sigma, borderType=cv2.BORDER_REFLECT)
        out[i] = y
    return out


def _nuisance(base: np.ndarray, m: int) -> np.ndarray:
    """Nuisance regressors on the interior (margin m): 1, base, base^2/255, and base shifted by one pixel (4 ways)."""
    h, w = base.shape
    inner = base[m : h - m, m : w - m]
    centred = inner - 128.0
    # Same span as (1, base, base^2, shifted bases); centred and differenced so the Gram matrix is well conditioned.
    cols = [
        np.ones_like(inner),
        centred,
        centred * centred / 128.0,
        base[m - 1 : h - m - 1, m : w - m] - inner,
        base[m + 1 : h - m + 1, m : w - m] - inner,
        base[m : h - m, m - 1 : w - m - 1] - inner,
        base[m : h - m, m + 1 : w - m + 1] - inner,
    ]
    return np.stack([c.ravel() for c in cols])


def _shifted(frame: np.ndarray, m: int, dy: int, dx: int) -> np.ndarray:
    """``frame(x - s)`` over the interior: the copy displaced by (dy, dx)."""
    h, w = frame.shape
    return frame[m - dy : h - m - dy, m - dx : w - m - dx]


def _candidate_shifts(lag: int, config: GhostingConfig) -> list[tuple[int, int]]:
    r = config.max_shift
    out = []
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            if lag == 0 and max(abs(dy), abs(dx)) < config.min_lag0_shift:
                continue
            out.append((dy, dx))
    return out


def ghost_scores(
    frames_base: np.ndarray, frames_cand: np.ndarray, config: GhostingConfig | None = None, workers: int = 1
) -> FrameScores:
    """Per-frame ghost strength of ``frames_cand`` relative to ``frames_base`` (both uint8 (T, H, W, 3)).

    ``workers`` caps the BLAS and FFT threads: the products here are skinny (7 x pixels), and a threaded BLAS on a
    shared 2-core machine was measured 5x slower than one thread.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=workers, user_api="blas"):
        return _ghost_scores(frames_base, frames_cand, config or GhostingConfig(), workers)


def _ghost_scores(
    frames_base: np.ndarray, frames_cand: np.ndarray, config: GhostingConfig, workers: int
) -> FrameScores:
    from scipy import fft as sfft

    if frames_base.shape != frames_cand.shape:
        raise ValueError(f"shape mismatch: baseline {frames_base.shape} vs candidate {frames_cand.shape}")
    t_count, h_full, w_full, _ = frames_base.shape
    factor = downsample_factor(h_full, w_full, config.work_long_side)
    score = np.zeros(t_count)
    lag_sel = np.full(t_count, -1, dtype=np.int64)
    dy_sel = np.zeros(t_count, dtype=np.int64)
    dx_sel = np.zeros(t_count, dtype=np.int64)
    scored = np.arange(t_count) % max(1, config.frame_stride) == 0
    result = FrameScores(score, lag_sel, dy_sel, dx_sel, scored=scored, factor=factor)
    same = [np.array_equal(frames_base[i], frames_cand[i]) for i in range(t_count)]
    if all(same):
        return result
    base = to_luma(frames_base, factor, config.blur_sigma)
    cand = to_luma(frames_cand, factor, config.blur_sigma)
    m = config.max_shift + 1
    _, h, w = base.shape
    if h <= 2 * m + 2 or w <= 2 * m + 2:
        raise ValueError(f"frames too small for the ghosting search: {h_full}x{w_full}")
    n_pix = (h - 2 * m) * (w - 2 * m)
    ridge = n_pix * config.ridge_rms**2
    spectra: dict[int, np.ndarray] = {}

    def spectrum(i: int) -> np.ndarray:
        if i not in spectra:
            spectra[i] = sfft.rfft2(base[i], workers=workers)
            for old in [k for k in spectra if k < i - config.max_lag]:
                del spectra[old]
        return spectra[i]

    for t in range(t_count):
        if same[t] or not scored[t]:
            continue
        b = base[t]
        inner = b[m : h - m, m : w - m]
        r = (cand[t] - b)[m : h - m, m : w - m].ravel()
        nmat = _nuisance(b, m)
        gram_inv = np.linalg.pinv(nmat @ nmat.T)
        r_perp = r - nmat.T @ (gram_inv @ (nmat @ r))
        padded = np.zeros((h, w))
        padded[m : h - m, m : w - m] = r_perp.reshape(h - 2 * m, w - 2 * m)
        r_spec = sfft.rfft2(padded, workers=workers)
        padded[:] = 0.0
        padded[m : h - m, m : w - m] = inner
        b_spec = sfft.rfft2(padded, workers=workers)
        energy_t, sum_t = float(np.sum(inner * inner)), float(np.sum(inner))
        rad = config.max_shift
        numerators: dict[int, np.ndarray] = {}
        exact: dict[tuple[int, int, int], tuple[float, float]] = {}

        def fit(lag: int, dy: int, dx: int) -> tuple[float, float]:
            """(explained energy, alpha-hat) of the copy at (lag, dy, dx); exact least squares with ridge."""
            key = (lag, dy, dx)
            if key not in exact:
                num = float(numerators[lag][dy + rad, dx + rad])
                if num <= 0:
                    exact[key] = (0.0, 0.0)
                else:
                    # |S_perp|^2 via the displacement S - base (same projection, base being a nuisance
                    # regressor), so that the subtraction is between small numbers.
                    d = (_shifted(base[t - lag], m, dy, dx) - inner).ravel()
                    q = nmat @ d
                    denom = max(float(d @ d) - float(q @ gram_inv @ q), 0.0) + ridge
                    exact[key] = (num * num / denom, num / denom)
            return exact[key]

        def robust_alpha(key: tuple[int, int, int]) -> float:
            """Energy-weighted median over blocks of the blockwise ridge fit of r_perp onto S_perp.

            A real ghost is a uniform blend, so every block of moving content shows the same strength. Codec
            differences are not: where one side's encoder copied a block from the previous frame and the other did
            not, that block alone looks like a full-strength lag copy, enough to move a global fit by 0.05-0.1 on
            real footage (bench/results/ghosting_calibration.md). The median ignores such blocks while they carry
            less than half of the copy's energy.
            """
            lag, dy, dx = key
            d = (_shifted(base[t - lag], m, dy, dx) - inner).ravel()
            s_perp = d - nmat.T @ (gram_inv @ (nmat @ d))
            bs = config.block
            hb, wb = (h - 2 * m) // bs, (w - 2 * m) // bs
            if hb == 0 or wb == 0:
                hb, wb, bs_y, bs_x = 1, 1, h - 2 * m, w - 2 * m
            else:
                bs_y = bs_x = bs

            def block_sums(v: np.ndarray) -> np.ndarray:
                v = v.reshape(h - 2 * m, w - 2 * m)[: hb * bs_y, : wb * bs_x]
                return v.reshape(hb, bs_y, wb, bs_x).sum(axis=(1, 3)).ravel()

            num = block_sums(r_perp * s_perp)
            den = block_sums(s_perp * s_perp)
            alphas = num / (den + bs_y * bs_x * config.ridge_rms**2)
            blended = alphas <= config.block_alpha_max
            return max(0.0, weighted_median(alphas[blended], den[blended]))

        seeds = []
        for lag in range(0, min(config.max_lag, t) + 1):
            # corr[s] = sum_x r_perp(x) * B_{t-lag}(x - s) = <r_perp, S_s>, and since r_perp is orthogonal to the
            # nuisance span this is also <r_perp, S_s projected off the nuisance>: the fit's exact numerator.
            lag_spec = np.conj(spectrum(t - lag))
            corr = sfft.irfft2(r_spec * lag_spec, s=(h, w), workers=workers)
            rows = np.arange(-rad, rad + 1) % h
            cols = np.arange(-rad, rad + 1) % w
            numerators[lag] = corr[np.ix_(rows, cols)]
            # Ranking only: |S_s - base|^2 less its mean, from one more cross-correlation (shifted energies taken as
            # unshifted, the one-pixel nuisance ignored). Exact fits follow for the best ``top_k`` shifts.
            cross = sfft.irfft2(b_spec * lag_spec, s=(h, w), workers=workers)[np.ix_(rows, cols)]
            lag_inner = base[t - lag][m : h - m, m : w - m]
            energy_l, sum_l = float(np.sum(lag_inner * lag_inner)), float(np.sum(lag_inner))
            approx = energy_l + energy_t - 2.0 * cross - (sum_l - sum_t) ** 2 / n_pix
            shifts = _candidate_shifts(lag, config)
            values = np.array([numerators[lag][dy + rad, dx + rad] for dy, dx in shifts])
            approx_at = np.array([approx[dy + rad, dx + rad] for dy, dx in shifts])
            rank = np.where(values > 0, values * values / (np.maximum(approx_at, 0.0) + ridge), 0.0)
            seeds.append([(lag, *shifts[j]) for j in np.argsort(-rank)[: config.top_k] if values[j] > 0])
        best = (0.0, -1, 0, 0)  # (robust alpha, lag, dy, dx)
        for lag_seeds in seeds:
            if not lag_seeds:
                continue
            # Best displacement of this lag by the global fit; the ranking underrates shifts close to the
            # one-pixel nuisance, so climb to the best exact neighbour.
            key = max(lag_seeds, key=lambda k: fit(*k)[0])
            allowed = set(_candidate_shifts(key[0], config))
            for _ in range(config.refine_steps):
                lag, dy0, dx0 = key
                neighbours = [(lag, dy0 + a, dx0 + b) for a in (-1, 0, 1) for b in (-1, 0, 1)]
                step = max((k for k in neighbours if k[1:] in allowed), key=lambda k: fit(*k)[0])
                if step == key:
                    break
                key = step
            if fit(*key)[0] <= 0:
                continue
            alpha = robust_alpha(key)
            if alpha > best[0]:
                best = (alpha, *key)
        if best[1] >= 0:
            score[t] = best[0]
            lag_sel[t] = best[1]
            dy_sel[t] = best[2] * factor
            dx_sel[t] = best[3] * factor
    return result


def required_frames(num_scored: int, config: GhostingConfig) -> int:
    """How many ghost frames flag a clip of ``num_scored`` scored frames."""
    return max(config.clip_min_frames, math.ceil(config.clip_min_fraction * num_scored - 1e-9))


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """Lower weighted median: the smallest value whose cumulative weight (in ascending value order) reaches half the
    total; 0.0 when the total weight is 0."""
    values, weights = np.asarray(values, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    total = float(weights.sum())
    if values.size == 0 or total <= 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, 0.5 * total)])


def clip_evidence(scores: np.ndarray, config: GhostingConfig) -> float:
    """The ``required_frames``-th largest frame score (0.0 when the clip has fewer scored frames): the clip is
    flagged exactly when this reaches ``frame_threshold``."""
    scores = np.asarray(scores, dtype=np.float64)
    k = required_frames(scores.size, config)
    if scores.size < k:
        return 0.0
    return float(np.sort(scores)[::-1][k - 1])


def frames_flagged(scores: np.ndarray, config: GhostingConfig) -> tuple[int, bool]:
    """(number of ghost frames, clip flagged) for the scores of the scored frames."""
    scores = np.asarray(scores, dtype=np.float64)
    ghost_frames = int(np.sum(scores >= config.frame_threshold))
    return ghost_frames, ghost_frames >= required_frames(scores.size, config)


def local_ghost_map(
    frames_base: np.ndarray, frames_cand: np.ndarray, t: int, lag: int, dy: int, dx: int, config: GhostingConfig
) -> np.ndarray:
    """Per-pixel amplitude (8-bit luma levels) of the selected copy at frame ``t``, at full resolution (heatmap).

    Windowed least squares of ``cand - base`` onto ``d = S - base`` (box window of 9 working pixels, same ridge per
    pixel as the frame fit) gives a local strength; times the local RMS of ``d`` it is how many levels the ghost
    adds there: a picture of where the displaced copy is visible, not a calibrated score.
    """
    import cv2

    h_full, w_full = frames_base.shape[1:3]
    factor = downsample_factor(h_full, w_full, config.work_long_side)
    lo, hi = max(0, t - lag), t + 1
    base = to_luma(frames_base[lo:hi], factor)
    cand = to_luma(frames_cand[t : t + 1], factor)[0]
    b = base[-1]
    copy = np.roll(base[0], (dy // factor, dx // factor), axis=(0, 1))
    d = copy - b
    r = cand - b
    num = cv2.boxFilter(r * d, -1, (9, 9))
    energy = np.maximum(cv2.boxFilter(d * d, -1, (9, 9)), 0.0)  # the running box sum can dip below 0 by rounding
    amplitude = np.clip(num / (energy + config.ridge_rms**2), 0.0, None) * np.sqrt(energy)
    return cv2.resize(amplitude, (w_full, h_full), interpolation=cv2.INTER_NEAREST)


def render_strip(
    frames_base: np.ndarray, frames_cand: np.ndarray, fs: FrameScores, indices: list[int], config: GhostingConfig,
    panel_width: int = 480, gain: float = 8.0, heat_max: float = 6.0,
) -> np.ndarray:
    """RGB uint8 image: one row per frame index, panels baseline | candidate | amplified difference | heatmap.

    The difference is ``128 + gain * (cand - base)``; the heatmap maps the local ghost amplitude
    (:func:`local_ghost_map`) 0..``heat_max`` levels onto the inferno colormap.
    """
    import cv2

    h_full, w_full = frames_base.shape[1:3]
    panel_height = max(2, round(h_full * panel_width / w_full))
    rows = []
    for t in indices:
        b, c = frames_base[t], frames_cand[t]
        diff = np.clip(128.0 + gain * (c.astype(np.float32) - b.astype(np.float32)), 0, 255).astype(np.uint8)
        if fs.lag[t] >= 0:
            alpha = local_ghost_map(frames_base, frames_cand, t, int(fs.lag[t]), int(fs.dy[t]), int(fs.dx[t]), config)
        else:
            alpha = np.zeros((h_full, w_full))
        heat = np.clip(alpha / heat_max * 255.0, 0, 255).astype(np.uint8)
        heat = cv2.applyColorMap(heat, cv2.COLORMAP_INFERNO)[..., ::-1]
        panels = [cv2.resize(p, (panel_width, panel_height), interpolation=cv2.INTER_AREA) for p in (b, c, diff, heat)]
        rows.append(np.concatenate(panels, axis=1))
    return np.concatenate(rows, axis=0)


def _png_bytes(rgb: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()


_CONFIG_OPTIONS = ("frame_threshold", "clip_min_frames", "clip_min_fraction", "frame_stride")
_OPTION_KEYS = {*_CONFIG_OPTIONS, "strip_frames", "workers"}


@register_gate
class GhostingGate(Gate):
    """Faint displaced copy of moving content in the candidate (field report 001); calibrated on real footage."""

    name = "ghosting"
    needs = ("video",)
    description = (
        "Estimated strength of a displaced copy (temporal lag 0-4, spatial shift) of the baseline in the candidate, "
        "per frame; flags the clip when enough frames exceed the calibrated threshold."
    )

    option_names = frozenset(_OPTION_KEYS)

    def evaluate(self, ctx: PairContext) -> GateResult:
        from gates.common import GateInputError, check_options, option_float, option_int, relative_to_run
        from gates.media_cache import load_video
        from h3.atomic import atomic_write_bytes
        from h3.media import MediaError

        defaults = GhostingConfig()
        try:
            check_options(self.name, ctx.options, self.option_names)
            config = dataclasses.replace(
                defaults,
                frame_threshold=option_float(ctx.options, "frame_threshold", defaults.frame_threshold),
                clip_min_frames=option_int(ctx.options, "clip_min_frames", defaults.clip_min_frames),
                clip_min_fraction=option_float(ctx.options, "clip_min_fraction", defaults.clip_min_fraction),
                frame_stride=option_int(ctx.options, "frame_stride", defaults.frame_stride),
            )
            strip_frames = option_int(ctx.options, "strip_frames", 3)
            workers = option_int(ctx.options, "workers", 1)
        except GateInputError as exc:
            return self._error(ctx, str(exc))
        try:
            # Through the runner's per-pair cache: the other gates of this pair decode the same two files.
            base, _ = load_video(ctx.baseline.mp4)
            cand, _ = load_video(ctx.candidate.mp4)
        except MediaError as exc:
            return self._error(ctx, str(exc))
        if base.shape != cand.shape:
            return self._error(
                ctx, f"frame shape mismatch: baseline {ctx.baseline.mp4.name} {base.shape} vs candidate "
                f"{ctx.candidate.mp4.name} {cand.shape}")
        try:
            fs = ghost_scores(base, cand, config, workers=workers)
        except ValueError as exc:  # frames too small for the displacement search
            return self._error(ctx, f"{ctx.candidate.mp4.name}: {exc}")
        scored = fs.scored
        values = fs.score[scored]
        ghost_frames, flagged = frames_flagged(values, config)
        metrics = {
            "ghost_score_max": Metric(value=float(values.max()), higher_is_better=False, unit="alpha"),
            "ghost_score_mean": Metric(value=float(values.mean()), higher_is_better=False, unit="alpha"),
            "ghost_frames": Metric(value=float(ghost_frames), higher_is_better=False, unit="frames"),
        }
        series = {
            "ghost_score": [float(v) if ok else None for v, ok in zip(fs.score, scored)],
            "ghost_lag": [float(v) if ok and v >= 0 else None for v, ok in zip(fs.lag, scored)],
        }
        flags = []
        worst = [int(i) for i in np.argsort(-np.where(scored, fs.score, -1.0), kind="stable")]
        worst = [i for i in worst if scored[i]][:strip_frames]
        if flagged:
            t = worst[0]
            flags.append(
                f"ghosting: {ghost_frames} of {int(scored.sum())} scored frames have ghost_score >= "
                f"{config.frame_threshold} (>= {required_frames(values.size, config)} flag the clip); worst frame {t}: "
                f"ghost_score {fs.score[t]:.3f}, copy of frame t-{fs.lag[t]} shifted by ({fs.dy[t]}, {fs.dx[t]}) px")
        artifacts = []
        if worst and fs.score[worst[0]] > 0:
            strip = render_strip(base, cand, fs, sorted(worst), config)
            path = ctx.artifact_dir / f"{ctx.pair.prompt_id}-s{ctx.pair.seed}-ghosting-strip.png"
            atomic_write_bytes(path, _png_bytes(strip))
            artifacts.append(relative_to_run(ctx, path))
        return GateResult(
            gate=self.name, pair=ctx.pair, metrics=metrics, series=series, flagged=flagged, flags=flags,
            artifacts=artifacts,
            info={
                "config": asdict(config),
                "calibration": "bench/results/ghosting_calibration.md",
                "scored_frames": int(scored.sum()),
                "num_frames": int(base.shape[0]),
                "required_frames": required_frames(values.size, config),
                "ghost_frame_indices": [int(t) for t in np.flatnonzero(scored & (fs.score >= config.frame_threshold))],
                "clip_evidence": clip_evidence(values, config),
                "downsample_factor": fs.factor,
                "strip_frames": sorted(worst),
                "worst_frames": [
                    {"frame": t, "ghost_score": float(fs.score[t]), "lag": int(fs.lag[t]), "dy": int(fs.dy[t]),
                     "dx": int(fs.dx[t])} for t in worst],
            },
        )

    def _error(self, ctx: PairContext, message: str) -> GateResult:
        logger.error("ghosting %s/%s-s%d: %s", ctx.pair.candidate, ctx.pair.prompt_id, ctx.pair.seed, message)
        return GateResult(gate=self.name, pair=ctx.pair, status="error", error=message)
