"""Paired statistics for signoff: pure functions over per-pair numbers, no I/O.

Every quality comparison in h3eval is paired clip by clip (same prompt, same seed; seed 002: a 4-clip check
suggested an improvement that the 16-clip paired test reversed). The functions here take the per-pair numbers of
one metric and return what the verdict reads:

* **Oriented delta** (:func:`oriented_deltas`): ``candidate - baseline`` when higher is better, ``baseline -
  candidate`` when lower is better. So a positive delta always means *the candidate is better*, and a negative one
  *worse*, whatever the metric.
* **Mean delta with a paired BCa bootstrap CI** (:func:`mean_ci`, :func:`bootstrap_ci`): ``scipy.stats.bootstrap``
  with ``method='BCa'``, resampling pairs. When every delta is equal the bootstrap distribution is a point and BCa
  is undefined; the CI is then reported as ``[d, d]`` with a note instead of NaN.
* **Sign counts** (:func:`sign_counts`): "worse on 14 of 16" (seed 002's words).
* **Wilcoxon signed-rank** (:func:`wilcoxon_signed_rank`): zeros are dropped (Wilcoxon's ``zero_method='wilcox'``)
  and counted; tied magnitudes get mid-ranks; the p-value is the exact null distribution (all ``2**n`` sign
  assignments, ties included, computed by a subset-sum recursion) up to :data:`WILCOXON_EXACT_MAX_N` non-zero
  deltas, else the normal approximation with tie correction. All-zero deltas give ``p = 1`` with a note rather
  than an error.
* **Exact McNemar** for 0/1 metrics (:func:`mcnemar_exact`; VBench's ``dynamic_degree`` is 0/1 per clip): the
  exact binomial test on the discordant pairs.
* **Non-inferiority** against a margin ``delta`` (:func:`noninferiority`): the lower bound of the two-sided
  ``confidence`` BCa interval must stay *above* ``-delta``. Also reported: the one-sided paired t-test p-value of
  ``H0: mean <= -delta`` (the p-value Holm adjusts) and the TOST equivalence p-value (two one-sided t-tests
  against ``+-delta``, as ``statsmodels.stats.weightstats.ttost_paired``).
* **Holm** step-down adjustment across the metrics of one verdict (:func:`holm`).
* **Minimum detectable effect** (:func:`minimum_detectable_effect`, :func:`pairs_needed`): the smallest true mean
  shift a one-sided paired t-test at level ``alpha`` detects with probability ``power`` given n pairs and the
  observed SD of the deltas (exact noncentral-t power, as ``statsmodels`` ``TTestPower``). When it is larger than
  the margin, the sample cannot resolve the margin and the verdict says so.
* **Run-level test of per-pair p-values** (:func:`ghost_run_test`, issue 19): Benjamini-Hochberg at a stated
  false-discovery rate; the run FAILs when any pair is a discovery (Simes' test of the all-benign null).
* **Speedup** (:func:`speedup`): ``mean(baseline latency) / mean(candidate latency)`` over paired requests (the
  ratio of total times, i.e. of throughput), with a paired BCa CI; also the geometric mean and median of the
  per-request ratios.
* **Quantiles** (:func:`quantile`): numpy's ``method="linear"`` (Hyndman & Fan type 7).
* **Cost per clip** (:func:`usd_per_clip`): p50 request-to-file latency × the machine's hourly rate / 3600.

This module is the one home of these numbers: the verdict, the speed summary (``speed.json``, ``speed.md``) and the
dashboard call these functions, so they cannot disagree on a run (the bootstrap is :func:`bootstrap_ci`, defined
once; its resample count and seed are parameters, defaulting to :data:`DEFAULT_RESAMPLES` and
:data:`DEFAULT_SEED`).

The tests check each function against scipy / statsmodels and against a slow, readable loop of the definition.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy import optimize, stats

logger = logging.getLogger(__name__)

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 9999
DEFAULT_SEED = 20261129
DEFAULT_POWER = 0.8
# The exact null distribution is a subset-sum over doubled ranks (O(n^3)); beyond 50 pairs the normal
# approximation is accurate (scipy's own switch point for its exact method is also 50).
WILCOXON_EXACT_MAX_N = 50


class StatsInputError(ValueError):
    """The numbers given to a statistic are not usable (NaN, wrong shape, not 0/1 where 0/1 is required)."""


def _as_finite_1d(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise StatsInputError(f"{what}: expected a 1-D sequence, got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise StatsInputError(f"{what}: {int(bad.sum())} non-finite value(s) at index {np.flatnonzero(bad).tolist()}")
    return arr


# -- deltas and signs ----------------------------------------------------------------------------------------------
def oriented_deltas(candidate, baseline, higher_is_better: bool) -> np.ndarray:
    """Per-pair ``candidate - baseline``, sign-flipped for lower-is-better metrics: positive = candidate better."""
    cand = _as_finite_1d(candidate, "candidate values")
    base = _as_finite_1d(baseline, "baseline values")
    if cand.shape != base.shape:
        raise StatsInputError(f"candidate has {cand.size} values but baseline has {base.size}; pairs must match")
    raw = cand - base
    return raw if higher_is_better else -raw


def orient(raw_deltas, higher_is_better: bool) -> np.ndarray:
    """Orient deltas that a gate already computed as ``candidate - baseline``."""
    raw = _as_finite_1d(raw_deltas, "deltas")
    return raw if higher_is_better else -raw


@dataclass(frozen=True)
class SignCounts:
    """How many pairs the candidate is better / worse / tied on (by oriented delta)."""

    better: int
    worse: int
    tied: int

    @property
    def n(self) -> int:
        return self.better + self.worse + self.tied

    def describe(self) -> str:
        return f"better on {self.better}, worse on {self.worse}, tied on {self.tied} of {self.n}"


def sign_counts(deltas, tie_tolerance: float = 0.0) -> SignCounts:
    """Count oriented deltas above ``tie_tolerance`` (better), below ``-tie_tolerance`` (worse), else tied."""
    d = _as_finite_1d(deltas, "deltas")
    if tie_tolerance < 0:
        raise StatsInputError("tie_tolerance must be >= 0")
    return SignCounts(
        better=int((d > tie_tolerance).sum()),
        worse=int((d < -tie_tolerance).sum()),
        tied=int((np.abs(d) <= tie_tolerance).sum()),
    )


# -- bootstrap -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfidenceInterval:
    estimate: float
    low: float
    high: float
    confidence: float
    method: str
    """``BCa`` (scipy.stats.bootstrap), or ``degenerate`` when every resample gives the same value."""
    n_resamples: int
    note: str | None = None


def bootstrap_ci(
    samples: tuple[np.ndarray, ...],
    statistic: Callable[..., np.ndarray],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> ConfidenceInterval:
    """Two-sided paired BCa CI of ``statistic(*samples)``; samples are resampled together (pairs stay pairs).

    ``statistic`` must be vectorized along ``axis`` (scipy's convention): ``statistic(*samples, axis=-1)``.
    """
    if not 0 < confidence < 1:
        raise StatsInputError(f"confidence must be in (0, 1), got {confidence}")
    arrays = tuple(_as_finite_1d(s, "bootstrap sample") for s in samples)
    n = arrays[0].size
    if any(a.size != n for a in arrays):
        raise StatsInputError("paired bootstrap samples must have the same length")
    if n < 2:
        raise StatsInputError(f"a bootstrap CI needs at least 2 pairs, got {n}")
    estimate = float(statistic(*arrays, axis=-1))
    # Every pair identical -> every resample gives the estimate; BCa's bias correction is then undefined (0/0).
    if all(np.all(a == a[0]) for a in arrays):
        return ConfidenceInterval(
            estimate, estimate, estimate, confidence, "degenerate", 0, "all pairs are equal: the CI is the point"
        )
    with warnings.catch_warnings():
        # scipy warns when BCa is undefined (a degenerate bootstrap distribution); that case is handled below.
        warnings.simplefilter("ignore", category=RuntimeWarning)
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
        res = stats.bootstrap(
            arrays,
            statistic,
            paired=True,
            vectorized=True,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="BCa",
            rng=np.random.default_rng(seed),
        )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        # BCa fails when the bootstrap distribution is (nearly) a point, e.g. one odd pair among equal ones;
        # fall back to the percentile interval of the same resamples and say so, rather than report NaN.
        boot = res.bootstrap_distribution
        tail = (1 - confidence) / 2
        low, high = float(np.quantile(boot, tail)), float(np.quantile(boot, 1 - tail))
        return ConfidenceInterval(
            estimate, low, high, confidence, "percentile", n_resamples, "BCa undefined here; percentile interval"
        )
    return ConfidenceInterval(estimate, low, high, confidence, "BCa", n_resamples)


def _mean(x, axis=-1):
    return np.mean(x, axis=axis)


def mean_ci(
    deltas, *, confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> ConfidenceInterval:
    """Mean of the per-pair deltas with its paired BCa bootstrap CI."""
    d = _as_finite_1d(deltas, "deltas")
    return bootstrap_ci((d,), _mean, confidence=confidence, n_resamples=n_resamples, seed=seed)


# -- rank and exact tests ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WilcoxonResult:
    w_plus: float
    """Sum of the (mid-)ranks of |delta| over the positive deltas (candidate better), zeros dropped."""
    w_minus: float
    pvalue: float
    alternative: str
    n_nonzero: int
    n_zero: int
    method: str
    """``exact`` (all sign assignments, ties included), ``approx`` (normal, tie-corrected) or ``none``."""
    note: str | None = None


def wilcoxon_signed_rank(deltas, alternative: str = "two-sided") -> WilcoxonResult:
    """Wilcoxon signed-rank test of ``H0: deltas symmetric about 0``; zeros dropped and counted.

    ``alternative='less'`` tests that the candidate is worse (deltas shifted below 0).
    """
    if alternative not in ("two-sided", "less", "greater"):
        raise StatsInputError(f"alternative must be two-sided, less or greater, got {alternative!r}")
    d = _as_finite_1d(deltas, "deltas")
    nonzero = d[d != 0]
    n_zero = int(d.size - nonzero.size)
    if nonzero.size == 0:
        return WilcoxonResult(0.0, 0.0, 1.0, alternative, 0, n_zero, "none", "all deltas are zero: no difference")
    ranks = stats.rankdata(np.abs(nonzero))  # mid-ranks for tied magnitudes
    w_plus = float(ranks[nonzero > 0].sum())
    w_minus = float(ranks[nonzero < 0].sum())
    if nonzero.size <= WILCOXON_EXACT_MAX_N:
        method = "exact"
        pvalue = _wilcoxon_exact_p(ranks, w_plus, alternative)
    else:
        method = "approx"
        pvalue = float(stats.wilcoxon(nonzero, alternative=alternative, method="approx", correction=False).pvalue)
    note = f"{n_zero} zero delta(s) dropped" if n_zero else None
    return WilcoxonResult(w_plus, w_minus, min(1.0, pvalue), alternative, int(nonzero.size), n_zero, method, note)


def _wilcoxon_exact_p(ranks: np.ndarray, w_plus: float, alternative: str) -> float:
    """Exact p of W+ under H0 (each sign + or - with probability 1/2), ties included.

    Mid-ranks are multiples of 1/2, so doubled ranks are integers and the null distribution of 2*W+ is the
    subset-sum count over them: a dynamic program instead of enumerating all 2**n sign assignments.
    """
    doubled = np.rint(ranks * 2).astype(np.int64)
    total = int(doubled.sum())
    counts = np.zeros(total + 1, dtype=np.float64)
    counts[0] = 1.0
    for r in doubled:
        counts[r:] = counts[r:] + counts[: total + 1 - r].copy()
    probs = counts / counts.sum()
    values = np.arange(total + 1)
    observed = int(round(2 * w_plus))
    if alternative == "greater":
        return float(probs[values >= observed].sum())
    if alternative == "less":
        return float(probs[values <= observed].sum())
    centre = total / 2
    return float(probs[np.abs(values - centre) >= abs(observed - centre)].sum())


@dataclass(frozen=True)
class McNemarResult:
    improved: int
    """Pairs with baseline 0 and candidate 1 (oriented: candidate better)."""
    regressed: int
    """Pairs with baseline 1 and candidate 0 (oriented: candidate worse)."""
    concordant: int
    pvalue: float
    """Exact two-sided binomial p-value on the discordant pairs (1.0 when there are none)."""


def mcnemar_exact(deltas) -> McNemarResult:
    """Exact McNemar test for a 0/1 metric from its oriented per-pair deltas (each in {-1, 0, 1})."""
    d = _as_finite_1d(deltas, "deltas")
    if not np.isin(d, (-1.0, 0.0, 1.0)).all():
        raise StatsInputError("McNemar needs 0/1 values per clip, so deltas in {-1, 0, 1}; got other values")
    improved, regressed = int((d == 1).sum()), int((d == -1).sum())
    discordant = improved + regressed
    p = 1.0 if discordant == 0 else float(stats.binomtest(improved, discordant, 0.5).pvalue)
    return McNemarResult(improved, regressed, int(d.size - discordant), p)


def check_binary(values, what: str) -> np.ndarray:
    arr = _as_finite_1d(values, what)
    if not np.isin(arr, (0.0, 1.0)).all():
        raise StatsInputError(f"{what}: a 0/1 metric has values other than 0 and 1: {sorted(set(arr.tolist()))}")
    return arr


# -- non-inferiority -----------------------------------------------------------------------------------------------
def _t_pvalues(d: np.ndarray, margin: float) -> tuple[float, float]:
    """One-sided paired t p-values of ``H0: mean <= -margin`` and ``H0: mean >= +margin``."""
    n = d.size
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        # No variability: the mean is known exactly, each null is either certainly true or certainly false.
        return (0.0 if mean > -margin else 1.0), (0.0 if mean < margin else 1.0)
    se = sd / math.sqrt(n)
    p_lower = float(stats.t.sf((mean + margin) / se, n - 1))
    p_upper = float(stats.t.cdf((mean - margin) / se, n - 1))
    return p_lower, p_upper


@dataclass(frozen=True)
class NonInferiority:
    margin: float
    """delta: how much worse (oriented) the candidate may be."""
    ci: ConfidenceInterval
    holds: bool
    """The CI's lower bound stays above ``-margin``."""
    p_value: float
    """One-sided paired t-test of ``H0: mean <= -margin`` (small = non-inferior)."""
    tost_p: float
    """TOST equivalence p-value, ``max`` of the two one-sided tests against ``-margin`` and ``+margin``."""


def noninferiority(
    deltas,
    margin: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    ci: ConfidenceInterval | None = None,
) -> NonInferiority:
    """Non-inferiority of oriented deltas against margin ``margin >= 0`` (pass: CI lower bound > ``-margin``)."""
    if not (margin >= 0 and math.isfinite(margin)):
        raise StatsInputError(f"margin must be a finite number >= 0, got {margin}")
    d = _as_finite_1d(deltas, "deltas")
    if ci is None:
        ci = mean_ci(d, confidence=confidence, n_resamples=n_resamples, seed=seed)
    p_lower, p_upper = _t_pvalues(d, margin)
    return NonInferiority(margin, ci, bool(ci.low > -margin), p_lower, max(p_lower, p_upper))


def tost_paired_p(deltas, margin: float) -> float:
    """TOST p-value for equivalence within ``[-margin, +margin]`` of the paired mean delta."""
    d = _as_finite_1d(deltas, "deltas")
    return max(_t_pvalues(d, margin))


# -- multiplicity --------------------------------------------------------------------------------------------------
def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (monotone, capped at 1), in the input order."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.size == 0:
        return []
    if (~np.isfinite(p)).any() or (p < 0).any() or (p > 1).any():
        raise StatsInputError(f"p-values must be in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted_sorted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(adjusted_sorted, 1.0)
    return adjusted.tolist()


# -- power ---------------------------------------------------------------------------------------------------------
MAX_EFFECT_SIZE = 1e3
"""The largest standardized effect :func:`minimum_detectable_effect` searches (beyond it: not detectable, inf)."""


def _power_one_sided(effect_size: float, n: int, alpha: float) -> float:
    """Power of the one-sided one-sample t-test at standardized effect ``effect_size`` (noncentral t)."""
    df = n - 1
    crit = stats.t.isf(alpha, df)
    return float(stats.nct.sf(crit, df, effect_size * math.sqrt(n)))


def minimum_detectable_effect(sd: float, n: int, *, alpha: float = 0.025, power: float = DEFAULT_POWER) -> float:
    """Smallest true mean delta (in the metric's units) a one-sided paired t-test at ``alpha`` detects with
    probability ``power``, given ``n`` pairs whose deltas have standard deviation ``sd``."""
    if n < 2:
        return math.inf
    if sd == 0:
        return 0.0
    if _power_one_sided(MAX_EFFECT_SIZE, n, alpha) < power:
        # So few pairs at so small an alpha (a sequential design's first look: 3 usable pairs at 1e-8) that no effect
        # under MAX_EFFECT_SIZE sd reaches the power: none is detectable (a root search would have no sign change).
        return math.inf
    es = optimize.brentq(lambda e: _power_one_sided(e, n, alpha) - power, 1e-9, MAX_EFFECT_SIZE, xtol=1e-12)
    return float(es * sd)


def pairs_needed(sd: float, effect: float, *, alpha: float = 0.025, power: float = DEFAULT_POWER,
                 max_n: int = 100_000) -> int | None:
    """Fewest pairs for which :func:`minimum_detectable_effect` is at most ``effect`` (None beyond ``max_n``)."""
    if effect <= 0:
        return None
    if sd == 0:
        return 2
    lo, hi = 2, 2
    while _power_one_sided(effect / sd, hi, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > max_n:
            return None
    while lo < hi:  # smallest n in [lo, hi] with enough power; power is increasing in n
        mid = (lo + hi) // 2
        if _power_one_sided(effect / sd, mid, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return lo


# -- speed ---------------------------------------------------------------------------------------------------------
QUANTILE_METHOD = "linear"


def quantile(values: Sequence[float], q: float) -> float:
    """numpy's ``quantile(method="linear")``: Hyndman & Fan type 7, linear interpolation between order statistics
    at ``(n - 1) * q``."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), q, method=QUANTILE_METHOD))


def usd_per_clip(request_to_file_latency_s: Sequence[float], hourly_rate: float | None) -> float | None:
    """Cost of one clip: p50 request-to-file seconds × the machine's hourly rate / 3600; None without a rate or a
    latency.

    Request-to-file (seed 002's latency: request in to finished file on disk) is what a paying request occupies the
    machine for, queueing and the MP4 mux included; the median keeps one slow first request from setting the price.
    Seed 001 prices GPU time per clip the same way, at the pod's hourly rate ("about $0.29" for ~80 s at $13.16/h).
    """
    latencies = [float(v) for v in request_to_file_latency_s]
    if hourly_rate is None or not latencies:
        return None
    return quantile(latencies, 0.5) * hourly_rate / 3600.0


def _ratio_of_means(base, cand, axis=-1):
    return np.mean(base, axis=axis) / np.mean(cand, axis=axis)


@dataclass(frozen=True)
class SpeedupResult:
    n: int
    baseline_mean_s: float
    candidate_mean_s: float
    ci: ConfidenceInterval
    """Of ``mean(baseline) / mean(candidate)``."""
    geometric_mean_ratio: float
    """Geometric mean of the per-request ratios ``baseline_i / candidate_i``."""
    median_ratio: float
    faster: int
    """Requests on which the candidate was faster than the baseline's same (prompt, seed) request."""


def speedup(
    baseline_latency_s,
    candidate_latency_s,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> SpeedupResult:
    """Speedup of the candidate over the baseline from paired per-request latencies (seconds, > 0)."""
    base = _as_finite_1d(baseline_latency_s, "baseline latencies")
    cand = _as_finite_1d(candidate_latency_s, "candidate latencies")
    if base.shape != cand.shape:
        raise StatsInputError(f"{base.size} baseline latencies but {cand.size} candidate latencies")
    if (base <= 0).any() or (cand <= 0).any():
        raise StatsInputError("latencies must be > 0 seconds")
    ci = bootstrap_ci((base, cand), _ratio_of_means, confidence=confidence, n_resamples=n_resamples, seed=seed)
    ratios = base / cand
    return SpeedupResult(
        n=int(base.size),
        baseline_mean_s=float(base.mean()),
        candidate_mean_s=float(cand.mean()),
        ci=ci,
        geometric_mean_ratio=float(np.exp(np.mean(np.log(ratios)))),
        median_ratio=float(np.median(ratios)),
        faster=int((cand < base).sum()),
    )


# -- one summary for the verdict -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeltaSummary:
    """Everything the verdict reports about one metric's oriented deltas."""

    n: int
    mean: float
    sd: float
    """Sample standard deviation (ddof=1) of the deltas."""
    ci: ConfidenceInterval
    signs: SignCounts
    wilcoxon: WilcoxonResult
    noninferiority: NonInferiority
    mde: float
    """Minimum detectable effect at (alpha, power) with these n and sd."""
    pairs_needed: int | None
    """Pairs needed to resolve the margin at the observed sd (None when the margin is 0 or unreachable)."""
    underpowered: bool
    """True when ``mde`` exceeds the margin: this sample cannot tell a regression of the margin's size from noise."""
    mcnemar: McNemarResult | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def summarize_deltas(
    deltas,
    margin: float,
    *,
    binary: bool = False,
    confidence: float = DEFAULT_CONFIDENCE,
    power: float = DEFAULT_POWER,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> DeltaSummary:
    """All per-metric statistics of oriented deltas against non-inferiority margin ``margin`` (needs n >= 2)."""
    d = _as_finite_1d(deltas, "deltas")
    if d.size < 2:
        raise StatsInputError(f"need at least 2 pairs for paired statistics, got {d.size}")
    ci = mean_ci(d, confidence=confidence, n_resamples=n_resamples, seed=seed)
    ni = noninferiority(d, margin, ci=ci)
    sd = float(d.std(ddof=1))
    alpha_one_sided = (1 - confidence) / 2
    mde = minimum_detectable_effect(sd, int(d.size), alpha=alpha_one_sided, power=power)
    needed = pairs_needed(sd, margin, alpha=alpha_one_sided, power=power) if margin > 0 else None
    notes = [n for n in (ci.note,) if n]
    return DeltaSummary(
        n=int(d.size),
        mean=float(d.mean()),
        sd=sd,
        ci=ci,
        signs=sign_counts(d),
        wilcoxon=wilcoxon_signed_rank(d),
        noninferiority=ni,
        mde=mde,
        pairs_needed=needed,
        underpowered=bool(mde > margin),
        mcnemar=mcnemar_exact(d) if binary else None,
        notes=notes,
    )


# -- run-level test of per-pair p-values (ghosting, issue 19) ---------------------------------------------------------
@dataclass(frozen=True)
class RunTest:
    """Benjamini-Hochberg over a run's per-pair p-values."""

    fail: bool
    """True when at least one pair is a discovery: the run FAILs."""
    fdr: float
    """The false-discovery rate q the discoveries are controlled at."""
    n: int
    discoveries: list[int]
    """Indices (input order) of the pairs rejected by Benjamini-Hochberg at ``fdr``."""
    run_p_value: float
    """Simes' combined p-value ``min_i n p_(i) / i`` (1.0 for no pairs): the run FAILs exactly when it is <= fdr."""


def ghost_run_test(pvalues: Sequence[float], fdr: float = 0.01) -> RunTest:
    """Decide a run from its pairs' p-values (each against the benign null, e.g. the ghosting gate's
    ``ghost_p_value``): Benjamini-Hochberg at false-discovery rate ``fdr``; the run FAILs when any pair is a
    discovery. Under the all-benign null this is Simes' test, so a benign run FAILs with probability at most ``fdr``
    for independent or positively dependent p-values (family-wise at the run level); when pairs do carry a defect,
    the discoveries are the pairs named, with the expected share of benign ones among them at most ``fdr``."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1:
        raise StatsInputError(f"p-values: expected a 1-D sequence, got shape {p.shape}")
    if (~np.isfinite(p)).any() or (p < 0).any() or (p > 1).any():
        raise StatsInputError(f"p-values must be finite and in [0, 1], got {p.tolist()}")
    if not 0 < fdr < 1:
        raise StatsInputError(f"fdr must be in (0, 1), got {fdr}")
    n = int(p.size)
    if n == 0:
        return RunTest(False, fdr, 0, [], 1.0)
    order = np.argsort(p, kind="stable")
    ranked = p[order]
    below = np.flatnonzero(ranked <= fdr * np.arange(1, n + 1) / n)
    discoveries = sorted(order[: below[-1] + 1].tolist()) if below.size else []
    run_p = float(min(1.0, np.min(n * ranked / np.arange(1, n + 1))))
    return RunTest(bool(discoveries), fdr, n, discoveries, run_p)
