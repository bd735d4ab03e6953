"""Ghosting gate: detects a faint displaced copy of moving content in the candidate that the baseline lacks.

Field report 001: a sparse-attention config passed the per-op gate and LPIPS, yet every frame carried a faint second
rendering of the moving subject; only side-by-side same-seed frames caught it. This gate automates that look.

Model. A ghost of strength ``alpha`` is ``cand = (1 - alpha) * base + alpha * S`` where ``S`` is a displaced copy of
the baseline: frame ``t - lag`` (lag 0..``max_lag``) translated by ``(dy, dx)`` pixels. So the residual
``r = cand - base`` equals ``alpha * (S - base)``. On luma at a reduced working resolution, we fit

    r  ~  alpha * S  +  nuisance

by least squares, where the nuisance regressors are ``1, base, base**2`` (brightness, contrast and gamma changes are
smooth pointwise functions of ``base``) and ``base`` shifted by one pixel up/down/left/right (codec blur or
sharpening is a local linear filter of ``base``). Because ``r`` contains ``-alpha * base`` and ``base`` is a nuisance
regressor, the coefficient on ``S`` is the ghost strength itself; benign differences (codec noise, LSB noise, gamma)
correlate with ``base`` and its immediate neighbourhood, not with a displaced copy, so they are absorbed or average
out. The displacement search: the fit's exact numerator for every shift within ``max_shift`` is one
cross-correlation per lag (FFT); shifts are ranked with an approximate denominator (a second cross-correlation), the
exact fit is done for the ``top_k`` best per lag, then a hill climb over neighbouring shifts of the best one
(tests/test_gate_ghosting.py checks the pooled fit against an exhaustive float64 reference). A ridge term
``ridge_rms`` keeps the estimate from blowing up where the displaced copy barely differs from the baseline (static
content: a ghost there is invisible anyway), which is how the fit is restricted to moving, textured content without a hand-made mask.

Pooling. A ghost from an attention defect is the same copy in every frame; codec noise is not. So the fit is joint
over a window of ``pool_frames`` scored frames: one (lag, dy, dx) for all of them, the per-frame normal equations
summed (numerators from the per-frame cross-correlations, exact denominators for the ranked candidates and a hill
climb over their neighbours). The window's strength is the energy-weighted median of the blockwise strengths over
all blocks of all its frames (:func:`_robust_alpha`), clipped at 0 (a negative coefficient is not a copy added to the
frame). Pooling 16 frames cuts the noise about 4x and removes most of the selection bias of a per-frame best of ~400
displacements, which is what let CRF 23/28 re-encodes reach per-frame scores of 0.085/0.18 on real footage.

A clip is flagged when any window's pooled strength reaches ``threshold``. The per-frame ``ghost_score`` is the
frame's own robust strength at its window's copy; frames of a flagged window at or above ``frame_threshold`` are
listed as ghost frames (the gate says which frames). Identical pairs score exactly 0 (the residual is zero). The
threshold comes from planting ghosts of known strength into real footage: bench/ghosting_calibration.py, whose
results are in bench/results/ghosting_calibration.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from pydantic import Field

from gates.base import Gate, GateInputError, GateOptions, GateResult, Metric, MetricSpec, PairContext, register_gate

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
    min_lag0_shift: int = 3
    """At lag 0 only displacements of at least this many pixels (Chebyshev) count; closer ones are codec smoothing
    of fine texture, not a second rendering (a CRF 28 re-encode of the test suite's noise texture pooled to 0.041 at
    a lag-0 copy shifted by (1, 2) with 2; 0.018 with 3)."""
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
    pool_frames: int = 16
    """Scored frames pooled into one fit (a window). A ghost from an attention defect is the same copy in every frame
    (field report 001: "on every frame"); codec noise is not, so summing the frames' normal equations for one shared
    (lag, dy, dx) cuts the noise about 4x over 16 frames and removes most of the per-frame selection bias of taking
    the best of ~400 displacements. Longer clips are covered by several windows (:func:`pool_windows`)."""
    threshold: float = 0.0364
    """A clip is flagged when the pooled strength of any of its windows reaches this. Chosen by
    bench/ghosting_calibration.py on 16-frame windows of real footage (bench/results/ghosting_calibration.md): the
    midpoint of the benign tail (0.026, the window ranked past the 1% allowed) and the 10th percentile of planted
    alpha = 0.05 ghosts (0.047); there 100% of planted ghosts at alpha 0.05 and >= 0.10 (98.6% at 0.07) and 1 of 138
    benign windows (0.72%, a CRF 28 re-encode) are flagged."""
    frame_threshold: float = 0.0182
    """In a flagged window, the frames whose own strength at the window's copy reaches this are listed as ghost
    frames (reporting only; the flag is the window's). Half the calibrated ``threshold``: 99% of the frames that can
    hold a planted copy are listed in the calibration."""


@dataclass
class PooledWindow:
    """One pooled fit: a window of scored frames and the displaced copy that best explains all of them."""

    frames: list[int]
    """Frame indices (scored frames) of the window."""
    score: float = 0.0
    """Robust pooled ghost strength alpha-hat of the window (>= 0)."""
    lag: int = -1
    """Temporal lag of the window's copy (-1 where nothing was selected)."""
    dy: int = 0
    """Vertical displacement of the copy, in pixels at full resolution."""
    dx: int = 0
    """Horizontal displacement of the copy, in pixels at full resolution."""
    frame_scores: dict[int, float] = field(default_factory=dict)
    """Per-frame robust strength at the window's copy (frames that can hold a copy of that lag)."""


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
    windows: list[PooledWindow] = field(default_factory=list)
    """The pooled fits (:func:`pool_windows`); a frame's score is its strength at the copy of the strongest window
    that contains it."""


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
    """Ghost strength of ``frames_cand`` relative to ``frames_base`` (both uint8 (T, H, W, 3)): one pooled fit per
    window of ``pool_frames`` scored frames, and per-frame strengths at each window's displaced copy.

    ``workers`` caps the BLAS and FFT threads: the products here are skinny (7 x pixels), and a threaded BLAS on a
    shared 2-core machine was measured 5x slower than one thread.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=workers, user_api="blas"):
        return _ghost_scores(frames_base, frames_cand, config or GhostingConfig(), workers)


def pool_windows(scored_frames: list[int], pool_frames: int) -> list[list[int]]:
    """Consecutive runs of ``pool_frames`` scored frames covering all of them: ceil(n / pool_frames) windows with
    evenly spread starts (the last ones overlap rather than leave a short, noisier window); one window when n is at
    most ``pool_frames``."""
    n = len(scored_frames)
    if n == 0:
        return []
    if n <= pool_frames:
        return [list(scored_frames)]
    count = math.ceil(n / pool_frames)
    starts = sorted({round(i * (n - pool_frames) / (count - 1)) for i in range(count)})
    return [list(scored_frames[s : s + pool_frames]) for s in starts]


class _Frame:
    """Per-frame quantities of the fit at working resolution (rebuilt on demand: a window's worth would not fit in
    memory at production size)."""

    def __init__(self, base: np.ndarray, cand: np.ndarray, t: int, m: int):
        h, w = base.shape[1:]
        self.t = t
        self.inner = base[t][m : h - m, m : w - m]
        self.nmat = _nuisance(base[t], m)
        self.gram_inv = np.linalg.pinv(self.nmat @ self.nmat.T)
        r = (cand[t] - base[t])[m : h - m, m : w - m].ravel()
        self.r_perp = self.perp(r)

    def perp(self, v: np.ndarray) -> np.ndarray:
        return v - self.nmat.T @ (self.gram_inv @ (self.nmat @ v))

    def displacement(self, base: np.ndarray, m: int, key: tuple[int, int, int]) -> np.ndarray:
        lag, dy, dx = key
        return (_shifted(base[self.t - lag], m, dy, dx) - self.inner).ravel()

    def exact_energy(self, base: np.ndarray, m: int, key: tuple[int, int, int]) -> float:
        """|S_perp|^2 via the displacement S - base (same projection, base being a nuisance regressor), so that
        the subtraction is between small numbers."""
        d = self.displacement(base, m, key)
        q = self.nmat @ d
        return max(float(d @ d) - float(q @ self.gram_inv @ q), 0.0)


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
    scored_frames = [int(t) for t in np.flatnonzero(scored)]
    same = [np.array_equal(frames_base[i], frames_cand[i]) for i in range(t_count)]
    if all(same[t] for t in scored_frames):
        result.windows = [PooledWindow(frames=w) for w in pool_windows(scored_frames, config.pool_frames)]
        return result
    base = to_luma(frames_base, factor, config.blur_sigma)
    cand = to_luma(frames_cand, factor, config.blur_sigma)
    m = config.max_shift + 1
    _, h, w = base.shape
    if h <= 2 * m + 2 or w <= 2 * m + 2:
        raise ValueError(f"frames too small for the ghosting search: {h_full}x{w_full}")
    n_pix = (h - 2 * m) * (w - 2 * m)
    ridge = n_pix * config.ridge_rms**2
    rad = config.max_shift
    rows = np.arange(-rad, rad + 1) % h
    cols = np.arange(-rad, rad + 1) % w
    spectra: dict[int, np.ndarray] = {}

    def spectrum(i: int) -> np.ndarray:
        if i not in spectra:
            spectra[i] = sfft.rfft2(base[i], workers=workers)
            for old in [k for k in spectra if k < i - config.max_lag]:
                del spectra[old]
        return spectra[i]

    # Pass 1, per scored frame and lag: the fit's exact numerator <r_perp, S_s> for every shift s (one
    # cross-correlation), and an approximate |S_s - base|^2 for ranking (a second one).
    numerators: dict[int, dict[int, np.ndarray]] = {}
    approxes: dict[int, dict[int, np.ndarray]] = {}
    for t in scored_frames:
        numerators[t], approxes[t] = {}, {}
        b = base[t]
        inner = b[m : h - m, m : w - m]
        padded = np.zeros((h, w))
        if not same[t]:
            fr = _Frame(base, cand, t, m)
            padded[m : h - m, m : w - m] = fr.r_perp.reshape(h - 2 * m, w - 2 * m)
            r_spec = sfft.rfft2(padded, workers=workers)
            padded[:] = 0.0
        padded[m : h - m, m : w - m] = inner
        b_spec = sfft.rfft2(padded, workers=workers)
        energy_t, sum_t = float(np.sum(inner * inner)), float(np.sum(inner))
        for lag in range(0, min(config.max_lag, t) + 1):
            lag_spec = np.conj(spectrum(t - lag))
            # corr[s] = sum_x r_perp(x) * B_{t-lag}(x - s) = <r_perp, S_s>, and since r_perp is orthogonal to the
            # nuisance span this is also <r_perp, S_s projected off the nuisance>: the fit's exact numerator.
            if same[t]:
                numerators[t][lag] = np.zeros((2 * rad + 1, 2 * rad + 1))
            else:
                numerators[t][lag] = sfft.irfft2(r_spec * lag_spec, s=(h, w), workers=workers)[np.ix_(rows, cols)]
            # Ranking only: |S_s - base|^2 less its mean (shifted energies taken as unshifted, the one-pixel
            # nuisance ignored). Exact fits follow for the best ``top_k`` shifts per lag.
            cross = sfft.irfft2(b_spec * lag_spec, s=(h, w), workers=workers)[np.ix_(rows, cols)]
            lag_inner = base[t - lag][m : h - m, m : w - m]
            energy_l, sum_l = float(np.sum(lag_inner * lag_inner)), float(np.sum(lag_inner))
            approxes[t][lag] = energy_l + energy_t - 2.0 * cross - (sum_l - sum_t) ** 2 / n_pix

    windows = []
    for frames in pool_windows(scored_frames, config.pool_frames):
        windows.append(_fit_window(base, cand, frames, numerators, approxes, config, m, ridge))
    result.windows = windows
    # Each frame reports the window (of those containing it) with the strongest pooled copy.
    owner: dict[int, PooledWindow] = {}
    for win in windows:
        for t in win.frames:
            if t not in owner or win.score > owner[t].score:
                owner[t] = win
    for t, win in owner.items():
        if win.lag >= 0 and t in win.frame_scores:
            score[t] = win.frame_scores[t]
            lag_sel[t] = win.lag
            dy_sel[t] = win.dy * factor
            dx_sel[t] = win.dx * factor
    for win in windows:
        win.dy *= factor
        win.dx *= factor
    return result


def _fit_window(base, cand, frames, numerators, approxes, config: GhostingConfig, m: int, ridge: float):
    """The pooled fit of one window: one displaced copy (lag, dy, dx) for all its frames.

    Pooled least squares sums the per-frame normal equations: alpha-hat = sum_t <r_perp, S_perp> /
    (sum_t |S_perp|^2 + ridge per frame). Per lag, shifts are ranked by the pooled explained energy with the
    approximate denominators, the ``top_k`` best get exact pooled fits, then a hill climb over neighbouring shifts.
    The window's strength is the robust (block-median) pooled estimate of the best copy of each lag, the largest
    over lags.
    """
    rad = config.max_shift
    ih, iw = base.shape[1] - 2 * m, base.shape[2] - 2 * m
    win = PooledWindow(frames=list(frames))
    if all(not np.any(numerators[t][lag]) for t in frames for lag in numerators[t]):
        return win  # identical frames throughout: residual zero
    lags = [lag for lag in range(config.max_lag + 1) if any(t - lag >= 0 for t in frames)]
    pooled_num = {lag: sum(numerators[t][lag] for t in frames if t >= lag) for lag in lags}
    frames_of = {lag: [t for t in frames if t >= lag] for lag in lags}
    exact: dict[tuple[int, int, int], float] = {}  # pooled exact explained energy
    # The window's frames are visited once per search step; keeping them (about 16 MB per frame at 384x672
    # working pixels) instead of rebuilding the nuisance basis each time was measured 25% faster overall.
    cache: dict[int, _Frame] = {}

    def frame(t: int) -> _Frame:
        if t not in cache:
            cache[t] = _Frame(base, cand, t, m)
        return cache[t]

    def by_frame(keys):
        """(t, frame t, the keys whose lag frame t reaches) over the window's frames, one pass."""
        for t in frames:
            mine = [k for k in keys if t >= k[0]]
            if mine:
                yield t, frame(t), mine

    def evaluate(keys: set[tuple[int, int, int]]) -> None:
        """Exact pooled explained energy of ``keys``, one pass over the frames."""
        todo = {k for k in keys if k not in exact}
        if not todo:
            return
        energies = {k: 0.0 for k in todo}
        for _, fr, mine in by_frame(todo):
            for k in mine:
                energies[k] += fr.exact_energy(base, m, k)
        for k in todo:
            num = float(pooled_num[k[0]][k[1] + rad, k[2] + rad])
            den = energies[k] + ridge * len(frames_of[k[0]])
            exact[k] = num * num / den if num > 0 else 0.0

    seeds: dict[int, list[tuple[int, int, int]]] = {}
    for lag in lags:
        approx = sum(approxes[t][lag] for t in frames_of[lag])
        shifts = _candidate_shifts(lag, config)
        values = np.array([pooled_num[lag][dy + rad, dx + rad] for dy, dx in shifts])
        approx_at = np.array([approx[dy + rad, dx + rad] for dy, dx in shifts])
        rank = np.where(values > 0, values * values / (np.maximum(approx_at, 0.0) + ridge * len(frames_of[lag])), 0.0)
        seeds[lag] = [(lag, *shifts[j]) for j in np.argsort(-rank, kind="stable")[: config.top_k] if values[j] > 0]
    evaluate({k for ks in seeds.values() for k in ks})
    current = {lag: max(ks, key=lambda k: exact[k]) for lag, ks in seeds.items() if ks}
    allowed = {lag: set(_candidate_shifts(lag, config)) for lag in current}
    # Hill climb, all lags in step (one pass over the frames per step): the ranking underrates shifts close to the
    # one-pixel nuisance.
    for _ in range(config.refine_steps):
        neighbours = {lag: [(lag, k[1] + a, k[2] + b) for a in (-1, 0, 1) for b in (-1, 0, 1)
                            if (k[1] + a, k[2] + b) in allowed[lag]] for lag, k in current.items()}
        evaluate({k for ks in neighbours.values() for k in ks})
        moved = False
        for lag, ks in neighbours.items():
            step = max(ks, key=lambda k: exact[k])
            if exact[step] > exact[current[lag]]:
                current[lag], moved = step, True
        if not moved:
            break
    finalists = [k for k in current.values() if exact[k] > 0]
    if not finalists:
        return win
    # Robust pooled strength of each finalist: energy-weighted median of the blockwise ridge fits over all blocks
    # of all frames of the window (see GhostingConfig.block_alpha_max), and the per-frame medians.
    blocks: dict[tuple[int, int, int], list[tuple[int, np.ndarray, np.ndarray]]] = {k: [] for k in finalists}
    for t, fr, mine in by_frame(finalists):
        for k in mine:
            s_perp = fr.perp(fr.displacement(base, m, k))
            num, den = _block_sums(fr.r_perp, s_perp, ih, iw, config.block)
            blocks[k].append((t, num, den))
    best = None
    for k in finalists:
        nums = np.concatenate([b[1] for b in blocks[k]])
        dens = np.concatenate([b[2] for b in blocks[k]])
        alpha = _robust_alpha(nums, dens, config, ih, iw)
        if best is None or alpha > best[0]:
            best = (alpha, k)
    alpha, (lag, dy, dx) = best
    win.score, win.lag, win.dy, win.dx = alpha, lag, dy, dx
    win.frame_scores = {
        t: _robust_alpha(num, den, config, ih, iw)
        for t, num, den in blocks[(lag, dy, dx)]
    }
    return win


def _block_geometry(ih: int, iw: int, block: int) -> tuple[int, int, int, int]:
    """(blocks down, blocks across, block height, block width); the whole interior when smaller than a block."""
    hb, wb = ih // block, iw // block
    if hb == 0 or wb == 0:
        return 1, 1, ih, iw
    return hb, wb, block, block


def _block_sums(r_perp: np.ndarray, s_perp: np.ndarray, ih: int, iw: int, block: int):
    """Per block: <r_perp, s_perp> and |s_perp|^2."""
    hb, wb, bs_y, bs_x = _block_geometry(ih, iw, block)

    def sums(v: np.ndarray) -> np.ndarray:
        v = v.reshape(ih, iw)[: hb * bs_y, : wb * bs_x]
        return v.reshape(hb, bs_y, wb, bs_x).sum(axis=(1, 3)).ravel()

    return sums(r_perp * s_perp), sums(s_perp * s_perp)


def _robust_alpha(num: np.ndarray, den: np.ndarray, config: GhostingConfig, ih: int, iw: int) -> float:
    """Energy-weighted median of the blockwise ridge fits, blocks above ``block_alpha_max`` left out, at least 0.

    A real ghost is a uniform blend, so every block of moving content shows the same strength. Codec differences
    are not: where one side's encoder copied a block from the previous frame and the other did not, that block alone
    looks like a full-strength lag copy, enough to move a global fit by 0.05-0.1 on real footage
    (bench/results/ghosting_calibration.md). The median ignores such blocks while they carry less than half of the
    copy's energy.
    """
    _, _, bs_y, bs_x = _block_geometry(ih, iw, config.block)
    alphas = num / (den + bs_y * bs_x * config.ridge_rms**2)
    blended = alphas <= config.block_alpha_max
    return max(0.0, weighted_median(alphas[blended], den[blended]))


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


def clip_evidence(fs: FrameScores) -> float:
    """The clip's ghost evidence: the largest pooled strength over its windows (0.0 without windows). The clip is
    flagged exactly when this reaches ``threshold``."""
    return max((w.score for w in fs.windows), default=0.0)


def ghost_frames(fs: FrameScores, config: GhostingConfig) -> list[int]:
    """Frames that carry the ghost: in a window whose pooled strength reaches ``threshold``, and with their own
    strength at that window's copy at least ``frame_threshold``."""
    out = set()
    for win in fs.windows:
        if win.score >= config.threshold:
            out.update(t for t, v in win.frame_scores.items() if v >= config.frame_threshold)
    return sorted(out)


def is_flagged(fs: FrameScores, config: GhostingConfig) -> bool:
    return clip_evidence(fs) >= config.threshold


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


class GhostingOptions(GateOptions):
    """The detector settings a run may change (defaults: :class:`GhostingConfig`'s, calibrated) and the strip."""

    threshold: float = GhostingConfig.threshold
    frame_threshold: float = GhostingConfig.frame_threshold
    pool_frames: int = Field(default=GhostingConfig.pool_frames, ge=1)
    frame_stride: int = Field(default=GhostingConfig.frame_stride, ge=1)
    strip_frames: int = 3
    """Worst frames shown in the strip artifact."""
    workers: int = 1
    """Threads of the displacement search."""


@register_gate
class GhostingGate(Gate):
    """Faint displaced copy of moving content in the candidate (field report 001); calibrated on real footage."""

    name = "ghosting"
    needs = ("video",)
    description = (
        "Estimated strength of a displaced copy (temporal lag 0-4, spatial shift) of the baseline in the candidate, "
        "fitted jointly over windows of frames; flags the clip when a window's pooled strength reaches the calibrated "
        "threshold, and lists the frames that carry the copy."
    )

    Options = GhostingOptions
    metrics = {"ghost_strength": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_score_max": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_score_mean": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_frames": MetricSpec(higher_is_better=False, unit="frames")}

    def evaluate(self, ctx: PairContext) -> GateResult:
        from gates.common import relative_to_run
        from gates.media_cache import load_video
        from h3.atomic import atomic_write_bytes
        from h3.media import MediaError

        try:
            options = self.parse_options(ctx.options)
        except GateInputError as exc:
            return self._error(ctx, str(exc))
        config = dataclasses.replace(GhostingConfig(), threshold=options.threshold,
                                     frame_threshold=options.frame_threshold, pool_frames=options.pool_frames,
                                     frame_stride=options.frame_stride)
        strip_frames, workers = options.strip_frames, options.workers
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
        evidence = clip_evidence(fs)
        flagged = evidence >= config.threshold
        listed = ghost_frames(fs, config)
        metrics = {
            "ghost_strength": Metric(value=evidence, higher_is_better=False, unit="alpha"),
            "ghost_score_max": Metric(value=float(values.max()), higher_is_better=False, unit="alpha"),
            "ghost_score_mean": Metric(value=float(values.mean()), higher_is_better=False, unit="alpha"),
            "ghost_frames": Metric(value=float(len(listed)), higher_is_better=False, unit="frames"),
        }
        series = {
            "ghost_score": [float(v) if ok else None for v, ok in zip(fs.score, scored)],
            "ghost_lag": [float(v) if ok and v >= 0 else None for v, ok in zip(fs.lag, scored)],
        }
        flags = []
        if flagged:
            for win in fs.windows:
                if win.score >= config.threshold:
                    flags.append(
                        f"ghosting: frames {win.frames[0]}-{win.frames[-1]} carry a copy of frame t-{win.lag} shifted "
                        f"by ({win.dy}, {win.dx}) px of pooled strength {win.score:.3f} (threshold "
                        f"{config.threshold}); {sum(t in listed for t in win.frames)} of its {len(win.frames)} "
                        f"scored frames at >= {config.frame_threshold}")
        worst = [int(i) for i in np.argsort(-np.where(scored, fs.score, -1.0), kind="stable")]
        worst = [i for i in worst if scored[i]][:strip_frames]
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
                "clip_evidence": evidence,
                "ghost_frame_indices": listed,
                "windows": [
                    {"first_frame": w.frames[0], "last_frame": w.frames[-1], "scored_frames": len(w.frames),
                     "strength": float(w.score), "lag": int(w.lag), "dy": int(w.dy), "dx": int(w.dx)}
                    for w in fs.windows],
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
