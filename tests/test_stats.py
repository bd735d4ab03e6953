"""h3eval.stats against scipy / statsmodels and against slow, readable loops of each definition."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
# statsmodels is a test dependency (the reference implementation); a missing one fails, never skips.
import statsmodels.stats.contingency_tables as sm_contingency
import statsmodels.stats.multitest as sm_multitest
import statsmodels.stats.power as sm_power
import statsmodels.stats.weightstats as sm_weightstats
from scipy import stats as sps

from h3eval import stats as S


# -- slow reference loops ------------------------------------------------------------------------------------------
def slow_bca(pairs: list[tuple[float, ...]], statistic, confidence: float, n_resamples: int, seed: int):
    """BCa interval written out as in Efron (1987): bias correction z0 from the bootstrap distribution,
    acceleration from the jackknife, then adjusted percentiles. Resamples are drawn pair by pair."""
    rng = np.random.default_rng(seed)
    n = len(pairs)
    theta_hat = statistic(pairs)
    boot = []
    for _ in range(n_resamples):
        resample = [pairs[rng.integers(n)] for _ in range(n)]
        boot.append(statistic(resample))
    boot = np.array(boot)
    z0 = sps.norm.ppf(np.mean(boot < theta_hat))
    jack = np.array([statistic(pairs[:i] + pairs[i + 1 :]) for i in range(n)])
    jm = jack.mean()
    a = np.sum((jm - jack) ** 3) / (6.0 * np.sum((jm - jack) ** 2) ** 1.5)
    alpha = (1 - confidence) / 2
    out = []
    for q in (alpha, 1 - alpha):
        zq = sps.norm.ppf(q)
        adj = sps.norm.cdf(z0 + (z0 + zq) / (1 - a * (z0 + zq)))
        out.append(np.quantile(boot, adj))
    return out


def slow_wilcoxon_exact_p(deltas: list[float]) -> float:
    """Two-sided exact p: enumerate every sign assignment of the mid-ranks of the non-zero |deltas|."""
    nz = [d for d in deltas if d != 0]
    mags = [abs(d) for d in nz]
    ranks = []
    for m in mags:  # mid-rank: average position of all equal magnitudes
        smaller = sum(1 for x in mags if x < m)
        equal = sum(1 for x in mags if x == m)
        ranks.append(smaller + (equal + 1) / 2)
    observed = sum(r for r, d in zip(ranks, nz) if d > 0)
    centre = sum(ranks) / 2
    extreme = 0
    total = 0
    for signs in itertools.product((0, 1), repeat=len(nz)):
        w = sum(r for r, s in zip(ranks, signs) if s)
        total += 1
        if abs(w - centre) >= abs(observed - centre) - 1e-12:
            extreme += 1
    return extreme / total


def slow_holm(pvalues: list[float]) -> list[float]:
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


# -- deltas and signs ----------------------------------------------------------------------------------------------
def test_oriented_deltas_follow_declared_direction():
    cand = [0.9, 0.8, 0.7]
    base = [0.8, 0.8, 0.9]
    np.testing.assert_allclose(S.oriented_deltas(cand, base, higher_is_better=True), [0.1, 0.0, -0.2], atol=1e-15)
    # LPIPS-like: lower is better, so a larger candidate value is a negative (worse) delta.
    np.testing.assert_allclose(S.oriented_deltas(cand, base, higher_is_better=False), [-0.1, 0.0, 0.2], atol=1e-15)
    np.testing.assert_allclose(S.orient([0.5, -0.25], higher_is_better=False), [-0.5, 0.25])


def test_oriented_deltas_reject_nan_and_mismatch():
    with pytest.raises(S.StatsInputError, match="non-finite value.*index \\[1\\]"):
        S.oriented_deltas([1.0, float("nan")], [1.0, 1.0], True)
    with pytest.raises(S.StatsInputError, match="pairs must match"):
        S.oriented_deltas([1.0, 2.0], [1.0], True)


def test_sign_counts_match_loop():
    rng = np.random.default_rng(0)
    d = np.round(rng.normal(size=40), 1)
    counts = S.sign_counts(d)
    assert (counts.better, counts.worse, counts.tied) == (
        sum(1 for x in d if x > 0),
        sum(1 for x in d if x < 0),
        sum(1 for x in d if x == 0),
    )
    assert S.sign_counts([-1.0] * 14 + [0.5, 0.0]).describe() == "better on 1, worse on 14, tied on 1 of 16"


# -- bootstrap -----------------------------------------------------------------------------------------------------
def test_mean_ci_matches_slow_bca_loop():
    rng = np.random.default_rng(1)
    d = rng.normal(-0.3, 1.0, size=16) ** 3  # skewed, where BCa differs from percentile
    ci = S.mean_ci(d, confidence=0.95, n_resamples=20000, seed=3)
    low, high = slow_bca([(x,) for x in d], lambda ps: float(np.mean([p[0] for p in ps])), 0.95, 20000, seed=11)
    width = high - low
    assert ci.method == "BCa"
    assert ci.estimate == pytest.approx(float(np.mean(d)), abs=1e-15)
    # Two independent Monte-Carlo runs of the same definition: endpoints agree to a few % of the width.
    assert abs(ci.low - low) < 0.05 * width
    assert abs(ci.high - high) < 0.05 * width


def test_mean_ci_equals_scipy_bca():
    d = np.array([0.3, -0.1, 0.25, 0.4, 0.05, -0.2, 0.6, 0.1])
    ci = S.mean_ci(d, n_resamples=5000, seed=7)
    ref = sps.bootstrap((d,), np.mean, method="BCa", n_resamples=5000, rng=np.random.default_rng(7))
    assert (ci.low, ci.high) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), rel=1e-12)


def test_mean_ci_all_equal_is_degenerate_not_nan():
    ci = S.mean_ci([0.0] * 8)
    assert (ci.low, ci.estimate, ci.high, ci.method) == (0.0, 0.0, 0.0, "degenerate")
    with pytest.raises(S.StatsInputError, match="at least 2 pairs"):
        S.mean_ci([0.1])


# -- Wilcoxon ------------------------------------------------------------------------------------------------------
def test_wilcoxon_matches_scipy_without_ties():
    rng = np.random.default_rng(2)
    d = rng.normal(0.4, 1.0, size=30)
    ours = S.wilcoxon_signed_rank(d)
    ref = sps.wilcoxon(d, method="exact")
    assert ours.method == "exact"
    assert ours.pvalue == pytest.approx(ref.pvalue, rel=1e-12)
    assert min(ours.w_plus, ours.w_minus) == pytest.approx(ref.statistic)
    assert ours.w_plus + ours.w_minus == pytest.approx(30 * 31 / 2)


def test_wilcoxon_ties_and_zeros_match_slow_enumeration():
    d = [1.0, -2.0, 2.0, 3.0, -1.0, 4.0, 5.0, 2.0, 0.0, 0.0]
    ours = S.wilcoxon_signed_rank(d)
    assert ours.n_zero == 2 and ours.n_nonzero == 8
    assert ours.pvalue == pytest.approx(slow_wilcoxon_exact_p(d), rel=1e-12)
    ref = sps.wilcoxon([x for x in d if x != 0], method=sps.PermutationMethod(n_resamples=np.inf))
    assert ours.pvalue == pytest.approx(ref.pvalue, rel=1e-12)
    one_sided = S.wilcoxon_signed_rank(d, alternative="greater")
    exact = sps.PermutationMethod(n_resamples=np.inf)
    ref1 = sps.wilcoxon([x for x in d if x != 0], alternative="greater", method=exact)
    assert one_sided.pvalue == pytest.approx(ref1.pvalue, rel=1e-12)
    # w_plus by hand: |d| mid-ranks 1.5,4,4,6,1.5,7,8,4 -> positives 1.5+4+6+7+8+4
    assert ours.w_plus == pytest.approx(30.5)


def test_wilcoxon_all_zero_is_explicit():
    res = S.wilcoxon_signed_rank([0.0] * 6)
    assert (res.pvalue, res.n_nonzero, res.method) == (1.0, 0, "none")
    assert "all deltas are zero" in res.note


def test_wilcoxon_large_n_uses_tie_corrected_normal_approx():
    rng = np.random.default_rng(3)
    d = np.round(rng.normal(0.2, 1, size=80), 1)
    ours = S.wilcoxon_signed_rank(d)
    ref = sps.wilcoxon(d[d != 0], method="approx")
    assert ours.method == "approx"
    assert ours.pvalue == pytest.approx(ref.pvalue, rel=1e-12)


def test_wilcoxon_worse_on_every_clip():
    # Seed 002: overall consistency dropped on every eligible clip of 16.
    res = S.wilcoxon_signed_rank(-np.linspace(0.1, 1.6, 16), alternative="less")
    assert res.pvalue == pytest.approx(0.5**16)


# -- McNemar -------------------------------------------------------------------------------------------------------
def test_mcnemar_exact_matches_statsmodels():
    base = np.array([1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1])
    cand = np.array([1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1])
    d = S.oriented_deltas(S.check_binary(cand, "c"), S.check_binary(base, "b"), higher_is_better=True)
    ours = S.mcnemar_exact(d)
    table = [[np.sum((base == i) & (cand == j)) for j in (0, 1)] for i in (0, 1)]
    ref = sm_contingency.mcnemar(table, exact=True)
    assert (ours.improved, ours.regressed, ours.concordant) == (1, 6, 9)
    assert ours.pvalue == pytest.approx(ref.pvalue, rel=1e-12)


def test_mcnemar_rejects_non_binary_and_handles_no_discordance():
    with pytest.raises(S.StatsInputError, match="0/1"):
        S.mcnemar_exact([0.5, 0.0])
    with pytest.raises(S.StatsInputError, match="values other than 0 and 1"):
        S.check_binary([0, 1, 2], "dynamic_degree")
    assert S.mcnemar_exact([0.0, 0.0, 0.0]).pvalue == 1.0


# -- non-inferiority -----------------------------------------------------------------------------------------------
def test_noninferiority_pvalues_match_statsmodels():
    rng = np.random.default_rng(4)
    base = rng.normal(0.7, 0.05, size=16)
    cand = base + rng.normal(-0.004, 0.01, size=16)
    d = S.oriented_deltas(cand, base, True)
    ni = S.noninferiority(d, 0.01, n_resamples=4000)
    ref_t = sm_weightstats.DescrStatsW(d).ttest_mean(value=-0.01, alternative="larger")
    assert ni.p_value == pytest.approx(ref_t[1], rel=1e-10)
    ref_tost = sm_weightstats.ttost_paired(cand, base, -0.01, 0.01)
    assert ni.tost_p == pytest.approx(ref_tost[0], rel=1e-10)
    assert ni.holds == (ni.ci.low > -0.01)


def test_noninferiority_planted_regression_fails_and_small_shift_passes():
    rng = np.random.default_rng(5)
    noise = rng.normal(0, 0.004, size=16)
    bad = S.noninferiority(-0.05 + noise, 0.01, n_resamples=4000)
    assert not bad.holds and bad.ci.high < -0.01
    ok = S.noninferiority(-0.002 + noise, 0.01, n_resamples=4000)
    assert ok.holds and ok.ci.low > -0.01
    with pytest.raises(S.StatsInputError, match="margin"):
        S.noninferiority(noise, -0.1)


def test_noninferiority_identical_outputs():
    ni = S.noninferiority([0.0] * 8, 0.01)
    assert ni.holds and ni.p_value == 0.0 and ni.ci.method == "degenerate"


# -- Holm ----------------------------------------------------------------------------------------------------------
def test_holm_matches_statsmodels_and_loop():
    p = [0.01, 0.04, 0.03, 0.005, 0.2, 0.04]
    ours = S.holm(p)
    ref = sm_multitest.multipletests(p, method="holm")[1]
    np.testing.assert_allclose(ours, ref, rtol=1e-12)
    np.testing.assert_allclose(ours, slow_holm(p), rtol=1e-12)
    assert S.holm([]) == []
    with pytest.raises(S.StatsInputError):
        S.holm([0.1, float("nan")])


# -- power ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [4, 8, 16, 40])
def test_mde_matches_statsmodels(n):
    sd = 0.02
    ours = S.minimum_detectable_effect(sd, n, alpha=0.025, power=0.8)
    es = sm_power.TTestPower().solve_power(nobs=n, alpha=0.025, power=0.8, alternative="larger")
    # statsmodels' root finder stops at ~1e-6 relative; its power function at our MDE is the sharper check.
    assert ours == pytest.approx(es * sd, rel=1e-5)
    power = sm_power.TTestPower().power(effect_size=ours / sd, nobs=n, alpha=0.025, alternative="larger")
    assert power == pytest.approx(0.8, abs=1e-9)


@pytest.mark.parametrize("n, alpha", [(2, 1e-8), (3, 1e-8), (2, 1e-6)])
def test_mde_is_infinite_where_no_effect_reaches_the_power(n, alpha):
    """A sequential design's first look can judge 2-3 usable pairs at alpha 1e-8: statsmodels' own power at the
    largest effect searched is below 0.8 there, so no effect is detectable (the root search used to raise)."""
    top = sm_power.TTestPower().power(effect_size=S.MAX_EFFECT_SIZE, nobs=n, alpha=alpha, alternative="larger")
    assert top < 0.8
    assert S.minimum_detectable_effect(0.02, n, alpha=alpha, power=0.8) == math.inf
    s = S.summarize_deltas(np.array([0.01, -0.02, 0.015][:n]), 0.05, confidence=1 - 2 * alpha, power=0.8,
                           n_resamples=199)
    assert s.mde == math.inf and s.underpowered


def test_pairs_needed_matches_loop():
    sd, effect = 0.02, 0.01
    n = S.pairs_needed(sd, effect, alpha=0.025, power=0.8)
    loop_n = next(k for k in range(2, 1000) if S.minimum_detectable_effect(sd, k, alpha=0.025, power=0.8) <= effect)
    assert n == loop_n
    # Normal approximation (z_{.975} + z_{.8})^2 (sd/effect)^2 ~ 31.4; the t-test needs a little more.
    assert 32 <= n <= 36


def test_summary_flags_underpowered_small_sample():
    rng = np.random.default_rng(6)
    d = rng.normal(0.0, 0.05, size=4)
    s = S.summarize_deltas(d, 0.01, n_resamples=2000)
    assert s.underpowered and s.mde > 0.01 and s.pairs_needed > 4
    assert s.signs.n == 4 and s.mean == pytest.approx(float(np.mean(d)))
    assert s.sd == pytest.approx(float(np.std(d, ddof=1)))


# -- speed ---------------------------------------------------------------------------------------------------------
def test_speedup_matches_loop_definitions():
    rng = np.random.default_rng(7)
    base = rng.uniform(70, 90, size=12)
    cand = base / rng.uniform(1.8, 2.2, size=12)
    res = S.speedup(base, cand, n_resamples=20000, seed=1)
    assert res.ci.estimate == pytest.approx(sum(base) / sum(cand), rel=1e-12)
    ratios = [b / c for b, c in zip(base, cand)]
    assert res.geometric_mean_ratio == pytest.approx(math.prod(ratios) ** (1 / len(ratios)), rel=1e-12)
    assert res.faster == 12
    low, high = slow_bca(
        list(zip(base, cand)),
        lambda ps: sum(p[0] for p in ps) / sum(p[1] for p in ps),
        0.95,
        20000,
        seed=2,
    )
    width = high - low
    assert abs(res.ci.low - low) < 0.05 * width and abs(res.ci.high - high) < 0.05 * width
    with pytest.raises(S.StatsInputError, match="> 0"):
        S.speedup([1.0, 0.0], [1.0, 1.0])


def test_speedup_constant_ratio_gives_point_interval_not_nan():
    # Every request exactly twice as fast: BCa is undefined (no spread); the percentile interval is the point.
    base = np.array([2.0, 3.0, 4.0, 5.0])
    res = S.speedup(base, base / 2, n_resamples=2000)
    assert (res.ci.low, res.ci.estimate, res.ci.high) == pytest.approx((2.0, 2.0, 2.0), rel=1e-12)
    assert res.ci.method == "percentile" and "BCa undefined" in res.ci.note


def slow_binomial_two_sided_p(k: int, n: int) -> float:
    """Exact two-sided binomial p at 1/2: the probability of outcomes no more likely than the one observed."""
    probs = [math.comb(n, i) / 2**n for i in range(n + 1)]
    return min(1.0, sum(p for p in probs if p <= probs[k] * (1 + 1e-12)))


def test_mcnemar_matches_slow_binomial_loop():
    for improved, regressed in [(0, 5), (2, 9), (7, 7), (1, 0)]:
        d = [1.0] * improved + [-1.0] * regressed + [0.0] * 4
        assert S.mcnemar_exact(d).pvalue == pytest.approx(slow_binomial_two_sided_p(improved, improved + regressed))


def test_noninferiority_p_matches_hand_written_t_test():
    d = [0.004, -0.012, 0.001, -0.003, 0.0, -0.007, 0.002, -0.001, -0.004, 0.003]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))  # ddof = 1, stated
    t_stat = (mean + 0.01) / (sd / math.sqrt(n))
    ni = S.noninferiority(d, 0.01, n_resamples=2000)
    assert ni.p_value == pytest.approx(sps.t.sf(t_stat, n - 1), rel=1e-12)
    t_upper = (mean - 0.01) / (sd / math.sqrt(n))
    assert ni.tost_p == pytest.approx(max(sps.t.sf(t_stat, n - 1), sps.t.cdf(t_upper, n - 1)), rel=1e-12)
