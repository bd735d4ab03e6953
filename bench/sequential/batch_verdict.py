"""The resample judge's outcome for many simulated runs at once (issue 53's simulation): the same numbers as
``bench/sequential/sequential_sim.decide`` (the verdict's own functions, h3eval.verdict.decide), computed per array.

What the slow path spends its time on, measured (cProfile, 60 verdicts of 13 metrics, 2-core Zen 1 VM): the minimum
detectable effect and the pairs needed (noncentral-t power by Brent's method, 12.4 of 19 s), which only word a
warning and never change an outcome, then scipy's BCa bootstrap called once per metric (3.7 s), then building the
verdict's pydantic records. Here:

- the BCa CI is ``scipy.stats.bootstrap`` itself, called once on all rows of a look (each row a run's metric): with
  the verdict's seed every call draws the same resample indices, so a row's CI is the one a call of its own gives
  (the mean over the last axis of a row is summed in the same order); rows whose deltas are all equal get the
  degenerate CI ``[d, d]`` and rows where BCa is undefined the percentile interval, as h3eval.stats.bootstrap_ci;
- the non-inferiority t p-value, Holm, the exact one-sided Wilcoxon p (the subset-sum count over doubled mid-ranks of
  h3eval.stats, every row at once: counts are integers and the probabilities dyadic, so the sums are exact in any
  order) and the decision rules of h3eval.verdict.decide (``_decide_paired_delta``, ``_regression_outcome``,
  ``combine``) per array;
- the minimum detectable effect and pairs needed are not computed (warnings only).

Only what the simulated pools use is supported: required ``sides`` metrics, not binary, no waivers; anything else
raises :class:`Unsupported` (the caller then uses the slow path). ``sequential_sim.py --check`` compares this with
the slow path on the first runs of every pool; tests/test_sequential.py compares it on planted data.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

CHUNK_ELEMENTS = 12_000_000
"""Rows of one bootstrap call are limited to this many resampled values (rows x resamples x pairs: ~100 MB)."""


class Unsupported(ValueError):
    """A policy feature the batched path does not implement."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric as the simulation judges it: its pool values and the policy's numbers."""

    key: str
    base: np.ndarray
    cand: np.ndarray
    sign: float
    """+1 higher is better, -1 lower is better (the oriented delta is ``sign * (cand - base)``)."""
    margin: float
    fail_beyond: str
    regression_alpha: float | None
    regression_shift: float | None


def _mean(x, axis=-1):
    """The mean over the last axis of each leading row, reduced with the shape that row has in a call of its own
    (the estimate 1-D, the resamples resamples x pairs, the jackknife pairs x pairs - 1): numpy sums a small last
    axis in another order when more rows share one reduction, and a last-bit difference moves a BCa bound where
    resample means tie with the estimate (checked bit for bit in tests/test_sequential.py)."""
    assert axis in (-1, x.ndim - 1) and x.ndim >= 2
    return np.stack([np.mean(row, axis=-1) for row in x])


def bca_rows(d: np.ndarray, confidence: float, n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``d`` (rows x pairs), the CI h3eval.stats.mean_ci gives that row alone."""
    low, high = np.empty(d.shape[0]), np.empty(d.shape[0])
    degenerate = np.all(d == d[:, :1], axis=1)
    if degenerate.any():  # every pair equal: the CI is the point (the verdict's estimate, the mean)
        low[degenerate] = high[degenerate] = np.mean(d[degenerate], axis=1)
    rows = np.flatnonzero(~degenerate)
    step = max(1, CHUNK_ELEMENTS // (n_resamples * d.shape[1]))
    tail = (1 - confidence) / 2
    for start in range(0, rows.size, step):
        idx = rows[start:start + step]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
            res = stats.bootstrap((d[idx],), _mean, paired=True, vectorized=True, confidence_level=confidence,
                                  n_resamples=n_resamples, method="BCa", rng=np.random.default_rng(seed), axis=-1)
        lo, hi = np.array(res.confidence_interval.low, dtype=float), np.array(res.confidence_interval.high, dtype=float)
        bad = ~(np.isfinite(lo) & np.isfinite(hi))
        for j in np.flatnonzero(bad):  # BCa undefined: the percentile interval of the same resamples
            boot = res.bootstrap_distribution[j]
            lo[j], hi[j] = float(np.quantile(boot, tail)), float(np.quantile(boot, 1 - tail))
        low[idx], high[idx] = lo, hi
    return low, high


def t_p_lower(d: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """h3eval.stats._t_pvalues' first value per row: the one-sided paired t p of ``H0: mean <= -margin``."""
    n = d.shape[1]
    mean, sd = d.mean(axis=1), d.std(axis=1, ddof=1)
    out = np.where(mean > -margin, 0.0, 1.0)
    ok = sd != 0.0
    se = sd[ok] / math.sqrt(n)
    out[ok] = stats.t.sf((mean[ok] + margin[ok]) / se, n - 1)
    return out


def wilcoxon_less_rows(d: np.ndarray) -> np.ndarray:
    """h3eval.stats.wilcoxon_signed_rank(row, "less").pvalue per row: zeros dropped, mid-ranks, the exact null count
    (rows of more than 50 non-zero deltas are not supported)."""
    k, n = d.shape
    nonzero = d != 0
    if nonzero.sum(axis=1).max(initial=0) > 50:
        raise Unsupported("more than 50 non-zero deltas: the normal approximation is not batched")
    mag = np.where(nonzero, np.abs(d), np.nan)
    ranks = stats.rankdata(mag, axis=1, nan_policy="omit")
    doubled = np.where(nonzero, np.rint(np.nan_to_num(ranks) * 2), 0).astype(np.int64)
    totals = doubled.sum(axis=1)
    width = int(totals.max(initial=0)) + 1
    counts = np.zeros((k, width))
    counts[:, 0] = 1.0
    cols = np.arange(width)[None, :]
    for j in range(n):
        r = doubled[:, j][:, None]
        src = cols - r
        shifted = np.take_along_axis(counts, np.clip(src, 0, None), axis=1) * (src >= 0)
        counts = counts + np.where(r > 0, shifted, 0.0)
    w_plus = np.where(d > 0, np.nan_to_num(ranks), 0.0).sum(axis=1)
    observed = np.rint(2 * w_plus).astype(np.int64)
    probs = counts / counts.sum(axis=1, keepdims=True)
    p = np.where(cols <= observed[:, None], probs, 0.0).sum(axis=1)
    p = np.where(nonzero.any(axis=1), p, 1.0)
    return np.minimum(1.0, p)


def holm_rows(p: np.ndarray) -> np.ndarray:
    """h3eval.stats.holm along axis 1 (metrics), every row (run) at once."""
    m = p.shape[1]
    order = np.argsort(p, axis=1, kind="stable")
    adjusted_sorted = np.maximum.accumulate((m - np.arange(m))[None, :] * np.take_along_axis(p, order, 1), axis=1)
    out = np.empty_like(p)
    np.put_along_axis(out, order, np.minimum(adjusted_sorted, 1.0), axis=1)
    return out


def outcomes(specs: list[MetricSpec], idx: np.ndarray, *, confidence: float, n_resamples: int, seed: int,
             holm: bool = True, detail: bool = False):
    """Each run's candidate outcome (``idx``: runs x pairs, indices into the pools) as ``decide`` gives it; with
    ``detail``, also the per-metric numbers (runs x metrics: ``low``, ``high``, ``mean``, ``margin``, ``p_worse``
    (NaN where no regression rule), ``shift``) as a second value."""
    if not specs:
        raise Unsupported("no metric to judge")
    runs, n = idx.shape
    m = len(specs)
    deltas = np.stack([s.sign * (s.cand[idx] - s.base[idx]) for s in specs], axis=1)  # runs x metrics x pairs
    if not np.isfinite(deltas).all():
        raise Unsupported("a non-finite value in the pool")
    margin = np.array([s.margin for s in specs])[None, :].repeat(runs, 0)
    flat = deltas.reshape(runs * m, n)
    low, high = bca_rows(flat, confidence, n_resamples, seed)
    low, high = low.reshape(runs, m), high.reshape(runs, m)
    mean = flat.mean(axis=1).reshape(runs, m)
    p_ni = t_p_lower(flat, margin.reshape(-1)).reshape(runs, m)
    p_dec = holm_rows(p_ni) if holm else p_ni
    alpha = (1 - confidence) / 2
    ci_rule = np.array([s.fail_beyond == "ci" for s in specs])[None, :]
    fail = np.where(ci_rule, high < -margin, mean <= -margin)
    passed = ~fail & (low > -margin) & (p_dec <= alpha)
    reg = [j for j, s in enumerate(specs) if s.regression_alpha is not None and s.regression_shift is not None]
    p_worse_all = np.full((runs, m), np.nan)
    shift_all = np.array([np.nan if s.regression_shift is None else s.regression_shift for s in specs])
    if reg:
        sub = deltas[:, reg, :].reshape(runs * len(reg), n)
        p_worse = holm_rows(wilcoxon_less_rows(sub).reshape(runs, len(reg)))
        r_alpha = np.array([specs[j].regression_alpha for j in reg])[None, :]
        r_shift = np.array([specs[j].regression_shift for j in reg])[None, :]
        fail[:, reg] |= (p_worse <= r_alpha) & (mean[:, reg] <= -r_shift)
        passed[:, reg] &= ~fail[:, reg]
        p_worse_all[:, reg] = p_worse
    out = np.where(fail.any(axis=1), "FAIL", np.where(passed.all(axis=1), "PASS", "INCONCLUSIVE")).astype(object)
    if not detail:
        return out
    return out, {"low": low, "high": high, "mean": mean, "margin": margin, "p_worse": p_worse_all,
                 "shift": np.broadcast_to(shift_all, (runs, m))}


def specs_for(pol, pool: dict, mps: dict, threshold, shift) -> list[MetricSpec]:
    """The pool's metrics under ``pol`` (the metrics ``decide`` judges), or :class:`Unsupported`."""
    if pol.waivers:
        raise Unsupported("waivers")
    out = []
    for key, (base, cand) in pool["pairs"].items():
        mp = mps.get(key)
        if mp is None or (key not in pool["floor"] and not isinstance(mp.margin, (int, float))):
            continue
        if mp.compare != "sides" or mp.binary or not mp.required:
            raise Unsupported(f"{key}: compare {mp.compare}, binary {mp.binary}, required {mp.required}")
        reg = mp.regression
        out.append(MetricSpec(key=key, base=np.asarray(base, float), cand=np.asarray(cand, float),
                              sign=1.0 if mp.higher_is_better else -1.0,
                              margin=float(threshold(mp, key, pool["floor"])),
                              fail_beyond=mp.fail_beyond, regression_alpha=None if reg is None else float(reg.alpha),
                              regression_shift=None if reg is None else float(shift(mp, key, pool["floor"]))))
    return out
