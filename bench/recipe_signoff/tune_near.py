"""The near judge's bounds, chosen on the tuning pool (issue 50): per quantity the near judge reads (audio STFT
distance, LPIPS mean, LPIPS worst frame; ghosting's run tests reported beside), the distances of the correct INT8 rung
against its parent turbo4-tiny and of the rungs and plants that must FAIL near, in units of the parent's own new-seed
floor; a bound per quantity by a stated rule; and each recipe's FAIL rate over simulated 16-pair runs under it.

    python bench/recipe_signoff/tune_near.py [--work /tmp/recipe_signoff] [--runs 2000] [--name tune_near]
                                             [--before-ghosting DIR]

Data. The tuning pool (pool 3: world-heldout prompts 12-15 x seeds 30-37, 32 pairs) for the correct rung
(turbo4-tiny-int8: no aspect of the world's ground truth read worse than turbo4-tiny's, recipe_signoff.md) and for
turbo4-tiny-sparse (ground truth: colour and direction worse, so it must FAIL). The corpus plants judged near were
made only in pool 0, a held-out pool (16 pairs each): they are read from there, labelled as such, and none of
their values is a tuning pool value. Each value is divided by its parent's floor in its own pool
(``<pool>/run/floors/turbo4-tiny/floor.json``); the plants whose parent is turbo4-tiny-sparse85 (sparse-audio,
sparse-all-streams) have no floor of their parent in the run, so turbo4-tiny's of pool 0 stands in for it.

Rule (:func:`choose`). A ``max`` bound (the run's mean, BCa CI: the verdict PASSes when the CI's upper bound is
within it and FAILs when the mean is beyond it): the correct rung's value is the 95th percentile over simulated 16-pair
runs (4 of each prompt's 8 seeds, without replacement) of the run's upper 95 % t-bound; a must-FAIL recipe's is the
5th percentile of its run mean (plants: bootstrap of their 16 pairs). A ``pair_limit`` (every pair): the correct
rung's value is the lognormal fit's quantile at 1 - 0.05 / 16 of its pairs (so a 16-pair run keeps all its pairs
below with probability 95 %; 32 pairs cannot show that tail empirically), a must-FAIL recipe's the 5th percentile
of its run's largest pair. The bound is the geometric mean of the correct value and the smallest must-FAIL value
above it (a quantity separates only the recipes it sits above; each must-FAIL recipe needs one quantity that catches
it, checked in the coverage table). Where no must-FAIL recipe sits above the correct value, the quantity catches none
of them and the bound is the correct value itself.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import recipe_signoff as rs  # noqa: E402

QUANTITIES = {"audio.stft_distance": ("max", 0.1), "fidelity.lpips_mean": ("max", 0.1),
              "fidelity.lpips_worst": ("pair_limit", 0.25)}
"""The near judge's deciding floor-relative bounds in release.toml: metric -> (kind, current fraction of floor)."""
ADVISORY = {"fidelity.ssim_mean": "min 0.9 (raw)", "audio.offset_ms": "pair_limit 20 ms (raw)",
            "ghosting.ghost_score_max": "max 0.1 floor"}
"""The near judge's quantities that do not decide (``required = false`` or advisory): reported, not tuned."""
CORRECT = {"turbo4-tiny-int8": (3, "turbo4-tiny")}
MUST_FAIL = {"turbo4-tiny-sparse": (3, "turbo4-tiny"),
             "bug-sparse-audio": (0, "turbo4-tiny-sparse85"),
             "bug-sparse-all-streams": (0, "turbo4-tiny-sparse85"),
             "bug-cache-turbo4-reuse": (0, "turbo4-tiny")}
"""Recipe (its run name) -> (pool, parent): the rung the ground truth says changed, and the corpus plants judged near
whose damage is measured (sparsity on the audio stream; a step cache that reuses); pool 0's plants held out."""
SHOWN = {"bug-cache-turbo4": (0, "turbo4-tiny"), "bug-int8-excluded": (0, "turbo4-tiny-int8")}
"""Plants judged near that no quality bound can catch, shown: cache-turbo4 renders its parent's clips (the cache
never hits: every distance 0); int8-excluded is turbo4-tiny's clip against INT8's, the INT8 distance itself. Both
are for the configured-versus-executed check."""
GHOST_FDR = 0.01
STALE_MAX = 0.013
CONFIDENCE = 0.95


def rescored_dir(work: Path, pool: int, recipe: str, parent: str) -> Path:
    return work / f"pool{pool}" / "ghosting_rescored" / recipe / f"vs-{parent}"


def rescore_ghosting(work: Path, pool: int, recipe: str, parent: str) -> Path:
    """The ghosting gate (as it is now: displacement compensation on) over ``recipe``'s pairs against ``parent`` in
    ``pool``'s one-recipe runs (``gen/``), through GhostingGate.evaluate; for the corpus plants, whose stored results
    predate the compensation. Written to :func:`rescored_dir`, resumable."""
    from gates.base import ClipSide, PairContext, PairRef, get_gate
    from h3.atomic import atomic_write_text

    def clip_dir(name: str) -> Path:
        stem = name.removeprefix("bug-")
        return next(d / "clips" / name for d in rs.gen_dirs(work, pool, stem) if (d / "clips" / name).is_dir())

    out = rescored_dir(work, pool, recipe, parent)
    out.mkdir(parents=True, exist_ok=True)
    gate = get_gate("ghosting")
    for mp4 in sorted(clip_dir(recipe).glob("*.mp4")):
        target = out / f"{mp4.stem}.json"
        base = clip_dir(parent) / mp4.name
        if target.is_file() or not base.is_file():
            continue
        prompt, seed = mp4.stem.rsplit("-s", 1)
        ctx = PairContext(run_dir=out, pair=PairRef(baseline=parent, candidate=recipe, prompt_id=prompt,
                                                    seed=int(seed)),
                          baseline=ClipSide(parent, base, {}), candidate=ClipSide(recipe, mp4, {}),
                          artifact_dir=out, options={})
        atomic_write_text(target, gate.evaluate(ctx).model_dump_json())
    return out


def pair_values(work: Path, pool: int, recipe: str, parent: str, gate: str, metric: str) -> dict[str, float]:
    """Per pair (clip stem) the gate's metric of ``recipe`` against ``parent`` in ``pool``'s run (the ghosting gate's
    re-scored results where :func:`rescore_ghosting` made them)."""
    d = work / f"pool{pool}" / "run" / "gates" / gate / recipe / f"vs-{parent}"
    if gate == "ghosting" and rescored_dir(work, pool, recipe, parent).is_dir():
        d = rescored_dir(work, pool, recipe, parent)
    out = {}
    for f in sorted(d.glob("*.json")):
        m = json.loads(f.read_text())["metrics"]
        if metric in m and m[metric]["value"] is not None:
            out[f.stem] = float(m[metric]["value"])
    if not out:
        raise SystemExit(f"no {gate}.{metric} results in {d}")
    return out


def floor(work: Path, pool: int, metric: str, parent: str = "turbo4-tiny") -> float:
    return float(json.loads((work / f"pool{pool}" / "run" / "floors" / parent / "floor.json").read_text())
                 ["metrics"][metric])


def run_picks(stems: list[str], rng: np.random.Generator, runs: int) -> list[list[int]]:
    """Simulated 16-pair runs: pools of 8 seeds a prompt draw 4 of each prompt's seeds without replacement
    (recipe_signoff.form_run); a 16-pair plant (4 a prompt) is bootstrapped with replacement."""
    by_prompt: dict[str, list[int]] = {}
    for i, s in enumerate(stems):
        by_prompt.setdefault(s.rsplit("-s", 1)[0], []).append(i)
    seeds = {p: list(range(len(v))) for p, v in by_prompt.items()}
    out = []
    for _ in range(runs):
        picks = rs.form_run(seeds, rng)
        out.append([by_prompt[p][k] for p, _, k in picks])
    return out


def t_upper(v: np.ndarray, confidence: float = CONFIDENCE) -> float:
    from scipy.stats import t

    return float(v.mean() + t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))


def lognormal_quantile(v: np.ndarray, q: float) -> float:
    from scipy.stats import norm

    logs = np.log(np.maximum(v, 1e-12))
    return float(math.exp(logs.mean() + norm.ppf(q) * logs.std(ddof=1)))


def recipe_stats(v: np.ndarray, picks: list[list[int]], kind: str) -> dict:
    """The run-level numbers the rule reads, for one recipe and quantity (``v`` in floor units)."""
    means = np.array([v[p].mean() for p in picks])
    uppers = np.array([t_upper(v[p]) for p in picks])
    maxima = np.array([v[p].max() for p in picks])
    out = {"pairs": int(v.size), "mean": float(v.mean()), "max": float(v.max()),
           "run_mean_p05": float(np.percentile(means, 5)), "run_upper_p95": float(np.percentile(uppers, 95)),
           "run_max_p05": float(np.percentile(maxima, 5)), "run_max_p95": float(np.percentile(maxima, 95))}
    if kind == "pair_limit":
        out["lognormal_q"] = lognormal_quantile(v, 1 - 0.05 / rs.PAIRS_PER_RUN)
    return out


def choose(kind: str, correct: dict, must_fail: dict[str, dict]) -> dict:
    """The bound by the module's rule, from the correct rung's and the must-FAIL recipes' run-level numbers."""
    c = correct["run_upper_p95"] if kind == "max" else max(correct["lognormal_q"], correct["run_max_p95"])
    low = {name: (s["run_mean_p05"] if kind == "max" else s["run_max_p05"]) for name, s in must_fail.items()}
    above = {n: x for n, x in low.items() if x > c}
    if not above:
        return {"correct_value": c, "must_fail_values": low, "separates": [], "bound": c}
    nearest = min(above, key=above.get)
    return {"correct_value": c, "must_fail_values": low, "separates": sorted(above), "nearest": nearest,
            "bound": math.sqrt(c * above[nearest])}


def fail_rates(v: np.ndarray, picks: list[list[int]], kind: str, bound: float) -> dict:
    """Per simulated run: FAIL (mean beyond the bound / any pair beyond the limit), PASS, INCONCLUSIVE (the mean
    within, its t upper bound not)."""
    fail = passed = 0
    for p in picks:
        x = v[p]
        if kind == "pair_limit":
            bad = bool((x > bound).any())
            fail, passed = fail + bad, passed + (not bad)
        elif x.mean() > bound:
            fail += 1
        elif t_upper(x) <= bound:
            passed += 1
    n = len(picks)
    return {"fail": fail / n, "pass": passed / n, "inconclusive": (n - fail - passed) / n}


def ghost_rates(work: Path, pool: int, recipe: str, parent: str, picks: list[list[int]], stems: list[str],
                directory: Path | None = None) -> dict:
    """The ghosting gate's two run tests over the simulated runs: Benjamini-Hochberg over ``ghost_p_value`` (FDR
    0.01) and the mean ``ghost_stale_evidence`` against 0.013 (release.toml's near judge)."""
    from h3eval.stats import ghost_run_test

    def read(metric):
        if directory is None:
            return pair_values(work, pool, recipe, parent, "ghosting", metric)
        return {f.stem: float(json.loads(f.read_text())["metrics"][metric]["value"])
                for f in sorted(directory.glob("*.json"))}

    p, stale = read("ghost_p_value"), read("ghost_stale_evidence")
    pv, sv = np.array([p[s] for s in stems]), np.array([stale[s] for s in stems])
    bh = np.mean([ghost_run_test(pv[k], fdr=GHOST_FDR).fail for k in picks])
    st = np.mean([sv[k].mean() > STALE_MAX for k in picks])
    return {"bh_fail": float(bh), "stale_fail": float(st), "either_fail": float(np.mean(
        [ghost_run_test(pv[k], fdr=GHOST_FDR).fail or sv[k].mean() > STALE_MAX for k in picks])),
            "p_min": float(pv.min()), "pairs_p_below_0.01/16": int((pv <= GHOST_FDR / 16).sum()),
            "stale_mean": float(sv.mean())}


def study(work: Path, runs: int, rng: np.random.Generator, before: Path | None) -> dict:
    recipes = {**{n: ("correct", *v) for n, v in CORRECT.items()}, **{n: ("must_fail", *v) for n, v in MUST_FAIL.items()},
               **{n: ("shown", *v) for n, v in SHOWN.items()}}
    values: dict[str, dict[str, np.ndarray]] = {}
    picks: dict[str, list[list[int]]] = {}
    out: dict = {"recipes": {}, "quantities": {}}
    for name, (group, pool, parent) in recipes.items():
        per = {q: pair_values(work, pool, name, parent, *q.split(".")) for q in QUANTITIES}
        stems = sorted(set.intersection(*(set(v) for v in per.values())))
        picks[name] = run_picks(stems, rng, runs)
        values[name] = {q: np.array([per[q][s] for s in stems]) / floor(work, pool, q) for q in QUANTITIES}
        entry = {"group": group, "pool": pool, "parent": parent, "pairs": len(stems),
                 "floor_of": f"pool{pool} turbo4-tiny" + (" (stand-in for its parent's)" if parent != "turbo4-tiny"
                                                          and pool == 0 and "sparse85" in parent else ""),
                 "ghosting": ghost_rates(work, pool, name, parent, picks[name], stems)}
        # Before compensation: the INT8 rung's copy (--before-ghosting), the plants' results stored in the run.
        stored = work / f"pool{pool}" / "run" / "gates" / "ghosting" / name / f"vs-{parent}"
        old = before if name in CORRECT else (stored if rescored_dir(work, pool, name, parent).is_dir() else None)
        if old is not None and old.is_dir():
            entry["ghosting_before"] = ghost_rates(work, pool, name, parent, picks[name], stems, old)
        entry["advisory"] = {}
        for q in ADVISORY:
            v = np.array(list(pair_values(work, pool, name, parent, *q.split(".")).values()))
            scale = floor(work, pool, q) if "floor" in ADVISORY[q] else 1.0
            entry["advisory"][q] = {"mean": float(v.mean() / scale), "min": float(v.min() / scale),
                                    "max": float(v.max() / scale), "unit": "floor" if scale != 1.0 else "raw"}
        out["recipes"][name] = entry
    for q, (kind, current) in QUANTITIES.items():
        stats = {n: recipe_stats(values[n][q], picks[n], kind) for n in recipes}
        (c,) = [stats[n] for n in CORRECT]
        chosen = choose(kind, c, {n: stats[n] for n in MUST_FAIL})
        bound = round(chosen["bound"], 2) if chosen["bound"] >= 0.1 else round(chosen["bound"], 3)
        out["quantities"][q] = {
            "kind": kind, "current": current, "stats": stats, **chosen, "proposed": bound,
            "rates_current": {n: fail_rates(values[n][q], picks[n], kind, current) for n in recipes},
            "rates_proposed": {n: fail_rates(values[n][q], picks[n], kind, bound) for n in recipes}}
    out["coverage"] = coverage(out, values, picks, recipes)
    return out


def coverage(out: dict, values: dict, picks: dict, recipes: dict) -> dict:
    """Per recipe, the share of its simulated runs that FAIL the near judge under the proposed bounds (any bound, or
    either ghosting run test), and under the current ones."""
    res = {}
    for name in recipes:
        g = out["recipes"][name]["ghosting"]
        row = {}
        for which in ("current", "proposed"):
            fails = 0
            for k in range(len(picks[name])):
                bad = False
                for q, spec in out["quantities"].items():
                    bound = spec[which]
                    x = values[name][q][picks[name][k]]
                    bad |= bool((x > bound).any()) if spec["kind"] == "pair_limit" else bool(x.mean() > bound)
                fails += bad
            row[f"bounds_{which}"] = fails / len(picks[name])
        row["ghosting_either"] = g["either_fail"]
        res[name] = row
    return res


def heldout(work: Path, pools: list[int], proposed: dict[str, float], runs: int, rng: np.random.Generator,
            before: Path | None) -> dict:
    """The held-out pools' check, after the choice and not used for it: the correct rung and turbo4-tiny-sparse
    against turbo4-tiny under the proposed bounds, and the ghosting run tests with (and, from ``before``'s
    ``pool<i>-<recipe>/vs-turbo4-tiny`` copies, without) displacement compensation."""
    out = {}
    for name in (*CORRECT, "turbo4-tiny-sparse"):
        for pool in pools:
            per = {q: pair_values(work, pool, name, "turbo4-tiny", *q.split(".")) for q in QUANTITIES}
            stems = sorted(set.intersection(*(set(v) for v in per.values())))
            vals = {q: np.array([per[q][s] for s in stems]) / floor(work, pool, q) for q in QUANTITIES}
            picks = run_picks(stems, rng, runs)
            row = {"pairs": len(stems), "fail": {q: fail_rates(vals[q], picks, QUANTITIES[q][0], proposed[q])["fail"]
                                                 for q in QUANTITIES},
                   "max": {q: float(vals[q].max()) for q in QUANTITIES},
                   "ghosting": ghost_rates(work, pool, name, "turbo4-tiny", picks, stems)}
            old = None if before is None else before / f"pool{pool}-{name}" / "vs-turbo4-tiny"
            if old is not None and old.is_dir():
                row["ghosting_before"] = ghost_rates(work, pool, name, "turbo4-tiny", picks, stems, old)
            pv, sv = (np.array([v[s] for s in stems]) for v in (
                pair_values(work, pool, name, "turbo4-tiny", "ghosting", m)
                for m in ("ghost_p_value", "ghost_stale_evidence")))
            row["any_fail"] = float(np.mean([row_fails(vals, k, proposed) or ghost_fails(pv[k], sv[k])
                                             for k in picks]))
            out[f"{name} pool {pool}"] = row
    return out


def row_fails(vals: dict, k: list[int], bounds: dict[str, float]) -> bool:
    return any(bool((vals[q][k] > bounds[q]).any()) if QUANTITIES[q][0] == "pair_limit" else bool(vals[q][k].mean()
               > bounds[q]) for q in QUANTITIES)


def ghost_fails(p_values: np.ndarray, stale: np.ndarray) -> bool:
    """One run's ghosting verdict: a Benjamini-Hochberg discovery or the stale mean beyond its bound."""
    from h3eval.stats import ghost_run_test

    return ghost_run_test(p_values, fdr=GHOST_FDR).fail or float(stale.mean()) > STALE_MAX


def heldout_markdown(rows: dict) -> str:
    lines = ["", "## Held out (pools 0-2), checked after the choice, not used for it", "",
             "FAIL share of simulated 16-pair runs under the proposed bounds; largest pair in floor units; ghosting "
             "run tests (BH or stale) with compensation, and without it where the stored results were kept.", "",
             "| recipe, pool | pairs | " + " | ".join(f"{q} FAIL (max pair)" for q in QUANTITIES)
             + " | ghosting, compensated | ghosting, uncompensated | near judge (these) FAIL |",
             "|---|---|" + "---|" * (len(QUANTITIES) + 3)]
    for key, r in rows.items():
        b = r.get("ghosting_before")
        lines.append(f"| `{key}` | {r['pairs']} | " + " | ".join(
            f"{r['fail'][q]:.1%} ({r['max'][q]:.3f})" for q in QUANTITIES)
            + f" | {r['ghosting']['either_fail']:.1%} (p min {r['ghosting']['p_min']:.2g}) | "
            + (f"{b['either_fail']:.1%} (p min {b['p_min']:.2g})" if b else "-") + f" | {r['any_fail']:.1%} |")
    return "\n".join(lines) + "\n"


def markdown(payload: dict) -> str:
    s = payload["study"]
    lines = ["## Distances against the parent, in units of the parent's new-seed floor", "",
             "| quantity | kind | recipe | group | pool | pairs | mean | max | run mean p5 | run upper-CI p95 | "
             "run max p5 | run max p95 | lognormal q(1-0.05/16) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for q, spec in s["quantities"].items():
        for n, st in spec["stats"].items():
            r = s["recipes"][n]
            lines.append(f"| {q} | {spec['kind']} | `{n}` | {r['group']} | {r['pool']} | {st['pairs']} | "
                         f"{st['mean']:.3f} | {st['max']:.3f} | {st['run_mean_p05']:.3f} | {st['run_upper_p95']:.3f} | "
                         f"{st['run_max_p05']:.3f} | {st['run_max_p95']:.3f} | "
                         + (f"{st['lognormal_q']:.3f} |" if "lognormal_q" in st else "- |"))
    lines += ["", "## Bounds (fraction of the parent's floor)", "",
              "| quantity | kind | current | correct value | nearest must-FAIL (value) | separates | proposed |",
              "|---|---|---|---|---|---|---|"]
    for q, spec in s["quantities"].items():
        near = (f"`{spec['nearest']}` ({spec['must_fail_values'][spec['nearest']]:.3f})" if spec.get("nearest")
                else "none above")
        lines.append(f"| {q} | {spec['kind']} | {spec['current']} | {spec['correct_value']:.3f} | {near} | "
                     f"{', '.join(spec['separates']) or '-'} | **{spec['proposed']}** |")
    lines += ["", "## FAIL rates over simulated 16-pair runs (per quantity: current -> proposed)", "",
              "| recipe | group | " + " | ".join(s["quantities"]) + " | all bounds current -> proposed | ghosting "
              "BH / stale / either | ghosting before compensation (BH / stale / either) |",
              "|---|---|" + "---|" * (len(s["quantities"]) + 3)]
    for n, r in s["recipes"].items():
        cells = [f"{spec['rates_current'][n]['fail']:.1%} -> {spec['rates_proposed'][n]['fail']:.1%}"
                 for spec in s["quantities"].values()]
        g, cov = r["ghosting"], s["coverage"][n]
        b = r.get("ghosting_before")
        lines.append(f"| `{n}` | {r['group']} (pool {r['pool']}) | " + " | ".join(cells)
                     + f" | {cov['bounds_current']:.1%} -> {cov['bounds_proposed']:.1%} | "
                     f"{g['bh_fail']:.1%} / {g['stale_fail']:.1%} / {g['either_fail']:.1%} (p min {g['p_min']:.2g}) | "
                     + (f"{b['bh_fail']:.1%} / {b['stale_fail']:.1%} / {b['either_fail']:.1%} (p min {b['p_min']:.2g})"
                        if b else "-") + " |")
    lines += ["", "The correct rung under the proposed bounds, per quantity (PASS / INCONCLUSIVE / FAIL of its runs): "
              + "; ".join(f"{q} {r['pass']:.1%} / {r['inconclusive']:.1%} / {r['fail']:.1%}"
                          for q, spec in s["quantities"].items() for n, r in spec["rates_proposed"].items()
                          if n in CORRECT) + "."]
    lines += ["", "## Advisory quantities (not deciding): mean [min, max] over the pairs", "",
              "| recipe | " + " | ".join(f"{q} ({spec})" for q, spec in ADVISORY.items()) + " |",
              "|---|" + "---|" * len(ADVISORY)]
    for n, r in s["recipes"].items():
        lines.append(f"| `{n}` | " + " | ".join(
            f"{a['mean']:.3f} [{a['min']:.3f}, {a['max']:.3f}]" for a in r["advisory"].values()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe_signoff"))
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rng", type=int, default=20261206)
    parser.add_argument("--before-ghosting", type=Path, default=None,
                        help="the INT8 rung's ghosting results of the tuning pool made before displacement "
                             "compensation (a copy of <work>/pool3/run/gates/ghosting/turbo4-tiny-int8/vs-turbo4-tiny)")
    parser.add_argument("--heldout", default="", help="after the choice, check it on these held-out pools (e.g. "
                                                          "0,1,2): reported apart, never used to choose")
    parser.add_argument("--before-heldout", type=Path, default=None,
                        help="copies of the held-out pools' ghosting results before compensation: "
                             "DIR/pool<i>-<recipe>/vs-turbo4-tiny")
    parser.add_argument("--name", default="tune_near")
    parser.add_argument("--note", default="")
    parser.add_argument("--rescore-ghosting", action="store_true",
                        help="first re-score the ghosting gate of the pool-0 plants (MUST_FAIL, SHOWN) as it is now")
    args = parser.parse_args()
    if args.rescore_ghosting:
        for name, (pool, parent) in {**MUST_FAIL, **SHOWN}.items():
            if pool != rs.TUNING_POOL:
                print(f"re-scored {rescore_ghosting(args.work, pool, name, parent)}", flush=True)
    result = study(args.work, args.runs, np.random.default_rng(args.rng), args.before_ghosting)
    import hashlib

    digest = hashlib.sha256(rs.RELEASE.read_bytes()).hexdigest()[:12]
    payload = {"note": args.note, "policy": f"release.toml {digest} (its [judges.near] bounds: the 'current' column)", "runs": args.runs, "rng": args.rng, "tuning_pool": rs.TUNING_POOL,
               "rule": __doc__.split("Rule (:func:`choose`). ")[1].strip(), "study": result}
    md = markdown(payload)
    if args.heldout:
        proposed = {q: v["proposed"] for q, v in result["quantities"].items()}
        payload["heldout"] = heldout(args.work, [int(p) for p in args.heldout.split(",")], proposed, args.runs,
                                     np.random.default_rng(args.rng + 1), args.before_heldout)
        md += heldout_markdown(payload["heldout"])
    rs.write_record(args.name, payload, md)


if __name__ == "__main__":
    main()
