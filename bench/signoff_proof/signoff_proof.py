"""End-to-end proof of per-recipe signoff on the trained tiny preset (issue 18), under the shipped release policy.

    python bench/signoff_proof.py [--model tiny] [--out /tmp/signoff18] [--prompts world-demo] [--seeds 0,1,2,3]
                                  [--vbench-env PATH] [--turbo turbo4-tiny]

One run of 16 pairs (the world-demo captions x 4 seeds, each with ground truth in its caption) with the baseline and
five candidates:

- ``identity`` (exact): every lever off, must PASS;
- ``turbo4-tiny`` (resample): the distilled 4-step LoRA, must PASS;
- ``turbo4-tiny-lora03`` (resample, bench/recipes): the same LoRA at scale 0.3, must FAIL naming dimensions;
- ``fewer-steps`` (resample): 8 steps without the LoRA, must FAIL naming dimensions;
- ``cond-fault`` (resample, bench/recipes): the baseline with its text embeddings zeroed at the DiT's input by a
  forward pre-hook this script plants (a test-only fault, not a lever), must FAIL on prompt faithfulness.

The new-seed noise floor the policy states its thresholds against comes from the run's own baseline clips
(``h3eval.floor.newseed_floor_from_run``: each clip against the same prompt's next seed, 16 pairs);
bench/signoff_false_fail.py resamples benign pairs from the same clips.

Gates, each on the candidates whose judge reads it (``run_gates(..., candidates=...)``): integrity, reference_free and
prompt_faithfulness on all; fidelity (LPIPS; the AlexNet trunk when its weights are in the torch cache, else the
package's ``rand`` trunk, recorded) and audio on the exact ``identity``; VBench's temporal_flickering in its pinned
environment (``--vbench-env``; one scoring subprocess per run through ``gates.vbench.evaluate_run``). The verdict is
``compute_verdict`` under gates/policies/release.toml; results go to bench/results/signoff_proof.{json,md} and the
run's own report.md.

A probe of another LoRA on the same checkpoint (``--reuse-from`` an earlier proof's --out) generates only the two
recipes that load it and reuses every other clip and gate result: 2 of the 6 recipes' clips are made. Session 18
checked it: run 22d's LoRA probed that way gave the same turbo4-tiny clips (sha256) and the same verdict, dimension
for dimension, as its full probe (signoff_proof_run22d_probe.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
BENCH_RECIPES = ROOT / "bench" / "recipes"
RELEASE = ROOT / "gates" / "policies" / "release.toml"
FAULT = "cond-fault"
PAIR_GATES = ["integrity", "reference_free", "prompt_faithfulness"]
EXACT_GATES = ["fidelity", "audio"]
FLOOR_GATES = ["fidelity", "audio", "reference_free", "prompt_faithfulness"]
EXPECTED = {"identity": "PASS", "turbo4-tiny": "PASS", "turbo4-tiny-lora03": "FAIL", "fewer-steps": "FAIL",
            FAULT: "FAIL"}


def zero_text_hook(module, args, kwargs):
    """The planted conditioning fault: the DiT sees all-zero text embeddings (the prompt is lost)."""
    import torch

    if "encoder_hidden_states" in kwargs:
        kwargs = {**kwargs, "encoder_hidden_states": torch.zeros_like(kwargs["encoder_hidden_states"])}
    else:
        args = (*args[:2], torch.zeros_like(args[2]), *args[3:])
    return args, kwargs


WARMUP = {"size": None}


def runtime_factory(model, recipe, device):
    """The runtime of ``recipe``, warmed up by one throwaway request at the run's shape, so that no recorded request
    pays the first-call costs (the product's A/B protocol excludes warm-up the same way); the planted fault's hook on
    ``cond-fault``."""
    import tempfile

    from h3.runtime import GenerateRequest, H3Runtime

    runtime = H3Runtime.load(model, recipe, device)
    if recipe.name == FAULT:
        runtime.pipe.transformer.register_forward_pre_hook(zero_text_hook, with_kwargs=True)
    size = WARMUP["size"]
    with tempfile.TemporaryDirectory(prefix="warmup-") as tmp:
        runtime.generate(GenerateRequest(prompt="warm-up", seed=0, height=size, width=size), Path(tmp) / "w.mp4")
    return runtime


def recipe(name: str, model: str = "tiny"):
    """A shipped recipe, or one of bench/recipes; with a checkpoint folder as the model, '@turbo4-tiny' is its LoRA."""
    from h3.recipe import load_recipe, with_lora_file

    path = BENCH_RECIPES / f"{name}.toml"
    loaded = load_recipe(path if path.exists() else name)
    if loaded.lora.enabled and loaded.lora.path == "@turbo4-tiny" and Path(model).is_dir():
        loaded = with_lora_file(loaded, Path(model) / "lora" / "turbo4-tiny.safetensors")
    return loaded


def generate(out: Path, model: str, recipes: list, prompts, seeds: list[int], kind: str,
             num_frames: int | None = None, size: int | None = None) -> None:
    from h3eval.runner import RequestShape, RunPlan, fill_run

    WARMUP["size"] = size
    plan = RunPlan(out=out, model=model, recipes=recipes, prompts=prompts, seeds=seeds, baseline="baseline",
                   kind=kind, device="cpu", shape=RequestShape(num_frames=num_frames, height=size, width=size),
                   args={"command": "bench/signoff_proof.py"})
    manifest = fill_run(plan, runtime_factory=runtime_factory, progress=True)
    if manifest.status != "complete":
        raise SystemExit(f"{out}: run ended {manifest.status}: {[e.error for e in manifest.errors[:3]]}")


def reuse_clips(source: Path, out: Path, lora_recipes: list[str]) -> list[str]:
    """Seed ``out/proof`` with a finished proof run's clips and gate results, less those of ``lora_recipes`` (the
    recipes that load the checkpoint's LoRA), so that a probe of another LoRA generates only those. The run's resume
    check (h3eval.runner) still refuses other weights, recipes, prompts, seeds or shapes; the LoRA file is not part
    of the model's identity, which is why its recipes' clips are dropped here. Returns the recipes kept."""
    src, dst = source / "proof", out / "proof"
    if not (src / "run.json").is_file():
        raise SystemExit(f"--reuse-from {source}: no proof run there ({src / 'run.json'} is missing)")
    if dst.exists():
        raise SystemExit(f"--reuse-from: {dst} exists; choose a new --out")
    shutil.copytree(src, dst)
    for name in ("verdict.json", "report.md", "report.html", "junit.xml"):
        (dst / name).unlink(missing_ok=True)
    for recipe_name in lora_recipes:
        for folder in (dst / "clips" / recipe_name, *(dst / "gates").glob(f"*/{recipe_name}"),
                       dst / "gates" / "vbench" / "clips" / recipe_name):
            shutil.rmtree(folder, ignore_errors=True)
    return sorted(p.name for p in (dst / "clips").iterdir())


def vbench_flicker(run_dir: Path, env: Path) -> dict:
    from gates.vbench import evaluate_run
    from h3eval.gaterun import run_context

    return evaluate_run(run_context(run_dir, "vbench"), ["temporal_flickering"], env=env)


def floor(pool: Path, out: Path, options: dict, env: Path | None, gates: list[str] = FLOOR_GATES) -> Path:
    """The new-seed floor of ``gates`` from the run's own baseline clips (each against the same prompt's next seed),
    and VBench's temporal_flickering from ``env`` when given; written where the policy reads it."""
    from h3.recipe import Recipe
    from h3eval.floor import floor_from_results, newseed_floor_from_run
    from h3eval.policy import write_floor
    from h3eval.store import RunStore

    newseed_floor_from_run(pool, "baseline", out, gates=gates, gate_options=options, progress=False)
    if env is not None:
        vbench_flicker(out, env)
        gates = [*gates, "vbench"]
    store = RunStore(out)
    manifest = store.read_manifest()
    metrics, counts = floor_from_results(store, Recipe.model_validate(manifest.recipes["baseline"]), gates)
    write_floor(store.floor_path, metrics, recipe="baseline", source_run=str(pool), seeds=list(manifest.seeds),
                pairs_per_metric=counts, gates=gates)
    return store.floor_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", default="/tmp/signoff18")
    parser.add_argument("--prompts", default="world-demo")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--vbench-env", default=None, help="pinned VBench environment (default: the gate's default)")
    parser.add_argument("--turbo", default="turbo4-tiny", help="the distilled recipe (turbo4-tiny on the trained tiny)")
    parser.add_argument("--lora03", default="turbo4-tiny-lora03")
    parser.add_argument("--num-frames", type=int, default=None, help="default: the model's")
    parser.add_argument("--size", type=int, default=None, help="square frame side (a checkpoint folder as the model "
                                                               "defaults to the full-size shape); default: the model's")
    parser.add_argument("--judge-only", action="store_true", help="the clips are made: gate, floor and judge only")
    parser.add_argument("--name", default="signoff_proof", help="results file name in bench/results")
    parser.add_argument("--note", default="", help="a line on how the clips were made (recorded)")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/results (dry runs)")
    parser.add_argument("--reuse-from", default=None,
                        help="a finished proof's --out made with the same checkpoint but another LoRA: its clips of "
                             "every recipe that does not load the LoRA are reused (only the LoRA's 2 recipes are "
                             "generated)")
    args = parser.parse_args()

    from gates.vbench.env import default_env_path
    from h3eval.demo import lpips_trunk
    from h3eval.gaterun import run_gates
    from h3eval.prompts import load_prompts
    from h3eval.report import run_report
    from h3eval.store import RunStore
    from h3eval.verdict import summary_lines

    started = time.perf_counter()
    out = Path(args.out)
    env = Path(args.vbench_env) if args.vbench_env else default_env_path()
    prompts = load_prompts(args.prompts)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = ["baseline", "identity", args.turbo, args.lora03, "fewer-steps", FAULT]
    proof_dir, floor_dir = out / "proof", out / "floor"
    timings = {}

    if args.reuse_from:
        kept = reuse_clips(Path(args.reuse_from), out, [args.turbo, args.lora03])
        print(f"reusing {args.reuse_from}'s clips of {', '.join(n for n in kept if n in names)}")
    t = time.perf_counter()
    if not args.judge_only:
        generate(proof_dir, args.model, [recipe(n, args.model) for n in names], prompts, seeds, "ab",
                 args.num_frames, args.size)
    timings["generate_s"] = round(time.perf_counter() - t, 1)

    trunk = lpips_trunk()
    options = {"fidelity.lpips_trunk": trunk}
    t = time.perf_counter()
    summary = run_gates(proof_dir, PAIR_GATES, device="cpu", options=options, progress=False)
    exact = run_gates(proof_dir, EXACT_GATES, device="cpu", options=options, progress=False,
                      candidates=["identity"])
    flicker = vbench_flicker(proof_dir, env)
    timings["pair_gates_s"] = round(time.perf_counter() - t, 1)
    if floor_dir.exists():
        shutil.rmtree(floor_dir)
    floor_path = floor(proof_dir, floor_dir, options, env)
    timings["gates_s"] = round(time.perf_counter() - t, 1)

    verdict, reports = run_report(proof_dir, RELEASE, floor=floor_path)
    lines = summary_lines(verdict)
    print("\n".join(lines))
    rows = []
    for c in verdict.candidates:
        failed = [f"{g.gate}.{m.metric}" for g in c.gates for m in g.metrics if m.required and m.outcome == "FAIL"]
        failed += [f"{g.gate} (flags)" for g in c.gates if g.required and g.outcome == "FAIL"
                   and not any(m.outcome == "FAIL" for m in g.metrics)]
        if c.speed is not None and c.speed.required and c.speed.outcome == "FAIL":
            failed.append("speed")
        rows.append({"candidate": c.candidate, "judge": c.judge, "outcome": c.outcome,
                     "expected": EXPECTED.get(c.candidate if c.candidate != args.turbo else "turbo4-tiny"),
                     "failed": failed, "reasons": c.reasons, "judge_reason": c.judge_reason,
                     "speedup": c.speed.speedup if c.speed else None,
                     "warnings": c.warnings})
    met = all(r["outcome"] == r["expected"] for r in rows)
    payload = {
        "model": args.model, "prompts": args.prompts, "seeds": seeds, "pairs": len(prompts.ids) * len(seeds),
        "policy": str(RELEASE.relative_to(ROOT)), "lpips_trunk": trunk,
        "vbench_env": str(env), "vbench_summary": {k: flicker.get(k) for k in ("partial", "denominators")},
        "gate_errors": summary.errors + exact.errors, "rows": rows, "all_as_expected": met, "timings": timings,
        "seconds": round(time.perf_counter() - started, 1), "run_dir": str(proof_dir), "verdict_lines": lines,
        "note": args.note,
    }
    table = ["| candidate | judge | outcome | expected | failed on |", "|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['candidate']} | {r['judge']} | **{r['outcome']}** | {r['expected']} | "
                     f"{', '.join(r['failed']) or '-'} |")
    md = "\n".join([
        f"Trained tiny preset (`--model {args.model}`), prompts `{args.prompts}` x seeds {seeds} = "
        f"{payload['pairs']} pairs, policy `gates/policies/release.toml`, floor from the baseline's new-seed pairs "
        f"of the same run; LPIPS trunk `{trunk}`; VBench temporal_flickering from {env}.", "",
        *([args.note, ""] if args.note else []), *table, "", f"All as expected: **{met}**.", "", "## Verdict", "", "```", *lines, "```", "",
        f"Generation {timings['generate_s']} s, gates and floor {timings['gates_s']} s on this machine's CPU.",
    ])
    if not args.no_record:
        from bench._results import write

        write(args.name, payload, md)
    print(md)


if __name__ == "__main__":
    main()
