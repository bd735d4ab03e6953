"""The group-sequential design of sequential signoff (issue 53): alpha spending, boundaries, nominal levels, the
looks' policies and the stopping rule; h3eval.sequential runs it.

The design
----------
Pairs are generated in rounds; after round ``k`` (``n_k`` pairs, information fraction ``t_k = n_k / N`` of the
design's ``N`` = ``--max-pairs``) the run is gated and the verdict computed. Each one-sided test the verdict makes
at level ``alpha`` (the non-inferiority test at ``(1 - confidence) / 2``, each metric's regression test at its own
``alpha``) is given a Lan-DeMets alpha-spending function:

- O'Brien-Fleming type: ``alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))`` (spends almost nothing early);
- Pocock type: ``alpha(t) = alpha ln(1 + (e - 1) t)`` (spends evenly).

The boundary ``c_k`` of look ``k`` is the z value that crossing it for the first time at look ``k`` has
probability ``alpha(t_k) - alpha(t_{k-1})`` under the null (z statistics of a Brownian motion at ``t_1 < t_2 ...``,
computed by recursive numerical integration in float64, :func:`boundaries`); the test's nominal level at look ``k``
is ``1 - Phi(c_k)`` (:func:`nominal_levels`). The verdict at look ``k`` is computed under the policy with each test's
level replaced by its nominal level (:func:`look_policy`); a candidate whose verdict is then PASS or FAIL stops
(:func:`stop_decision`), an INCONCLUSIVE one continues, and at the last look the verdict stands as it is. An interim
look decides only when its nominal level is one its pairs can reach (:func:`resolvable`: at least ``2**-n`` and one
over the resamples): O'Brien-Fleming's first looks (2e-10 at 4 of 32 pairs, 7e-6 at 8) and Pocock's first (0.005 at
4 pairs, where a CI is at widest the 4 deltas' range) judge and record, but stop only a byte-identical candidate.

At an interim look a FAIL must be a test's: a metric whose policy FAILs on the mean alone (``fail_beyond =
"mean"``) FAILs only when its whole (nominal-level) CI is beyond the margin (``fail_beyond = "ci"``); at the last
look the policy's own rule applies. The policy's ``min_pairs`` are the design's looks (the boundaries, not a pair
count, guard an early decision). Whether the error rates stay at the fixed design's on the suite's own paired
metrics is measured by simulation (bench/sequential/).

Looks are whole seeds of the prompt suite (every prompt at every seed of a round): a look of ``n`` pairs with ``P``
prompts takes ``ceil(n / P)`` seeds (:func:`look_seeds`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Sequence

import numpy as np
from scipy import optimize
from scipy.stats import norm

Design = Literal["obrien-fleming", "pocock"]
DESIGNS: tuple[str, ...] = ("obrien-fleming", "pocock")
DEFAULT_LOOKS: tuple[int, ...] = (4, 8, 16, 32)
"""Default looks, in pairs (up to ``--max-pairs``)."""
DEFAULT_MAX_PAIRS = 32
GRID_POINTS = 2001
"""Points of the numerical integration's grid per look (Simpson's rule); boundaries agree with the literature's to
1e-4 (tests/test_sequential.py)."""


MIN_NOMINAL = 1e-8
"""The smallest nominal level a look's verdict is computed at: O'Brien-Fleming's first looks ask for less (2e-10 at 4 of
32 pairs), where the statistics' minimum detectable effect is not computable (h3eval.stats: no root); raising them to
1e-8 adds at most 1e-8 a look to the type-I error."""


MAX_SHARE = 1.0 - 1e-9
"""The largest departed share a policy may state (``DepartedRule.max_share`` < 1)."""


class SequentialError(ValueError):
    """A design that cannot be built (bad looks, alpha or design name): one clear message, exit 3."""


# -- alpha spending --------------------------------------------------------------------------------------------------
def spent(t: float | np.ndarray, alpha: float, design: str) -> np.ndarray | float:
    """Cumulative one-sided type-I error spent by information fraction ``t`` (Lan & DeMets 1983)."""
    _check_alpha(alpha)
    t = np.asarray(t, dtype=np.float64)
    if ((t < 0) | (t > 1) | ~np.isfinite(t)).any():
        raise SequentialError(f"information fractions must be in [0, 1], got {t.tolist()}")
    if design == "obrien-fleming":
        with np.errstate(divide="ignore"):
            out = np.where(t > 0, 2.0 - 2.0 * norm.cdf(norm.isf(alpha / 2) / np.sqrt(np.maximum(t, 1e-300))), 0.0)
    elif design == "pocock":
        out = alpha * np.log1p((math.e - 1.0) * t)
    else:
        raise SequentialError(f"design must be one of {', '.join(DESIGNS)}, got {design!r}")
    return float(out) if out.ndim == 0 else out


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and 0 < alpha < 0.5):
        raise SequentialError(f"alpha must be a one-sided level in (0, 0.5), got {alpha!r}")


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    t = np.asarray(fractions, dtype=np.float64)
    if t.ndim != 1 or t.size == 0 or not np.isfinite(t).all() or (t <= 0).any() or (t > 1 + 1e-12).any() or \
            (np.diff(t) <= 0).any():
        raise SequentialError(f"information fractions must increase within (0, 1], got {list(fractions)}")
    return t


def _simpson_weights(n: int, h: float) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * h / 3.0


def boundaries(fractions: Sequence[float], alpha: float, design: str) -> list[float]:
    """Upper z boundaries ``c_1 .. c_K`` of a one-sided group-sequential test at the information fractions given,
    with the Lan-DeMets spending function of ``design``: P(first crossing at look k | H0) = alpha(t_k) - alpha(t_{k-1}).

    Recursive numerical integration (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19) of the score
    statistic ``S_k = Z_k sqrt(t_k)``, a Brownian motion, over the continuation region ``S_k < c_k sqrt(t_k)``, in
    float64 with Simpson's rule; each ``c_k`` by Brent's method. Fractions need not end at 1 (the design's last look
    then spends ``alpha(t_K)``)."""
    t = _check_fractions(fractions)
    cum = np.asarray(spent(t, alpha, design), dtype=np.float64)
    out: list[float] = []
    grid: np.ndarray | None = None
    dens: np.ndarray | None = None  # density of S on the continuation region of the previous look
    prev_t, prev_cum = 0.0, 0.0
    for k, (tk, ck) in enumerate(zip(t, cum)):
        target = ck - prev_cum
        sd_k = math.sqrt(tk)
        if grid is None:
            c = float(norm.isf(target))
        else:
            assert dens is not None
            step = math.sqrt(tk - prev_t)
            w = _simpson_weights(grid.size, grid[1] - grid[0]) * dens

            def exceed(c_val: float) -> float:
                return float(np.sum(w * norm.sf((c_val * sd_k - grid) / step))) - target

            lo, hi = -10.0, 40.0
            c = float(optimize.brentq(exceed, lo, hi, xtol=1e-12, rtol=1e-12)) if target > 0 else math.inf
        out.append(c)
        if k == len(t) - 1:
            break
        # The density of S_k on S_k < c sqrt(t_k), on a grid from 10 sd below to the boundary.
        upper = c * sd_k if math.isfinite(c) else 10.0 * sd_k
        new_grid = np.linspace(-10.0 * sd_k, upper, GRID_POINTS)
        if grid is None:
            new_dens = norm.pdf(new_grid, scale=sd_k)
        else:
            step = math.sqrt(tk - prev_t)
            w = _simpson_weights(grid.size, grid[1] - grid[0]) * dens
            new_dens = (w[None, :] * norm.pdf((new_grid[:, None] - grid[None, :]) / step) / step).sum(axis=1)
        grid, dens = new_grid, new_dens
        prev_t, prev_cum = float(tk), float(ck)
    return out


def nominal_levels(fractions: Sequence[float], alpha: float, design: str) -> list[float]:
    """The one-sided nominal level of each look: ``1 - Phi(c_k)``, what a p-value at look ``k`` is compared to."""
    return [float(norm.sf(c)) for c in boundaries(fractions, alpha, design)]


def crossing_probabilities(fractions: Sequence[float], bounds: Sequence[float], drift: float = 0.0) -> list[float]:
    """P(first crossing at look k) of z statistics of a Brownian motion with ``drift`` (the z expected at t = 1)
    through upper ``bounds``: an independent check of :func:`boundaries` via scipy's multivariate normal CDF (Genz),
    ``P(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}) - P(Z_1 < c_1, ..., Z_k < c_k)``."""
    from scipy.stats import multivariate_normal

    t = _check_fractions(fractions)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    mean = drift * np.sqrt(t)
    stay = [1.0]
    for k in range(1, t.size + 1):
        if k == 1:
            stay.append(float(norm.cdf(bounds[0] - mean[0])))
        else:
            mvn = multivariate_normal(mean[:k], cov[:k, :k], seed=20261206, maxpts=200000 * k, abseps=1e-9,
                                      releps=1e-9)
            stay.append(float(mvn.cdf(np.asarray(bounds[:k]))))
    return [stay[k - 1] - stay[k] for k in range(1, t.size + 1)]


# -- looks -----------------------------------------------------------------------------------------------------------
def look_pairs(max_pairs: int, n_prompts: int, looks: Sequence[int] = DEFAULT_LOOKS) -> list[int]:
    """The design's looks in pairs: each of ``looks`` up to ``max_pairs`` rounded up to whole seeds of the suite
    (``n_prompts`` pairs a seed), duplicates dropped, ``max_pairs`` (rounded likewise) last."""
    if not isinstance(max_pairs, int) or max_pairs < 2:
        raise SequentialError(f"--max-pairs must be an integer of at least 2, got {max_pairs!r}")
    if not isinstance(n_prompts, int) or n_prompts < 1:
        raise SequentialError(f"the prompt suite must hold at least one prompt, got {n_prompts!r}")
    if not looks or any(not isinstance(n, int) or n < 1 for n in looks):
        raise SequentialError(f"looks must be positive pair counts, got {list(looks)}")
    seeds = sorted({math.ceil(n / n_prompts) for n in looks if n < max_pairs} | {math.ceil(max_pairs / n_prompts)})
    pairs = [s * n_prompts for s in seeds]
    if pairs[0] < 2:
        pairs = [p for p in pairs if p >= 2] or [2 * n_prompts]
    return pairs


def look_seeds(seeds: Sequence[int], n_prompts: int, pairs: int) -> list[int]:
    """The first seeds that make ``pairs`` pairs with ``n_prompts`` prompts."""
    need = math.ceil(pairs / n_prompts)
    if need > len(seeds):
        raise SequentialError(f"{pairs} pairs with {n_prompts} prompts need {need} seeds; {len(seeds)} given")
    return list(seeds[:need])


@dataclass(frozen=True)
class SequentialDesign:
    """A design: its looks (pairs), the information fractions, and the boundaries and nominal levels of every alpha
    the verdict tests at (the non-inferiority alpha and each regression alpha)."""

    design: str
    looks: tuple[int, ...]
    max_pairs: int
    alphas: dict[float, tuple[float, ...]]
    """alpha -> nominal one-sided level at each look."""
    bounds: dict[float, tuple[float, ...]]
    """alpha -> z boundary at each look."""

    @property
    def fractions(self) -> list[float]:
        return [n / self.looks[-1] for n in self.looks]

    def nominal(self, alpha: float, look: int) -> float:
        return self.alphas[round(alpha, 12)][look]

    def bound(self, alpha: float, look: int) -> float:
        return self.bounds[round(alpha, 12)][look]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["alphas"] = {str(k): list(v) for k, v in self.alphas.items()}
        data["bounds"] = {str(k): list(v) for k, v in self.bounds.items()}
        data["fractions"] = self.fractions
        data["spending"] = ("Lan-DeMets O'Brien-Fleming: alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t))"
                            if self.design == "obrien-fleming" else "Lan-DeMets Pocock: alpha(t) = alpha ln(1 + (e-1) t)")
        return data


def make_design(design: str, looks: Sequence[int], alphas: Sequence[float]) -> SequentialDesign:
    """Boundaries and nominal levels of ``design`` at ``looks`` (pairs, increasing) for each alpha."""
    if design not in DESIGNS:
        raise SequentialError(f"--design must be one of {', '.join(DESIGNS)}, got {design!r}")
    looks = tuple(int(n) for n in looks)
    if not looks or any(b <= a for a, b in zip(looks, looks[1:])) or looks[0] < 2:
        raise SequentialError(f"looks must be increasing pair counts of at least 2, got {list(looks)}")
    fractions = [n / looks[-1] for n in looks]
    levels, bounds = {}, {}
    for a in sorted({round(float(a), 12) for a in alphas}):
        c = boundaries(fractions, a, design)
        bounds[a] = tuple(c)
        levels[a] = tuple(float(norm.sf(x)) for x in c)
    return SequentialDesign(design=design, looks=looks, max_pairs=looks[-1], alphas=levels, bounds=bounds)


def policy_alphas(policy) -> list[float]:
    """Every one-sided alpha the verdict tests at under ``policy``: the non-inferiority alpha, each metric's
    regression alpha and each gate's run-test false-discovery rate (a run of benign pairs FAILs it at most that
    often)."""
    out = {round((1 - policy.confidence) / 2, 12)}
    for gates in [policy.gates, *(j.gates for j in policy.judges.values())]:
        for gp in gates.values():
            if gp.run_test is not None:
                out.add(round(gp.run_test.fdr, 12))
            for mp in gp.metrics.values():
                if mp.regression is not None:
                    out.add(round(mp.regression.alpha, 12))
    return sorted(out)


def look_policy(policy, design: SequentialDesign, look: int):
    """The policy a look's verdict is computed under: every test at its nominal level of this look (confidence
    ``1 - 2 nominal``; each regression alpha and each gate's run-test FDR its own nominal level), ``min_pairs`` at
    the look's pairs, and at an interim look FAILs of the mean alone replaced by FAILs of the whole CI (``fail_beyond
    = "ci"``) and a departed-pairs share replaced by the last look's count (an interim FAIL needs more departed pairs
    than the whole run may have). Before session 32 the ghosting run test ran at its full FDR at every look: on the
    fresh recipe-signoff pools the correct INT8 rung FAILed at 16 pairs in 11 of 100 runs the fixed 32 passed
    (bench/sequential/results/corpus_sim_s32.md)."""
    from h3eval.policy import Policy

    last = look == len(design.looks) - 1
    n = design.looks[look]
    data = policy.model_dump(mode="python")
    data["confidence"] = 1.0 - 2.0 * max(MIN_NOMINAL, design.nominal((1 - policy.confidence) / 2, look))
    data["min_pairs"] = min(data["min_pairs"], n)
    if data.get("speed") and data["speed"].get("min_pairs") is not None:
        data["speed"]["min_pairs"] = min(data["speed"]["min_pairs"], n)
    for gates in [data["gates"], *(j["gates"] for j in data["judges"].values())]:
        for gp in gates.values():
            if gp.get("min_pairs") is not None:
                gp["min_pairs"] = min(gp["min_pairs"], n)
            if gp.get("run_test") is not None:
                gp["run_test"]["fdr"] = max(MIN_NOMINAL, design.nominal(gp["run_test"]["fdr"], look))
            for mp in gp["metrics"].values():
                if not last and mp.get("departed") is not None:
                    # A share of departed pairs is not monotone in the pairs (2 of 16 then 2 of 32): an interim look
                    # FAILs only on more departed pairs than the last look allows.
                    allowed = int(mp["departed"]["max_share"] * design.looks[-1] + 1e-9)
                    mp["departed"]["max_share"] = min(allowed / n, MAX_SHARE)
                if mp.get("min_pairs") is not None:
                    mp["min_pairs"] = max(2, min(mp["min_pairs"], n))
                if mp.get("regression") is not None:
                    mp["regression"]["alpha"] = max(MIN_NOMINAL, design.nominal(mp["regression"]["alpha"], look))
                if not last and mp.get("compare") != "pair":
                    mp["fail_beyond"] = "ci"
    return Policy.model_validate(data)


# -- the stop decision -----------------------------------------------------------------------------------------------
def resolvable(design: SequentialDesign, look: int, alpha: float, n_resamples: int) -> bool:
    """Whether an interim look's nominal level for ``alpha`` is one its pairs and resamples can reach: at least
    ``2**-n`` (the smallest one-sided p a sign or signed-rank test of ``n`` pairs has; a bootstrap CI of ``n`` pairs
    is at widest their range, which misses the mean with about that probability) and ``1 / (n_resamples + 1)`` (the
    smallest tail a bootstrap of that many resamples resolves). The last look is always resolvable.

    Measured (bench/sequential, 1000 runs): at 4 pairs an O'Brien-Fleming "CI" at confidence 1 - 2e-8 is the range
    of the 4 deltas, so a benign candidate whose 4 faithfulness deltas all fell beyond the margin FAILed at look 1 (13
    of 1000 runs; 3 of 1000 at the fixed 32)."""
    if look == len(design.looks) - 1:
        return True
    level = design.nominal(alpha, look)
    return level >= max(0.5 ** design.looks[look], 1.0 / (n_resamples + 1))


def stop_decision(outcome: str, look: int, n_looks: int, identical: bool = False,
                  decidable: bool = True) -> tuple[bool, str]:
    """Whether a candidate stops after ``look`` (0-based) of ``n_looks`` given its verdict there, and why.

    A FAIL stops at any look whose level its pairs can reach (``decidable``: :func:`resolvable`). A PASS stops before
    the last look only when every clip so far is byte-identical to the clip it is judged against (at any look);
    any other interim PASS continues to the last look. Without this guard a planted bug could PASS at an early look
    before the regression rule, spent to its tiny interim level, could FAIL it (bench/sequential: lora-half PASSed
    5 of 30 runs sequentially against 0 of 30 at the fixed 32)."""
    if outcome not in ("PASS", "FAIL", "INCONCLUSIVE"):
        raise SequentialError(f"unknown outcome {outcome!r}")
    last = look == n_looks - 1
    if (outcome == "PASS" and identical) or (outcome in ("PASS", "FAIL") and last) or \
            (outcome == "FAIL" and decidable):
        return True, f"decided: {outcome} at look {look + 1} of {n_looks} at the look's nominal levels"
    if outcome == "FAIL":
        return False, (f"FAIL at look {look + 1} of {n_looks} with too few pairs for the look's nominal level: "
                       "continues")
    if outcome == "PASS":
        return False, (f"PASS at look {look + 1} of {n_looks} with clips that differ: continues (before the last "
                       "look only a FAIL or a byte-identical PASS stops)")
    if last:
        return True, f"undecided at the last look ({look + 1} of {n_looks}): INCONCLUSIVE stands"
    return False, f"undecided at look {look + 1} of {n_looks}: continues"


def z_of(p: float | None) -> float | None:
    """A one-sided p-value as the z statistic that has it (what the dashboard plots against the boundary)."""
    if p is None or not math.isfinite(p):
        return None
    return float(norm.isf(min(max(p, 1e-300), 1.0)))


# -- the sequential run --------------------------------------------------------------------------------------------
