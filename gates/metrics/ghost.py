"""Paired ghost: a faint displaced copy of moving content in the candidate that the baseline lacks (field report 001).

Physics. A ghost of strength ``alpha`` is ``cand = (1 - alpha) * base + alpha * S`` where ``S`` is a displaced copy
of the baseline: frame ``t - lag`` (lag 0..``max_lag``) translated by ``(dy, dx)``. The residual ``r = cand - base``
is then ``alpha * d`` with ``d = S - base``: a copy of *content from another place or time*, of the same strength
everywhere the copy differs from the frame. Compression is different in three measurable ways, each of which the
detector uses:

* Blur and sharpening of high frequencies is a local linear filter of ``base``: the fit's nuisance regressors
  (``1, base, base^2`` and ``base`` shifted by one pixel four ways) absorb it, and a Gaussian low-pass
  (``blur_sigma``) removes most block-grid quantization noise before the fit.
* A codec predicts each block from a reference frame *along the motion* and, at a coarse quantizer, drops part of
  the correction: the residual leaks a copy of frame ``t - lag`` that is *aligned* with the motion in that block.
  Such a copy barely differs from the frame (its difference is the motion-compensated innovation), so it is not a
  second rendering. Per block, the copy is called aligned when its squared difference from the frame is at most
  ``align_ratio`` times that of the same copy moved ``align_offset`` pixels any of four ways (a distinct local
  minimum of the block's matching error); aligned blocks are left out.
* Quantization correlates with faint structure (smooth gradients, low-contrast texture), where a displaced copy
  differs from the frame by a few levels only; a ghost of 5% there is invisible anyway. Only blocks where the copy
  differs from the frame visibly (RMS of the part of ``d`` outside the nuisance span at least ``visible_rms`` levels)
  carry evidence.
* A ghost is a copy of *moving* content. A displaced copy of a static background differs from the frame at every
  edge, and a recipe that moves a few static edges by a fraction of a pixel (INT8 over the trained tiny's striped
  background, issue 50) correlates with it. A displaced copy's blocks carry evidence only where the baseline moves
  (``motion_rms``: its difference from a frame up to ``max_lag`` away, in that block or a neighbouring one); an
  in-place copy (frame ``t - lag`` at the same pixels) differs from the frame only where it moves anyway.

Fit. On luma at a reduced working resolution (``work_long_side``), per scored frame the residual is projected off the
nuisance span; for every lag and every shift within ``max_shift`` the exact least-squares numerator
``<r_perp, S>`` and energy ``|S_perp|^2`` come from FFT cross-correlations (one batch per lag). Frames are pooled in
windows of ``pool_frames`` scored frames (a ghost from an attention defect is the same copy in every frame; codec
noise is not): per lag, the copy that explains most pooled residual energy is the window's candidate. For each
candidate, per block of ``block`` x ``block`` working pixels of every frame, the ridge fit's numerator and
denominator are summed over the blocks that are visible, not aligned and not replaced content (a block whose own
strength exceeds ``block_alpha_max`` is a stale block an encoder left, not a faint blend): the window's strength
``alpha-hat`` is the pooled ratio, and its standard error is the larger of the frame-clustered and the block-level
sandwich estimates. The window's *evidence* is the one-sided lower bound ``alpha-hat - lcb_k * SE``, the largest over
the candidates: a strength that a handful of blocks suggest is not evidence, one that hundreds of blocks over
sixteen frames agree on is.

Copy share (issue 50). A window's copy counts only where it explains at least ``copy_share_min`` of the pair's
visible residual over the window (``1 - sum (r - alpha d)^2 / sum r^2`` over the pixels where the residual or the
copy's contribution is visible; :func:`gates.metrics.ghost_fit.copy_share`). The block statistics above count only
blocks a copy could explain, so a near recipe that re-renders a subject (a few pixels wider, another shade) reads
there as a blend with a copy a few pixels aside, its rim matching, while the body's change, which no copy explains,
is not counted against the fit. A ghost is the frame plus a faint copy: after the copy little but codec noise is
left. Among a window's candidate copies the strongest that passes is its copy; none passing, its evidence is 0.

Fine lag-0 pass. A lag-0 copy 2 working pixels away is, to second order, a 1-pixel shift plus a blur: the nuisance
absorbs most of it and the coarse fit underestimates it (about a third of its strength). Where the clip is
downsampled, the same fit runs again at twice the resolution for lag 0 only, with two more nuisance regressors (the
baseline less its Gaussian blur at two scales: a codec's broader loss of fine detail, which a blend with a distant
copy also causes), on every other scored frame of each window (``fine_lag0``). It is off by default: its null,
fitted on the fit footage, is too light out of sample (benign re-encodes flagged on one publish scene).

Decision (issue 19). A window's p-value is its evidence against the benign null measured on held-out footage
(bench/ghosting/results/ghosting_calibration.md): ``null_tail_p * exp(-(evidence - null_tail_u) / null_tail_scale)``, capped
at 1. Where the fine pass ran, its evidence has its own null, and the window's p-value is the weighted
Bonferroni combination ``min(p_coarse / (1 - w), p_fine / w)`` (``fine_lag0_weight`` w). A pair's p-value combines its windows by Simes' test (valid for the positively dependent overlapping windows
of one clip), leaving out the clip's opening window where it has more (``opening_windows``: a correct near recipe
departs from its parent most in the first second; a lever's ghost is in every frame); the pair is flagged when it
is at most ``flag_p``. The release decision is made per run, not per pair:
h3eval.stats.ghost_run_test applies Benjamini-Hochberg at a stated false-discovery rate to the pairs' p-values (the
run FAILs when any pair is a discovery, which under the all-benign null happens with probability at most that rate).

In-place stale copy (issue 50). Whatever copy the search chose, each window also fits the in-place copies
(frame ``t - lag`` at the same pixels, lag 1..``max_lag``: seed 001's ghost, a stale rendering of the moving
subject, whatever the camera does) with the same block statistics, and keeps the strongest one's evidence
(``PooledWindow.stale_evidence``). It is one fixed copy per lag rather than the best of the search's shifts, so a
benign window scores about 0 on it; gates.metrics.ghost_run pools it over a run's pairs.

Identical pairs score exactly 0 (the residual is zero). The GPU path (``device`` a CUDA device) runs the same
computation in torch; tests/test_gate_ghosting.py checks it against the numpy path on the CPU.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gates.common import blas_controller
from gates.metrics import ghost_backend
from gates.metrics import ghost_fit as fit
from gates.metrics.ghost_config import FrameScores, GhostingConfig, PooledWindow
from gates.metrics.ghost_pvalue import pair_p_value, tail_p, window_p_value

higher_is_better = False


def downsample_factor(height: int, width: int, work_long_side: int) -> int:
    return max(1, math.ceil(max(height, width) / work_long_side))


def to_luma(frames: np.ndarray, factor: int, blur_sigma: float = 0.0) -> np.ndarray:
    """uint8 (T, H, W, 3) -> float64 luma (T, H // factor, W // factor), box-averaged over factor x factor blocks."""
    return ghost_backend.NumpyBackend(1).prepare(frames, list(range(frames.shape[0])), factor, blur_sigma) + 128.0


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


def ghost_scores(
    frames_base: np.ndarray, frames_cand: np.ndarray, config: GhostingConfig | None = None, workers: int = 1,
    device: str = "cpu", chunk: int | None = None,
) -> FrameScores:
    """Ghost strength and evidence of ``frames_cand`` relative to ``frames_base`` (both uint8 (T, H, W, 3)): one
    pooled fit per window of ``pool_frames`` scored frames, and per-frame strengths at each window's copy.

    ``device`` "cpu" runs numpy and scipy's FFT (``workers`` caps its threads and BLAS's: a threaded BLAS on a shared
    2-core machine was measured 5x slower than one thread); a CUDA device runs the same computation in torch;
    "torch:cpu" runs the torch path on the CPU (tests)."""
    config = config or GhostingConfig()
    if device == "cpu":
        with blas_controller().limit(limits=workers, user_api="blas"):
            return _ghost_scores(frames_base, frames_cand, config, ghost_backend.NumpyBackend(workers), chunk or 4)
    return _ghost_scores(frames_base, frames_cand, config, ghost_backend.backend(device, workers), chunk or 16)


def _frames_equal(a, b) -> bool:
    """Two frames, numpy arrays or torch tensors (the clip cache's device copies), are equal."""
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return bool((a == b).all())


def _window_fits(be, frames_base, frames_cand, windows: list[list[int]], factor: int, config: GhostingConfig,
                 chunk: int, with_stale: bool = False):
    """Per window (a list of scored frames): the candidate copy with the strongest evidence at downsampling
    ``factor`` among those that explain at least ``copy_share_min`` of the visible residual (else the strongest of
    all, marked as not passing), as (est, se, evidence, blocks, (lag, dy, dx) in working pixels, frames, num, den,
    use, share, passes, evidence before the share rule: the largest of all candidates'), or None.
    With ``with_stale`` also, per window, (evidence, lag, strength) of the strongest in-place copy (lag 1..max_lag,
    shift 0; lag -1 where no block carries evidence)."""
    scored = sorted({t for w in windows for t in w})
    h_full, w_full = frames_base.shape[1:3]
    g = fit.geometry(h_full // factor, w_full // factor, config)
    needed = sorted({t - lag for t in scored for lag in range(config.max_lag + 1) if t - lag >= 0} | set(scored))
    row_of = {t: j for j, t in enumerate(needed)}
    base = be.prepare(frames_base, needed, factor, config.blur_sigma)
    cand = be.prepare(frames_cand, needed, factor, config.blur_sigma)
    numerators, energies = fit.search(be, base, cand, row_of, scored, config, g, chunk)
    out, stale_out = [], []
    stale_keys = [(lag, 0, 0) for lag in range(1, config.max_lag + 1)]
    for frames in windows:
        keys = fit.candidates(frames, numerators, energies, config, g)
        fits = fit.window_blocks(be, base, cand, row_of, frames, list(dict.fromkeys(keys + stale_keys)), config, g)
        best, before = None, -math.inf
        for key in keys:
            fr, num, den, use = fits[key]
            est, se, evidence, count = fit.pooled(num, den, use, config)
            share = (fit.copy_share(be, base, cand, row_of, frames, key, max(0.0, est), config, g)
                     if count > 0 else None)
            passes = config.copy_share_min <= 0 or (share is not None and share >= config.copy_share_min)
            before = max(before, evidence)  # 0 without evidence blocks, as the p-value reads it
            if best is None or (passes, evidence) > (best[10], best[2]):
                best = (est, se, evidence, count, key, fr, num, den, use, share, passes)
        out.append(None if best is None else best + (before,))
        # The in-place stale copy (seed 001's ghost: frame t - lag at the same pixels), whatever the search chose.
        stale = (0.0, -1, 0.0)
        for key in stale_keys:
            if key in fits:
                est, _, evidence, count = fit.pooled(*fits[key][1:], config)
                if count > 0 and (stale[1] < 0 or evidence > stale[0]):
                    stale = (evidence, key[0], est)
        stale_out.append(stale)
    return (out, stale_out) if with_stale else out


def _evidence(window_fit) -> float:
    """A window fit's evidence for its p-value: 0 without evidence blocks or where its copy explains too little of
    the residual (``copy_share_min``)."""
    if window_fit is None or window_fit[3] <= 0 or not window_fit[10]:
        return 0.0
    return window_fit[2]


def _ghost_scores(frames_base, frames_cand, config: GhostingConfig, be, chunk: int) -> FrameScores:
    if frames_base.shape != frames_cand.shape:
        raise ValueError(f"shape mismatch: baseline {frames_base.shape} vs candidate {frames_cand.shape}")
    t_count, h_full, w_full, _ = frames_base.shape
    factor = downsample_factor(h_full, w_full, config.work_long_side)
    score = np.zeros(t_count)
    lag_sel = np.full(t_count, -1, dtype=np.int64)
    dy_sel = np.zeros(t_count, dtype=np.int64)
    dx_sel = np.zeros(t_count, dtype=np.int64)
    scored_mask = np.arange(t_count) % max(1, config.frame_stride) == 0
    result = FrameScores(score, lag_sel, dy_sel, dx_sel, scored=scored_mask, factor=factor)
    scored = [int(t) for t in np.flatnonzero(scored_mask)]
    fit.geometry(h_full // factor, w_full // factor, config)  # refuse frames too small before any work
    if all(_frames_equal(frames_base[t], frames_cand[t]) for t in scored):
        result.windows = [PooledWindow(frames=w, factor=factor) for w in pool_windows(scored, config.pool_frames)]
        return result
    pooled = pool_windows(scored, config.pool_frames)
    coarse_fits, stale_fits = _window_fits(be, frames_base, frames_cand, pooled, factor, config, chunk, True)
    fine_fits: list = [None] * len(pooled)
    fine_ran = config.fine_lag0 and factor >= 2
    if fine_ran:
        # The fine lag-0 pass (see GhostingConfig.fine_lag0): same detector, lag 0 only, twice the resolution, on
        # every fine_lag0_stride-th frame of each window, with the broader detail-loss regressors.
        fine = dataclasses.replace(config, max_lag=0, min_lag0_shift=config.fine_lag0_min_shift,
                                   highpass=config.fine_lag0_highpass)
        sub = [w[:: max(1, config.fine_lag0_stride)] for w in pooled]
        fine_fits = _window_fits(be, frames_base, frames_cand, sub, factor // 2, fine, chunk)
    windows = []
    for frames, coarse_fit, fine_fit, stale in zip(pooled, coarse_fits, fine_fits, stale_fits):
        win = PooledWindow(frames=list(frames), factor=factor)
        win.stale_evidence, win.stale_lag, win.stale_strength = stale
        coarse_ev = _evidence(coarse_fit)
        fine_ev = _evidence(fine_fit) if fine_ran else None
        win.coarse_evidence, win.fine_evidence = coarse_ev, fine_ev
        win.evidence_before_share = coarse_fit[11] if coarse_fit is not None else 0.0
        win.p_value = window_p_value(coarse_ev, config, fine_ev)
        # The copy reported is the one of the pass whose own share of the p-value is smaller.
        fit_factor, best = factor, coarse_fit
        if fine_ev is not None and fine_fit is not None and fine_fit[3] > 0 and (
                tail_p(fine_ev, config, fine=True) / config.fine_lag0_weight
                < tail_p(coarse_ev, config) / (1.0 - config.fine_lag0_weight)):
            fit_factor, best = factor // 2, fine_fit
        if best is not None and best[3] > 0:
            est, se, evidence, count, (lag, dy, dx), fr, num, den, use, share = best[:10]
            win.score, win.stderr, win.evidence, win.blocks = max(0.0, est), se, evidence, count
            win.copy_share = share
            win.lag, win.dy, win.dx, win.factor = lag, dy * fit_factor, dx * fit_factor, fit_factor
            for i, t in enumerate(fr):
                d = float(np.where(use[i], den[i], 0.0).sum())
                win.frame_scores[t] = max(0.0, float(np.where(use[i], num[i], 0.0).sum()) / d) if d > 0 else 0.0
        windows.append(win)
    result.windows = windows
    # Each frame reports the window (of those containing it) with the smallest p-value (then the strongest evidence).
    owner: dict[int, PooledWindow] = {}
    for win in windows:
        for t in win.frames:
            if t not in owner or (win.p_value, -win.evidence) < (owner[t].p_value, -owner[t].evidence):
                owner[t] = win
    for t, win in owner.items():
        if win.lag >= 0 and t in win.frame_scores:
            score[t], lag_sel[t], dy_sel[t], dx_sel[t] = win.frame_scores[t], win.lag, win.dy, win.dx
    return result


def clip_evidence(fs: FrameScores) -> float:
    """The clip's ghost strength: the pooled strength of its window with the smallest p-value, then the strongest
    evidence (0.0 without windows)."""
    if not fs.windows:
        return 0.0
    return min(fs.windows, key=lambda w: (w.p_value, -w.evidence)).score


def ghost_frames(fs: FrameScores, config: GhostingConfig) -> list[int]:
    """Frames that carry the ghost: in a window whose p-value is at most ``flag_p``, with their own strength at that
    window's copy at least ``frame_threshold``."""
    out = set()
    for win in fs.windows:
        if win.p_value <= config.flag_p:
            out.update(t for t, v in win.frame_scores.items() if v >= config.frame_threshold)
    return sorted(out)


def is_flagged(fs: FrameScores, config: GhostingConfig) -> bool:
    return pair_p_value(fs, config) <= config.flag_p

