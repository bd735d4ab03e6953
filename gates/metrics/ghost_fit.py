"""The paired ghost estimator's least-squares fit: geometry of the fit region, the nuisance basis of each frame, the
FFT displacement search (exact numerators and energies for every lag and shift), each window's candidate copies, the
block statistics (visible, not aligned with the motion, not replaced content) and the pooled strength with its
standard error and one-sided lower bound (the window's evidence). :mod:`gates.metrics.ghost` drives it; the
physics is in that module's docstring. Not a metric itself (``higher_is_better`` None)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from gates.metrics.ghost_config import GhostingConfig

higher_is_better = None


@dataclass(frozen=True)
class Geometry:
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


def geometry(h: int, w: int, config: GhostingConfig) -> Geometry:
    m = config.max_shift + config.align_offset + 1
    ih, iw = h - 2 * m, w - 2 * m
    bs = config.block
    if ih < bs or iw < bs:
        raise ValueError(f"frames too small for the ghosting search: working size {h}x{w}")
    return Geometry(h, w, m, ih - ih % bs, iw - iw % bs, bs)


def interior(x, g: Geometry, dy: int = 0, dx: int = 0):
    """``x(I - (dy, dx))`` over the fit region I of (k, h, w) frames: the copy displaced by (dy, dx)."""
    return x[..., g.m - dy : g.m - dy + g.ih, g.m - dx : g.m - dx + g.iw]


def frame_terms(be, b, c, g: Geometry, highpass: tuple[float, ...] = ()):
    """Nuisance basis N (k, K, P) of each frame, its inverse Gram matrix (k, K, K) and the residual projected off
    it (k, P). Regressors: 1, base, base^2 / 128 (brightness, contrast, gamma) and base shifted by one pixel four
    ways, less base (a local linear filter: codec blur or sharpening, sub-pixel misregistration); K = 7, plus one
    per ``highpass`` sigma: base less its Gaussian blur of that sigma (a broader loss or gain of detail)."""
    k = b.shape[0]
    bi = interior(b, g)
    cols = [bi * 0.0 + 1.0, bi, bi * bi / 128.0, interior(b, g, 1, 0) - bi, interior(b, g, -1, 0) - bi,
            interior(b, g, 0, 1) - bi, interior(b, g, 0, -1) - bi]
    cols += [interior(b - be.blur(b, sigma), g) for sigma in highpass]
    n = be.stack(cols, axis=1).reshape(k, len(cols), g.npix)
    gram_inv = be.pinv(n @ be.swap(n))
    r = (interior(c, g) - bi).reshape(k, g.npix)
    return n, gram_inv, perp(be, n, gram_inv, r)


def perp(be, n, gram_inv, v):
    """``v - N^T G^-1 N v`` for v of shape (k, P) or (k, j, P)."""
    single = v.ndim == 2
    if single:
        v = v[:, None]
    out = v - ((v @ be.swap(n)) @ gram_inv) @ n
    return out[:, 0] if single else out


def search(be, base, cand, row_of: dict[int, int], scored: list[int], config: GhostingConfig, g: Geometry,
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
        n, gram_inv, r_perp = frame_terms(be, b, c, g, config.highpass)
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


def allowed(lag: int, dy: int, dx: int, config: GhostingConfig) -> bool:
    return not (lag == 0 and max(abs(dy), abs(dx)) < config.min_lag0_shift)


def candidates(frames: list[int], numerators, energies, config: GhostingConfig, g: Geometry):
    """Per lag, the shift whose pooled ridge fit explains most residual energy over the window's frames t >= lag."""
    rad = config.max_shift
    ridge = g.npix * config.ridge_rms**2
    mask = np.array([[allowed(0, dy, dx, config) for dx in range(-rad, rad + 1)] for dy in range(-rad, rad + 1)])
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


def block_sums(v, g: Geometry):
    nby, nbx = g.blocks
    return v.reshape(v.shape[:-1] + (nby, g.block, nbx, g.block)).sum(-1).sum(-2)


def moving_blocks(be, base, row_of, frames: list[int], config: GhostingConfig, g: Geometry) -> np.ndarray:
    """Per frame t of ``frames`` and per block: whether the baseline moves there (bool (frames, blocks down, blocks
    across)). A block moves when the RMS of ``base_t - base_u`` over it reaches ``motion_rms`` levels for some other
    frame u within ``max_lag`` of t (earlier or later; the frames the search prepared), or a neighbouring block
    (3 x 3) does: a displaced copy lands up to ``max_shift`` working pixels, at most one block, from the content
    it copies. All True when ``motion_rms`` is 0."""
    nby, nbx = g.blocks
    if config.motion_rms <= 0:
        return np.ones((len(frames), nby, nbx), dtype=bool)
    bi = interior(base[be.index([row_of[t] for t in frames])], g)
    energy = np.zeros((len(frames), nby, nbx))
    for j, t in enumerate(frames):
        others = [u for u in range(t - config.max_lag, t + config.max_lag + 1) if u != t and u in row_of]
        if not others:
            continue
        diff = (interior(base[be.index([row_of[u] for u in others])], g) - bi[j : j + 1]).reshape(len(others), -1)
        energy[j] = be.numpy(block_sums(diff * diff, g)).max(axis=0)
    moving = energy >= config.motion_rms**2 * g.block * g.block
    return ndimage.binary_dilation(moving, structure=np.ones((1, 3, 3), dtype=bool))


def window_blocks(be, base, cand, row_of, frames: list[int], keys, config: GhostingConfig, g: Geometry):
    """For each candidate (lag, dy, dx): per frame t >= lag of the window and per block, the ridge fit's numerator
    and denominator and whether the block carries evidence (numpy arrays (frames, blocks down, blocks across)).
    A displaced copy ((dy, dx) not (0, 0)) carries evidence only in blocks where the baseline moves
    (:func:`moving_blocks`): a ghost is a copy of moving content, and a shifted copy of a static background is
    what a sub-pixel change of its edges correlates with (issue 50). An in-place copy (frame t - lag at the same
    pixels) differs from the frame only where the frame moves, so it needs no mask."""
    a = config.align_offset
    moving = moving_blocks(be, base, row_of, frames, config, g)
    offsets = [(a, 0), (-a, 0), (0, a), (0, -a)]
    ridge_b = g.block * g.block * config.ridge_rms**2
    b = base[be.index([row_of[t] for t in frames])]
    c = cand[be.index([row_of[t] for t in frames])]
    n, gram_inv, r_perp = frame_terms(be, b, c, g, config.highpass)
    bi = n[:, 1]
    out = {}
    for lag, dy, dx in keys:
        sel = [j for j, t in enumerate(frames) if t >= lag]
        if not sel:
            continue
        jsel = be.index(sel)
        refs = base[be.index([row_of[frames[j] - lag] for j in sel])]
        d = interior(refs, g, dy, dx).reshape(len(sel), -1) - bi[jsel]
        dp = perp(be, n[jsel], gram_inv[jsel], d)
        num = block_sums(r_perp[jsel] * dp, g)
        den = block_sums(dp * dp, g)
        ssd = block_sums(d * d, g)
        moved = None
        for oy, ox in offsets:
            e = interior(refs, g, dy + oy, dx + ox).reshape(len(sel), -1) - bi[jsel]
            s = block_sums(e * e, g)
            moved = s if moved is None else be.minimum(moved, s)
        num, den, ssd, moved = (be.numpy(x) for x in (num, den, ssd, moved))
        alpha = num / (den + ridge_b)
        use = ((alpha <= config.block_alpha_max) & (den >= config.visible_rms**2 * g.block * g.block)
               & (ssd > config.align_ratio * moved))
        if (dy, dx) != (0, 0):
            use = use & moving[sel]
        out[(lag, dy, dx)] = ([frames[j] for j in sel], num, den + ridge_b, use)
    return out


def copy_share(be, base, cand, row_of, frames: list[int], key, alpha: float, config: GhostingConfig,
               g: Geometry) -> float | None:
    """Share of the pair's visible residual over the fit region that the copy ``key`` (lag, dy, dx) at strength
    ``alpha`` explains, over the window's frames t >= lag: with ``r = cand_t - base_t`` and ``d = S - base_t`` (S the
    copy), ``1 - sum (r - alpha d)^2 / sum r^2`` over the pixels where ``|r|`` exceeds ``share_visible_residual`` or
    ``|alpha d|`` exceeds ``share_visible_copy`` levels. About 1 for a ghost (little is left after the copy), about 0
    for a re-rendered subject whose rim a copy happens to match (most of the residual is left); negative where
    the copy adds what the residual lacks. None where no pixel is visible."""
    lag, dy, dx = key
    sel = [t for t in frames if t >= lag]
    if not sel:
        return None
    b = interior(base[be.index([row_of[t] for t in sel])], g)
    r = interior(cand[be.index([row_of[t] for t in sel])], g) - b
    d = interior(base[be.index([row_of[t - lag] for t in sel])], g, dy, dx) - b
    seen = (abs(r) > config.share_visible_residual) | (abs(alpha * d) > config.share_visible_copy)
    total = float((r * r * seen).sum())
    if total <= 0:
        return None
    e = r - alpha * d
    return 1.0 - float((e * e * seen).sum()) / total


def pooled(num: np.ndarray, den: np.ndarray, use: np.ndarray, config: GhostingConfig):
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

