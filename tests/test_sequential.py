"""Issue 53: the group-sequential design's pure parts (h3eval/sequential.py) against references."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from h3eval import sequential as Q

FIVE = [0.2, 0.4, 0.6, 0.8, 1.0]


def test_obrien_fleming_boundaries_match_the_literature():
    # Lan-DeMets O'Brien-Fleming spending, 5 equally spaced looks, alpha 0.025 one-sided: the boundaries tabulated by
    # Reboussin et al. (ld98 / R ldbounds) and gsDesign (sfLDOF): 4.8769, 3.3569, 2.6803, 2.2898, 2.0310.
    got = Q.boundaries(FIVE, 0.025, "obrien-fleming")
    assert got == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=2e-4)


def test_pocock_boundaries_match_the_literature():
    # Lan-DeMets Pocock-type spending, 5 equally spaced looks, alpha 0.025 one-sided (ldbounds): 2.4380, 2.4268,
    # 2.4101, 2.3966, 2.3859.
    got = Q.boundaries(FIVE, 0.025, "pocock")
    assert got == pytest.approx([2.4380, 2.4268, 2.4101, 2.3966, 2.3859], abs=2e-4)


def test_one_look_is_the_fixed_test():
    for design in Q.DESIGNS:
        assert Q.boundaries([1.0], 0.025, design) == pytest.approx([norm.isf(0.025)], abs=1e-12)


@pytest.mark.parametrize("design", Q.DESIGNS)
def test_each_look_spends_what_the_function_says(design):
    # An independent float64 computation: the first-crossing probabilities of the boundaries from scipy's
    # multivariate normal CDF (Genz) equal the spending function's increments.
    t = [0.125, 0.25, 0.5, 1.0]
    bounds = Q.boundaries(t, 0.025, design)
    want = np.diff([0.0] + [Q.spent(x, 0.025, design) for x in t])
    got = Q.crossing_probabilities(t, bounds)
    assert got == pytest.approx(want, abs=2e-6)
    assert sum(got) == pytest.approx(0.025, abs=5e-6)


def test_spending_functions_end_at_alpha_and_start_at_zero():
    for design in Q.DESIGNS:
        assert Q.spent(1.0, 0.01, design) == pytest.approx(0.01, rel=1e-12)
        assert Q.spent(0.0, 0.01, design) == 0.0
    # O'Brien-Fleming spends almost nothing early, Pocock about evenly.
    assert Q.spent(0.25, 0.025, "obrien-fleming") < 1e-4 < 0.008 < Q.spent(0.25, 0.025, "pocock")


@pytest.mark.parametrize("design", Q.DESIGNS)
def test_type_one_error_by_simulation(design):
    # Z statistics of 32 N(0, 1) pairs looked at after 4, 8, 16 and 32: the group-sequential test rejects at most
    # alpha of the time; the naive test (1.96 at every look) well above it.
    rng = np.random.default_rng(20261206)
    looks = np.array([4, 8, 16, 32])
    bounds = np.array(Q.boundaries(looks / 32, 0.025, design))
    x = rng.standard_normal((200_000, 32))
    z = np.cumsum(x, axis=1)[:, looks - 1] / np.sqrt(looks)
    rate = (z >= bounds).any(axis=1).mean()
    se = np.sqrt(0.025 * 0.975 / x.shape[0])
    assert abs(rate - 0.025) < 4 * se
    assert (z >= norm.isf(0.025)).any(axis=1).mean() > 0.05


def test_look_pairs_round_to_whole_seeds():
    assert Q.look_pairs(32, 4) == [4, 8, 16, 32]
    assert Q.look_pairs(32, 16) == [16, 32]
    assert Q.look_pairs(16, 4) == [4, 8, 16]
    assert Q.look_pairs(20, 3) == [6, 9, 18, 21]
    assert Q.look_seeds([0, 1, 2, 3], 4, 8) == [0, 1]
    with pytest.raises(Q.SequentialError, match="need 3 seeds"):
        Q.look_seeds([0, 1], 4, 9)


@pytest.mark.parametrize("bad", [dict(max_pairs=1, n_prompts=4), dict(max_pairs=32, n_prompts=0),
                                 dict(max_pairs=32, n_prompts=4, looks=[])])
def test_bad_looks_are_one_clear_error(bad):
    with pytest.raises(Q.SequentialError):
        Q.look_pairs(**bad)


def test_bad_design_input_is_one_clear_error():
    with pytest.raises(Q.SequentialError, match="design must be one of"):
        Q.make_design("haybittle", [4, 8], [0.025])
    with pytest.raises(Q.SequentialError, match="alpha"):
        Q.boundaries([0.5, 1.0], float("nan"), "pocock")
    with pytest.raises(Q.SequentialError, match="increase"):
        Q.boundaries([0.5, 0.5], 0.025, "pocock")


def test_stop_decision():
    assert Q.stop_decision("PASS", 3, 4)[0] and Q.stop_decision("FAIL", 2, 4)[0] and Q.stop_decision("FAIL", 0, 4)[0]
    # The guard on interim PASSes: only a byte-identical candidate's PASS stops before the last look.
    assert Q.stop_decision("PASS", 0, 4, identical=True)[0]
    stop, why = Q.stop_decision("PASS", 0, 4)
    assert not stop and "continues" in why
    assert not Q.stop_decision("INCONCLUSIVE", 0, 4, identical=True)[0]
    assert not Q.stop_decision("INCONCLUSIVE", 2, 4)[0]
    stop, why = Q.stop_decision("INCONCLUSIVE", 3, 4)
    assert stop and "last look" in why
    with pytest.raises(Q.SequentialError):
        Q.stop_decision("MAYBE", 0, 4)
    # A FAIL at a look whose level its pairs cannot reach continues; a byte-identical PASS still stops there.
    stop, why = Q.stop_decision("FAIL", 0, 4, decidable=False)
    assert not stop and "too few pairs" in why
    assert Q.stop_decision("PASS", 0, 4, identical=True, decidable=False)[0]
    assert Q.stop_decision("FAIL", 3, 4, decidable=False)[0]


def test_round_warmups_warm_each_recipe_once_per_process():
    """A recipe generated in an earlier round of this process is not warmed again; one new in this round is; the
    caller's ``warmup_recipes`` still restricts which recipes are ever warmed; ``warmup = 0`` stays off."""
    ab = {"warmup": 1}
    assert Q.round_warmups(ab, set(), ["base", "a", "b"]) == {"warmup_recipes": ["base", "a", "b"]}
    assert Q.round_warmups(ab, {"base", "a", "b"}, ["base", "a"]) == {"warmup": 0, "warmup_recipes": None}
    assert Q.round_warmups(ab, {"base", "a"}, ["base", "a", "c"]) == {"warmup_recipes": ["c"]}
    assert Q.round_warmups({"warmup": 2, "warmup_recipes": ["a", "c"]}, {"a"}, ["base", "a", "c"]) == {
        "warmup_recipes": ["c"]}
    assert Q.round_warmups({"warmup": 1, "warmup_recipes": ["a"]}, set(), ["base"]) == {"warmup": 0,
                                                                                     "warmup_recipes": None}
    assert Q.round_warmups({"warmup": 0}, set(), ["base", "a"]) == {}
    assert Q.round_warmups({}, set(), ["base"]) == {"warmup_recipes": ["base"]}  # h3eval ab's default: one warm-up


def test_resolvable_looks():
    # Looks 4, 8, 16, 32 at alpha 0.025: O'Brien-Fleming's nominal levels 2.3e-10 and 7.4e-6 are below 2**-4 and
    # 2**-8 (and 1/1000); 0.0015 at 16 pairs is above 2**-16 and 1/1000. Pocock's 0.0049 at 4 pairs is below
    # 2**-4 = 0.0625; 0.0053 at 8 above 2**-8 = 0.0039. The last look always decides.
    obf = Q.make_design("obrien-fleming", [4, 8, 16, 32], [0.025])
    poc = Q.make_design("pocock", [4, 8, 16, 32], [0.025])
    assert [Q.resolvable(obf, k, 0.025, 999) for k in range(4)] == [False, False, True, True]
    assert [Q.resolvable(poc, k, 0.025, 999) for k in range(4)] == [False, True, True, True]
    assert 2.0 ** -8 < poc.nominal(0.025, 1) < 2.0 ** -4 and obf.nominal(0.025, 2) > 1 / 1000
    # Too few resamples for the level: 0.0015 is beyond a 499-resample bootstrap's 1/500.
    assert not Q.resolvable(obf, 2, 0.025, 499) and Q.resolvable(obf, 3, 0.025, 499)


def test_look_policy_sets_nominal_levels_and_interim_ci_rule():
    from h3eval.policy import load_policy

    policy = load_policy("gates/policies/release.toml").policy
    design = Q.make_design("pocock", [4, 8, 16, 32], Q.policy_alphas(policy))
    assert Q.policy_alphas(policy) == [0.01, 0.025]
    first = Q.look_policy(policy, design, 0)
    assert (1 - first.confidence) / 2 == pytest.approx(design.nominal(0.025, 0), rel=1e-9)
    assert first.min_pairs == 4
    dd = first.judges["resample"].gates["reference_free"].metrics["dynamic_degree"]
    assert dd.fail_beyond == "ci" and dd.regression.alpha == pytest.approx(design.nominal(0.01, 0))
    last = Q.look_policy(policy, design, 3)
    assert last.judges["resample"].gates["reference_free"].metrics["dynamic_degree"].fail_beyond == "mean"
    assert last.min_pairs == 16
    assert (1 - last.confidence) / 2 < 0.025


def test_look_policy_spends_the_run_test_and_counts_departed_pairs_against_the_last_look():
    """The ghosting run test's FDR is an alpha like the others (at each look its nominal level); a departed-pairs
    share at an interim look FAILs only on more departed pairs than the last look allows (2 of 16 then 4 of 32)."""
    from h3eval.policy import load_policy

    policy = load_policy("gates/policies/release.toml").policy
    fdr = policy.judges["near"].gates["ghosting"].run_test.fdr
    rule = policy.judges["near"].gates["fidelity"].metrics["lpips_mean"].departed
    design = Q.make_design("obrien-fleming", [4, 8, 16, 32], Q.policy_alphas(policy))
    assert round(fdr, 12) in Q.policy_alphas(policy)
    for k, n in enumerate(design.looks):
        look = Q.look_policy(policy, design, k)
        assert look.judges["near"].gates["ghosting"].run_test.fdr == pytest.approx(
            max(1e-8, design.nominal(fdr, k)), rel=1e-12)
        got = look.judges["near"].gates["fidelity"].metrics["lpips_mean"].departed
        # the count a run of n pairs may have at this look, against the policy's own rule at 32 pairs
        assert got.allowed(n) == (min(rule.allowed(32), n - 1) if k < 3 else rule.allowed(n))
    assert design.nominal(fdr, 2) < fdr / 10  # at 16 of 32 pairs O'Brien-Fleming spends a tenth of it at most


# -- the simulation's batched verdict (bench/sequential/batch_verdict.py) against the verdict's own functions ---------
def _bench_sequential():
    import importlib
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent.parent / "bench" / "sequential")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("batch_verdict"), importlib.import_module("sequential_sim")


@pytest.mark.parametrize("n", [4, 8, 16, 32])
def test_batched_statistics_equal_the_verdicts_bit_for_bit(n):
    # Planted deltas with ties (one decimal), zeros, an all-equal row (degenerate CI), a row of one odd pair among
    # equal ones (BCa undefined: the percentile interval): every number equals h3eval.stats' own, bit for bit.
    from h3eval import stats as S

    B, _ = _bench_sequential()
    rng = np.random.default_rng(n)
    d = np.round(rng.normal(-0.1, 1.0, (40, n)), 1)
    d[0], d[1] = 0.3, 0.0
    d[2, :], d[2, 0] = 0.0, -0.5
    low, high = B.bca_rows(d, 0.95, 999, 20261129)
    ref = [S.mean_ci(r, confidence=0.95, n_resamples=999, seed=20261129) for r in d]
    assert {c.method for c in ref} >= {"BCa", "degenerate"}
    assert np.array_equal(low, [c.low for c in ref]) and np.array_equal(high, [c.high for c in ref])
    assert np.array_equal(B.wilcoxon_less_rows(d), [S.wilcoxon_signed_rank(r, "less").pvalue for r in d])
    margin = np.full(d.shape[0], 0.2)
    assert np.array_equal(B.t_p_lower(d, margin), [S._t_pvalues(r, 0.2)[0] for r in d])
    p = rng.random((20, 13))
    p[0, :3] = p[0, 3]  # ties keep their order
    assert np.array_equal(B.holm_rows(p), [S.holm(r) for r in p])


def test_batched_outcomes_equal_decide_on_the_simulated_pools():
    # The simulation's two paths on the same draws: decide() (the verdict's own functions, one verdict at a time) and
    # the batched outcomes, under the fixed policy and an interim look's (tiny nominal levels, FAIL by the whole CI).
    B, sim = _bench_sequential()
    from h3eval.sequential import look_policy, make_design, policy_alphas

    fixed = sim.policy()
    look = look_policy(fixed, make_design("pocock", sim.LOOKS, policy_alphas(fixed)), 1)
    pools = sim.pools()
    rng = np.random.default_rng(53)
    seen = set()
    for name, runs in (("turbo4-tiny", 2), ("bug:lora-half", 3), ("bug:sparse-audio", 3)):
        idx = rng.integers(0, 16, (runs, 16))
        for pol, n in ((fixed, 16), (look, 8)):
            got = sim.judge_batch(pol, pools[name], idx[:, :n])
            want = [sim.decide(pol, pools[name], row[:n]) for row in idx]
            assert list(got) == want, (name, n)
            seen |= set(want)
    assert {"PASS", "FAIL"} <= seen  # the comparison covers both decided outcomes


def test_pairs_used_counts_a_parent_until_its_last_rung_stops():
    """A ladder's parent keeps making clips while a rung built on it runs (they are the rung's reference): counted
    until the rung stops, by hand over three recipes and the baseline."""
    from h3eval.sequential import pairs_used

    state = {"max_pairs": 32, "baseline": "base", "candidates": ["a", "b", "c", "d"],
             "parents": {"b": "a", "c": "b"},
             "stopped": {"a": {"n_pairs": 8}, "b": {"n_pairs": 16}, "c": {"n_pairs": 32}, "d": {"n_pairs": 4}}}
    assert pairs_used(state) == {"a": 32, "b": 32, "c": 32, "d": 4, "base": 32}
    state["stopped"]["c"] = {"n_pairs": 4}
    assert pairs_used(state) == {"a": 16, "b": 16, "c": 4, "d": 4, "base": 16}
    # a record without parents (written before they were kept): each candidate at its own stop
    del state["parents"]
    assert pairs_used(state) == {"a": 8, "b": 16, "c": 4, "d": 4, "base": 16}
    # a candidate that has not stopped counts the design's pairs
    del state["stopped"]["d"]
    assert pairs_used(state)["d"] == 32 and pairs_used(state)["base"] == 32


def test_a_rung_identical_to_its_parent_but_not_the_baseline_waits():
    """A ladder's top is judged against its parent and against the baseline: a rung byte-identical to its parent
    (a step cache that never hits) but not to the baseline stops on a PASS only at the last look (its verdict against
    the baseline is its parent's, which still runs); identical to both it stops at once. corpus_sim_s32: such a rung
    stopped at 16 pairs in 37 of 100 runs and PASSed 12 of them that the fixed 32 FAILed."""
    from types import SimpleNamespace

    from h3eval.sequential import _record_look
    from h3eval.verdict.schema import CandidateVerdict

    design = Q.make_design("obrien-fleming", [4, 8, 16, 32], [0.01, 0.025])
    top = CandidateVerdict(candidate="rung", outcome="PASS", judged_against="base")
    rung = CandidateVerdict(candidate="rung", outcome="PASS", judged_against="parent", against_baseline=top)
    policy = SimpleNamespace(n_resamples=999)

    def look(identical_to: set[str]) -> dict:
        state = {"stopped": {}, "verdicts": {}, "rounds": []}
        verdict = SimpleNamespace(candidates=[rung], model_dump=lambda mode: {})
        _record_look(state, verdict, 2, 4, 16, [0, 1, 2, 3], ["rung"], 0.99, design, 0.025, policy, lambda line: None,
                     lambda cand, against: (against or "base") in identical_to)
        return state

    assert "rung" not in look({"parent"})["stopped"]
    assert look({"parent", "base"})["stopped"]["rung"]["n_pairs"] == 16
    assert "rung" not in look(set())["stopped"]
