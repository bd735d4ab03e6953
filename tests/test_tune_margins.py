"""bench/recipe_signoff/tune_margins.py's selection rule (issue 50, session 26): a correct recipe simulated at the upper
bound of its established worsening (:func:`robust_pairs`), and the smallest min_shift / margin that keeps its FAIL
rate within the target (:func:`choose`), against float64 references on planted data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "recipe_signoff" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


rs = _load("recipe_signoff")
tm = _load("tune_margins")

DIM = {"higher_is_better": True, "margin": {"fraction_of_floor": 1.5, "at_least": 0.0},
       "regression": {"alpha": 0.01, "min_shift": {"fraction_of_floor": 0.1}}}


def test_robust_pairs_moves_only_an_established_worsening_to_the_t_upper_bound():
    rng = np.random.default_rng(7)
    floor = np.array([2.0, 0.5, 0.0])
    w = np.column_stack([rng.normal(0.8, 0.6, 32) * 2.0,  # worse by ~0.4 floor: CI above 0
                         rng.normal(0.0, 1.0, 32) * 0.5,  # benign: CI spans 0
                         np.zeros(32)])  # a score that never moves: floor 0
    ws, added = tm.robust_pairs(w, floor)
    wf = w[:, 0] / floor[0]
    low, high = scipy.stats.t.interval(0.95, 31, loc=wf.mean(), scale=scipy.stats.sem(wf))
    assert low > 0
    assert ws[:, 0].mean() / floor[0] == pytest.approx(high, rel=1e-12)
    assert added[0] == pytest.approx(high - wf.mean(), rel=1e-12)
    assert np.allclose(ws[:, 0] - w[:, 0], (high - wf.mean()) * floor[0], rtol=0, atol=1e-12)  # a shift, not a rescale
    assert np.array_equal(ws[:, 1:], w[:, 1:]) and added[1] == 0 and added[2] == 0
    # the pessimist's case moves the benign dimension too, to its own upper bound; never the floorless one
    we, add_e = tm.robust_pairs(w, floor, everywhere=True)
    b = w[:, 1] / floor[1]
    assert we[:, 1].mean() / floor[1] == pytest.approx(
        scipy.stats.t.interval(0.95, 31, loc=b.mean(), scale=scipy.stats.sem(b))[1], rel=1e-12)
    assert np.array_equal(we[:, 2], w[:, 2]) and add_e[2] == 0


@pytest.mark.parametrize("top,expect", [(1.0, 1.0), (1.25, 1.3), (0.05, 0.1)])
def test_choose_takes_the_smallest_min_shift_within_the_target(top, expect):
    """1000 runs whose mean worsening is evenly spaced on [0, top], all significant: a min_shift m FAILs the runs at
    or above m, so the rule (at most 0.5 % of runs, i.e. 5) needs m above the 995th smallest, top * 994 / 999."""
    run_abs = np.linspace(0.0, top, 1000)[:, None]
    run_q = np.zeros_like(run_abs)
    dims = {"reference_free.x": DIM}
    got = tm.choose({"c": ("correct", run_abs, run_q)}, dims, np.array([1.0]))
    assert got["min_shift"]["reference_free.x"] == expect
    assert min(m for m in tm.GRID if m > top * 994 / 999) == expect
    # the same runs given as the shifted tuning set decide; the measured runs (here all 0) do not
    zero = np.zeros_like(run_abs)
    got = tm.choose({"c": ("correct", zero, run_q)}, dims, np.array([1.0]), tuning={"c": (run_abs, run_q)})
    assert got["min_shift"]["reference_free.x"] == expect
    assert got["rates"]["c (shifted)"]["fail_rate"] <= tm.TARGET
    # no run significant: the regression rule never FAILs, the smallest value stands
    got = tm.choose({"c": ("correct", run_abs, np.ones_like(run_abs))}, dims, np.array([1.0]))
    assert got["min_shift"]["reference_free.x"] == tm.GRID[0]


def test_the_shifted_rule_against_a_float64_simulation_of_a_planted_recipe():
    """A planted correct recipe 0.4 floor worse (sd 0.8 floor), 4 prompts x 8 seeds: its CI is above 0, so the rule
    simulates it at the CI's upper bound and the chosen min_shift keeps those runs' regression FAILs within 0.5 %,
    computed here with scipy's exact one-sided Wilcoxon (one dimension: Holm is the p itself) and float64 means."""
    rng = np.random.default_rng(11)
    floor = np.array([0.002])
    keys = [(f"p{i}", s) for i in range(4) for s in range(8)]
    w = (rng.normal(0.4, 0.8, 32) * floor[0])[:, None]
    dims = {"reference_free.x": DIM}
    seeds = {f"p{i}": list(range(8)) for i in range(4)}
    index = {k: i for i, k in enumerate(keys)}
    picks = [[index[(pid, seed)] for pid, _, seed in rs.form_run(seeds, rng)] for _ in range(400)]
    ws, added = tm.robust_pairs(w, floor)
    assert added[0] > 0
    measured, shifted = tm.simulate(w, picks, dims), tm.simulate(ws, picks, dims)
    got = tm.choose({"c": ("correct", *measured)}, dims, floor, tuning={"c": shifted})
    plain = tm.choose({"c": ("correct", *measured)}, dims, floor)
    m = got["min_shift"]["reference_free.x"]
    assert m > plain["min_shift"]["reference_free.x"]  # the robust rule asks for more than the point estimate's

    def fail_rate(pairs, shift):
        fails = 0
        for p in picks:
            d = pairs[p, 0]
            pv = scipy.stats.wilcoxon(d, alternative="greater", method="exact").pvalue
            fails += pv <= 0.01 and float(np.mean(d, dtype=np.float64)) >= shift * floor[0]
        return fails / len(picks)

    assert fail_rate(ws, m) <= tm.TARGET
    below = tm.GRID[tm.GRID.index(m) - 1]
    assert fail_rate(ws, below) > tm.TARGET  # the smallest such value
