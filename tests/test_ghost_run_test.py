"""Run-level error control of the ghosting gate (issue 19): Benjamini-Hochberg over the pairs' p-values decides the
run; a benign run does not FAIL on one marginal pair, a ghosted pair is named, a NaN never passes."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import statsmodels.stats.multitest as sm_multitest  # test dependency: the reference Benjamini-Hochberg

from h3eval import stats as S
from h3eval.policy import PolicyError, load_policy, parse_policy
from h3eval.verdict import compute_verdict

from test_policy_verdict import POLICIES
from verdict_fixtures import make_run, pairs_of, write_result, write_text

TODAY = dt.date(2026, 11, 29)


def readable_bh(p, q):
    """Benjamini-Hochberg by its definition: the largest k with p_(k) <= k q / n; reject the k smallest."""
    n = len(p)
    order = sorted(range(n), key=lambda i: (p[i], i))
    k = 0
    for rank, i in enumerate(order, start=1):
        if p[i] <= rank * q / n:
            k = rank
    return sorted(order[:k])


@pytest.mark.parametrize("seed", range(6))
def test_run_test_equals_statsmodels_and_the_definition(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 70))
    p = rng.uniform(0, 1, n) ** rng.uniform(0.5, 6)  # from near-uniform to many small p-values
    q = float(rng.choice([0.01, 0.05, 0.2]))
    res = S.ghost_run_test(p, q)
    reject, *_ = sm_multitest.multipletests(p, alpha=q, method="fdr_bh")
    assert res.discoveries == np.flatnonzero(reject).tolist() == readable_bh(p.tolist(), q)
    assert res.fail == bool(reject.any()) and res.n == n and res.fdr == q
    simes = min(1.0, min(n * x / (i + 1) for i, x in enumerate(sorted(p))))
    assert res.run_p_value == pytest.approx(simes, rel=1e-12)
    assert res.fail == (res.run_p_value <= q)  # BH finds a discovery exactly when Simes' test rejects


def test_run_test_single_strong_pair_and_many_weak_pairs():
    # One pair at 1e-5 among 63 benign ones: a discovery at FDR 1% (1e-5 <= 0.01 / 64).
    p = np.r_[np.linspace(0.05, 1.0, 63), 1e-5]
    res = S.ghost_run_test(p, 0.01)
    assert res.fail and res.discoveries == [63]
    # Sixteen pairs each at p = 0.009: no single one passes Bonferroni (0.01 / 16), all are BH discoveries.
    res = S.ghost_run_test([0.009] * 16, 0.01)
    assert res.fail and res.discoveries == list(range(16))
    # One marginal pair (p = 0.002) among 16 benign: not a discovery (0.002 > 0.01 / 16): the run does not FAIL.
    res = S.ghost_run_test(np.r_[np.linspace(0.1, 1.0, 15), 0.002], 0.01)
    assert not res.fail and res.discoveries == []
    assert S.ghost_run_test([], 0.01) == S.RunTest(False, 0.01, 0, [], 1.0)


@pytest.mark.parametrize("bad", [[0.5, float("nan")], [0.5, 1.2], [-0.1], [[0.1, 0.2]]])
def test_run_test_rejects_bad_p_values(bad):
    with pytest.raises(S.StatsInputError):
        S.ghost_run_test(bad, 0.01)
    with pytest.raises(S.StatsInputError):
        S.ghost_run_test([0.5], 1.0)


def test_benign_false_fail_rate_is_at_most_the_fdr_by_simulation():
    """Uniform p-values (the benign null): runs of 16 pairs FAIL about fdr of the time; 20000 runs, binomial bound."""
    rng = np.random.default_rng(0)
    fails = sum(S.ghost_run_test(rng.uniform(0, 1, 16), 0.05).fail for _ in range(20000))
    assert 0.045 <= fails / 20000 <= 0.055  # Simes under independence: exactly 5%


RUN_POLICY = """
version = 1
name = "ghost"
min_pairs = 8

[gates.ghosting]
run_test = { metric = "ghost_p_value", fdr = 0.01 }
"""


@pytest.fixture
def ghost_run(tmp_path):
    store = make_run(tmp_path / "run")
    policy = load_policy(write_text(tmp_path / "ghost.toml", RUN_POLICY))
    return store, policy


def _write(store, values, flagged=()):
    for i, (pid, seed) in enumerate(pairs_of(store)):
        write_result(store, "ghosting", "fast", pid, seed, {"ghost_p_value": (values[i], True)},
                     flagged=pid in flagged)


def _ghost_gate(verdict):
    return next(g for g in verdict.candidates[0].gates if g.gate == "ghosting")


def test_verdict_passes_a_benign_run_even_with_a_flag_and_fails_a_ghosted_pair(ghost_run):
    store, policy = ghost_run
    benign = np.linspace(0.003, 1.0, 16).tolist()  # the smallest, 0.003, is not a discovery at 1% over 16 pairs
    _write(store, benign, flagged={"p00"})  # a pair's own flag no longer fails the run
    v = compute_verdict(store.root, policy, today=TODAY)
    g = _ghost_gate(v)
    assert v.outcome == "PASS" and g.outcome == "PASS" and g.flagged == []
    assert "no discovery" in g.reasons[0] and "16 pairs" in g.reasons[0]
    ghosted = list(benign)
    ghosted[5] = 1e-6
    _write(store, ghosted)
    v = compute_verdict(store.root, policy, today=TODAY)
    g = _ghost_gate(v)
    assert v.outcome == "FAIL" and g.outcome == "FAIL"
    assert g.flagged == ["p05-s0 (p 1e-06)"] and "1 pair(s) are discoveries" in g.reasons[0]
    assert g.evidence[-1] == "gates/ghosting/fast/p05-s0.json"


@pytest.mark.parametrize("bad", [None, float("nan"), 1.5])
def test_verdict_never_passes_a_missing_or_invalid_p_value(ghost_run, bad):
    store, policy = ghost_run
    values = np.linspace(0.1, 1.0, 16).tolist()
    values[3] = bad
    _write(store, values)
    g = _ghost_gate(compute_verdict(store.root, policy, today=TODAY))
    assert g.outcome == "INCONCLUSIVE" and "p03-s0" in g.reasons[0]


def test_shipped_release_policy_decides_ghosting_per_run():
    release = load_policy(POLICIES / "release.toml").policy
    ghosting = release.judges["near"].gates["ghosting"]
    assert ghosting.max_flagged is None
    assert ghosting.run_test.metric == "ghost_p_value" and ghosting.run_test.fdr == 0.01
    with pytest.raises(PolicyError, match="fdr"):
        parse_policy({"version": 1, "name": "x", "gates": {"g": {"run_test": {"metric": "p", "fdr": 1.5}}}})
