"""The resample judge's margins, chosen on the tuning pool only (issue 50): per reference-free dimension (and prompt
faithfulness), the mean worsening of each recipe against the 29-step baseline in units of the pool's new-seed floor,
with its CI, for the correct recipes and the recipes the policy must reject; then, over simulated 16-pair runs of the
pool (4 of each prompt's 8 seeds, without replacement), how often the non-inferiority and regression rules of
release.toml's resample judge FAIL each recipe as the regression rule's ``min_shift`` varies.

    python bench/recipe_signoff/tune_margins.py [--work /tmp/recipe_signoff] [--runs 2000] [--name tune_margins]
                                                [--note TEXT]

Reads only the per-clip scores recipe_signoff.py wrote for the tuning pool (``--work``/pool3/scores), never a
held-out pool's (pools 0-2 publish the rates). The simulation is the verdict's arithmetic on those scores, not the
verdict: the paired deltas (candidate - baseline, signed so that negative is worse), the one-sided Wilcoxon
signed-rank p of "worse" (h3eval.stats.wilcoxon_signed_rank) Holm-adjusted across the judge's dimensions that carry
the rule (h3eval.stats.holm), the regression FAIL when that p <= alpha and the mean worsening >= min_shift x floor,
the non-inferiority FAIL when the mean worsening >= the margin. The flag detectors, integrity and the near judge are
left out (the held-out study judges them with compute_verdict).

The selection rule (session 26, :func:`robust_pairs`, :func:`choose`): a correct recipe is simulated not at the
tuning pool's point estimate but, on every dimension where its worsening is established there (the 95 % t-CI over the
pool's 32 pairs wholly above 0), at that CI's upper bound (its pairs shifted by the difference); each rule takes the
smallest value at which no correct recipe so shifted FAILs more than :data:`TARGET` of its runs. Session 25 chose at
the point estimate (results/tune_margins_s25.md): motion smoothness's min_shift of 0.8 floor sat at the edge of
turbo4-tiny's +0.36 floor, and on the held-out pools, where its shift is 0.36-0.73 floor, it FAILed 9.7 % of runs.
:func:`ni_separation` asks whether any non-inferiority margin FAILs the recipes the policy must reject while the
correct recipes (shifted) pass, and states each dimension's 16-pair MDE beside the rejects' shifts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import recipe_signoff as rs  # noqa: E402

GROUPS = {"correct": ("turbo4-tiny", "turbo4-tiny-int8"),
          "changed (ground truth)": ("turbo4-tiny-sparse",),
          "reject": ("fewer-steps", "turbo4-tiny-lora03", "lora-16x", "lora-half", "sparse95-nocomp")}
"""The correct recipes by the world's ground truth (identity is byte-identical to the baseline: every shift 0), the
shipped rung whose clips the ground truth says changed (recipe_signoff.CHANGED_SHIPPED: shown, not used to choose),
and the recipes the policy must reject (issue 50's 8 steps without a LoRA and the LoRA at 0.3; the corpus plants
that change the clip)."""
GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 2.0)


def judge_dimensions(policy: Path = rs.RELEASE) -> dict[str, dict]:
    """The resample judge's ``sides`` metrics of the per-clip gates: name -> direction, margin and regression."""
    data = tomllib.loads(policy.read_text())
    out = {}
    for gate in ("reference_free", "prompt_faithfulness"):
        for metric, mp in data["judges"]["resample"]["gates"].get(gate, {}).get("metrics", {}).items():
            if mp.get("compare") != "sides":
                continue
            out[f"{gate}.{metric}"] = {"higher_is_better": mp["direction"] == "higher_is_better",
                                       "margin": mp["margin"], "regression": mp.get("regression")}
    return out


def score_table(scores: Path, recipe: str, dims: dict) -> dict[tuple[str, int], np.ndarray]:
    """(prompt, seed) -> the clip's score on each dimension (in ``dims``' order)."""
    out = {}
    for path in sorted((scores / recipe).glob("*.json")):
        pid, seed = path.stem.rsplit("-s", 1)
        data = json.loads(path.read_text())
        out[(pid, int(seed))] = np.array([data["faith"] if d == "prompt_faithfulness.faithfulness"
                                          else data["rf"][d.split(".", 1)[1]] for d in dims], dtype=np.float64)
    return out


def resolve(spec, floor: float) -> float:
    """A policy threshold's value: a number, or ``{fraction_of_floor, at_least}``."""
    if isinstance(spec, (int, float)):
        return float(spec)
    return max(spec["fraction_of_floor"] * floor, spec.get("at_least", 0.0))


def worsening(base: dict, cand: dict, dims: dict) -> tuple[list, np.ndarray]:
    """The pairs both recipes have, and per pair x dimension the worsening (base - cand for higher-is-better, cand -
    base for lower-is-better: positive is worse)."""
    sign = np.array([1.0 if d["higher_is_better"] else -1.0 for d in dims.values()])
    keys = sorted(set(base) & set(cand))
    return keys, np.array([(base[k] - cand[k]) * sign for k in keys])


def run_fails(w: np.ndarray, floor: np.ndarray, dims: dict, min_shift: float) -> tuple[bool, bool]:
    """(non-inferiority FAIL, regression FAIL) of one run's worsening (pairs x dims) with the regression rule's
    floor-relative min_shift set to ``min_shift`` (absolute min_shifts, e.g. faithfulness's 0.05, kept)."""
    ni, reg = dim_fails(w, floor, dims, min_shift)
    return bool(ni.any()), bool(reg.any())


def dim_fails(w: np.ndarray, floor: np.ndarray, dims: dict, min_shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Per dimension: (non-inferiority FAIL, regression FAIL) of one run, as :func:`run_fails`."""
    from h3eval.stats import holm, wilcoxon_signed_rank

    names = list(dims)
    mean = w.mean(axis=0)
    margins = np.array([resolve(dims[n]["margin"], floor[i]) for i, n in enumerate(names)])
    ni = mean >= margins
    reg_dims = [i for i, n in enumerate(names) if dims[n]["regression"]]
    p = [wilcoxon_signed_rank(-w[:, i], alternative="less").pvalue for i in reg_dims]
    reg = np.zeros(len(names), bool)
    for i, qi in zip(reg_dims, holm(p)):
        spec = dims[names[i]]["regression"]
        reg[i] = qi <= spec["alpha"] and mean[i] >= shift_needed(spec, min_shift, floor[i])
    return ni, reg


MARGIN_GRID = (1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
TARGET = 0.005
"""Per dimension, the largest share of a correct recipe's simulated runs that one rule may FAIL (about 14 rules
decide together; the issue's target is <= 2 % a run)."""
CONFIDENCE = 0.95
"""The CI whose upper bound a correct recipe's established worsening is simulated at (:func:`robust_pairs`)."""
NI_GRID = tuple(round(0.05 * k, 2) for k in range(1, 61))
"""Non-inferiority margins (x floor) :func:`ni_separation` tries, below the policy's 1.5 floor too."""
REJECT_NI = ("fewer-steps", "turbo4-tiny-lora03")
"""The recipes issue 50 asks to FAIL on non-inferiority itself."""


def shift_ci(wf: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of ``wf`` (pairs x dims, floor units): the mean and the two-sided t-CI's (low, high) bounds; nan
    where a column is not finite (a zero floor)."""
    from scipy.stats import t

    n = wf.shape[0]
    with np.errstate(invalid="ignore"):
        mean, sd = wf.mean(axis=0), wf.std(axis=0, ddof=1)
    half = t.ppf(0.5 + confidence / 2, n - 1) * sd / np.sqrt(n)
    return mean, mean - half, mean + half


def robust_pairs(w: np.ndarray, floor: np.ndarray, confidence: float = CONFIDENCE,
                 everywhere: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A correct recipe's pairs (pairs x dims, worsening in the metric's units) shifted, on each dimension whose
    worsening the pool establishes (its ``confidence`` t-CI in floor units wholly above 0), by the CI's upper bound
    minus the mean: the recipe as it would read were its true shift at that bound (a pool where it loses more, as
    turbo4-tiny's motion smoothness does on held-out pool 1). Other dimensions are left as measured, unless
    ``everywhere``: then every dimension with a floor sits at its upper bound (the pessimist's case
    :func:`ni_separation` also reports). Returns the shifted pairs and the shift added (floor units; 0 where none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        wf = w / floor
    mean, low, high = shift_ci(wf, confidence)
    add = np.where(np.isfinite(low) & ((low > 0) | everywhere), high - mean, 0.0)
    return w + add * np.where(floor > 0, floor, 0.0), add


def holm_worse(w: np.ndarray, dims: dict) -> np.ndarray:
    """Per dimension, the Holm-adjusted one-sided Wilcoxon p of "worse" (nan where the policy has no regression)."""
    from h3eval.stats import holm, wilcoxon_signed_rank

    names = list(dims)
    reg = [i for i, n in enumerate(names) if dims[n]["regression"]]
    q = np.full(len(names), np.nan)
    q[reg] = holm([wilcoxon_signed_rank(-w[:, i], alternative="less").pvalue for i in reg])
    return q


def simulate(w: np.ndarray, picks: list[list[int]], dims: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per simulated run (``picks``: the pool's pair indices of each run): the mean worsening and the Holm p of
    "worse" per dimension."""
    run_abs = np.zeros((len(picks), w.shape[1]))
    run_q = np.full((len(picks), w.shape[1]), np.nan)
    for r, p in enumerate(picks):
        wr = w[p]
        run_abs[r], run_q[r] = wr.mean(axis=0), holm_worse(wr, dims)
    return run_abs, run_q


def reg_fails(run_abs: np.ndarray, run_q: np.ndarray, i: int, spec: dict, floor: float, m: float) -> np.ndarray:
    """Per run, the regression rule's FAIL on dimension ``i`` at min_shift ``m`` x floor (:func:`shift_needed`)."""
    return (run_q[:, i] <= spec["alpha"]) & (run_abs[:, i] >= shift_needed(spec, m, floor))


def shift_needed(spec: dict, m: float, floor: float) -> float:
    """The regression rule's smallest mean worsening at min_shift ``m`` x floor, never below the policy's ``at_least``
    for it (an absolute min_shift, e.g. faithfulness's 0.05, kept)."""
    shift = spec["min_shift"]
    return max(m * floor, shift.get("at_least", 0.0)) if isinstance(shift, dict) else float(shift)


def _chosen_margin(spec: dict, i: int, floor: np.ndarray, tuning: list) -> float | None:
    if not isinstance(spec["margin"], dict):  # an absolute margin (faithfulness): kept
        return None
    at_least = spec["margin"].get("at_least", 0.0)
    return next((f for f in MARGIN_GRID if all((run_abs[:, i] >= max(f * floor[i], at_least)).mean() <= TARGET
                                               for run_abs, _ in tuning)), None)


def _chosen_shift(spec: dict, i: int, floor: np.ndarray, tuning: list) -> float | None:
    reg = spec["regression"]
    if reg is None or not isinstance(reg["min_shift"], dict) or floor[i] == 0:
        return None
    return next((m for m in GRID if all(reg_fails(run_abs, run_q, i, reg, floor[i], m).mean() <= TARGET
                                        for run_abs, run_q in tuning)), None)


def choose(sims: dict, dims: dict, floor: np.ndarray, tuning: dict | None = None) -> dict:
    """Per dimension, the smallest regression min_shift (x floor, :data:`GRID`) and non-inferiority margin (x floor,
    :data:`MARGIN_GRID`, the policy's at_least kept) at which no correct recipe FAILs more than :data:`TARGET` of
    its simulated runs on that dimension, the correct recipes read from ``tuning`` (recipe -> (run_abs, run_q): the
    shifted runs of :func:`robust_pairs`; default their runs as measured, ``sims``' correct group); then every
    recipe's FAIL rate under the chosen rules (per dimension and in all), ``sims``' and ``tuning``'s."""
    names = list(dims)
    if tuning is None:
        tuning = {r: (a, q) for r, (g, a, q) in sims.items() if g == "correct"}
    shift = {n: _chosen_shift(dims[n], i, floor, list(tuning.values())) for i, n in enumerate(names)}
    margin = {n: _chosen_margin(dims[n], i, floor, list(tuning.values())) for i, n in enumerate(names)}
    rates = {}
    judged = {**sims, **{f"{r} (shifted)": ("correct at its CI's upper bound", a, q) for r, (a, q) in tuning.items()}}
    for recipe, (group, run_abs, run_q) in judged.items():
        fails = np.zeros_like(run_abs, dtype=bool)
        for i, n in enumerate(names):
            spec = dims[n]
            if isinstance(spec["margin"], dict):
                f = margin[n] if margin[n] is not None else MARGIN_GRID[-1]
                m = max(f * floor[i], spec["margin"].get("at_least", 0.0))
            else:
                m = resolve(spec["margin"], floor[i])
            fails[:, i] = run_abs[:, i] >= m
            if spec["regression"] is not None:
                fails[:, i] |= reg_fails(run_abs, run_q, i, spec["regression"], floor[i],
                                         shift[n] if shift[n] is not None else GRID[-1])
        rates[recipe] = {"group": group, "fail_rate": float(fails.any(axis=1).mean()),
                         "by_dimension": {n: float(fails[:, i].mean()) for i, n in enumerate(names) if fails[:, i].any()}}
    return {"target_per_dimension": TARGET, "min_shift": shift, "margin": margin, "rates": rates}


def ni_separation(sims: dict, tuning: dict, dims: dict, floor: np.ndarray, stats: dict,
                  everywhere: bool = False) -> dict:
    """Per dimension with a floor: can a non-inferiority margin alone FAIL :data:`REJECT_NI` while no correct recipe
    (``tuning``: shifted as in :func:`robust_pairs`) FAILs more than :data:`TARGET` of its runs? The smallest margin
    of :data:`NI_GRID` the correct recipes allow, each reject's NI FAIL rate there (the most any allowed margin
    gives), the correct recipes' 16-pair MDE (one-sided 2.5 %, power 0.8, from their per-pair sd over the pool) and
    the rejects' shifts (floor units), and the pairs a run would need for a margin to separate them (normal
    approximation: the correct recipes' shifted mean plus z(1 - TARGET) of their run's standard error below the
    rejects' mean minus z(0.95) of theirs; ``everywhere``: ``tuning`` holds the correct recipes at every
    dimension's upper bound, and so does the shifted mean)."""
    from scipy.stats import norm

    from h3eval.stats import minimum_detectable_effect

    out = {}
    for i, n in enumerate(dims):
        if floor[i] == 0 or not isinstance(dims[n]["margin"], dict):
            continue
        allowed = [x for x in NI_GRID if all((a[:, i] >= x * floor[i]).mean() <= TARGET for a, _ in tuning.values())]
        x = allowed[0] if allowed else None
        rej = {r: float((sims[r][1][:, i] >= x * floor[i]).mean()) if x is not None else 0.0
               for r in REJECT_NI if r in sims}
        c_mean = max(stats[r]["high" if everywhere else "mean"][i] + (0 if everywhere else stats[r]["added"][i])
                     for r in tuning)
        c_sd = max(stats[r]["sd"][i] for r in tuning)
        need = {}
        for r in rej:
            gap = stats[r]["mean"][i] - c_mean
            need[r] = (math.ceil(((norm.ppf(1 - TARGET) * c_sd + norm.ppf(0.95) * stats[r]["sd"][i]) / gap) ** 2)
                       if gap > 0 else None)
        out[n] = {"smallest_margin": x, "reject_fail_rate": rej,
                  "separates": bool(rej) and min(rej.values()) >= 0.95,
                  "mde16": {r: minimum_detectable_effect(stats[r]["sd"][i], 16) for r in tuning},
                  "reject_shift": {r: stats[r]["mean"][i] for r in rej}, "pairs_needed": need}
    return out


def study_recipe(recipe: str, group: str, scores: Path, base: dict, dims: dict, floor: np.ndarray, runs: int,
                 rng: np.random.Generator) -> tuple | None:
    """One recipe of the tuning pool: its row of the record (shift in floor units with CI, FAIL rates by min_shift),
    its simulated runs (group, run_abs, run_q), its shift statistics, and for a correct recipe the runs of its pairs
    shifted by :func:`robust_pairs` (the same runs' picks); None when fewer than 32 pairs are scored."""
    names = list(dims)
    cand = score_table(scores, rs.recipe_of(recipe).name, dims)  # a plant's clips are filed as bug-<stem>
    keys, w = worsening(base, cand, dims)
    if len(keys) < 32:
        print(f"{recipe}: {len(keys)} pairs scored in the tuning pool, left out", flush=True)
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        wf = w / floor  # a dimension whose floor is 0 (no clip clips) has no floor units: nan
    mean, low, high = shift_ci(wf)
    index = {k: i for i, k in enumerate(keys)}
    seeds = {pid: sorted(s for p, s in keys if p == pid) for pid in sorted({p for p, _ in keys})}
    picks = [[index[(pid, seed)] for pid, _, seed in rs.form_run(seeds, rng)] for _ in range(runs)]
    run_abs, run_q = simulate(w, picks, dims)
    shifted, added = None, np.zeros(len(names))
    if group == "correct":
        ws, added = robust_pairs(w, floor)
        shifted = simulate(ws, picks, dims), simulate(robust_pairs(w, floor, everywhere=True)[0], picks, dims)
    with np.errstate(divide="ignore", invalid="ignore"):
        run_means = run_abs / floor
    margins = np.array([resolve(dims[n]["margin"], floor[i]) for i, n in enumerate(names)])
    ni_d = run_abs >= margins
    reg_d = np.zeros((len(GRID), runs, len(names)), bool)
    for g, m in enumerate(GRID):
        for i, n in enumerate(names):
            if dims[n]["regression"] is not None:
                reg_d[g, :, i] = reg_fails(run_abs, run_q, i, dims[n]["regression"], floor[i], m)
    ni, reg = ni_d.any(axis=1), reg_d.any(axis=2)
    row = {
        "group": group, "pairs": len(keys),
        "shift_floor_units": {n: {"mean": float(mean[i]), "ci95": [float(low[i]), float(high[i])],
                                  "run_sd": float(run_means[:, i].std(ddof=1)),
                                  "pair_sd": float(np.std(wf[:, i], ddof=1))} for i, n in enumerate(names)},
        "ni_fail_rate": float(ni.mean()),
        "ni_fail_rate_by_dimension": {n: float(ni_d[:, i].mean()) for i, n in enumerate(names) if ni_d[:, i].any()},
        "regression_fail_rate_by_dimension": {str(m): {n: float(reg_d[g, :, i].mean())
                                                       for i, n in enumerate(names) if reg_d[g, :, i].any()}
                                              for g, m in enumerate(GRID)},
        "fail_rate_by_min_shift": {str(m): float((reg[g] | ni).mean()) for g, m in enumerate(GRID)},
    }
    if group == "correct":
        row["simulated_at_upper_bound"] = {n: float(added[i]) for i, n in enumerate(names) if added[i] > 0}
    print(f"{recipe}: NI {ni.mean():.3f}; " + ", ".join(f"{m}: {(reg[g] | ni).mean():.3f}"
                                                         for g, m in enumerate(GRID)), flush=True)
    with np.errstate(invalid="ignore"):
        sd = wf.std(axis=0, ddof=1)
    stats = {"mean": mean, "high": high, "sd": sd, "added": added}
    return row, (group, run_abs, run_q), stats, shifted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe_signoff"))
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rng", type=int, default=50)
    parser.add_argument("--name", default="tune_margins")
    parser.add_argument("--note", default="", help="what the record should say beside the numbers")
    args = parser.parse_args()
    pool = rs.TUNING_POOL
    scores = args.work / f"pool{pool}" / "scores"
    dims = judge_dimensions()
    names = list(dims)
    floors = rs.clip_floor(scores, "baseline")
    floor = np.array([floors[n] for n in names])
    base = score_table(scores, "baseline", dims)
    rng = np.random.default_rng(args.rng)
    rows, sims, tuning, pessimist, stats = {}, {}, {}, {}, {}
    for group, recipes in GROUPS.items():
        for recipe in recipes:
            got = study_recipe(recipe, group, scores, base, dims, floor, args.runs, rng)
            if got is None:
                continue
            rows[recipe], sims[recipe], stats[recipe], shifted = got
            if shifted is not None:
                tuning[recipe], pessimist[recipe] = shifted
    chosen = choose(sims, dims, floor, tuning)
    payload = {"pool": pool, "prompts": rs.POOLS[pool], "note": args.note, "floor": {n: float(f) for n, f in zip(names, floor)},
               "baseline_mean": {n: float(np.mean([v[i] for v in base.values()])) for i, n in enumerate(names)},
               "runs": args.runs, "grid": list(GRID), "recipes": rows, "chosen": chosen,
               "ni_separation": ni_separation(sims, tuning, dims, floor, stats),
               "ni_separation_everywhere": ni_separation(sims, pessimist, dims, floor, stats, everywhere=True),
               "how": "worsening = baseline - candidate (higher-is-better) or candidate - baseline, / the pool's "
                      "new-seed floor (32 next-seed pairs of the baseline); CI: t over the pool's 32 pairs; runs: "
                      "4 of 8 seeds a prompt without replacement; FAIL = non-inferiority (mean >= margin) or "
                      "regression (Holm Wilcoxon p <= alpha and mean >= min_shift x floor)",
               "rule": f"per dimension, the smallest value at which no correct recipe FAILs more than {TARGET:.1%} "
                       f"of its runs on it, each correct recipe simulated with its pairs shifted so that, on every "
                       f"dimension whose worsening the tuning pool establishes ({CONFIDENCE:.0%} t-CI wholly above "
                       f"0), its mean sits at the CI's upper bound"}
    from h3.atomic import atomic_write_json

    atomic_write_json(HERE / "results" / f"{args.name}.json", {**rs_context(), **payload})
    (HERE / "results" / f"{args.name}.md").write_text(markdown(payload))
    print(markdown(payload))


def rs_context() -> dict:
    from bench.lib.results import context

    return context()


def _f(x, fmt: str = "+.2f") -> str:
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, fmt)


def _pairs(n: int | None) -> str:
    return "never" if n is None else (f"{n}" if n <= 10_000 else "> 10^4")


def markdown(payload: dict) -> str:
    names = list(payload["floor"])
    short = [n.split(".", 1)[1] for n in names]
    lines = [f"# tune_margins (tuning pool {payload['pool']}: world-heldout prompts from {payload['prompts'][0]}, "
             f"seeds {payload['prompts'][1]})", "", *([payload["note"], ""] if payload.get("note") else []),
             payload["how"], "",
             "Mean worsening in floor units [95% CI over 32 pairs] (positive = worse):", "",
             "| recipe | group | " + " | ".join(short) + " |", "|---|---|" + "---|" * len(names)]
    for recipe, row in payload["recipes"].items():
        cells = [f"{row['shift_floor_units'][n]['mean']:+.2f} [{row['shift_floor_units'][n]['ci95'][0]:+.2f}, "
                 f"{row['shift_floor_units'][n]['ci95'][1]:+.2f}]" for n in names]
        lines.append(f"| `{recipe}` | {row['group']} | " + " | ".join(cells) + " |")
    lines += ["", "Simulated 16-pair FAIL rate (non-inferiority or regression) by the regression rule's min_shift "
              "(x floor), pairs as measured:", "",
              "| recipe | group | NI alone | " + " | ".join(str(m) for m in payload["grid"]) + " |",
              "|---|---|---|" + "---|" * len(payload["grid"])]
    for recipe, row in payload["recipes"].items():
        lines.append(f"| `{recipe}` | {row['group']} | {row['ni_fail_rate']:.3f} | " + " | ".join(
            f"{row['fail_rate_by_min_shift'][str(m)]:.3f}" for m in payload["grid"]) + " |")
    lines += ["", f"Rule: {payload['rule']}. Shift added (floor units) to simulate each correct recipe at that bound:", ""]
    for recipe, row in payload["recipes"].items():
        if "simulated_at_upper_bound" in row:
            lines.append(f"- `{recipe}`: " + (", ".join(f"{n.split('.', 1)[1]} +{v:.2f}" for n, v in
                                                     row["simulated_at_upper_bound"].items()) or "none"))
    chosen, base, floor = payload["chosen"], payload["baseline_mean"], payload["floor"]
    lines += ["", f"Chosen per dimension (x floor; '-' kept as in release.toml), and each in the metric's units and as "
                  f"a share of the baseline's mean on this pool:", "",
              "| rule | " + " | ".join(short) + " |", "|---|" + "---|" * len(names),
              "| regression min_shift | " + " | ".join(str(chosen["min_shift"][n] or "-") for n in names) + " |",
              "| non-inferiority margin | " + " | ".join(str(chosen["margin"][n] or "-") for n in names) + " |",
              "| floor (units) | " + " | ".join(f"{floor[n]:.3g}" for n in names) + " |",
              "| baseline mean | " + " | ".join(f"{base[n]:.3g}" for n in names) + " |",
              "| min_shift / baseline mean | " + " | ".join(
                  f"{chosen['min_shift'][n] * floor[n] / abs(base[n]):.2%}" if chosen["min_shift"][n] and base[n]
                  else "-" for n in names) + " |",
              "", "FAIL rate under the chosen rules (simulated runs of the tuning pool; '(shifted)': the correct "
                  "recipe at its CI's upper bound):", ""]
    for recipe, row in chosen["rates"].items():
        lines.append(f"- `{recipe}` ({row['group']}): {row['fail_rate']:.3f}; " + ", ".join(
            f"{n.split('.', 1)[1]} {v:.3f}" for n, v in row["by_dimension"].items()))
    lines += ["", "Non-inferiority alone (issue 50: FAIL fewer-steps and the LoRA at 0.3 on NI itself): per dimension "
                  "the smallest margin (x floor, 0.05 steps) at which no shifted correct recipe FAILs more than "
                  f"{chosen['target_per_dimension']:.1%} of its runs, the rejects' NI FAIL rate there, the correct "
                  "recipes' 16-pair MDE and the rejects' mean shifts (floor units), and the pairs a run would need:",
              "", "| dimension | smallest margin | reject NI FAIL rate | separates | correct MDE at 16 pairs | "
                  "reject shift | pairs needed |", "|---|---|---|---|---|---|---|"]
    for n, row in payload["ni_separation"].items():
        lines.append(f"| {n.split('.', 1)[1]} | {_f(row['smallest_margin'], '.2f')} | " + ", ".join(
            f"{r} {v:.3f}" for r, v in row["reject_fail_rate"].items()) + f" | {'yes' if row['separates'] else 'no'} | "
            + ", ".join(f"{_f(v, '.2f')}" for v in row["mde16"].values()) + " | "
            + ", ".join(f"{_f(v)}" for v in row["reject_shift"].values()) + " | "
            + ", ".join(_pairs(v) for v in row["pairs_needed"].values()) + " |")
    lines += ["", "The same with each correct recipe at its CI's upper bound on every dimension (the pessimist's case: "
                  "a held-out pool may find any of its shifts there):", "",
              "| dimension | smallest margin | reject NI FAIL rate | separates | pairs needed |", "|---|---|---|---|---|"]
    for n, row in payload["ni_separation_everywhere"].items():
        lines.append(f"| {n.split('.', 1)[1]} | {_f(row['smallest_margin'], '.2f')} | " + ", ".join(
            f"{r} {v:.3f}" for r, v in row["reject_fail_rate"].items()) + f" | {'yes' if row['separates'] else 'no'} | "
            + ", ".join(_pairs(v) for v in row["pairs_needed"].values()) + " |")
    lines += ["", "What FAILs (share of runs, pairs as measured; NI: non-inferiority at the policy's margins, reg@m: "
                  "regression at min_shift m):", ""]
    for recipe, row in payload["recipes"].items():
        parts = [f"NI {n.split('.', 1)[1]} {v:.3f}" for n, v in row["ni_fail_rate_by_dimension"].items()]
        for m in ("0.1", "0.5", "1.0"):
            parts += [f"reg@{m} {n.split('.', 1)[1]} {v:.3f}" for n, v in
                      row["regression_fail_rate_by_dimension"][m].items()]
        lines.append(f"- `{recipe}`: " + ("; ".join(parts) or "nothing"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
