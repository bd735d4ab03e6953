"""A lever's quality cost on the trained tiny preset, judged by the suite's own gates under the shipped release policy
(issue 23: "each new lever has its quality cost on the tiny preset recorded by the suite's gates").

    python bench/lever_quality/lever_quality.py --candidate fp8-attention-emulated [--model tiny] [--prompts world-demo]
                                  [--seeds 0,1,2,3] [--out /tmp/lever-quality] [--name lever_quality_<candidate>]
                                  [--vbench-env PATH]

One run of 16 pairs (the world-demo captions x 4 seeds) with the baseline and the candidate recipes (each judged by the
kind its recipe declares), latent trajectories recorded; the per-pair gates of each candidate's judge: exact and near
read integrity, fidelity, audio, ghosting and trajectory (LPIPS on the AlexNet trunk when its weights are in the torch
cache, else the package's ``rand`` trunk, recorded), resample reads integrity, reference_free and prompt_faithfulness
(and VBench's temporal_flickering with ``--vbench-env``, as bench/signoff_proof/signoff_proof.py); the new-seed noise floor from the
run's own baseline clips (each clip against the same prompt's next seed), then ``compute_verdict`` under
gates/policies/release.toml. Writes bench/<study>/results/NAME.{json,md}: the verdict per candidate, the failed metrics, and
each metric's pooled value against the floor.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import PAIR_GATES, RELEASE, ROOT, floor, recipe  # noqa: E402

GATES = ["integrity", "fidelity", "audio", "ghosting", "trajectory"]
FLOOR_GATES = ["fidelity", "audio", "ghosting", "trajectory"]
RESAMPLE_GATES = PAIR_GATES
"""What the resample judge reads (bench/signoff_proof/signoff_proof.py's per-pair gates)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", action="append", required=True, help="a recipe (repeatable)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", default="world-demo")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--out", default="/tmp/lever-quality")
    parser.add_argument("--name", default=None, help="results file name in results/ (default: from the candidates)")
    parser.add_argument("--judge-only", action="store_true", help="the clips are made: gate, floor and judge only")
    parser.add_argument("--vbench-env", default=None, help="pinned VBench environment: temporal_flickering for the "
                        "resample candidates")
    args = parser.parse_args()

    from h3.runtime import GenerateRequest  # noqa: F401  (the runtime's import cost before the clock starts)
    from h3eval.demo import lpips_trunk
    from h3eval.gaterun import run_gates
    from h3eval.prompts import load_prompts
    from h3eval.report import run_report
    from h3eval.runner import RequestShape, RunPlan, fill_run
    from h3eval.verdict import summary_lines

    import bench.lib.tiny as proof

    started = time.perf_counter()
    out = Path(args.out)
    prompts = load_prompts(args.prompts)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = ["baseline", *args.candidate]
    run_dir, floor_dir = out / "run", out / "floor"
    timings = {}
    t = time.perf_counter()
    if not args.judge_only:
        proof.WARMUP["size"] = None
        plan = RunPlan(out=run_dir, model=args.model, recipes=[recipe(n, args.model) for n in names], prompts=prompts,
                       seeds=seeds, baseline="baseline", kind="ab", device="cpu", shape=RequestShape(),
                       args={"command": "bench/lever_quality/lever_quality.py"}, trajectory=True)
        manifest = fill_run(plan, runtime_factory=proof.runtime_factory, progress=True)
        if manifest.status != "complete":
            raise SystemExit(f"{run_dir}: run ended {manifest.status}: {[e.error for e in manifest.errors[:3]]}")
    timings["generate_s"] = round(time.perf_counter() - t, 1)
    trunk = lpips_trunk()
    options = {"fidelity.lpips_trunk": trunk}
    t = time.perf_counter()
    kinds = {loaded.name: loaded.signoff.kind for loaded in (recipe(n, args.model) for n in args.candidate)}
    resample = [n for n, kind in kinds.items() if kind == "resample"]
    near = [n for n in kinds if n not in resample]
    errors = []
    for gates, judged in ((GATES, near), (RESAMPLE_GATES, resample)):
        if judged:
            errors += run_gates(run_dir, gates, device="cpu", options=options, progress=False,
                                candidates=judged).errors
    env = Path(args.vbench_env) if args.vbench_env and resample else None
    if env is not None:
        proof.vbench_flicker(run_dir, env)
    floor_gates = [*(FLOOR_GATES if near else []),
                   *([g for g in proof.FLOOR_GATES if g not in FLOOR_GATES] if resample else [])]
    if floor_dir.exists():
        shutil.rmtree(floor_dir)
    floor_path = floor(run_dir, floor_dir, options, env, gates=floor_gates)
    timings["gates_and_floor_s"] = round(time.perf_counter() - t, 1)
    verdict, _ = run_report(run_dir, RELEASE, floor=floor_path)
    lines = summary_lines(verdict)
    rows = []
    for c in verdict.candidates:
        metrics = [{"gate": g.gate, "metric": m.metric, "outcome": m.outcome, "mean": m.mean_value,
                    "ci": [m.ci_low, m.ci_high], "threshold": m.threshold, "threshold_source": m.threshold_source,
                    "required": m.required}
                   for g in c.gates for m in g.metrics]
        failed = [f"{m['gate']}.{m['metric']}" for m in metrics if m["required"] and m["outcome"] == "FAIL"]
        # a required gate that FAILed on no metric of the table (integrity's flags, ghosting's run-level test)
        failed += [f"{g.gate} ({'; '.join(g.reasons)[:160]})" if g.reasons else g.gate for g in c.gates
                   if g.required and g.outcome == "FAIL" and not any(f.startswith(g.gate + ".") for f in failed)]
        rows.append({"candidate": c.candidate, "judge": c.judge, "outcome": c.outcome, "failed": failed,
                     "speed": c.speed.outcome if c.speed else None, "metrics": metrics, "reasons": c.reasons})
    payload = {"model": args.model, "prompts": args.prompts, "seeds": seeds, "pairs": len(prompts.ids) * len(seeds),
               "candidates": args.candidate, "policy": str(RELEASE.relative_to(ROOT)), "lpips_trunk": trunk,
               "gates": {"near_or_exact": GATES if near else [], "resample": RESAMPLE_GATES if resample else []},
               "vbench_env": str(env) if env else None, "floor_gates": floor_gates, "gate_errors": errors,
               "rows": rows,
               "timings": timings, "seconds": round(time.perf_counter() - started, 1), "run_dir": str(run_dir),
               "verdict_lines": lines}
    # The speed verdict is this CPU's (the levers are GPU levers): a quality record reads the gates, not the speed.
    table = ["| candidate | judge | outcome | failed on | speed verdict on this CPU (not the lever's point) |",
             "|---|---|---|---|---|"]
    for r in rows:
        failed = (", ".join(r["failed"]) or "-").replace("|", "\\|")  # a reason's "|change|" is no column
        table.append(f"| {r['candidate']} | {r['judge']} | **{r['outcome']}** | {failed} | {r['speed'] or '-'} |")
    table += ["", "| candidate | metric | mean over pairs | 95% CI | threshold | outcome |", "|---|---|---|---|---|---|"]
    for r in rows:
        for m in r["metrics"]:
            fmt = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
            table.append(f"| {r['candidate']} | {m['gate']}.{m['metric']} | {fmt(m['mean'])} | "
                         f"[{fmt(m['ci'][0])}, {fmt(m['ci'][1])}] | {fmt(m['threshold'])} | {m['outcome']} |")
    md = "\n".join([
        f"Model `{args.model}`, prompts `{args.prompts}` x seeds {seeds} = {payload['pairs']} pairs, policy "
        f"`gates/policies/release.toml`, floor from the baseline's new-seed pairs of the same run; LPIPS trunk "
        f"`{trunk}`; gates {', '.join(GATES)} (exact and near) and {', '.join(RESAMPLE_GATES)} (resample"
        f"{', with VBench temporal_flickering' if env else ''}).", "", *table, "", "## Verdict", "", "```", *lines,
        "```", "",
        f"Generation {timings['generate_s']} s, gates and floor {timings['gates_and_floor_s']} s on this machine's CPU.",
    ])
    from bench.lib.results import write

    write(args.name or "lever_quality_" + "_".join(args.candidate), payload, md)
    print(md)


if __name__ == "__main__":
    main()
