"""Keyframe and reference adherence of a baseline and its candidates on fl2va and ref2va suites (issue 25).

    python bench/keyframe_adherence/keyframe_adherence.py --model tiny-trained --baseline baseline \
        --candidate turbo4-tiny --candidate turbo4-tiny-int8 \
        --suite world-fl2va --suite world-ref2va --seeds 0,1 [--work DIR] [--name keyframe_adherence]

For each suite: generates every (recipe, prompt, seed) clip (h3eval's runner, resumable in ``--work``), runs the
integrity and keyframe gates, and records per recipe the mean adherence of its clips to their own inputs (fl2va:
``keyframe_lpips`` / ``keyframe_ssim`` / ``keyframe_psnr`` of the first and last frames against the keyframes;
ref2va: ``reference_colour_distance`` / ``reference_shape_distance`` of the reference's subject through the clip)
and, per candidate, the paired adherence lost against the baseline (mean oriented delta with its BCa CI from
h3eval.stats, sign counts). A **shuffled control** shows the inputs are honoured at all: the baseline's clips scored
against *another* prompt's keyframes or reference (the next line of the suite), with the same functions; a clip
that honours its own inputs is much closer to them than to another prompt's.

Writes results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

METRICS = {
    "fl2va": (("keyframe_psnr", True), ("keyframe_ssim", True), ("keyframe_lpips", False)),
    "ref2va": (("reference_colour_distance", False), ("reference_shape_distance", False)),
}


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def shuffled_control(store, suite, baseline: str, seeds: list[int], workflow: str, trunk: str) -> dict:
    """The baseline clips scored against the next prompt's inputs (the suite's lines shifted by one)."""
    from gates.fidelity import load_lpips
    from gates.keyframe import ReferenceProfile, adherence, identity_distances, keyframe_targets
    from gates.media_cache import load_video

    prompts = suite.prompts
    values: dict[str, list[float]] = {name: [] for name, _ in METRICS[workflow]}
    model = load_lpips(trunk, "cpu") if workflow == "fl2va" else None
    for i, prompt in enumerate(prompts):
        other = prompts[(i + 1) % len(prompts)]
        for seed in seeds:
            mp4 = store.clip_path(baseline, prompt.id, seed)
            if not mp4.is_file():
                continue
            frames, _ = load_video(mp4)
            if workflow == "fl2va":
                targets = keyframe_targets(other.images, frames.shape[1], frames.shape[2])
                scores = adherence(frames, targets, model, 1.0, "cpu")
                for key in ("psnr", "ssim", "lpips"):
                    values[f"keyframe_{key}"].append(float(np.mean([scores[a][key] for a in targets])))
            else:
                colour, shape = identity_distances(frames, ReferenceProfile(other.images["reference"].pixels))
                values["reference_colour_distance"].append(float(colour.mean()))
                values["reference_shape_distance"].append(float(np.nanmean(shape)) if np.isfinite(shape).any()
                                                          else None)
    return {name: _mean(v) for name, v in values.items()}


def run_suite(args, suite_name: str, work: Path, trunk: str) -> dict:
    from h3.recipe import load_recipe
    from h3eval import stats
    from h3eval.gaterun import run_gates
    from h3eval.prompts import load_prompts, parse_seeds
    from h3eval.runner import RunPlan, fill_run
    from h3eval.store import RunStore

    suite = load_prompts(suite_name)
    workflows = {p.workflow for p in suite.prompts}
    if len(workflows) != 1 or workflows & {"t2va"}:
        raise SystemExit(f"{suite_name}: an fl2va or an ref2va suite, one workflow, got {sorted(workflows)}")
    (workflow,) = workflows
    recipes = [load_recipe(args.baseline)] + [load_recipe(c) for c in args.candidate]
    seeds = parse_seeds(args.seeds)
    out = work / Path(suite_name).stem
    plan = RunPlan(out=out, model=args.model, recipes=recipes, prompts=suite, seeds=seeds, baseline=recipes[0].name,
                   args={"command": "bench/keyframe_adherence/keyframe_adherence.py"})
    manifest = fill_run(plan, progress=False)
    summary = run_gates(out, ["integrity", "keyframe"], options={"lpips_trunk": trunk}, progress=False)
    store = RunStore(out)
    base_name = recipes[0].name
    per_recipe: dict[str, dict] = {}
    losses: dict[str, dict] = {}
    for cand in [r.name for r in recipes[1:]]:
        pairs = []
        for prompt in suite.prompts:
            for seed in seeds:
                path = store.gate_result_path("keyframe", cand, prompt.id, seed)
                if path.is_file():
                    result = json.loads(path.read_text())
                    if result["status"] == "ok":
                        pairs.append({k: v["value"] for k, v in result["metrics"].items()})
        losses[cand] = {}
        for name, higher in METRICS[workflow]:
            both = [(p.get(name), p.get(f"{name}.baseline")) for p in pairs]
            both = [(c, b) for c, b in both if c is not None and b is not None]
            per_recipe.setdefault(cand, {})[name] = _mean([c for c, _ in both])
            per_recipe.setdefault(base_name, {})[name] = _mean([b for _, b in both])
            entry = {"pairs": len(both)}
            if len(both) >= 2:
                deltas = stats.oriented_deltas([c for c, _ in both], [b for _, b in both], higher)
                ci = stats.mean_ci(deltas)
                signs = stats.sign_counts(deltas)
                entry.update(mean_oriented_delta=ci.estimate, ci=[ci.low, ci.high], signs=signs.describe())
            elif both:
                entry["mean_oriented_delta"] = float(stats.oriented_deltas([both[0][0]], [both[0][1]], higher)[0])
            losses[cand][name] = entry
    flagged = {g: n for g, n in summary.flagged.items() if n}
    return {"baseline": base_name, "suite": str(suite.path), "suite_sha256": suite.sha256, "workflow": workflow, "prompts": len(suite.prompts),
            "seeds": seeds, "run_status": manifest.status, "run_errors": [e.error for e in manifest.errors],
            "gate_errors": summary.errors, "integrity_flagged": flagged, "adherence": per_recipe,
            "adherence_lost": losses, "shuffled_control": shuffled_control(store, suite, base_name, seeds, workflow,
                                                                            trunk)}


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        names = [n for n, _ in METRICS[r["workflow"]]]
        lines += [f"## {r['workflow']}: `{r['suite']}` ({r['prompts']} prompts x seeds {r['seeds']}, run "
                  f"{r['run_status']})", "",
                  "| recipe | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for recipe, values in r["adherence"].items():
            lines.append(f"| {recipe} | " + " | ".join(_fmt(values.get(n)) for n in names) + " |")
        lines.append(f"| {r['baseline']} vs another prompt's inputs (shuffled control) | "
                     + " | ".join(_fmt(r["shuffled_control"].get(n)) for n in names) + " |")
        lines += ["", "Adherence lost against the baseline (mean oriented delta, positive = candidate better; "
                      "95% BCa CI; signs):", ""]
        for cand, entries in r["adherence_lost"].items():
            for name, e in entries.items():
                ci = e.get("ci")
                lines.append(f"- {cand} {name}: {_fmt(e.get('mean_oriented_delta'))}"
                             + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}], {e.get('signs')}" if ci else "")
                             + f" ({e['pairs']} pairs)")
        if r["gate_errors"] or r["run_errors"]:
            lines.append(f"- errors: {len(r['run_errors'])} clip(s), {len(r['gate_errors'])} gate result(s)")
        if r["integrity_flagged"]:
            lines.append(f"- integrity flagged: {r['integrity_flagged']}")
        lines.append("")
    return "\n".join(lines)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--baseline", default="baseline")
    parser.add_argument("--candidate", action="append", default=[])
    parser.add_argument("--suite", action="append", default=[])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--work", type=Path, default=None, help="Run directories (kept; resumable). Default: temp.")
    parser.add_argument("--name", default="keyframe_adherence")
    args = parser.parse_args()

    from bench.lib import results as _results
    from gates.fidelity import alexnet_weights_path

    trunk = "alexnet" if alexnet_weights_path().is_file() else "rand"
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        results = [run_suite(args, suite, work, trunk) for suite in args.suite]
    payload = {"model": args.model, "baseline": args.baseline, "candidates": args.candidate,
               "lpips_trunk": trunk if trunk == "alexnet" else "rand (the AlexNet weights are not in the torch hub "
                                                               "cache; LPIPS is the package's random trunk)",
               "results": results, "argv": shlex.join(sys.argv)}
    md = table(results)
    _results.write(args.name, payload, f"LPIPS trunk: {payload['lpips_trunk']}\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
