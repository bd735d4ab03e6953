"""Settings and results of the paired ghost estimator (:mod:`gates.metrics.ghost`): the calibrated
:class:`GhostingConfig`, a pooled window's fit (:class:`PooledWindow`) and a pair's per-frame scores
(:class:`FrameScores`). Not a metric itself (``higher_is_better`` None)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

higher_is_better = None


@dataclass(frozen=True)
class GhostingConfig:
    """Detector settings. The defaults are the ones calibrated in bench/ghosting/results/ghosting_calibration.md."""

    max_lag: int = 4
    """Largest temporal lag (frames) of the displaced copy searched."""
    max_shift: int = 4
    """Largest spatial displacement (working pixels, per axis) searched: +-16 px of a 768x1344 clip."""
    min_lag0_shift: int = 2
    """At lag 0 only displacements of at least this many working pixels (Chebyshev) count; closer ones are within
    the one-pixel nuisance's reach (blur, not a second rendering)."""
    motion_rms: float = 8.0
    """A displaced copy's block carries evidence only where the baseline moves: the RMS of its difference from a
    frame up to ``max_lag`` away reaches this many levels there or in a neighbouring block (issue 50: INT8 over
    turbo4-tiny moves a static stripe's edge by a fraction of a pixel, which a copy 4 pixels aside correlates with;
    the trained tiny's static background flickers up to ~6.6 levels per block). 0 turns the mask off."""
    work_long_side: int = 384
    """Frames are box-downsampled by an integer factor until the long side is at most this (a 768x1344 clip by 4):
    the box average removes most codec noise of the full-resolution encode, and the calibration clips were scored at
    2x less downsampling (more codec noise at working resolution), so the production setting is the easier one."""
    blur_sigma: float = 1.0
    """Gaussian low-pass (working pixels) before the fit: removes block-grid quantization noise and grain."""
    ridge_rms: float = 1.5
    """Ridge per pixel, in 8-bit levels, in each block's fit."""
    frame_stride: int = 2
    """Score every ``frame_stride``-th frame (0, s, 2s, ...); the others get no score (None), never zero. The lag
    copies come from all frames. The calibration scores at this stride."""
    block: int = 8
    """Block size (working pixels) of the visibility and alignment tests and of the strength's blocks."""
    block_alpha_max: float = 0.5
    """Blocks whose own strength exceeds this are replaced content (a stale block an encoder skipped), not a blend."""
    visible_rms: float = 8.0
    """A block carries evidence when the copy differs from the frame there by at least this RMS (levels, part
    outside the nuisance span): a 5% ghost adds 0.4 levels there, the edge of visibility."""
    align_offset: int = 2
    """The alignment test compares the copy with the same copy moved this many working pixels (four ways)."""
    align_ratio: float = 0.5
    """A block where the copy's squared difference from the frame is at most this fraction of the moved copies'
    smallest one is aligned with the motion (a codec's prediction), and is left out."""
    lcb_k: float = 2.0
    """Evidence = strength - lcb_k * standard error (a one-sided lower bound)."""
    min_blocks: int = 32
    """A window with fewer evidence blocks (frames x blocks) has evidence 0: too little visible moving structure to
    judge, and a standard error from a handful of blocks is not one (the calibration's worst benign window before
    this rule was a single block of an x264 re-encode with a lower bound equal to its estimate)."""
    pool_frames: int = 16
    """Scored frames pooled into one fit (a window); longer clips are covered by several windows."""
    opening_windows: int = 1
    """The clip's first ``opening_windows`` windows (its opening second at 24-25 fps: frames 0-30) are fitted and
    reported with their p-values but left out of the pair's p-value when the clip has more windows than that (issue 50).
    A lever's ghost (seed 001: a stale copy from an attention or cache defect) is in every frame, so the later windows
    carry it; the opening is where a correct near recipe's sample departs from its parent most (measured on the
    trained tiny: INT8 over turbo4-tiny draws the subject's first second a few pixels and a shape apart, the opening
    window's lag-0 evidence up to 0.12 on a pair whose later windows read benign; pool 6 of
    bench/recipe_signoff: 26 % of INT8 runs FAILed on opening windows alone, 0 % without them, the ghosting plants
    unchanged). 0 tests every window."""
    copy_share_min: float = 0.2
    """A copy counts as a window's ghost only where it explains at least this share of the pair's visible residual
    over the window (:func:`gates.metrics.ghost_fit.copy_share`): a ghost is the frame plus a faint copy, so after
    the copy little but codec noise is left; a near recipe that re-renders a subject (redder, a few pixels wider:
    INT8 over the trained tiny, issue 50) leaves most of its difference, and the fit, which counts only the blocks
    a copy could explain, read its rim as a blend. Measured before this rule (bench/recipe_signoff/results/
    copy_share_probe.md): planted ghosts alpha 0.10 median 0.64, alpha 0.05 median 0.37; INT8's deciding windows
    median 0.09 (max 0.36), the sparse rung 0.06, a reusing step cache 0.01. Among a window's candidate copies the
    strongest one that passes is its copy; none passing, the window's evidence is 0 (its strongest copy is still
    reported with its share). 0 turns the rule off."""
    share_visible_residual: float = 4.0
    """Pixels where the residual ``|cand - base|`` exceeds this many levels (working luma) count in the share ..."""
    share_visible_copy: float = 2.0
    """... and so do those where the copy's contribution ``|alpha (copy - base)|`` exceeds this many."""
    null_tail_u: float = 0.00309
    """Benign-null tail of the window evidence (bench/ghosting/results/ghosting_calibration.md, fit footage): the evidence
    above which the exponential tail is fitted ..."""
    null_tail_p: float = 0.1027
    """... the share of benign windows above it ..."""
    null_tail_scale: float = 0.01075
    """... and the tail's scale (upper 95% confidence bound of the mean excess, conservative)."""
    flag_p: float = 0.001
    """A pair is flagged when its p-value is at most this (a benign pair is flagged at most 0.1% of the time). The
    release decision is not this flag but the run-level test over all pairs' p-values."""
    frame_threshold: float = 0.02
    """In a window whose p-value is at most ``flag_p``, frames whose own strength at the window's copy reaches this
    are listed as ghost frames (reporting only)."""
    highpass: tuple[float, ...] = ()
    """Extra nuisance regressors: per sigma (working pixels), the baseline less its Gaussian blur of that sigma. The
    coarse fit has none; the fine lag-0 pass uses ``fine_lag0_highpass``."""
    fine_lag0: bool = False
    """Off by default: out of sample it flags benign re-encodes (bench/ghosting/results/ghosting_calibration_fine_lag0.md:
    AV1 CRF 40 and 50 on one publish scene at fine evidence 0.040-0.045, against a fit-footage maximum of 0.015;
    benign runs FAIL 16.9% at 16 pairs), while it catches every visible alpha >= 0.10 production pair (118 / 118).
    Where the working resolution is downsampled (factor >= 2), also search lag 0 at half the factor (twice the
    resolution), each pass against its own null. A lag-0 copy 2 working pixels away is, to second
    order, a 1-pixel shift plus a blur: the one-pixel nuisance absorbs most of it and the coarse fit finds about a
    third of its strength (bench/ghosting/results/ghosting_calibration.md, 'Lag-0 copies by displacement'); at twice the
    resolution the same copy is 4 pixels away, outside the nuisance's reach. Lag 0 needs no earlier frames, so the
    fine pass prepares only the scored frames."""
    fine_lag0_min_shift: int = 3
    """Smallest lag-0 displacement (Chebyshev, fine working pixels) the fine pass counts: 3 fine = 1.5 coarse
    pixels, so it covers the coarse search's weak spot (2) and not the one-pixel reach of the coarse nuisance."""
    fine_lag0_highpass: tuple[float, ...] = (1.0, 2.5)
    """``highpass`` of the fine pass. At twice the resolution a codec's loss of fine detail is broader than the
    one-pixel nuisance reaches, and a lag-0 blend with a copy a few pixels away also loses detail (the copy's fine
    detail is uncorrelated with the frame's): without these regressors a coarse re-encode scores as a weak lag-0
    copy (evidence up to 0.033 on the fit footage's benign windows, against 0.015 with them). The ghost keeps the
    part these cannot absorb, its copy's own detail, and its strength is estimated closer to the planted one."""
    fine_lag0_weight: float = 0.1
    """The window's p-value is the weighted Bonferroni combination ``min(p_coarse / (1 - w), p_fine / w)`` of the
    coarse fit's and the fine pass's, each against its own benign null (a valid p-value for any dependence between
    them). The fine pass gets the small share w: it exists for lag-0 copies the coarse fit underestimates, whose fine
    evidence is far above its null (0.05-0.10 at alpha 0.05-0.10 on the fit footage, against a benign maximum of
    0.016), while the coarse fit carries every other ghost and loses only a factor 1 / (1 - w) = 1.11 in p."""
    fine_null_tail_u: float = 0.00988
    """Benign null of the fine pass's window evidence, fitted like the coarse one on the fit footage
    (bench/ghosting/results/ghosting_calibration_fine_lag0.md; too light a tail out of sample) ..."""
    fine_null_tail_p: float = 0.1018
    """... the share of benign windows above ``fine_null_tail_u`` ..."""
    fine_null_tail_scale: float = 0.00389
    """... and the tail's scale (upper 95% confidence bound of the mean excess)."""
    fine_lag0_stride: int = 2
    """The fine pass fits every ``fine_lag0_stride``-th scored frame of each window (8 of 16): at four times the pixels
    per frame it would otherwise cost about 1.5 coarse passes (bench/gates_speed/results/cpu/gates_speed_cpu*.md), and a lag-0 copy
    missed by the coarse fit is the same copy in every frame, so half of them carry it as well."""


@dataclass
class PooledWindow:
    """One pooled fit: a window of scored frames and the displaced copy whose evidence is strongest."""

    frames: list[int]
    """Frame indices (scored frames) of the window."""
    score: float = 0.0
    """Pooled ghost strength alpha-hat of the window's copy over its evidence blocks (>= 0)."""
    evidence: float = 0.0
    """One-sided lower bound ``alpha-hat - lcb_k * SE`` (can be negative; 0 for identical frames)."""
    stderr: float = 0.0
    """Standard error of ``score``."""
    p_value: float = 1.0
    """Against the benign null (:func:`window_p_value`)."""
    blocks: int = 0
    """Evidence blocks (frames x blocks) the strength was pooled over."""
    lag: int = -1
    """Temporal lag of the window's copy (-1 where nothing was selected)."""
    dy: int = 0
    """Vertical displacement of the copy, in pixels at full resolution."""
    dx: int = 0
    """Horizontal displacement of the copy, in pixels at full resolution."""
    frame_scores: dict[int, float] = field(default_factory=dict)
    """Per-frame strength at the window's copy over that frame's evidence blocks."""
    factor: int = 1
    """Downsampling factor of the fit that found the copy (the clip's, or half of it for the fine lag-0 pass)."""
    coarse_evidence: float = 0.0
    """Evidence of the coarse fit (all lags, the clip's factor) that the window's p-value uses: 0 where no copy passes
    the share rule (``copy_share_min``)."""
    evidence_before_share: float = 0.0
    """The coarse fit's largest evidence over its candidate copies whatever their share (``copy_share_min``): the
    benign null is fitted on it (bench/ghosting), and since the share rule only ever lowers a window's evidence, that
    null's tail bounds the tail of ``coarse_evidence`` (a conservative p-value)."""
    fine_evidence: float | None = None
    """Evidence of the fine lag-0 pass (None where it did not run: factor 1, or switched off)."""
    stale_evidence: float = 0.0
    """Evidence (lower bound, as ``evidence``) of the strongest *in-place* copy: frame ``t - stale_lag`` at the same
    pixels (lag 1..max_lag, shift 0), whichever copy the search chose. Seed 001's ghost is such a stale copy of the
    moving subject; one fixed copy per lag is fitted, not the best of 81 shifts, so benign windows score lower here
    (gates.metrics.ghost_run: the run-level statistic pools it over the run's pairs)."""
    copy_share: float | None = None
    """Share of the window's visible residual its copy explains (:func:`gates.metrics.ghost_fit.copy_share`; None
    where nothing was selected or nothing is visible); below ``copy_share_min`` the window is evidence of nothing."""
    stale_lag: int = -1
    """Lag of that copy (-1 where no block carried evidence, or the pair is identical)."""
    stale_strength: float = 0.0
    """Pooled strength (alpha-hat) of that copy."""


@dataclass
class FrameScores:
    """Output of :func:`ghost_scores`: per-frame arrays of length T and the windows."""

    score: np.ndarray
    """Ghost strength per frame at its window's copy (>= 0)."""
    lag: np.ndarray
    """Temporal lag of the frame's window copy (-1 where nothing was selected)."""
    dy: np.ndarray
    """Vertical displacement of that copy, in pixels at full resolution."""
    dx: np.ndarray
    """Horizontal displacement of that copy, in pixels at full resolution."""
    scored: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """True where the frame was scored (see ``frame_stride``); ``score`` is 0 and meaningless elsewhere."""
    factor: int = 1
    """Downsampling factor used (working resolution = full / factor)."""
    windows: list[PooledWindow] = field(default_factory=list)
    """The pooled fits (:func:`pool_windows`); a frame reports the window (of those containing it) with the
    strongest evidence."""

