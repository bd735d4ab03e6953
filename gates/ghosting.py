"""Ghosting gate: detects a faint displaced copy of moving content in the candidate that the baseline lacks.

Field report 001: a sparse-attention config passed the per-op gate and LPIPS, yet every frame carried a faint second
rendering of the moving subject; only side-by-side same-seed frames caught it. This gate automates that look, and
is built so that what a codec does to a clip does not read as a ghost (issue 19).

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

Fine lag-0 pass. A lag-0 copy 2 working pixels away is, to second order, a 1-pixel shift plus a blur: the nuisance
absorbs most of it and the coarse fit underestimates it (about a third of its strength). Where the clip is
downsampled, the same fit runs again at twice the resolution for lag 0 only, with two more nuisance regressors (the
baseline less its Gaussian blur at two scales: a codec's broader loss of fine detail, which a blend with a distant
copy also causes), on every other scored frame of each window (``fine_lag0``). It is off by default: its null,
fitted on the fit footage, is too light out of sample (benign re-encodes flagged on one publish scene).

Decision (issue 19). A window's p-value is its evidence against the benign null measured on held-out footage
(bench/results/ghosting_calibration.md): ``null_tail_p * exp(-(evidence - null_tail_u) / null_tail_scale)``, capped
at 1. Where the fine pass ran, its evidence has its own null, and the window's p-value is the weighted
Bonferroni combination ``min(p_coarse / (1 - w), p_fine / w)`` (``fine_lag0_weight`` w). A pair's p-value combines its windows by Simes' test (valid for the positively dependent overlapping windows
of one clip); the pair is flagged when it is at most ``flag_p``. The release decision is made per run, not per pair:
h3eval.stats.ghost_run_test applies Benjamini-Hochberg at a stated false-discovery rate to the pairs' p-values (the
run FAILs when any pair is a discovery, which under the all-benign null happens with probability at most that rate).

Identical pairs score exactly 0 (the residual is zero). The GPU path (``device`` a CUDA device) runs the same
computation in torch; tests/test_gate_ghosting.py checks it against the numpy path on the CPU.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from pydantic import Field

from gates.base import Gate, GateInputError, GateOptions, GateResult, Metric, MetricSpec, PairContext, register_gate
from gates.common import blas_controller

logger = logging.getLogger(__name__)

# Luma weights (ITU-R BT.601), the ones the H.264 yuv420p path of the runtime uses.
_LUMA = np.array([0.299, 0.587, 0.114])


@dataclass(frozen=True)
class GhostingConfig:
    """Detector settings. The defaults are the ones calibrated in bench/results/ghosting_calibration.md."""

    max_lag: int = 4
    """Largest temporal lag (frames) of the displaced copy searched."""
    max_shift: int = 4
    """Largest spatial displacement (working pixels, per axis) searched: +-16 px of a 768x1344 clip."""
    min_lag0_shift: int = 2
    """At lag 0 only displacements of at least this many working pixels (Chebyshev) count; closer ones are within
    the one-pixel nuisance's reach (blur, not a second rendering)."""
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
    null_tail_u: float = 0.00335
    """Benign-null tail of the window evidence (bench/results/ghosting_calibration.md, fit footage): the evidence
    above which the exponential tail is fitted ..."""
    null_tail_p: float = 0.1027
    """... the share of benign windows above it ..."""
    null_tail_scale: float = 0.0107
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
    """Off by default: out of sample it flags benign re-encodes (bench/results/ghosting_calibration_fine_lag0.md:
    AV1 CRF 40 and 50 on one publish scene at fine evidence 0.040-0.045, against a fit-footage maximum of 0.015;
    benign runs FAIL 16.9% at 16 pairs), while it catches every visible alpha >= 0.10 production pair (118 / 118).
    Where the working resolution is downsampled (factor >= 2), also search lag 0 at half the factor (twice the
    resolution), each pass against its own null. A lag-0 copy 2 working pixels away is, to second
    order, a 1-pixel shift plus a blur: the one-pixel nuisance absorbs most of it and the coarse fit finds about a
    third of its strength (bench/results/ghosting_calibration.md, 'Lag-0 copies by displacement'); at twice the
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
    (bench/results/ghosting_calibration_fine_lag0.md; too light a tail out of sample) ..."""
    fine_null_tail_p: float = 0.1018
    """... the share of benign windows above ``fine_null_tail_u`` ..."""
    fine_null_tail_scale: float = 0.00389
    """... and the tail's scale (upper 95% confidence bound of the mean excess)."""
    fine_lag0_stride: int = 2
    """The fine pass fits every ``fine_lag0_stride``-th scored frame of each window (8 of 16): at four times the pixels
    per frame it would otherwise cost about 1.5 coarse passes (bench/results/gates_speed_cpu*.md), and a lag-0 copy
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
    """Evidence of the coarse fit (all lags, the clip's factor)."""
    fine_evidence: float | None = None
    """Evidence of the fine lag-0 pass (None where it did not run: factor 1, or switched off)."""


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


def downsample_factor(height: int, width: int, work_long_side: int) -> int:
    return max(1, math.ceil(max(height, width) / work_long_side))


def to_luma(frames: np.ndarray, factor: int, blur_sigma: float = 0.0) -> np.ndarray:
    """uint8 (T, H, W, 3) -> float64 luma (T, H // factor, W // factor), box-averaged over factor x factor blocks."""
    return _Numpy(1).prepare(frames, list(range(frames.shape[0])), factor, blur_sigma) + 128.0


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


# -- array backends: numpy + scipy.fft on the CPU, torch on any device; the detector is written once over both --------
class _Numpy:
    torch = False

    def __init__(self, workers: int):
        self.workers = workers

    def asarray(self, x):
        return np.asarray(x, dtype=np.float64)

    def index(self, x):
        return np.asarray(x, dtype=np.int64)

    def numpy(self, x) -> np.ndarray:
        return np.asarray(x)

    def stack(self, xs, axis=0):
        return np.stack(xs, axis=axis)

    def zeros(self, shape):
        return np.zeros(shape)

    def rfft2(self, x):
        from scipy import fft as sfft

        return sfft.rfft2(x, workers=self.workers)

    def irfft2(self, x, s):
        from scipy import fft as sfft

        return sfft.irfft2(x, s=s, workers=self.workers)

    def conj(self, x):
        return np.conj(x)

    def pinv(self, x):
        return np.linalg.pinv(x)

    def clip0(self, x):
        return np.maximum(x, 0.0)

    def minimum(self, a, b):
        return np.minimum(a, b)

    def swap(self, x):
        return np.swapaxes(x, -1, -2)

    def blur(self, x, sigma: float):
        """Gaussian blur of (k, h, w) frames (cv2's kernel, BORDER_REFLECT), float64."""
        import cv2

        return np.stack([cv2.GaussianBlur(f, (0, 0), sigma, borderType=cv2.BORDER_REFLECT) for f in x])

    def integral(self, x):
        """Integral images with a leading zero row and column: (k, h + 1, w + 1)."""
        out = np.zeros(x.shape[:-2] + (x.shape[-2] + 1, x.shape[-1] + 1))
        out[..., 1:, 1:] = x.cumsum(-1).cumsum(-2)
        return out

    def prepare(self, frames: np.ndarray, indices: list[int], factor: int, sigma: float):
        """uint8 (T, H, W, 3) -> float64 (len(indices), h, w): luma - 128, box-downsampled, Gaussian-blurred."""
        import cv2

        _, h, w, _ = frames.shape
        hh, ww = h // factor, w // factor
        weights = _LUMA.astype(np.float32)
        out = np.empty((len(indices), hh, ww))
        for j, i in enumerate(indices):
            y = frames[i, : hh * factor, : ww * factor].astype(np.float32) @ weights
            if factor > 1:
                # INTER_AREA with an integer factor is the exact block mean.
                y = cv2.resize(y, (ww, hh), interpolation=cv2.INTER_AREA)
            if sigma > 0:
                y = cv2.GaussianBlur(y, (0, 0), sigma, borderType=cv2.BORDER_REFLECT)
            out[j] = y
        return out - 128.0


class _Torch:
    """The same operations in torch (float64), on ``device``. Preparation matches :meth:`_Numpy.prepare` (same
    kernel, same symmetric border) up to float32 rounding."""

    torch = True

    def __init__(self, device: str):
        import torch

        self.t = torch
        self.device = torch.device(device)

    def asarray(self, x):
        return self.t.as_tensor(np.asarray(x), dtype=self.t.float64, device=self.device)

    def index(self, x):
        return self.t.as_tensor(np.asarray(x), dtype=self.t.int64, device=self.device)

    def numpy(self, x) -> np.ndarray:
        return x.detach().cpu().numpy()

    def stack(self, xs, axis=0):
        return self.t.stack(xs, dim=axis)

    def zeros(self, shape):
        return self.t.zeros(shape, dtype=self.t.float64, device=self.device)

    def rfft2(self, x):
        return self.t.fft.rfft2(x)

    def irfft2(self, x, s):
        return self.t.fft.irfft2(x, s=s)

    def conj(self, x):
        return x.conj()

    def pinv(self, x):
        return self.t.linalg.pinv(x)

    def clip0(self, x):
        return self.t.clamp(x, min=0.0)

    def minimum(self, a, b):
        return self.t.minimum(a, b)

    def swap(self, x):
        return x.transpose(-1, -2)

    def integral(self, x):
        return self.t.nn.functional.pad(x.cumsum(-1).cumsum(-2), (1, 0, 1, 0))

    def blur(self, x, sigma: float):
        import cv2

        size = int(round(sigma * 8 + 1)) | 1
        kernel = self.t.tensor(cv2.getGaussianKernel(size, sigma).ravel(), dtype=x.dtype, device=self.device)
        return self._blur(x, kernel)

    def prepare(self, frames: np.ndarray, indices: list[int], factor: int, sigma: float, chunk: int = 8):
        import cv2

        torch, fn = self.t, self.t.nn.functional
        _, h, w, _ = frames.shape
        hh, ww = h // factor, w // factor
        weights = torch.tensor(_LUMA, dtype=torch.float32, device=self.device)
        kernel = None
        if sigma > 0:
            # cv2.GaussianBlur's own kernel for (0, 0) and a float image: size round(8 sigma + 1) | 1.
            size = int(round(sigma * 8 + 1)) | 1
            kernel = torch.tensor(cv2.getGaussianKernel(size, sigma).ravel(), dtype=torch.float32, device=self.device)
        outs = []
        for start in range(0, len(indices), chunk):
            idx = indices[start : start + chunk]
            if torch.is_tensor(frames):  # the clip cache's device copy: no upload
                x = frames[torch.as_tensor(idx, device=frames.device), : hh * factor, : ww * factor].to(self.device)
            else:
                x = torch.from_numpy(np.ascontiguousarray(frames[idx, : hh * factor, : ww * factor])).to(self.device)
            y = (x.to(torch.float32) * weights).sum(-1)
            if factor > 1:
                y = fn.avg_pool2d(y[:, None], factor)[:, 0]
            if kernel is not None:
                y = self._blur(y, kernel)
            outs.append(y.to(torch.float64))
        return torch.cat(outs) - 128.0

    def _blur(self, y, kernel):
        """Separable convolution with cv2's BORDER_REFLECT (edge pixel repeated: fedcba|abcdef)."""
        fn = self.t.nn.functional
        r = kernel.numel() // 2
        k = kernel[None, None]
        n, hh, ww = y.shape
        y = self.t.cat([y[:, :, :r].flip(-1), y, y[:, :, -r:].flip(-1)], dim=-1)
        y = fn.conv1d(y.reshape(n * hh, 1, -1), k).reshape(n, hh, ww)
        y = self.t.cat([y[:, :r].flip(-2), y, y[:, -r:].flip(-2)], dim=-2).transpose(1, 2)
        y = fn.conv1d(y.reshape(n * ww, 1, -1), k).reshape(n, ww, hh)
        return y.transpose(1, 2)


def _backend(device: str, workers: int):
    """numpy on "cpu"; torch on anything else ("cuda", "cuda:1"); "torch:cpu" runs the torch path on the CPU."""
    if device == "cpu":
        return _Numpy(workers)
    return _Torch(device.removeprefix("torch:"))


# -- geometry and per-frame terms ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Geometry:
    h: int
    w: int
    m: int
    """Margin: no copy of the search (shift up to max_shift + align_offset) reaches outside the frame."""
    ih: int
    iw: int
    """The fit region: ih x iw working pixels from (m, m), whole blocks."""
    block: int

    @property
    def npix(self) -> int:
        return self.ih * self.iw

    @property
    def blocks(self) -> tuple[int, int]:
        return self.ih // self.block, self.iw // self.block


def _geometry(h: int, w: int, config: GhostingConfig) -> _Geometry:
    m = config.max_shift + config.align_offset + 1
    ih, iw = h - 2 * m, w - 2 * m
    bs = config.block
    if ih < bs or iw < bs:
        raise ValueError(f"frames too small for the ghosting search: working size {h}x{w}")
    return _Geometry(h, w, m, ih - ih % bs, iw - iw % bs, bs)


def _interior(x, g: _Geometry, dy: int = 0, dx: int = 0):
    """``x(I - (dy, dx))`` over the fit region I of (k, h, w) frames: the copy displaced by (dy, dx)."""
    return x[..., g.m - dy : g.m - dy + g.ih, g.m - dx : g.m - dx + g.iw]


def _frame_terms(be, b, c, g: _Geometry, highpass: tuple[float, ...] = ()):
    """Nuisance basis N (k, K, P) of each frame, its inverse Gram matrix (k, K, K) and the residual projected off
    it (k, P). Regressors: 1, base, base^2 / 128 (brightness, contrast, gamma) and base shifted by one pixel four
    ways, less base (a local linear filter: codec blur or sharpening, sub-pixel misregistration); K = 7, plus one
    per ``highpass`` sigma: base less its Gaussian blur of that sigma (a broader loss or gain of detail)."""
    k = b.shape[0]
    bi = _interior(b, g)
    cols = [bi * 0.0 + 1.0, bi, bi * bi / 128.0, _interior(b, g, 1, 0) - bi, _interior(b, g, -1, 0) - bi,
            _interior(b, g, 0, 1) - bi, _interior(b, g, 0, -1) - bi]
    cols += [_interior(b - be.blur(b, sigma), g) for sigma in highpass]
    n = be.stack(cols, axis=1).reshape(k, len(cols), g.npix)
    gram_inv = be.pinv(n @ be.swap(n))
    r = (_interior(c, g) - bi).reshape(k, g.npix)
    return n, gram_inv, _perp(be, n, gram_inv, r)


def _perp(be, n, gram_inv, v):
    """``v - N^T G^-1 N v`` for v of shape (k, P) or (k, j, P)."""
    single = v.ndim == 2
    if single:
        v = v[:, None]
    out = v - ((v @ be.swap(n)) @ gram_inv) @ n
    return out[:, 0] if single else out


def _search(be, base, cand, row_of: dict[int, int], scored: list[int], config: GhostingConfig, g: _Geometry,
            chunk: int) -> tuple[dict, dict]:
    """Per scored frame t and lag: the fit's exact numerator ``<r_perp, S_s>`` and energy ``|S_s perp|^2`` for every
    shift s within ``max_shift`` (arrays (2R+1, 2R+1), as numpy), from FFT cross-correlations.

    ``S_s = base_{t-lag}(x - s)`` on the fit region I. With the regressor images n_j (zero outside I), and
    ``d = S_s - base``: ``q_j = <n_j, d> = xcorr(n_j, base_{t-lag})(s) - <n_j, base>``, ``|d|^2 = sum_I S_s^2 -
    2 <base, S_s> + |base|^2`` (the first a box sum of an integral image), and the energy is ``|d|^2 - q^T G^-1 q``
    (``|S_perp| = |d_perp|``: base is in the span). Circular correlation is exact: n_j vanish within m > s of the
    frame's edge."""
    rad = config.max_shift
    rows = be.index(np.arange(-rad, rad + 1) % g.h)
    cols = be.index(np.arange(-rad, rad + 1) % g.w)
    y0 = be.index((g.m - np.arange(-rad, rad + 1))[:, None])
    x0 = be.index((g.m - np.arange(-rad, rad + 1))[None, :])
    refs_needed = sorted({t - lag for t in scored for lag in range(config.max_lag + 1) if t - lag >= 0})
    ref_row = {t: j for j, t in enumerate(refs_needed)}
    refs = base[be.index([row_of[t] for t in refs_needed])]
    ref_spec = be.rfft2(refs)
    sums = be.integral(refs)
    sums2 = be.integral(refs * refs)

    def box(ii, sel):
        a = ii[sel]
        return a[:, y0 + g.ih, x0 + g.iw] - a[:, y0, x0 + g.iw] - a[:, y0 + g.ih, x0] + a[:, y0, x0]

    numerators: dict[int, dict[int, np.ndarray]] = {}
    energies: dict[int, dict[int, np.ndarray]] = {}
    for start in range(0, len(scored), chunk):
        ts = scored[start : start + chunk]
        k = len(ts)
        b = base[be.index([row_of[t] for t in ts])]
        c = cand[be.index([row_of[t] for t in ts])]
        n, gram_inv, r_perp = _frame_terms(be, b, c, g, config.highpass)
        nk = n.shape[1]  # regressors, the constant included
        bi = n[:, 1]
        imgs = be.zeros((k, nk, g.h, g.w))
        imgs[:, : nk - 1, g.m : g.m + g.ih, g.m : g.m + g.iw] = n[:, 1:].reshape(k, nk - 1, g.ih, g.iw)
        imgs[:, nk - 1, g.m : g.m + g.ih, g.m : g.m + g.iw] = r_perp.reshape(k, g.ih, g.iw)
        spec = be.rfft2(imgs)
        n_base = (n @ bi[:, :, None])[..., 0]  # <n_j, base>, (k, nk)
        base_energy = (bi * bi).sum(-1)
        for lag in range(config.max_lag + 1):
            sel = [j for j, t in enumerate(ts) if t >= lag]
            if not sel:
                continue
            rsel = be.index([ref_row[ts[j] - lag] for j in sel])
            jsel = be.index(sel)
            corr = be.irfft2(spec[jsel] * be.conj(ref_spec[rsel])[:, None], s=(g.h, g.w))
            corr = corr[..., rows[:, None], cols[None, :]]  # (ks, nk, 2R+1, 2R+1): <img_j, S_s>
            s1, s2 = box(sums, rsel), box(sums2, rsel)  # sum S_s, sum S_s^2 over I
            q = be.stack([s1] + [corr[:, j] for j in range(nk - 1)], axis=1) - n_base[jsel][:, :, None, None]
            dd = s2 - 2.0 * corr[:, 0] + base_energy[jsel][:, None, None]
            qf = q.reshape(len(sel), nk, -1)
            quad = (qf * (gram_inv[jsel] @ qf)).sum(1).reshape(dd.shape)
            num, den = be.numpy(corr[:, nk - 1]), be.numpy(be.clip0(dd - quad))
            for i, j in enumerate(sel):
                numerators.setdefault(ts[j], {})[lag] = num[i]
                energies.setdefault(ts[j], {})[lag] = den[i]
    return numerators, energies


def _allowed(lag: int, dy: int, dx: int, config: GhostingConfig) -> bool:
    return not (lag == 0 and max(abs(dy), abs(dx)) < config.min_lag0_shift)


def _candidates(frames: list[int], numerators, energies, config: GhostingConfig, g: _Geometry):
    """Per lag, the shift whose pooled ridge fit explains most residual energy over the window's frames t >= lag."""
    rad = config.max_shift
    ridge = g.npix * config.ridge_rms**2
    mask = np.array([[_allowed(0, dy, dx, config) for dx in range(-rad, rad + 1)] for dy in range(-rad, rad + 1)])
    out = []
    for lag in range(config.max_lag + 1):
        fr = [t for t in frames if t >= lag and lag in numerators.get(t, {})]
        if not fr:
            continue
        num = sum(numerators[t][lag] for t in fr)
        den = sum(energies[t][lag] for t in fr) + ridge * len(fr)
        explained = np.where(num > 0, num * num / den, 0.0)
        if lag == 0:
            explained = np.where(mask, explained, -1.0)
        best = int(np.argmax(explained))
        if explained.ravel()[best] > 0:
            dy, dx = divmod(best, 2 * rad + 1)
            out.append((lag, dy - rad, dx - rad))
    return out


def _block_sums(v, g: _Geometry):
    nby, nbx = g.blocks
    return v.reshape(v.shape[:-1] + (nby, g.block, nbx, g.block)).sum(-1).sum(-2)


def _window_blocks(be, base, cand, row_of, frames: list[int], keys, config: GhostingConfig, g: _Geometry):
    """For each candidate (lag, dy, dx): per frame t >= lag of the window and per block, the ridge fit's numerator
    and denominator and whether the block carries evidence (numpy arrays (frames, blocks down, blocks across))."""
    a = config.align_offset
    offsets = [(a, 0), (-a, 0), (0, a), (0, -a)]
    ridge_b = g.block * g.block * config.ridge_rms**2
    b = base[be.index([row_of[t] for t in frames])]
    c = cand[be.index([row_of[t] for t in frames])]
    n, gram_inv, r_perp = _frame_terms(be, b, c, g, config.highpass)
    bi = n[:, 1]
    out = {}
    for lag, dy, dx in keys:
        sel = [j for j, t in enumerate(frames) if t >= lag]
        if not sel:
            continue
        jsel = be.index(sel)
        refs = base[be.index([row_of[frames[j] - lag] for j in sel])]
        d = _interior(refs, g, dy, dx).reshape(len(sel), -1) - bi[jsel]
        dp = _perp(be, n[jsel], gram_inv[jsel], d)
        num = _block_sums(r_perp[jsel] * dp, g)
        den = _block_sums(dp * dp, g)
        ssd = _block_sums(d * d, g)
        moved = None
        for oy, ox in offsets:
            e = _interior(refs, g, dy + oy, dx + ox).reshape(len(sel), -1) - bi[jsel]
            s = _block_sums(e * e, g)
            moved = s if moved is None else be.minimum(moved, s)
        num, den, ssd, moved = (be.numpy(x) for x in (num, den, ssd, moved))
        alpha = num / (den + ridge_b)
        use = ((alpha <= config.block_alpha_max) & (den >= config.visible_rms**2 * g.block * g.block)
               & (ssd > config.align_ratio * moved))
        out[(lag, dy, dx)] = ([frames[j] for j in sel], num, den + ridge_b, use)
    return out


def _pooled(num: np.ndarray, den: np.ndarray, use: np.ndarray, config: GhostingConfig):
    """Pooled strength over the evidence blocks, its standard error, and the evidence (lower bound)."""
    count = int(use.sum())
    if count == 0:
        return 0.0, 0.0, 0.0, 0
    fn = np.where(use, num, 0.0).sum(axis=(1, 2))
    fd = np.where(use, den, 0.0).sum(axis=(1, 2))
    total = float(fd.sum())
    est = float(fn.sum()) / total
    nf = int((fd > 0).sum())
    # Frame-clustered sandwich (blocks of one frame share the frame's codec decisions) and block-level sandwich;
    # the larger one, so that a few frames or a few blocks never look certain.
    se_frames = math.sqrt(float(((fn - est * fd) ** 2).sum()) * nf / max(nf - 1, 1)) / total
    se_blocks = math.sqrt(float(((num[use] - est * den[use]) ** 2).sum())) / total
    se = max(se_frames, se_blocks)
    evidence = est - config.lcb_k * se if count >= config.min_blocks else 0.0
    return est, se, evidence, count


def _tail_p(evidence: float, config: GhostingConfig, fine: bool = False) -> float:
    """The calibrated exponential tail of the coarse (or the fine pass's) benign window evidence, capped at 1."""
    if not math.isfinite(evidence):
        raise ValueError(f"window evidence {evidence} is not finite")
    if evidence <= 0:
        return 1.0
    u, p_u, scale = ((config.fine_null_tail_u, config.fine_null_tail_p, config.fine_null_tail_scale) if fine
                     else (config.null_tail_u, config.null_tail_p, config.null_tail_scale))
    return float(min(1.0, p_u * math.exp(-(evidence - u) / scale)))


def window_p_value(evidence: float, config: GhostingConfig, fine_evidence: float | None = None) -> float:
    """p-value of a window under the benign null: the coarse fit's ``evidence`` against its calibrated tail; where
    the fine lag-0 pass ran (``fine_evidence`` not None), the weighted Bonferroni combination with the fine pass's
    evidence against its own tail (GhostingConfig.fine_lag0_weight)."""
    p = _tail_p(evidence, config)
    if fine_evidence is None:
        return p
    w = config.fine_lag0_weight
    return float(min(1.0, p / (1.0 - w), _tail_p(fine_evidence, config, fine=True) / w))


def simes(pvalues) -> float:
    """Simes' combined p-value ``min_i m p_(i) / i`` (1.0 for none): the pair's p-value from its windows."""
    p = np.sort(np.asarray(pvalues, dtype=np.float64))
    if p.size == 0:
        return 1.0
    return float(min(1.0, np.min(p.size * p / np.arange(1, p.size + 1))))


def pair_p_value(fs: "FrameScores") -> float:
    """The pair's p-value: Simes over its windows (1.0 without windows)."""
    return simes([w.p_value for w in fs.windows])


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
            return _ghost_scores(frames_base, frames_cand, config, _Numpy(workers), chunk or 4)
    return _ghost_scores(frames_base, frames_cand, config, _backend(device, workers), chunk or 16)


def _frames_equal(a, b) -> bool:
    """Two frames, numpy arrays or torch tensors (the clip cache's device copies), are equal."""
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return bool((a == b).all())


def _window_fits(be, frames_base, frames_cand, windows: list[list[int]], factor: int, config: GhostingConfig,
                 chunk: int) -> list[tuple | None]:
    """Per window (a list of scored frames): the candidate copy with the strongest evidence at downsampling
    ``factor``, as (est, se, evidence, blocks, (lag, dy, dx) in working pixels, frames, num, den, use), or None."""
    scored = sorted({t for w in windows for t in w})
    h_full, w_full = frames_base.shape[1:3]
    g = _geometry(h_full // factor, w_full // factor, config)
    needed = sorted({t - lag for t in scored for lag in range(config.max_lag + 1) if t - lag >= 0} | set(scored))
    row_of = {t: j for j, t in enumerate(needed)}
    base = be.prepare(frames_base, needed, factor, config.blur_sigma)
    cand = be.prepare(frames_cand, needed, factor, config.blur_sigma)
    numerators, energies = _search(be, base, cand, row_of, scored, config, g, chunk)
    out = []
    for frames in windows:
        keys = _candidates(frames, numerators, energies, config, g)
        best = None
        for key, (fr, num, den, use) in _window_blocks(be, base, cand, row_of, frames, keys, config, g).items():
            est, se, evidence, count = _pooled(num, den, use, config)
            if best is None or evidence > best[2]:
                best = (est, se, evidence, count, key, fr, num, den, use)
        out.append(best)
    return out


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
    _geometry(h_full // factor, w_full // factor, config)  # refuse frames too small before any work
    if all(_frames_equal(frames_base[t], frames_cand[t]) for t in scored):
        result.windows = [PooledWindow(frames=w, factor=factor) for w in pool_windows(scored, config.pool_frames)]
        return result
    pooled = pool_windows(scored, config.pool_frames)
    coarse_fits = _window_fits(be, frames_base, frames_cand, pooled, factor, config, chunk)
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
    for frames, coarse_fit, fine_fit in zip(pooled, coarse_fits, fine_fits):
        win = PooledWindow(frames=list(frames), factor=factor)
        coarse_ev = coarse_fit[2] if coarse_fit is not None and coarse_fit[3] > 0 else 0.0
        fine_ev = (fine_fit[2] if fine_fit is not None and fine_fit[3] > 0 else 0.0) if fine_ran else None
        win.coarse_evidence, win.fine_evidence = coarse_ev, fine_ev
        win.p_value = window_p_value(coarse_ev, config, fine_ev)
        # The copy reported is the one of the pass whose own share of the p-value is smaller.
        fit_factor, best = factor, coarse_fit
        if fine_ev is not None and fine_fit is not None and fine_fit[3] > 0 and (
                _tail_p(fine_ev, config, fine=True) / config.fine_lag0_weight
                < _tail_p(coarse_ev, config) / (1.0 - config.fine_lag0_weight)):
            fit_factor, best = factor // 2, fine_fit
        if best is not None and best[3] > 0:
            est, se, evidence, count, (lag, dy, dx), fr, num, den, use = best
            win.score, win.stderr, win.evidence, win.blocks = max(0.0, est), se, evidence, count
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
    return pair_p_value(fs) <= config.flag_p


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
    # A copy found by the fine lag-0 pass can sit between working pixels: use the finest factor that holds it.
    factor = math.gcd(downsample_factor(h_full, w_full, config.work_long_side), dy, dx)
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

    flag_p: float = Field(default=GhostingConfig.flag_p, ge=0.0, le=1.0)
    """A pair is flagged (for reporting) when its p-value against the benign null is at most this; the release
    decision is the run-level test over the pairs' p-values, not this flag."""
    frame_threshold: float = GhostingConfig.frame_threshold
    pool_frames: int = Field(default=GhostingConfig.pool_frames, ge=1)
    frame_stride: int = Field(default=GhostingConfig.frame_stride, ge=1)
    strip_frames: int = 3
    """Worst frames shown in the strip artifact."""
    workers: int = 1
    """Threads of the displacement search."""


@register_gate
class GhostingGate(Gate):
    """Faint displaced copy of moving content in the candidate (field report 001); calibrated out of sample."""

    name = "ghosting"
    needs = ("video",)
    description = (
        "Strength of a displaced copy (temporal lag 0-4, spatial shift) of the baseline in the candidate, fitted "
        "jointly over windows of frames where the copy is visible and not aligned with the motion (what a codec "
        "leaks); a p-value per pair against the benign null of held-out footage, for the run-level test."
    )

    Options = GhostingOptions
    metrics = {"ghost_strength": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_evidence": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_p_value": MetricSpec(higher_is_better=True, unit="p"),
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
        config = dataclasses.replace(GhostingConfig(), flag_p=options.flag_p,
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
        device = ctx.device if str(ctx.device).startswith("cuda") else "cpu"
        scored_base, scored_cand = base, cand
        if device != "cpu":
            from gates.media_cache import load_video_on

            # The clip cache's device copies: each clip uploaded once for all the gates of the pair.
            scored_base, _ = load_video_on(ctx.baseline.mp4, device)
            scored_cand, _ = load_video_on(ctx.candidate.mp4, device)
        try:
            fs = ghost_scores(scored_base, scored_cand, config, workers=workers, device=device)
        except ValueError as exc:  # frames too small for the displacement search
            return self._error(ctx, f"{ctx.candidate.mp4.name}: {exc}")
        scored = fs.scored
        values = fs.score[scored]
        strength = clip_evidence(fs)
        p_value = pair_p_value(fs)
        flagged = p_value <= config.flag_p
        listed = ghost_frames(fs, config)
        top = min(fs.windows, key=lambda w: (w.p_value, -w.evidence)) if fs.windows else None
        metrics = {
            "ghost_strength": Metric(value=strength, higher_is_better=False, unit="alpha"),
            "ghost_evidence": Metric(value=max(0.0, top.evidence) if top else 0.0, higher_is_better=False,
                                     unit="alpha"),
            "ghost_p_value": Metric(value=p_value, higher_is_better=True, unit="p"),
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
                if win.p_value <= config.flag_p:
                    flags.append(
                        f"ghosting: frames {win.frames[0]}-{win.frames[-1]} carry a copy of frame t-{win.lag} shifted "
                        f"by ({win.dy}, {win.dx}) px of pooled strength {win.score:.3f} +- {win.stderr:.3f} over "
                        f"{win.blocks} blocks (p {win.p_value:.2g} against benign footage, flag_p {config.flag_p:.3g}); "
                        f"{sum(t in listed for t in win.frames)} of its {len(win.frames)} scored frames at >= "
                        f"{config.frame_threshold}")
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
                "device": device,
                "scored_frames": int(scored.sum()),
                "num_frames": int(base.shape[0]),
                "pair_p_value": p_value,
                "ghost_frame_indices": listed,
                "windows": [
                    {"first_frame": w.frames[0], "last_frame": w.frames[-1], "scored_frames": len(w.frames),
                     "strength": float(w.score), "stderr": float(w.stderr), "evidence": float(w.evidence),
                     "p_value": float(w.p_value), "blocks": int(w.blocks), "lag": int(w.lag), "dy": int(w.dy),
                     "dx": int(w.dx), "fit_factor": int(w.factor), "coarse_evidence": float(w.coarse_evidence),
                     "fine_evidence": None if w.fine_evidence is None else float(w.fine_evidence)}
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
