"""The resample judge's margins, chosen on the tuning pool only (issue 50): per reference-free dimension (and prompt
faithfulness), the mean worsening of each recipe against the 29-step baseline in units of the pool's new-seed floor,
with its CI, for the correct recipes and the recipes the policy must reject; then, over simulated 16-pair runs of the
pool (4 of each prompt's 8 seeds, without replacement), how often the non-inferiority and regression rules of
release.toml's resample judge FAIL each recipe as the regression rule's ``min_shift`` varies.

    python bench/recipe_signoff/tune_margins.py [--work /tmp/recipe_signoff] [--runs 2000] [--name tune_margins]

Reads only the per-clip scores recipe_signoff.py wrote for the tuning pool (``--work``/pool3/scores), never a
held-out pool's (pools 0-2 publish the rates). The simulation is the verdict's arithmetic on those scores, not the
verdict: the paired deltas (candidate - baseline, signed so that negative is worse), the one-sided Wilcoxon
signed-rank p of "worse" (h3eval.stats.wilcoxon_signed_rank) Holm-adjusted across the judge's dimensions that carry
the rule (h3eval.stats.holm), the regression FAIL when that p <= alpha and the mean worsening >= min_shift x floor,
the non-inferiority FAIL when the mean worsening >= the margin. The flag detectors, integrity and the near judge are
left out (the held-out study judges them with compute_verdict).
"""

from __future__ import annotations

import argparse
import json
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
GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5)


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
        need = min_shift * floor[i] if isinstance(spec["min_shift"], dict) else float(spec["min_shift"])
        reg[i] = qi <= spec["alpha"] and mean[i] >= need
    return ni, reg


MARGIN_GRID = (1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
TARGET = 0.005
"""Per dimension, the largest share of a correct recipe's simulated runs that one rule may FAIL (about 14 rules
decide together; the issue's target is <= 2 % a run)."""


def holm_worse(w: np.ndarray, dims: dict) -> np.ndarray:
    """Per dimension, the Holm-adjusted one-sided Wilcoxon p of "worse" (nan where the policy has no regression)."""
    from h3eval.stats import holm, wilcoxon_signed_rank

    names = list(dims)
    reg = [i for i, n in enumerate(names) if dims[n]["regression"]]
    q = np.full(len(names), np.nan)
    q[reg] = holm([wilcoxon_signed_rank(-w[:, i], alternative="less").pvalue for i in reg])
    return q


def choose(sims: dict, dims: dict, floor: np.ndarray) -> dict:
    """Per dimension, the smallest regression min_shift (x floor, :data:`GRID`) and non-inferiority margin (x floor,
    :data:`MARGIN_GRID`, the policy's at_least kept) at which no correct recipe FAILs more than :data:`TARGET` of
    its simulated runs on that dimension; then every recipe's FAIL rate under the chosen rules (per dimension and in
    all)."""
    names = list(dims)
    correct = [v for v in sims.values() if v[0] == "correct"]
    shift, margin = {}, {}
    for i, n in enumerate(names):
        spec = dims[n]
        at_least = spec["margin"].get("at_least", 0.0) if isinstance(spec["margin"], dict) else None
        if at_least is None:  # an absolute margin (faithfulness): kept
            margin[n] = None
        else:
            margin[n] = next((f for f in MARGIN_GRID if all(
                (run_abs[:, i] >= max(f * floor[i], at_least)).mean() <= TARGET for _, run_abs, _ in correct)), None)
        reg = spec["regression"]
        if reg is None or not isinstance(reg["min_shift"], dict) or floor[i] == 0:
            shift[n] = None
            continue
        shift[n] = next((m for m in GRID if all(
            ((run_q[:, i] <= reg["alpha"]) & (run_abs[:, i] >= m * floor[i])).mean() <= TARGET
            for _, run_abs, run_q in correct)), None)
    rates = {}
    for recipe, (group, run_abs, run_q) in sims.items():
        fails = np.zeros_like(run_abs, dtype=bool)
        for i, n in enumerate(names):
            spec = dims[n]
            f = margin[n] if margin[n] is not None else MARGIN_GRID[-1]
            m = resolve(spec["margin"], floor[i]) if margin[n] is None and not isinstance(spec["margin"], dict) \
                else max(f * floor[i], spec["margin"].get("at_least", 0.0))
            fails[:, i] = run_abs[:, i] >= m
            reg = spec["regression"]
            if reg is not None:
                need = (shift[n] if shift[n] is not None else GRID[-1]) * floor[i] if isinstance(
                    reg["min_shift"], dict) else float(reg["min_shift"])
                fails[:, i] |= (run_q[:, i] <= reg["alpha"]) & (run_abs[:, i] >= need)
        rates[recipe] = {"group": group, "fail_rate": float(fails.any(axis=1).mean()),
                         "by_dimension": {n: float(fails[:, i].mean()) for i, n in enumerate(names) if fails[:, i].any()}}
    return {"target_per_dimension": TARGET, "min_shift": shift, "margin": margin, "rates": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe_signoff"))
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rng", type=int, default=50)
    parser.add_argument("--name", default="tune_margins")
    args = parser.parse_args()
    pool = rs.TUNING_POOL
    scores = args.work / f"pool{pool}" / "scores"
    dims = judge_dimensions()
    names = list(dims)
    floors = rs.clip_floor(scores, "baseline")
    floor = np.array([floors[n] for n in names])
    base = score_table(scores, "baseline", dims)
    rng = np.random.default_rng(args.rng)
    rows = {}
    sims: dict = {}
    for group, recipes in GROUPS.items():
        for recipe in recipes:
            cand = score_table(scores, rs.recipe_of(recipe).name, dims)  # a plant's clips are filed as bug-<stem>
            keys, w = worsening(base, cand, dims)
            if len(keys) < 32:
                print(f"{recipe}: {len(keys)} pairs scored in the tuning pool, left out", flush=True)
                continue
            from scipy.stats import t

            with np.errstate(divide="ignore", invalid="ignore"):
                wf = w / floor  # a dimension whose floor is 0 (no clip clips) has no floor units: nan
            mean, sd = wf.mean(axis=0), wf.std(axis=0, ddof=1)
            half = t.ppf(0.975, len(keys) - 1) * sd / np.sqrt(len(keys))
            index = {k: i for i, k in enumerate(keys)}
            seeds = {pid: sorted(s for p, s in keys if p == pid) for pid in sorted({p for p, _ in keys})}
            run_abs = np.zeros((args.runs, len(names)))
            run_q = np.full((args.runs, len(names)), np.nan)
            ni_d = np.zeros((args.runs, len(names)), bool)
            reg_d = np.zeros((len(GRID), args.runs, len(names)), bool)
            run_means = np.zeros((args.runs, len(names)))
            for r in range(args.runs):
                picks = rs.form_run(seeds, rng)
                wr = w[[index[(pid, seed)] for pid, _, seed in picks]]
                with np.errstate(divide="ignore", invalid="ignore"):
                    run_means[r] = wr.mean(axis=0) / floor
                run_abs[r], run_q[r] = wr.mean(axis=0), holm_worse(wr, dims)
            # the rules from each run's means and Holm p (as dim_fails computes them, without redoing the tests)
            margins = np.array([resolve(dims[n]["margin"], floor[i]) for i, n in enumerate(names)])
            ni_d = run_abs >= margins
            for g, m in enumerate(GRID):
                for i, n in enumerate(names):
                    spec = dims[n]["regression"]
                    if spec is None:
                        continue
                    need = m * floor[i] if isinstance(spec["min_shift"], dict) else float(spec["min_shift"])
                    reg_d[g, :, i] = (run_q[:, i] <= spec["alpha"]) & (run_abs[:, i] >= need)
            ni, reg = ni_d.any(axis=1), reg_d.any(axis=2)
            sims[recipe] = (group, run_abs, run_q)
            rows[recipe] = {
                "group": group, "pairs": len(keys),
                "shift_floor_units": {n: {"mean": float(mean[i]), "ci95": [float(mean[i] - half[i]),
                                                                           float(mean[i] + half[i])],
                                          "run_sd": float(run_means[:, i].std(ddof=1))}
                                      for i, n in enumerate(names)},
                "ni_fail_rate": float(ni.mean()),
                "ni_fail_rate_by_dimension": {n: float(ni_d[:, i].mean()) for i, n in enumerate(names)
                                              if ni_d[:, i].any()},
                "regression_fail_rate_by_dimension": {str(m): {n: float(reg_d[g, :, i].mean())
                                                               for i, n in enumerate(names) if reg_d[g, :, i].any()}
                                                      for g, m in enumerate(GRID)},
                "fail_rate_by_min_shift": {str(m): float((reg[g] | ni).mean()) for g, m in enumerate(GRID)},
            }
            print(f"{recipe}: NI {ni.mean():.3f}; " + ", ".join(f"{m}: {(reg[g] | ni).mean():.3f}"
                                                                 for g, m in enumerate(GRID)), flush=True)
    chosen = choose(sims, dims, floor)
    payload = {"pool": pool, "prompts": rs.POOLS[pool], "floor": {n: float(f) for n, f in zip(names, floor)},
               "runs": args.runs, "grid": list(GRID), "recipes": rows, "chosen": chosen,
               "how": "worsening = baseline - candidate (higher-is-better) or candidate - baseline, / the pool's "
                      "new-seed floor (32 next-seed pairs of the baseline); CI: t over the pool's 32 pairs; runs: "
                      "4 of 8 seeds a prompt without replacement; FAIL = non-inferiority (mean >= margin) or "
                      "regression (Holm Wilcoxon p <= alpha and mean >= min_shift x floor)"}
    from h3.atomic import atomic_write_json

    atomic_write_json(HERE / "results" / f"{args.name}.json", {**rs_context(), **payload})
    (HERE / "results" / f"{args.name}.md").write_text(markdown(payload))
    print(markdown(payload))


def rs_context() -> dict:
    from bench.lib.results import context

    return context()


def markdown(payload: dict) -> str:
    names = list(payload["floor"])
    short = [n.split(".", 1)[1] for n in names]
    lines = [f"# tune_margins (tuning pool {payload['pool']}: world-heldout prompts from {payload['prompts'][0]}, "
             f"seeds {payload['prompts'][1]})", "", payload["how"], "",
             "Mean worsening in floor units [95% CI over 32 pairs] (positive = worse):", "",
             "| recipe | group | " + " | ".join(short) + " |", "|---|---|" + "---|" * len(names)]
    for recipe, row in payload["recipes"].items():
        cells = [f"{row['shift_floor_units'][n]['mean']:+.2f} [{row['shift_floor_units'][n]['ci95'][0]:+.2f}, "
                 f"{row['shift_floor_units'][n]['ci95'][1]:+.2f}]" for n in names]
        lines.append(f"| `{recipe}` | {row['group']} | " + " | ".join(cells) + " |")
    lines += ["", "Simulated 16-pair FAIL rate (non-inferiority or regression) by the regression rule's min_shift "
              "(x floor):", "", "| recipe | group | NI alone | " + " | ".join(str(m) for m in payload["grid"]) + " |",
              "|---|---|---|" + "---|" * len(payload["grid"])]
    for recipe, row in payload["recipes"].items():
        lines.append(f"| `{recipe}` | {row['group']} | {row['ni_fail_rate']:.3f} | " + " | ".join(
            f"{row['fail_rate_by_min_shift'][str(m)]:.3f}" for m in payload["grid"]) + " |")
    chosen = payload["chosen"]
    lines += ["", f"Chosen per dimension (the smallest value at which no correct recipe FAILs more than "
                  f"{chosen['target_per_dimension']:.1%} of its runs on it; x floor; '-' kept as in release.toml):", "",
              "| rule | " + " | ".join(short) + " |", "|---|" + "---|" * len(names),
              "| regression min_shift | " + " | ".join(str(chosen["min_shift"][n] or "-") for n in names) + " |",
              "| non-inferiority margin | " + " | ".join(str(chosen["margin"][n] or "-") for n in names) + " |",
              "", "FAIL rate under the chosen rules (simulated runs of the tuning pool):", ""]
    for recipe, row in chosen["rates"].items():
        lines.append(f"- `{recipe}` ({row['group']}): {row['fail_rate']:.3f}; " + ", ".join(
            f"{n.split('.', 1)[1]} {v:.3f}" for n, v in row["by_dimension"].items()))
    lines += ["", "What FAILs (share of runs; NI: non-inferiority, reg@m: regression at min_shift m):", ""]
    for recipe, row in payload["recipes"].items():
        parts = [f"NI {n.split('.', 1)[1]} {v:.3f}" for n, v in row["ni_fail_rate_by_dimension"].items()]
        for m in ("0.1", "0.5", "1.0"):
            parts += [f"reg@{m} {n.split('.', 1)[1]} {v:.3f}" for n, v in
                      row["regression_fail_rate_by_dimension"][m].items()]
        lines.append(f"- `{recipe}`: " + ("; ".join(parts) or "nothing"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
