"""Resample margins on the mean (issue 50): do the 8-step recipe without a LoRA and the LoRA at 0.3 FAIL the release
policy's non-inferiority itself, and what is the benign false-FAIL rate under the same margins?

    python bench/resample_margins/resample_margins.py [--pool /tmp/resample_margins] [--seeds 4,5,6,7] [--runs 1000]
                                                      [--model tiny-trained] [--scores-only]

1. Clips: the baseline, ``turbo4-tiny``, ``turbo4-tiny-lora03`` (bench/recipes) and ``fewer-steps`` on the trained
   tiny, the world-demo captions x ``--seeds`` (signoff_proof's pool: seeds 4-7 are signoff_proof_run23d200_seeds4567's
   and signoff_false_fail_run23d200_seeds4567's), made with bench/signoff_proof/signoff_proof.py's ``generate``.
2. Every clip scored once by the gates' own functions (reference_free's ``score_mp4``, prompt_faithfulness's
   ``clip_faithfulness``); the per-clip scores go into the record, so the figures below can be recomputed from it.
3. Candidates: each one's 16 same-seed pairs judged by ``compute_verdict`` under gates/policies/release.toml with its
   ``regression`` side rule removed (and without [speed] and vbench: no VBench environment here), so a FAIL is the
   non-inferiority test's own, at the shipped margins and at each of :data:`MARGINS` x the floor with
   ``fail_beyond = "ci"``; then under the policy as shipped.
4. Benign: ``--runs`` simulated runs of 16 pairs of the baseline against itself under other seeds
   (bench/signoff_false_fail/signoff_false_fail.py's ``resample_run``), judged under the shipped policy without [speed] and vbench; the
   false-FAIL rate with its Clopper-Pearson CI (optimistic: one pool resampled).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "signoff_false_fail"))

RELEASE = ROOT / "gates" / "policies" / "release.toml"
CANDIDATES = ["turbo4-tiny", "turbo4-tiny-lora03", "fewer-steps"]
EXPECTED = {"turbo4-tiny": "PASS", "turbo4-tiny-lora03": "FAIL", "fewer-steps": "FAIL"}
DROPPED = ("vbench",)
"""Gates left out of the simulated policy: VBench needs its pinned environment, which this machine lacks."""


def make_clips(pool: Path, model: str, seeds: list[int], candidates: list[str]) -> None:
    from bench.lib.tiny import generate, recipe

    from h3eval.prompts import load_prompts

    generate(pool, model, [recipe(n, model) for n in ["baseline", *candidates]], load_prompts("world-demo"), seeds,
             "ab")


def clip_scores(pool: Path) -> dict[str, dict[str, dict]]:
    """recipe -> ``<prompt>-s<seed>`` -> {rf: reference-free scores, faith: faithfulness, problems: integrity}."""
    from gates.integrity import check_clip
    from gates.media_cache import load_audio, load_video
    from gates.prompt_faithfulness import clip_faithfulness
    from gates.reference_free import ReferenceFreeOptions, score_mp4
    from h3eval.store import RunStore

    store = RunStore(pool)
    manifest = store.read_manifest()
    out: dict[str, dict[str, dict]] = {}
    for name in [manifest.baseline, *manifest.candidates]:
        for pid in manifest.prompts.ids:
            for seed in manifest.seeds:
                record = store.read_record(name, pid, seed)
                mp4 = store.clip_path(name, pid, seed)
                rf, _ = score_mp4(mp4, ReferenceFreeOptions())
                frames, _ = load_video(mp4)
                audio, rate = load_audio(mp4)
                faith, _ = clip_faithfulness(frames, audio, int(rate), record.request.prompt)
                integrity = check_clip(mp4, record.model_dump(mode="json"))
                out.setdefault(name, {})[f"{pid}-s{seed}"] = {
                    "rf": {k: float(v) for k, v in rf.items()}, "faith": float(faith),
                    "problems": len(integrity.problems) + (integrity.decode_error is not None)}
    return out


def floor_of(base: dict[str, dict]) -> dict[str, float]:
    """The new-seed floor of each per-clip score (``h3eval floor``'s definition): the mean |difference| between each
    clip and the same prompt's next seed."""
    from gates.reference_free import DIMENSIONS

    keys = sorted(base)
    by_prompt: dict[str, list[str]] = {}
    for key in keys:
        by_prompt.setdefault(key.rsplit("-s", 1)[0], []).append(key)
    pairs = [(ks[i], ks[(i + 1) % len(ks)]) for ks in by_prompt.values() for i in range(len(ks))]
    out = {f"reference_free.{name}": float(np.mean([abs(base[a]["rf"][name] - base[b]["rf"][name])
                                                    for a, b in pairs])) for name in DIMENSIONS}
    out["prompt_faithfulness.faithfulness"] = float(np.mean([abs(base[a]["faith"] - base[b]["faith"])
                                                             for a, b in pairs]))
    return out


MARGINS = (0.4, 0.7, 1.0, 1.5)
"""Margins tried (x the new-seed floor), each with non-inferiority FAILing when the whole CI is beyond it."""


def sim_policy(regression: bool, margin_k: float | None = None):
    """release.toml without [speed] and the dropped gates (and without every metric's ``regression`` side rule when
    ``regression`` is False; with every floor-relative margin at ``margin_k`` x the floor and ``fail_beyond = "ci"``
    when given), 999 bootstrap resamples (a FAIL never depends on them)."""
    from h3eval.policy import LoadedPolicy, parse_policy

    data = tomllib.loads(RELEASE.read_text())
    data.pop("speed", None)
    data["n_resamples"] = 999
    for judge in data["judges"].values():
        for gate in DROPPED:
            judge["gates"].pop(gate, None)
        for gate in judge["gates"].values():
            for metric in gate.get("metrics", {}).values():
                if not regression:
                    metric.pop("regression", None)
                if margin_k is not None and isinstance(metric.get("margin"), dict):
                    metric["margin"]["fraction_of_floor"] = margin_k
                    metric["fail_beyond"] = "ci"
    what = "release.toml without [speed], " + ", ".join(DROPPED) + ("" if regression else ", regression rules") + (
        f", margins {margin_k} x floor failing beyond the CI" if margin_k is not None else "")
    return LoadedPolicy(policy=parse_policy(data, RELEASE), path=RELEASE, sha256=f"simulated: {what}")


def _write_pair(store, candidate: str, pid: str, seed: int, base: dict, cand: dict) -> None:
    from gates.reference_free import DIMENSIONS
    from signoff_false_fail import _write

    flagged = base["problems"] + cand["problems"] > 0
    _write(store, "integrity", candidate, pid, seed, {"baseline_problems": (base["problems"], False, None),
                                                      "candidate_problems": (cand["problems"], False, None)},
           flagged=flagged, flags=["integrity problems"] if flagged else [])
    rf = {}
    for name, dim in DIMENSIONS.items():
        rf[name] = (cand["rf"][name], dim.higher_is_better, dim.unit)
        rf[f"{name}.baseline"] = (base["rf"][name], dim.higher_is_better, dim.unit)
    _write(store, "reference_free", candidate, pid, seed, rf)
    _write(store, "prompt_faithfulness", candidate, pid, seed,
           {"faithfulness": (cand["faith"], True, None), "faithfulness.baseline": (base["faith"], True, None)})


def judge_candidates(scores: dict, floor: Path, root: Path) -> dict:
    """Each candidate's same-seed pairs, judged with and without the regression side rule."""
    from signoff_false_fail import _manifest

    from h3eval.verdict import compute_verdict

    base = scores["baseline"]
    keys = sorted(base)
    prompts = sorted({k.rsplit("-s", 1)[0] for k in keys})
    seeds = sorted({int(k.rsplit("-s", 1)[1]) for k in keys})
    out = {}
    for candidate in [c for c in CANDIDATES if c in scores]:
        store = _manifest(root / candidate, candidate, "resample", prompts, seeds)
        for key in keys:
            pid, seed = key.rsplit("-s", 1)
            _write_pair(store, candidate, pid, int(seed), base[key], scores[candidate][key])
        row = {"expected": EXPECTED[candidate]}
        variants = [("non_inferiority_only", False, None), ("shipped", True, None)]
        variants += [(f"non_inferiority_only@{k}xfloor_ci", False, k) for k in MARGINS]
        for label, regression, margin_k in variants:
            c = compute_verdict(store.root, sim_policy(regression, margin_k), floor_path=floor).candidates[0]
            metrics = [m for g in c.gates for m in g.metrics if m.required]
            row[label] = {
                "outcome": c.outcome,
                "failed": [f"{m.gate}.{m.metric}" for m in metrics if m.outcome == "FAIL"],
                "metrics": {f"{m.gate}.{m.metric}": {
                    "outcome": m.outcome, "mean_delta": m.mean_value, "ci": [m.ci_low, m.ci_high],
                    "margin": m.threshold, "margin_source": m.threshold_source,
                    "mde": (m.stats or {}).get("mde")} for m in metrics},
            }
        out[candidate] = row
    return out


def benign(scores: dict, floor: Path, root: Path, runs: int, seed: int) -> dict:
    """The false-FAIL rate of the shipped policy (without [speed] and vbench) over simulated benign runs."""
    from signoff_false_fail import judge, rate, resample_run

    pool = {(k.rsplit("-s", 1)[0], int(k.rsplit("-s", 1)[1])): {**v, "flicker": 0.0}
            for k, v in scores["baseline"].items()}
    loaded = sim_policy(True)
    rng = np.random.default_rng(seed)
    fails, failed_on, outcomes = 0, {}, {"PASS": 0, "FAIL": 0, "INCONCLUSIVE": 0}
    for i in range(runs):
        run = root / f"benign-{i}"
        resample_run(run, pool, rng)
        outcome, failed, _ = judge(run, loaded, floor)
        outcomes[outcome] += 1
        if outcome == "FAIL":
            fails += 1
            for name in failed:
                failed_on[name] = failed_on.get(name, 0) + 1
    return {**rate(fails, runs), "outcomes": outcomes, "failed_on": failed_on}


def record(name: str, payload: dict) -> Path:
    """The record (date, machine, versions, the exact command and the numbers) in this study's results/, with its
    Markdown table."""
    from bench.lib.results import context
    from h3.atomic import atomic_write_json, atomic_write_text

    results = Path(__file__).resolve().parent / "results"
    data = {**context(), **payload}
    atomic_write_json(results / f"{name}.json", data)
    lines = [f"# {name}", "", f"- date: {data['date']}", f"- command: `{data['command']}`",
             f"- machine: {data['machine']['platform']}, {data['machine']['cpu_count']} cpus",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()), "",
             "| candidate | expected | non-inferiority alone | failed on | shipped policy | failed on |",
             "|---|---|---|---|---|---|"]
    for name_, row in payload["candidates"].items():
        ni, sh = row["non_inferiority_only"], row["shipped"]
        lines.append(f"| {name_} | {row['expected']} | {ni['outcome']} | {', '.join(ni['failed']) or '-'} | "
                     f"{sh['outcome']} | {', '.join(sh['failed']) or '-'} |")
    b = payload["benign"]
    lines += ["", f"Benign (the baseline against itself under other seeds, {b['runs']} simulated runs of 16 pairs): "
              f"{b['fails']} FAIL, {b['rate']:.2%}, 95% CI [{b['ci95'][0]:.2%}, {b['ci95'][1]:.2%}]; "
              f"outcomes {b['outcomes']}; failed on {b['failed_on'] or 'nothing'}.", ""]
    atomic_write_text(results / f"{name}.md", "\n".join(lines) + "\n")
    return results / f"{name}.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", default="/tmp/resample_margins")
    parser.add_argument("--model", default="tiny-trained")
    parser.add_argument("--seeds", default="4,5,6,7")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rng", type=int, default=20261206)
    parser.add_argument("--scores-only", action="store_true", help="make and score the clips, judge nothing")
    parser.add_argument("--candidates", default=",".join(CANDIDATES),
                        help="the candidates to make beside the baseline (the benign pool is the baseline's clips; a "
                             "candidate left out is judged from signoff_proof_run23d200_seeds4567's CIs instead, "
                             "tests/test_policy_margins.py)")
    parser.add_argument("--name", default="resample_margins")
    args = parser.parse_args()
    started = time.perf_counter()
    pool = Path(args.pool) / "clips"
    scores_path = Path(args.pool) / "scores.json"
    if not scores_path.is_file():
        if not (pool / "run.json").is_file() or "complete" not in (pool / "run.json").read_text():
            make_clips(pool, args.model, [int(s) for s in args.seeds.split(",")],
                       [c for c in args.candidates.split(",") if c])
        scores_path.write_text(json.dumps(clip_scores(pool)))
    scores = json.loads(scores_path.read_text())
    if args.scores_only:
        return
    from h3eval.policy import write_floor

    floor_values = floor_of(scores["baseline"])
    with tempfile.TemporaryDirectory() as tmp:
        floor = write_floor(Path(tmp) / "floor.json", floor_values).path
        candidates = judge_candidates(scores, floor, Path(tmp))
        rates = benign(scores, floor, Path(tmp), args.runs, args.rng)
    record(args.name, {
        "policy": str(RELEASE.relative_to(ROOT)),
        "dropped_gates": list(DROPPED), "model": args.model, "prompts": "world-demo", "seeds": args.seeds,
        "floor": floor_values, "candidates": candidates, "benign": rates, "clip_scores": scores,
        "seconds": round(time.perf_counter() - started, 1),
    })


if __name__ == "__main__":
    main()
