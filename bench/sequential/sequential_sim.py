"""Sequential signoff by simulation (issue 53): false-FAIL, false-PASS and pairs used of the group-sequential design
(h3eval/sequential.py, looks 4, 8, 16, 32) against the fixed 16- and 32-pair designs, on the paired metric
distributions the suite measured on the trained tiny.

    python bench/sequential/sequential_sim.py [--runs 200] [--rng 20261206] [--check K] [--slow] [--same-as JSON]

Pools (each simulated run draws its pairs with replacement from a pool's 16 measured pairs):
- bench/resample_margins/results/resample_margins.json ``clip_scores`` (world-demo x seeds 4-7): ``benign`` (the
  baseline against itself under another seed of the same prompt), ``turbo4-tiny`` (a correct distilled recipe),
  ``turbo4-tiny-lora03`` and ``fewer-steps`` (planted regressions); the 12 reference-free dimensions and prompt
  faithfulness, with the release policy's resample judge (margins 1.5 x the pool's floor, regression rule);
- bench/recipe_bugs/results/recipe_bugs.json (heldout x seeds 0-3, each plant against its parent): prompt faithfulness
  alone, as the share of the six content aspects read right per clip, under the resample judge's faithfulness rule.
Each look is decided by the verdict's own functions (h3eval.verdict.decide: metric_statistics, decide_metrics: the
paired CI, non-inferiority t-test, Holm, the one-sided Wilcoxon regression test) under
h3eval.sequential.look_policy; the fixed designs under the policy as shipped. Integrity and the gates' pair-level
checks are not simulated (clean on these pools).

Two paths compute the same outcomes: ``--slow`` calls :func:`decide` per verdict (0.3-1 s each: most of it the
minimum detectable effect's noncentral-t root finding, which words only a warning); the default judges every run of
a look at once (bench/sequential/batch_verdict.py: the same bootstrap CIs bit for bit, the same tests and rules, no
power computation). ``--check K`` compares the two on each pool's first K runs, ``--same-as`` a whole record of the
slow path (same ``--runs`` and ``--rng``: the draws are the same stream) with this one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

RELEASE = ROOT / "gates" / "policies" / "release.toml"
MARGINS = ROOT / "bench" / "resample_margins" / "results" / "resample_margins.json"
BUGS = ROOT / "bench" / "recipe_bugs" / "results" / "recipe_bugs.json"
ASPECTS = ("colour", "shape", "direction", "pitch", "bounces", "sync")
LOOKS = (4, 8, 16, 32)

from h3eval.sequential import stop_decision  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batch_verdict as B  # noqa: E402


def policy():
    """release.toml without [speed] and vbench (no pinned VBench environment here), 999 bootstrap resamples."""
    from h3eval.policy import parse_policy

    data = tomllib.loads(RELEASE.read_text())
    data.pop("speed", None)
    data["n_resamples"] = 999
    data["judges"]["resample"]["gates"].pop("vbench", None)
    return parse_policy(data, RELEASE)


def pools() -> dict[str, dict]:
    """name -> {expected, metrics: {key: (baseline values, candidate values)} over the pool's pairs, benign flag}."""
    d = json.loads(MARGINS.read_text())
    scores, floor = d["clip_scores"], d["floor"]
    base = scores["baseline"]
    keys = sorted(base)

    def vec(recipe: str, ks) -> dict[str, np.ndarray]:
        rows = [scores[recipe][k] for k in ks]
        out = {f"reference_free.{n}": np.array([r["rf"][n] for r in rows]) for n in rows[0]["rf"]}
        out["prompt_faithfulness.faithfulness"] = np.array([r["faith"] for r in rows])
        return out

    out: dict[str, dict] = {}
    # benign: (prompt, seed) against the same prompt at every other seed: 4 x 4 x 3 = 48 pairs
    by_prompt: dict[str, list[str]] = {}
    for k in keys:
        by_prompt.setdefault(k.rsplit("-s", 1)[0], []).append(k)
    a_keys, b_keys = zip(*[(a, b) for ks in by_prompt.values() for a in ks for b in ks if a != b])
    A, B = vec("baseline", a_keys), vec("baseline", b_keys)
    out["benign"] = {"expected": "PASS", "pairs": {m: (A[m], B[m]) for m in A}, "floor": floor}
    for cand, want in (("turbo4-tiny", "PASS"), ("turbo4-tiny-lora03", "FAIL"), ("fewer-steps", "FAIL")):
        A, B = vec("baseline", keys), vec(cand, keys)
        out[cand] = {"expected": want, "pairs": {m: (A[m], B[m]) for m in A}, "floor": floor}
    bugs = json.loads(BUGS.read_text())
    share = lambda c: float(np.mean([bool(c[a]) for a in ASPECTS]))  # noqa: E731
    for name, plant in bugs["plants"].items():
        clips = plant.get("clips") or {}
        parent = bugs["parents"].get(plant["parent"], {}).get("clips") or {}
        ks = sorted(set(clips) & set(parent))
        if len(ks) < 8:
            continue  # refused at load: nothing to judge
        base_v = np.array([share(parent[k]) for k in ks])
        cand_v = np.array([share(clips[k]) for k in ks])
        identical = all(clips[k]["frames_sha256"] == parent[k]["frames_sha256"] for k in ks)
        expected = "PASS (byte-identical to its parent)" if identical else "a planted bug (clips differ)"
        out[f"bug:{name}"] = {"expected": expected,
                              "identical": identical, "floor": floor,
                              "pairs": {"prompt_faithfulness.faithfulness": (base_v, cand_v)}}
    return out


def metric_policies(pol) -> dict:
    judge = pol.judges["resample"]
    return {f"{g}.{m}": mp for g, gp in judge.gates.items() for m, mp in gp.metrics.items()}


def threshold(mp, key: str, floor: dict) -> float:
    t = mp.margin
    return float(t) if isinstance(t, (int, float)) else max(t.fraction_of_floor * floor[key], t.at_least)


def shift(mp, key: str, floor: dict) -> float:
    s = mp.regression.min_shift
    return float(s) if isinstance(s, (int, float)) else max(s.fraction_of_floor * floor[key], s.at_least)


def decide(pol, pool: dict, idx: np.ndarray) -> str:
    """The candidate's outcome over the pool's metrics at these pairs, by the verdict's own functions."""
    import datetime as dt

    from h3eval.verdict.decide import combine, decide_metrics, metric_statistics
    from h3eval.verdict.schema import MetricVerdict, PairValue, Settings

    settings = Settings(confidence=pol.confidence, alpha_one_sided=(1 - pol.confidence) / 2, power=pol.power,
                        n_resamples=pol.n_resamples, seed=pol.seed, holm=pol.holm, today=dt.date(2026, 12, 6))
    mps = metric_policies(pol)
    works = []
    for key, (base, cand) in pool["pairs"].items():
        mp = mps.get(key)
        if mp is None or (key not in pool["floor"] and not isinstance(mp.margin, (int, float))):
            continue  # a score the pool has but the policy or the pool's floor does not
        gate, metric = key.split(".", 1)
        pairs = [PairValue(prompt_id=f"p{i}", seed=int(j), value=float(cand[i]), baseline_value=float(base[i]),
                           file="") for j, i in enumerate(idx)]
        mv = MetricVerdict(gate=gate, metric=metric, candidate="c", compare=mp.compare, direction=mp.direction,
                           required=True, outcome="INCONCLUSIVE", raw_outcome="INCONCLUSIVE",
                           threshold=threshold(mp, key, pool["floor"]), n_pairs=len(idx), n_expected=len(idx),
                           regression_shift=shift(mp, key, pool["floor"]) if mp.regression else None, pairs=pairs)
        works.append(metric_statistics(mv, mp, settings))
    decide_metrics(works, pol, settings, "c")
    return combine([w.mv.outcome for w in works])


def simulate(pool: dict, runs: int, rng: np.random.Generator, fixed, seq_policies: dict, decidable: dict) -> dict:
    """The slow path: every verdict by :func:`decide` (the verdict's own functions), run after run."""
    n_pool = len(next(iter(pool["pairs"].values()))[0])
    res = {"fixed16": [], "fixed32": [], **{d: [] for d in seq_policies}, **{f"{d}_pairs": [] for d in seq_policies}}
    for _ in range(runs):
        idx = rng.integers(0, n_pool, size=LOOKS[-1])
        res["fixed16"].append(decide(fixed, pool, idx[:16]))
        res["fixed32"].append(decide(fixed, pool, idx))
        for d, pols in seq_policies.items():
            for k, n in enumerate(LOOKS):
                outcome = decide(pols[k], pool, idx[:n])
                if stop_decision(outcome, k, len(LOOKS), pool.get("identical", False), decidable[d][k])[0]:
                    break
            res[d].append(outcome)
            res[f"{d}_pairs"].append(n)
    return res


def draws(pool: dict, runs: int, rng: np.random.Generator) -> np.ndarray:
    """Each run's pairs (runs x 32 indices into the pool), drawn in the slow path's order from the same stream."""
    n_pool = len(next(iter(pool["pairs"].values()))[0])
    return np.stack([rng.integers(0, n_pool, size=LOOKS[-1]) for _ in range(runs)])


def judge_batch(pol, pool: dict, idx: np.ndarray, detail: bool = False):
    """Every run's outcome at these pairs (runs x n) under ``pol`` by bench/sequential/batch_verdict.py: the numbers
    :func:`decide` computes, per array."""
    specs = B.specs_for(pol, pool, metric_policies(pol), threshold, shift)
    return B.outcomes(specs, idx, confidence=pol.confidence, n_resamples=pol.n_resamples, seed=pol.seed,
                      holm=pol.holm, detail=detail)


VARIANTS = ("any-look-fail", "no-guard", "pass-clears-shift")
"""Stopping rules analysed beside the shipped one (h3eval.sequential.stop_decision), on the same draws and looks'
verdicts: ``any-look-fail``: a FAIL stops at any look, resolvable or not (the rule of 781fe76); ``no-guard``: any
PASS or FAIL stops at any look (the rule before f375d06: the bound on what early decisions save);
``pass-clears-shift``: the shipped rule, and an interim PASS at a resolvable look also stops when every metric with a
regression rule has its look-level CI lower bound above ``-min_shift`` (a non-inferiority test at the regression
rule's own shift, at the look's spent level: the candidate is shown not worse by what the regression rule FAILs)."""


def stops(rule: str, outcome: str, k: int, identical: bool, clears: bool, decidable: bool) -> bool:
    """Whether a run stops at look ``k`` under ``rule`` (``shipped``: h3eval.sequential.stop_decision)."""
    if rule == "no-guard":
        return outcome in ("PASS", "FAIL") or k == len(LOOKS) - 1
    if rule == "any-look-fail":
        return stop_decision(outcome, k, len(LOOKS), identical)[0]
    if rule == "pass-clears-shift":
        return stop_decision(outcome, k, len(LOOKS), identical or (outcome == "PASS" and clears and decidable),
                             decidable)[0]
    return stop_decision(outcome, k, len(LOOKS), identical, decidable)[0]


def simulate_batched(pool: dict, idx: np.ndarray, fixed, seq_policies: dict, decidable: dict) -> dict:
    """:func:`simulate`'s result from the same draws, every look of every run judged at once (a run's outcome at a
    look depends only on its first pairs, so judging looks after its stop changes nothing); also each look's
    outcomes (``looks``: design -> look -> runs' outcomes) and the :data:`VARIANTS` (``design:variant``)."""
    res: dict = {"fixed16": list(judge_batch(fixed, pool, idx[:, :16])), "fixed32": list(judge_batch(fixed, pool, idx)),
                 "looks": {}}
    identical = pool.get("identical", False)
    for d, pols in seq_policies.items():
        per_look, clears = [], []
        for k, n in enumerate(LOOKS):
            outs, det = judge_batch(pols[k], pool, idx[:, :n], detail=True)
            per_look.append(outs)
            reg = np.isfinite(det["p_worse"][0])
            clears.append(np.all(det["low"][:, reg] > -det["shift"][:, reg], axis=1))
        res["looks"][d] = per_look
        for rule in ("shipped", *VARIANTS):
            name = d if rule == "shipped" else f"{d}:{rule}"
            res[name], res[f"{name}_pairs"] = [], []
            for r in range(idx.shape[0]):
                for k, n in enumerate(LOOKS):
                    outcome = per_look[k][r]
                    if stops(rule, outcome, k, identical, bool(clears[k][r]), decidable[d][k]):
                        break
                res[name].append(outcome)
                res[f"{name}_pairs"].append(n)
    return res


def check(pool: dict, idx: np.ndarray, fixed, seq_policies: dict, batched: dict) -> dict:
    """The batched outcomes of the first runs against :func:`decide` on the same pairs: every look of both designs
    and both fixed designs."""
    compared, mismatches = 0, []
    for r in range(idx.shape[0]):
        want = {("fixed16", -1): decide(fixed, pool, idx[r, :16]), ("fixed32", -1): decide(fixed, pool, idx[r])}
        for d, pols in seq_policies.items():
            for k, n in enumerate(LOOKS):
                want[(d, k)] = decide(pols[k], pool, idx[r, :n])
        for (d, k), w in want.items():
            got = batched[d][r] if k < 0 else batched["looks"][d][k][r]
            compared += 1
            if got != w:
                mismatches.append({"run": r, "design": d, "look": k + 1, "batched": got, "decide": w})
    return {"runs": int(idx.shape[0]), "verdicts_compared": compared, "mismatches": mismatches}


def rate(k: int, n: int) -> dict:
    from scipy.stats import beta

    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return {"k": k, "n": n, "rate": k / n, "ci95": [lo, hi]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rng", type=int, default=20261206)
    parser.add_argument("--only", default="", help="comma-separated pool names (default all)")
    parser.add_argument("--slow", action="store_true", help="every verdict by decide(), run after run (the old path)")
    parser.add_argument("--check", type=int, default=0, metavar="K",
                        help="compare the batched outcomes of each pool's first K runs with decide()'s")
    parser.add_argument("--name", default="sequential_sim", help="results/NAME.json and .md")
    parser.add_argument("--same-as", default="", metavar="JSON",
                        help="a record of the slow path (same --runs and --rng): compare every pool's counts with it")
    args = parser.parse_args()
    from h3eval.sequential import look_policy, make_design, policy_alphas, resolvable

    started = time.perf_counter()
    fixed = policy()
    seq, dec = {}, {}
    designs = {}
    for d in ("obrien-fleming", "pocock"):
        design = make_design(d, LOOKS, policy_alphas(fixed))
        designs[d] = design.to_dict()
        seq[d] = [look_policy(fixed, design, k) for k in range(len(LOOKS))]
        dec[d] = [resolvable(design, k, (1 - fixed.confidence) / 2, fixed.n_resamples) for k in range(len(LOOKS))]
    rng = np.random.default_rng(args.rng)
    rows = {}
    all_pools = pools()
    for name, pool in all_pools.items():
        if args.only and name not in args.only.split(","):
            continue
        if args.slow:
            res = simulate(pool, args.runs, rng, fixed, seq, dec)
        else:
            idx = draws(pool, args.runs, rng)
            res = simulate_batched(pool, idx, fixed, seq, dec)
        row = {"expected": pool["expected"], "metrics": len(pool["pairs"])}
        if not args.slow:
            row["by_look"] = by_look(res, pool, dec)
            if args.check:
                row["check"] = check(pool, idx[:args.check], fixed, seq, res)
        designs_here = [d for d in ("fixed16", "fixed32", *seq, *(f"{d}:{v}" for d in seq for v in VARIANTS))
                        if d in res]
        for design in designs_here:
            outs = res[design]
            row[design] = {o: outs.count(o) for o in ("PASS", "FAIL", "INCONCLUSIVE")}
            row[design]["FAIL_rate"] = rate(outs.count("FAIL"), len(outs))
            row[design]["PASS_rate"] = rate(outs.count("PASS"), len(outs))
            if design not in ("fixed16", "fixed32"):
                row[design]["excess_over_fixed32"] = excess(outs, res["fixed32"])
                pairs = np.array(res[f"{design}_pairs"])
                row[design]["mean_pairs"] = float(pairs.mean())
                row[design]["share_of_fixed16"] = float(pairs.mean() / 16)
                row[design]["share_of_fixed32"] = float(pairs.mean() / 32)
        rows[name] = row
        print(name, {k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk in
                                                             ("PASS", "FAIL", "INCONCLUSIVE", "mean_pairs")})
                     for k, v in row.items()}, flush=True)
    record({"runs": args.runs, "rng": args.rng, "looks": list(LOOKS), "designs": designs,
            "policy": "gates/policies/release.toml without [speed] and vbench, 999 resamples", "pools": rows,
            "path": "slow (decide per verdict)" if args.slow else "batched (bench/sequential/batch_verdict.py)",
            **({"same_as": same_as(Path(args.same_as), rows)} if args.same_as else {}),
            "seconds": round(time.perf_counter() - started, 1)}, args.name)


def same_as(path: Path, rows: dict) -> dict:
    """Every pool's and design's counts against another record's (the slow path's, same draws). A record without a
    ``path`` (781fe76's) stopped a FAIL at any look: its sequential designs are compared with ``any-look-fail``."""
    other = json.loads(path.read_text())
    rule = "shipped" if "path" in other else "any-look-fail"
    here = {"fixed16": "fixed16", "fixed32": "fixed32", **{d: d if rule == "shipped" else f"{d}:{rule}"
                                                           for d in ("obrien-fleming", "pocock")}}
    diffs = [{"pool": p, "design": d, "here": rows[p][here[d]], "there": o[d]}
             for p, o in other["pools"].items() if p in rows
             for d in here if d in o and {k: rows[p][here[d]].get(k) for k in o[d]} != o[d]]
    return {"record": str(path), "date": other.get("date"), "rule": rule, "path": other.get("path", "slow (decide per verdict)"),
            "seconds": other.get("seconds"), "rows_compared": sum(1 for p in other["pools"] if p in rows) * 4,
            "differences": diffs}


def excess(outs: list[str], fixed: list[str]) -> dict:
    """On the same draws: the runs this design FAILs (PASSes) that the fixed 32 does not, as a rate with its
    Clopper-Pearson 95 % CI: an upper bound on how much the design adds to the fixed design's FAIL (PASS) rate."""
    return {o: rate(sum(a == o != b for a, b in zip(outs, fixed)), len(outs)) for o in ("FAIL", "PASS")}


def by_look(res: dict, pool: dict, decidable: dict) -> dict:
    """Per design and look: the outcomes of the runs still going there, how many stop there, and how many PASS
    there but go on (the guard: only a FAIL or a byte-identical PASS stops before the last look)."""
    out = {}
    for d, per_look in res["looks"].items():
        going = np.ones(len(per_look[0]), dtype=bool)
        rows = []
        for k, outs in enumerate(per_look):
            outs = np.asarray(outs)
            stop = np.array([stop_decision(o, k, len(LOOKS), pool.get("identical", False), decidable[d][k])[0]
                             for o in outs])
            rows.append({"look": k + 1, "pairs": LOOKS[k], "going": int(going.sum()),
                         **{o: int((going & (outs == o)).sum()) for o in ("PASS", "FAIL", "INCONCLUSIVE")},
                         "resolvable": decidable[d][k], "stopped": int((going & stop).sum()),
                         "passed_but_went_on": int((going & ~stop & (outs == "PASS")).sum())})
            going &= ~stop
        out[d] = rows
    return out


def record(payload: dict, name: str = "sequential_sim") -> None:
    from bench.lib.results import context
    from h3.atomic import atomic_write_json, atomic_write_text

    results = Path(__file__).resolve().parent / "results"
    data = {**context(), **payload}
    atomic_write_json(results / f"{name}.json", data)
    pct = lambda r: f"{r['rate']:.1%} [{r['ci95'][0]:.1%}, {r['ci95'][1]:.1%}]"  # noqa: E731
    numerics = data["machine"].get("numerics") or {}
    cpu = f" ({numerics['cpu_model']})" if numerics.get("cpu_model") else ""
    lines = [f"# {name}", "", f"- date: {data['date']}", f"- command: `{data['command']}`",
             f"- machine: {data['machine']['platform']}, {data['machine']['cpu_count']} cpus{cpu}",
             f"- path: {payload.get('path', 'slow')}; {payload['seconds']} s",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
             f"- {payload['runs']} simulated runs per pool, looks {payload['looks']}; {payload['policy']}", "",
             "| pool | expected | design | PASS | FAIL | INCONCLUSIVE | FAIL rate (95% CI) | PASS rate (95% CI) "
             "| mean pairs | FAILs not the fixed 32's (95% CI) | PASSes not the fixed 32's (95% CI) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for pool_name, row in payload["pools"].items():
        for design in [d for d in row if isinstance(row[d], dict) and "FAIL_rate" in row[d]]:
            r = row[design]
            mean = r.get("mean_pairs", 16 if design == "fixed16" else 32)
            ex = r.get("excess_over_fixed32")
            extra = f"{pct(ex['FAIL'])} | {pct(ex['PASS'])} |" if ex else " | |"
            lines.append(f"| {pool_name} | {row['expected']} | {design} | {r['PASS']} | {r['FAIL']} | "
                         f"{r['INCONCLUSIVE']} | {pct(r['FAIL_rate'])} | {pct(r['PASS_rate'])} | {mean:.1f} | {extra}")
    means: dict[str, list[float]] = {}
    for row in payload["pools"].values():
        for design, r in row.items():
            if isinstance(r, dict) and "mean_pairs" in r:
                means.setdefault(design, []).append(r["mean_pairs"])
    lines += ["", "| design | mean pairs over the pools | share of the fixed 32 | share of the fixed 16 |",
              "|---|---|---|---|"]
    lines += [f"| {d} | {np.mean(v):.1f} | {np.mean(v) / 32:.0%} | {np.mean(v) / 16:.0%} |" for d, v in means.items()]
    atomic_write_text(results / f"{name}.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
