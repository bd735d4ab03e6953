"""The calibration's run simulation over production pairs (bench/ghosting/ghosting_calibration.py): the run-level rates in
ghosting_calibration.md come from it, so check it against probabilities worked out by hand for Benjamini-Hochberg."""
import numpy as np
from scipy import stats

from bench.lib.ghosting import simulate_pair_runs


def test_one_ghosted_pair_among_benign_fails_as_often_as_its_p_clears_the_first_bh_step():
    # 16 pairs, one ghosted: benign pairs at p = 1 are never discoveries, so the run FAILs exactly when the ghosted
    # pair's p is <= q / 16 = 0.000625; half of the ghosted pool is below that.
    benign = np.array([1.0])
    ghost = np.array([0.0005, 0.0007])
    out = simulate_pair_runs(benign, ghost, 16, 1, 4000, seed=3, q=0.01)
    assert out["n"] == 4000
    # a two-sided binomial test of the simulated count against p = 0.5
    assert stats.binomtest(out["k"], out["n"], 0.5).pvalue > 1e-4
    lo, hi = out["ci95"]
    assert lo < 0.5 < hi


def test_every_pair_ghosted_uses_the_step_up_rule():
    # 16 ghosted pairs, all at p = 0.009: BH rejects all of them (0.009 <= 0.01 * 16 / 16) though none clears the
    # first step (0.000625); at p = 0.011 none is rejected.
    benign = np.array([1.0])
    fail = simulate_pair_runs(benign, np.array([0.009]), 16, 16, 200, seed=1, q=0.01)
    keep = simulate_pair_runs(benign, np.array([0.011]), 16, 16, 200, seed=1, q=0.01)
    assert (fail["k"], keep["k"]) == (200, 0)


def test_benign_runs_from_uniform_p_values_fail_at_about_q():
    # Independent uniform p-values under the null: Simes' test FAILs with probability exactly q.
    benign = np.random.default_rng(0).uniform(size=20000)
    out = simulate_pair_runs(benign, np.array([1.0]), 16, 0, 4000, seed=5, q=0.05)
    assert stats.binomtest(out["k"], out["n"], 0.05).pvalue > 1e-4


def test_the_null_tail_is_the_exponential_fit_and_refuses_a_degenerate_null():
    """fit_tail against its closed form (the 90th percentile, the share above it, the chi-square upper bound of the
    exponential mean excess); a benign null that is all zeros (every window's evidence removed, as the copy-share
    rule does to the tested evidence) or holds a NaN has no tail: one clear error, never a NaN scale."""
    import pytest

    from bench.lib.ghosting import fit_tail

    ev = np.random.default_rng(5).exponential(0.01, 200)
    t = fit_tail(ev)
    u = np.quantile(ev, 0.9)
    excess = ev[ev > u] - u
    upper = 2 * excess.size * excess.mean() / stats.chi2.ppf(0.025, 2 * excess.size)
    assert (t["u"], t["p_u"], t["scale"]) == (round(u, 5), round(excess.size / 200, 5), round(upper, 5))
    with pytest.raises(ValueError, match="no exponential tail"):
        fit_tail(np.zeros(185))
    with pytest.raises(ValueError, match="no exponential tail"):
        fit_tail(np.r_[ev, np.nan])
