"""Sequential signoff on the recipe-signoff corpus (issue 53): the group-sequential designs of h3eval.sequential
(looks of 4, 8, 16, 32 pairs) against the fixed 16- and 32-pair designs, judged by the verdict itself, with every
judge of the release policy (exact, near, resample; ladders judged against their parents and the ladder top against
the baseline), on the trained tiny's correct recipes and the recipe-bug corpus' plants.

    python bench/sequential/corpus_sim.py --work WORK --pools 15,18,19,20 --runs 40 [--designs obrien-fleming,pocock]
        [--workers 2] [--name NAME]

WORK is bench/recipe_signoff/recipe_signoff.py's work folder, its pools gated (``--gate-only``): each pool is 4
prompts x 8 seeds, so a simulated 32-pair run is a bootstrap of the pool: each prompt's 8 seed slots drawn with
replacement (recipe_signoff.form_run); look ``k`` takes the run's first ``n_k / 4`` slots of every prompt, the fixed 16
its first 4, the fixed 32 all 8. Every design is judged on the same draws, so the differences are paired.

Each look is judged by recipe_signoff.judge_run (h3eval.verdict.compute_verdict on the pool's gate results) under
h3eval.sequential_design.look_policy, and a candidate stops by h3eval.sequential_design.stop_decision, as ``h3eval ab
--sequential`` does; a candidate is byte-identical when each of its clips at the look's pairs equals its parent's and
the baseline's byte for byte (a rung is judged against both). A run's requests: the baseline until the last candidate
stops, each candidate until it stops or, when later, until the last of the rungs built on it (its children's near
judge needs its clips) stops; the fixed design makes every recipe's 32.

Errors: a FAIL of a correct recipe (recipe_signoff.CORRECT) is false; a PASS of a plant or of a shipped recipe whose
clips changed (CHANGED_SHIPPED) is false. Each is compared with the fixed designs' on the same draws: the runs where
the sequential design errs and the fixed one does not (its excess), with a Clopper-Pearson interval.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

import math

import numpy as np
from scipy.stats import betabinom, norm

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "recipe_signoff"))
import recipe_signoff as RS  # noqa: E402

LOOKS = (4, 8, 16, 32)
FIXED = (16, 32)
RULES = ("shipped", "curtail")
_POOL: dict = {}  # the worker's pool (filled before the fork)


def prepare_pool(work: Path, pool: int, designs: list[str], n_resamples: int) -> dict:
    """A pool's gate results, floor, policies (shipped and per look and design) and byte-identity map."""
    from h3eval.policy import LoadedPolicy
    from h3eval.sequential_design import look_policy, make_design, policy_alphas, resolvable
    from h3eval.store import RunStore

    run = work / f"pool{pool}" / "run"
    if not (run / "run.json").is_file():
        raise SystemExit(f"pool {pool}: no gated run at {run} (recipe_signoff.py --gate-only first)")
    loaded = RS.sim_policy(n_resamples)
    manifest = RS.load_pool(run).manifest
    stems = {RS.recipe_of(p.stem).name: p.stem for p in RS.PLANTS.glob("*.toml")}  # a plant's recipe name -> stem
    RS.score_pool(work, pool, [stems.get(c, c) for c in [manifest.baseline, *manifest.candidates]], make=False)
    missing = RS.write_clip_gate_results(run, loaded, work / f"pool{pool}" / "scores")
    if missing:
        raise SystemExit(f"pool {pool}: clips not scored: {missing[:5]}")
    data = RS.load_pool(run)
    m = data.manifest
    store = RunStore(run)
    parent, identical = {}, {}
    for c in m.candidates:
        ladder = RS.chain(m, c)
        parent[c] = ladder[-2] if len(ladder) > 1 else m.baseline
        refs = {parent[c], m.baseline}  # a ladder's top is judged against both (h3eval.sequential._record_look)
        identical[c] = {(pid, s): all(store.clip_path(c, pid, s).read_bytes() == store.clip_path(r, pid, s).read_bytes()
                                      for r in refs)
                        for pid in data.seeds for s in data.seeds[pid]}
    looks = {}
    for d in designs:
        design = make_design(d, list(LOOKS), policy_alphas(loaded.policy))
        alpha_ni = (1 - loaded.policy.confidence) / 2
        looks[d] = [(LoadedPolicy(policy=look_policy(loaded.policy, design, k), path=loaded.path,
                                  sha256=f"{loaded.sha256} at {d} look {k + 1}"),
                     resolvable(design, k, alpha_ni, loaded.policy.n_resamples)) for k in range(len(LOOKS))]
    return {"pool": pool, "data": data, "floor": run.parent / "floor.json", "loaded": loaded, "looks": looks,
            "parent": parent, "identical": identical, "candidates": list(m.candidates)}


def _judge(picks, loaded, scratch: Path, tag: str, n: int) -> dict[str, list]:
    """Every candidate's outcome at these pairs and, for the curtailed rule, its predicted risk of not passing at
    the design's last look (h3eval.sequential_design.pass_risk; None where it cannot be predicted)."""
    root = scratch / tag
    RS.write_run(root, _POOL["data"], picks)
    try:
        rows = RS.judge_run(root, loaded, _POOL["floor"], keep=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    conf = _POOL["loaded"].policy.confidence
    return {c: [r["outcome"], pass_risk(r["verdict"], n, LOOKS[-1], conf)] for c, r in rows.items()}


def stops(looks: list[dict], identical: dict, decidable: list[bool], rule: str) -> dict[str, list]:
    """Each candidate's [outcome, pairs] where it stops under ``rule``: ``shipped`` (stop_decision as h3eval ab
    --sequential applies it: an interim PASS stops only byte-identical) or ``curtail`` (an interim PASS at a
    resolvable look also stops when its pass_risk is at most CURTAIL_RISK)."""
    from h3eval.sequential_design import stop_decision

    out = {}
    for c in looks[0]:
        for k, n in enumerate(LOOKS):
            outcome, risk = looks[k][c]
            curtailed = rule == "curtail" and risk is not None and risk <= CURTAIL_RISK
            # h3eval ab --sequential's rule; a curtailed PASS at a resolvable look stops as a byte-identical one does
            if stop_decision(outcome, k, len(LOOKS), identical[c][k] or (curtailed and decidable[k]),
                             decidable[k])[0]:
                out[c] = [outcome, n]
                break
    return out


def simulate_run(args: tuple[int, int]) -> dict:
    """One 32-pair draw: the fixed designs' outcomes and each sequential design and rule's (outcome, pairs at its
    stop). Every candidate is judged at every look (a verdict does not depend on which rungs still run), so the rules
    compare on the same verdicts."""
    rng_seed, i = args
    p = _POOL
    picks = RS.form_run(p["data"].seeds, np.random.default_rng([rng_seed, p["pool"], i]), seeds_per_prompt=8)
    n_prompts = len(p["data"].seeds)

    def first(n: int):
        return [x for x in picks if x[1] < n // n_prompts]

    identical = {c: [all(p["identical"][c][(pid, seed)] for pid, _, seed in first(n)) for n in LOOKS]
                 for c in p["candidates"]}
    out: dict = {"fixed": {}, "seq": {}, "risk": {}}
    with tempfile.TemporaryDirectory(prefix="corpus_sim-") as tmp:
        scratch = Path(tmp)
        for n in FIXED:
            got = _judge(first(n), p["loaded"], scratch, f"fixed{n}", n)
            out["fixed"][str(n)] = {c: v[0] for c, v in got.items()}
        for d, looks in p["looks"].items():
            verdicts = [_judge(first(n), looks[k][0], scratch, f"{d}{k}", n) for k, n in enumerate(LOOKS)]
            for rule in RULES:
                out["seq"][f"{d}:{rule}"] = stops(verdicts, identical, [x[1] for x in looks], rule)
            out["risk"][d] = [{c: v[1] for c, v in look.items()} for look in verdicts]
            out.setdefault("outcomes", {})[d] = [{c: v[0] for c, v in look.items()} for look in verdicts]
    out["identical"] = identical
    return out


CURTAIL_RISK = 0.005
"""The ``curtail`` rule's bound on a PASS's predicted chance (summed over its metrics) of not passing at the last
look, set before any run of this script: half the 0.5-point excess of false PASS issue 53 allows (among runs stopped
so, the expected share the last look would judge otherwise is at most this, if the predictive model holds)."""


def pass_risk(candidate, n: int, max_pairs: int, confidence: float, regression_alpha: float = 0.01) -> float | None:
    """The predicted chance that ``candidate`` (a CandidateVerdict at a look of ``n`` pairs) would not PASS at the
    last look of ``max_pairs`` pairs under the shipped policy, summed over its required metrics (the ladder top's
    against the baseline too; Boole); None when a required metric cannot be predicted.

    A paired metric's final mean, given its ``k`` pairs so far (mean ``m``, sd ``s``), is predicted as normal with
    mean ``m`` and sd ``w = s sqrt((N - k) / (N k))`` (the flat-prior predictive distribution). It misses a PASS by
    non-inferiority when the final mean is within ``z s / sqrt(N)`` of ``-margin`` (``z`` at the final one-sided
    level; a ``pair`` metric's deltas are the room left to its threshold: margin 0), and by the regression rule when
    it is at or below both ``-min_shift`` and ``-z_r s / sqrt(N)`` (``z_r`` at ``regression_alpha``, Holm left out,
    which overstates the chance). A flag metric's chance is :func:`_flag_risk`'s."""
    alpha = (1.0 - confidence) / 2.0
    z, z_reg = float(norm.isf(alpha)), float(norm.isf(regression_alpha))
    total = 0.0
    verdicts = [candidate] + ([candidate.against_baseline] if candidate.against_baseline is not None else [])
    for v in verdicts:
        for g in v.gates:
            if not g.required:
                continue
            for m in g.metrics:
                if not m.required:
                    continue
                st = m.stats or {}
                if m.compare == "flag":
                    risk = _flag_risk(st, m.n_pairs, max_pairs)
                    if risk is None:
                        return None
                    total += risk
                    continue
                mean, sd, k = st.get("mean"), st.get("sd"), st.get("n")
                if mean is None or sd is None or not k or not (math.isfinite(mean) and math.isfinite(sd)):
                    return None
                w = sd * math.sqrt(max(max_pairs - k, 0) / (max_pairs * k))
                se = sd / math.sqrt(max_pairs)
                margin = 0.0 if m.compare == "pair" or m.threshold is None else float(m.threshold)
                limits = [-margin + z * se]
                if m.regression_shift is not None:
                    limits.append(min(-float(m.regression_shift), -z_reg * se))
                for lim in limits:
                    total += (1.0 if mean <= lim else 0.0) if w == 0 else float(norm.cdf((lim - mean) / w))
    return total


def _flag_risk(stats: dict, n: int, max_pairs: int) -> float | None:
    """A flag metric's predicted chance of more than ``max_flagged_pairs`` candidate-flagged pairs at the last look:
    the flag rate's Jeffreys posterior after ``f`` of ``n`` pairs (Beta(f + 1/2, n - f + 1/2)), the remaining pairs'
    flags beta-binomial. Its McNemar condition (``flag_alpha``) is left out: the chance is an upper bound."""
    f, limit = stats.get("candidate_flagged"), stats.get("max_flagged_pairs")
    if not isinstance(f, int) or not isinstance(limit, int) or n < 1:
        return None
    if f > limit:
        return 1.0
    rest = max(max_pairs - n, 0)
    return 0.0 if rest == 0 else float(betabinom.sf(limit - f, rest, f + 0.5, n - f + 0.5))


def requests(stops: dict[str, list], parent: dict[str, str], baseline: str) -> int:
    """A run's quality requests, counted as ``h3eval ab --sequential`` counts them (h3eval.sequential.pairs_used):
    each recipe until it and every rung built on it have stopped; the baseline until the last candidate has."""
    from h3eval.sequential import pairs_used

    state = {"max_pairs": LOOKS[-1], "baseline": baseline, "candidates": list(stops),
             "parents": {c: p for c, p in parent.items() if p != baseline},
             "stopped": {c: {"n_pairs": n} for c, (_, n) in stops.items()}}
    return sum(pairs_used(state).values())


def truth(c: str) -> str:
    """'correct' (a FAIL is false), 'bug' (a PASS is false)."""
    return "correct" if c in RS.CORRECT else "bug"


def summarize(pools: dict[int, dict], designs: list[str]) -> dict:
    rows, totals = {}, {}
    for pool, res in pools.items():
        runs, parent, base = res["runs"], res["parent"], res["baseline"]
        fixed_req = sum(32 * (1 + len(parent)) for _ in runs)
        for d in designs:
            t = totals.setdefault(d, {"requests": 0, "fixed32_requests": 0, "fixed16_requests": 0})
            t["requests"] += sum(requests(r["seq"][d], parent, base) for r in runs)
            t["fixed32_requests"] += fixed_req
            t["fixed16_requests"] += fixed_req // 2
        for c in parent:
            row = rows.setdefault(f"{pool}:{c}", {"pool": pool, "candidate": c, "truth": truth(c), "runs": len(runs)})
            bad = "FAIL" if truth(c) == "correct" else "PASS"
            for n in FIXED:
                oc = [r["fixed"][str(n)][c] for r in runs]
                row[f"fixed{n}"] = {o: oc.count(o) for o in ("PASS", "FAIL", "INCONCLUSIVE")}
            for d in designs:
                oc = [r["seq"][d][c][0] for r in runs]
                pairs = [r["seq"][d][c][1] for r in runs]
                excess = {str(n): sum(1 for r in runs if r["seq"][d][c][0] == bad and r["fixed"][str(n)][c] != bad)
                          for n in FIXED}
                row[d] = {**{o: oc.count(o) for o in ("PASS", "FAIL", "INCONCLUSIVE")},
                          "mean_pairs": float(np.mean(pairs)),
                          "stopped_at": {str(n): pairs.count(n) for n in LOOKS},
                          "errs": oc.count(bad), "excess_over_fixed": excess,
                          "excess_ci": {n: RS.clopper_pearson(k, len(runs)) for n, k in excess.items()}}
    return {"rows": rows, "totals": totals}


def markdown(summary: dict, designs: list[str]) -> str:
    pct = RS.pct
    lines = ["| pool | candidate | truth | runs | fixed 16 P/F/I | fixed 32 P/F/I | "
             + " | ".join(f"{d} P/F/I | {d} mean pairs (stops at 4/8/16/32) | {d} errs beyond fixed 32 [95% CI]"
                          for d in designs) + " |",
             "|---|---|---|---|---|---|" + "---|---|---|" * len(designs)]
    for row in summary["rows"].values():
        def pfi(x):
            return f"{x['PASS']}/{x['FAIL']}/{x['INCONCLUSIVE']}"
        cells = [str(row["pool"]), f"`{row['candidate']}`", row["truth"], str(row["runs"]), pfi(row["fixed16"]),
                 pfi(row["fixed32"])]
        for d in designs:
            x = row[d]
            lo, hi = x["excess_ci"]["32"]
            cells += [pfi(x), f"{x['mean_pairs']:.1f} ({'/'.join(str(x['stopped_at'][str(n)]) for n in LOOKS)})",
                      f"{x['excess_over_fixed']['32']} ({pct(x['excess_over_fixed']['32'] / row['runs'])}) "
                      f"[{pct(lo)}, {pct(hi)}]"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for d in designs:
        t = summary["totals"][d]
        lines.append(f"- **{d}**: {t['requests']} quality requests against the fixed 32's {t['fixed32_requests']} "
                     f"(**{pct(t['requests'] / t['fixed32_requests'])}**) and the fixed 16's {t['fixed16_requests']} "
                     f"({pct(t['requests'] / t['fixed16_requests'])}).")
    for d in designs:
        for kind, bad in (("correct", "FAIL"), ("bug", "PASS")):
            rs = [r for r in summary["rows"].values() if r["truth"] == kind]
            n = sum(r["runs"] for r in rs)
            if not n:
                continue
            seq = sum(r[d]["errs"] for r in rs)
            f32 = sum(r["fixed32"][bad] for r in rs)
            f16 = sum(r["fixed16"][bad] for r in rs)
            ex = sum(r[d]["excess_over_fixed"]["32"] for r in rs)
            lo, hi = RS.clopper_pearson(ex, n)
            lines.append(f"- {d}, {kind} recipes ({bad} is the error), {n} runs pooled: sequential {seq} "
                         f"({pct(seq / n)}), fixed 32 {f32} ({pct(f32 / n)}), fixed 16 {f16} ({pct(f16 / n)}); runs "
                         f"where only the sequential design errs (vs fixed 32): {ex}, {pct(ex / n)} [{pct(lo)}, "
                         f"{pct(hi)}]")
    for d, r in summary.get("risk", {}).items():
        lines.append(f"- {d}: interim PASSes (looks 1-3, every candidate judged at every look): {r['n']}; their "
                     f"predicted chance of not passing at 32 pairs (pass_risk): min {r['min']}, median {r['median']};"
                     f" at most CURTAIL_RISK {CURTAIL_RISK}: {r['curtailable']} (correct recipes: "
                     f"{r['correct_min']} the smallest)")
    return "\n".join(lines) + "\n"


def risk_summary(pools: dict[int, dict], designs: list[str]) -> dict:
    """Over every run and candidate, the pass_risk of each interim PASS (looks 1-3) per design."""
    out = {}
    for d in designs:
        vals, correct = [], []
        for res in pools.values():
            for r in res["runs"]:
                for k, look in enumerate(r["risk"][d][:-1]):
                    for c, risk in look.items():
                        if r["outcomes"][d][k][c] == "PASS" and not r["identical"][c][k]:
                            vals.append(math.inf if risk is None else risk)
                            if truth(c) == "correct":
                                correct.append(vals[-1])
        fmt = (lambda x: "none" if x is None else f"{x:.3g}")
        out[d] = {"n": len(vals), "min": fmt(min(vals, default=None)),
                  "median": fmt(float(np.median(vals)) if vals else None),
                  "curtailable": sum(v <= CURTAIL_RISK for v in vals), "correct_min": fmt(min(correct, default=None))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--pools", default="15,18,19,20")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--designs", default="obrien-fleming,pocock")
    parser.add_argument("--rng", type=int, default=20261207)
    parser.add_argument("--n-resamples", type=int, default=999)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--name", default="corpus_sim")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    designs = [d for d in args.designs.split(",") if d]
    started = time.perf_counter()
    pools: dict[int, dict] = {}
    for pool in [int(p) for p in args.pools.split(",") if p]:
        global _POOL
        _POOL = prepare_pool(args.work, pool, designs, args.n_resamples)
        t0 = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(args.workers) as workers:
            runs = []
            for r in workers.imap(simulate_run, [(args.rng, i) for i in range(args.runs)]):
                runs.append(r)
                if len(runs) % 5 == 0:
                    print(f"pool {pool}: {len(runs)} of {args.runs} runs in {time.perf_counter() - t0:.0f} s",
                          flush=True)
        pools[pool] = {"runs": runs, "parent": _POOL["parent"], "baseline": _POOL["data"].manifest.baseline,
                       "policy": _POOL["loaded"].sha256}
    variants = [f"{d}:{rule}" for d in designs for rule in RULES]
    summary = summarize(pools, variants)
    summary["risk"] = risk_summary(pools, designs)
    md = markdown(summary, variants)
    from bench.lib.results import write

    payload = {"note": args.note, "looks": list(LOOKS), "designs": designs, "pools": args.pools, "runs": args.runs,
               "policy": next(iter(pools.values()))["policy"], "summary": summary,
               "per_pool": {str(p): {"parent": v["parent"], "runs": [{k: r[k] for k in ("fixed", "seq")}
                                                                      for r in v["runs"]]} for p, v in pools.items()},
               "seconds": round(time.perf_counter() - started, 1)}
    write(args.name, payload, (args.note + "\n\n" if args.note else "") + md)
    print(md)


if __name__ == "__main__":
    main()
