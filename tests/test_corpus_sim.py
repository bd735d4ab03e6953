"""bench/sequential/corpus_sim.py's pure functions (issue 53): the predicted risk of an interim PASS against a Monte
Carlo of its predictive model and a numerical integral, and the requests a run spends, by hand."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import integrate, special
from scipy.stats import beta, norm

HERE = str(Path(__file__).resolve().parent.parent / "bench" / "sequential")


@pytest.fixture(scope="module")
def cs():
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    return importlib.import_module("corpus_sim")


def _metric(compare="sides", mean=0.0, sd=1.0, n=16, threshold=1.0, shift=None, stats=None, n_pairs=16):
    return SimpleNamespace(required=True, compare=compare, threshold=threshold, regression_shift=shift,
                           n_pairs=n_pairs, stats=stats if stats is not None else {"mean": mean, "sd": sd, "n": n})


def _verdict(*metrics, top=None):
    return SimpleNamespace(gates=[SimpleNamespace(required=True, metrics=list(metrics))], against_baseline=top)


def _monte_carlo(mean, sd, k, n_max, limit, draws=400_000, seed=0):
    """The flat-prior predictive model drawn: the true mean around the observed one, the remaining pairs' mean
    around the true one, the final mean their weighted sum; the share at or below ``limit``."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(mean, sd / math.sqrt(k), draws)
    rest = rng.normal(mu, sd / math.sqrt(n_max - k))
    final = (k * mean + (n_max - k) * rest) / n_max
    return float(np.mean(final <= limit))


@pytest.mark.parametrize("mean,sd,k,margin,shift", [(0.2, 1.0, 16, 1.0, 0.5), (-0.3, 0.5, 8, 0.6, 0.2),
                                                    (0.05, 0.2, 16, 0.3, 0.01)])
def test_pass_risk_matches_a_monte_carlo_of_its_predictive_model(cs, mean, sd, k, margin, shift):
    n_max, conf, reg = 32, 0.95, 0.01
    got = cs.pass_risk(_verdict(_metric(mean=mean, sd=sd, n=k, threshold=margin, shift=shift)), k, n_max, conf, reg)
    se = sd / math.sqrt(n_max)
    ni_limit = -margin + norm.isf((1 - conf) / 2) * se
    reg_limit = min(-shift, -norm.isf(reg) * se)
    expected = _monte_carlo(mean, sd, k, n_max, ni_limit) + _monte_carlo(mean, sd, k, n_max, reg_limit, seed=1)
    assert got == pytest.approx(expected, abs=4e-3)


def test_pass_risk_sums_metrics_and_the_ladder_top_and_refuses_what_it_cannot_predict(cs):
    a = _metric(mean=0.2, sd=1.0, threshold=1.0)
    b = _metric(compare="pair", mean=0.1, sd=0.3, threshold=0.5)  # a pair metric: margin 0 on its room
    alone = [cs.pass_risk(_verdict(m), 16, 32, 0.95) for m in (a, b)]
    assert cs.pass_risk(_verdict(a, top=_verdict(b)), 16, 32, 0.95) == pytest.approx(sum(alone), rel=1e-12)
    w = 0.3 * math.sqrt(16 / (32 * 16))
    assert alone[1] == pytest.approx(norm.cdf((1.96 * 0.3 / math.sqrt(32) - 0.1) / w), rel=1e-3)
    assert cs.pass_risk(_verdict(_metric(stats={})), 16, 32, 0.95) is None  # no statistics: never curtails
    assert cs.pass_risk(_verdict(_metric(mean=float("nan"))), 16, 32, 0.95) is None
    # at the last look nothing is left to predict: beyond the limit or not
    assert cs.pass_risk(_verdict(_metric(mean=0.5, sd=1.0, n=32, threshold=1.0)), 32, 32, 0.95) == 0.0


@pytest.mark.parametrize("f,n,limit,n_max", [(0, 16, 1, 32), (1, 16, 1, 32), (2, 8, 3, 32), (0, 4, 0, 32)])
def test_flag_risk_matches_an_integral_over_the_jeffreys_posterior(cs, f, n, limit, n_max):
    rest = n_max - n
    a, b = f + 0.5, n - f + 0.5

    def more_than(p):  # P(more than limit - f flags among rest pairs | rate p)
        return sum(special.comb(rest, j) * p ** j * (1 - p) ** (rest - j) for j in range(limit - f + 1, rest + 1))

    expected = integrate.quad(lambda p: more_than(p) * beta.pdf(p, a, b), 0, 1, limit=200)[0]
    stats = {"candidate_flagged": f, "max_flagged_pairs": limit}
    assert cs._flag_risk(stats, n, n_max) == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert cs._flag_risk({"candidate_flagged": limit + 1, "max_flagged_pairs": limit}, n, n_max) == 1.0
    assert cs._flag_risk({"candidate_flagged": None, "max_flagged_pairs": limit}, n, n_max) is None


def test_requests_count_each_parent_until_its_last_rung_stops(cs):
    parent = {"a": "base", "b": "a", "c": "b", "d": "base"}
    stops = {"a": ["FAIL", 8], "b": ["PASS", 16], "c": ["FAIL", 32], "d": ["PASS", 4]}
    # a and b run on to 32 for c; the baseline to the last stop (32)
    assert cs.requests(stops, parent, "base") == 32 + 32 + 32 + 4 + 32
    stops["c"] = ["FAIL", 4]
    assert cs.requests(stops, parent, "base") == 16 + 16 + 4 + 4 + 16
