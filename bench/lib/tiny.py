"""Tiny-model quality studies' shared parts: the sign-off proof, the distillation gap, content misses, step motion (issue 52: code that studies and tests share; each study's CLI is bench/<study>/).

Parts, in order: ``signoff_proof`` (bench/signoff_proof/), ``distill_gap`` (bench/distill_gap/), ``content_misses`` (bench/content_check/), ``step_motion`` (bench/step_motion/), ``paired`` (bench/tiny_wider_dit/paired.py), ``event_marks`` (bench/tiny_event_weight/event_marks.py).
"""

from __future__ import annotations


# ---- signoff_proof (the CLI: bench/signoff_proof/signoff_proof.py) ------------------------------------------------------


import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
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
                   args={"command": "bench/signoff_proof/signoff_proof.py"})
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


def signoff_proof_main() -> None:
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
    parser.add_argument("--name", default="signoff_proof", help="results file name in results/")
    parser.add_argument("--note", default="", help="a line on how the clips were made (recorded)")
    parser.add_argument("--no-record", action="store_true", help="do not write results/ (dry runs)")
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
        from bench.lib.results import write

        write(args.name, payload, md)
    print(md)


# ---- distill_gap (the CLI: bench/distill_gap/distill_gap.py) ----------------------------------------------------------


import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def final_x0_gap(teacher: dict[str, np.ndarray], student: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean squared difference of the last step's x0 per modality (``video``, ``audio``) between two trajectories of
    one request shape (h3.trajectory's arrays); a modality missing from either, rows sampled differently, shapes that
    differ or a non-finite value is refused (ValueError)."""
    gaps = {}
    for modality in ("video", "audio"):
        key = f"{modality}_x0"
        if key not in teacher or key not in student:
            raise ValueError(f"{key} missing from a trajectory")
        stride = f"{modality}_row_stride"
        if int(teacher.get(stride, 1)) != int(student.get(stride, 1)):
            raise ValueError(f"{stride} differs: the trajectories sampled different rows")
        a, b = np.asarray(teacher[key][-1], np.float64), np.asarray(student[key][-1], np.float64)
        if a.shape != b.shape:
            raise ValueError(f"{key} shapes differ: {a.shape} against {b.shape}")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError(f"{key} is not finite")
        gaps[modality] = float(np.mean((a - b) ** 2))
    return gaps


def summarize(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, np.float64)
    return {"n": int(v.size), "median": float(np.median(v)), "mean": float(v.mean()), "max": float(v.max())}


def gap_table(label: str, summary: dict[str, dict]) -> str:
    """The markdown table of per-row summaries (a suite's or a student's), video and audio."""
    md = (f"| {label} | clips | video median | video mean | video max | audio median | audio mean | audio max |\n"
          "|---|---|---|---|---|---|---|---|\n")
    for name, s in summary.items():
        v, a = s["video"], s["audio"]
        md += (f"| `{name}` | {v['n']} | {v['median']:.4f} | {v['mean']:.4f} | {v['max']:.4f} | {a['median']:.5f} | "
               f"{a['mean']:.5f} | {a['max']:.5f} |\n")
    return md


def distill_gap_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-trained")
    parser.add_argument("--lora", default=None, help="a LoRA file for the student in place of the checkpoint's")
    parser.add_argument("--prompts", default="world-train,world-heldout")
    parser.add_argument("--limit", type=int, default=8, help="the first N prompts of each suite")
    parser.add_argument("--seeds", default="100,101")
    parser.add_argument("--teacher", default="baseline")
    parser.add_argument("--student", action="append", default=None, help="default turbo4-tiny; repeatable with "
                        "--from-run")
    parser.add_argument("--from-run", default=None, help="an A/B run folder whose clips have trajectories")
    parser.add_argument("--name", default="distill_gap")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    args.student = args.student or ["turbo4-tiny"]
    if args.from_run:
        return from_run(Path(args.from_run), args.teacher, args.student, args.name, args.note)
    if len(args.student) > 1:
        raise SystemExit("several --student need --from-run (a generating run compares one student)")
    args.student = args.student[0]

    from bench.lib import results as _results
    from h3.recipe import load_recipe, with_lora_file
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.trajectory import load_trajectory, trajectory_path
    from h3eval.prompts import load_prompts, parse_seeds

    student = load_recipe(args.student)
    if args.lora:
        if not Path(args.lora).is_file():
            raise SystemExit(f"--lora {args.lora}: no such file")
        student = with_lora_file(student, Path(args.lora).resolve())
    runtimes = {"teacher": H3Runtime.load(args.model, load_recipe(args.teacher), "cpu"),
                "student": H3Runtime.load(args.model, student, "cpu")}
    seeds = parse_seeds(args.seeds)
    clips, suites = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.prompts.split(","):
            suite = load_prompts(name)
            suites[name] = suite.sha256
            for prompt in suite.prompts[: args.limit]:
                for seed in seeds:
                    trajectories = {}
                    for side, runtime in runtimes.items():
                        out = Path(tmp) / f"{side}-{name}-{prompt.id}-s{seed}.mp4"
                        runtime.generate(GenerateRequest(prompt=prompt.prompt, seed=seed, prompt_id=prompt.id), out,
                                         trajectory=True)
                        trajectories[side] = load_trajectory(trajectory_path(out))
                    gap = final_x0_gap(trajectories["teacher"], trajectories["student"])
                    clips.append({"suite": name, "prompt_id": prompt.id, "seed": seed, **gap})
                    print(clips[-1], flush=True)
    summary = {name: {m: summarize([c[m] for c in clips if c["suite"] == name]) for m in ("video", "audio")}
               for name in suites}
    md = (args.note.rstrip() + "\n\n" if args.note else "")
    md += (f"Student `{args.student}`" + (f" with LoRA `{args.lora}`" if args.lora else "")
           + f" against teacher `{args.teacher}` on `{args.model}`, seeds {seeds}, the first {args.limit} prompts of "
           "each suite: mean squared difference of the final x0 latents (pipeline latent space).\n\n")
    md += gap_table("suite", summary)
    payload = {"model": args.model, "lora": args.lora, "teacher": args.teacher, "student": args.student,
               "seeds": seeds, "limit": args.limit, "prompts_sha256": suites, "summary": summary, "clips": clips,
               "note": args.note}
    paths = _results.write(args.name, payload, md)
    print(md)
    print("wrote", *paths)


def from_run(run: Path, teacher: str, students: list[str], name: str, note: str) -> None:
    """The gap of each student's recorded clips to the teacher's of the same prompt and seed in one A/B run."""
    from bench.lib import results as _results
    from h3.trajectory import load_trajectory

    clips_dir = run / "clips"
    if not (clips_dir / teacher).is_dir():
        raise SystemExit(f"{run}: no clips of {teacher!r} (an A/B run folder with trajectories?)")
    teacher_files = {p.name: p for p in sorted((clips_dir / teacher).glob("*.traj.npz"))}
    if not teacher_files:
        raise SystemExit(f"{run}: {teacher!r} has no trajectories (the run was made without trajectory=True)")
    rows, summary = [], {}
    for student in students:
        files = sorted((clips_dir / student).glob("*.traj.npz"))
        missing = sorted({p.name for p in files} ^ set(teacher_files))
        if not files or missing:
            raise SystemExit(f"{run}: {student!r} and {teacher!r} do not have the same clips' trajectories "
                             f"({len(files)} against {len(teacher_files)}; e.g. {missing[:2]})")
        for path in files:
            gap = final_x0_gap(load_trajectory(teacher_files[path.name]), load_trajectory(path))
            rows.append({"student": student, "clip": path.name.removesuffix(".traj.npz"), **gap})
        summary[student] = {m: summarize([r[m] for r in rows if r["student"] == student]) for m in ("video", "audio")}
    md = (note.rstrip() + "\n\n" if note else "")
    md += (f"Recorded trajectories of run `{run}`: each student's final x0 against teacher `{teacher}`'s, same prompt "
           "and seed (mean squared difference, pipeline latent space).\n\n")
    md += gap_table("student", summary)
    paths = _results.write(name, {"run": str(run), "teacher": teacher, "students": students, "summary": summary,
                                  "clips": rows, "note": note}, md)
    print(md)
    print("wrote", *paths)


# ---- content_misses (the CLI: bench/content_check/content_misses.py) -----------------------------------------------------


import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def read_misses(check: dict, suite_lines: list[str], row: str) -> dict:
    truths = {entry["id"]: entry["ground_truth"] for entry in map(json.loads, filter(str.strip, suite_lines))}
    clips = check["rows"][row]["clips"]
    once, onsets = [], {}
    for clip in clips:
        truth = truths[clip["prompt_id"]]
        bounces = [e for e in truth["events"] if e["kind"] == "bounce"]
        if len(truth["shapes"]) == 1 and len(bounces) == 1:
            seen = sum(len(v) for v in clip["details"]["bounces_seen"].values())
            once.append({"prompt_id": clip["prompt_id"], "seed": clip["seed"], "bounces_seen": seen})
        onsets.setdefault(str(clip["seed"]), []).extend(clip["details"]["onsets"])
    habits = {seed: Counter(round(t, 2) for t in times).most_common() for seed, times in onsets.items()}
    return {"clips": len(clips), "one_bounce_clips": once,
            "one_bounce_without_bounce": sum(o["bounces_seen"] == 0 for o in once), "onsets_by_seed": habits}


def content_misses_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", default=str(ROOT / "bench" / "content_check" / "results" / "content_check.json"))
    parser.add_argument("--row", default="baseline")
    parser.add_argument("--prompts", default="world-heldout")
    parser.add_argument("--name", default="content_misses")
    args = parser.parse_args()
    check = json.loads(Path(args.check).read_text())
    if args.row not in check.get("rows", {}):
        raise SystemExit(f"{args.check}: no row {args.row!r} (rows: {', '.join(check.get('rows', {}))})")
    suite = ROOT / "prompts" / f"{args.prompts}.jsonl"
    data = suite.read_bytes()
    recorded = str(check.get("prompts_sha256", ""))
    if recorded and hashlib.sha256(data).hexdigest() != recorded:
        raise SystemExit(f"{suite}: not the prompt suite {args.check} was made on (sha256 {recorded[:12]})")
    result = read_misses(check, data.decode("utf-8").splitlines(), args.row)
    table = (f"From `{Path(args.check).name}`, row `{args.row}` ({result['clips']} clips), ground truth from "
             f"`prompts/{args.prompts}.jsonl`.\n\n"
             f"- one-shape captions with one bounce: **{result['one_bounce_without_bounce']} of "
             f"{len(result['one_bounce_clips'])} clips show no bounce** of their shape in the video\n\n"
             "| seed | onset times the detector found (s), clips sounding each, most frequent first |\n|---|---|\n")
    for seed, habits in result["onsets_by_seed"].items():
        table += f"| {seed} | " + ", ".join(f"{t:.2f} ({n})" for t, n in habits[:8]) + " |\n"
    from bench.lib import results as _results

    _results.write(args.name, {"check": args.check, "row": args.row, "prompts": args.prompts, **result}, table)
    print(table)


# ---- step_motion (the CLI: bench/step_motion/step_motion.py) ----------------------------------------------------------


import argparse
from pathlib import Path

import numpy as np


def latent_motion(x0: np.ndarray, frames: int) -> float:
    """Mean squared change between consecutive latent frames of one x0 estimate (rows, values), rows frame-major."""
    rows = np.asarray(x0, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] % frames or rows.shape[0] // frames < 1 or frames < 2:
        raise ValueError(f"{rows.shape} rows do not split into {frames} latent frames")
    per_frame = rows.reshape(frames, -1, rows.shape[1])
    return float(np.mean(np.diff(per_frame, axis=0) ** 2))


def run_motion(run: Path, teacher: str, student: str, frames: int) -> dict:
    """Per clip: the teacher's final motion and the student's at each step; summary shares of the teacher's."""
    from h3.trajectory import load_trajectory

    clips = run / "clips"
    teacher_files = {p.name: p for p in sorted((clips / teacher).glob("*.traj.npz"))}
    student_files = {p.name: p for p in sorted((clips / student).glob("*.traj.npz"))}
    if not teacher_files or set(teacher_files) != set(student_files):
        raise SystemExit(f"{run}: {teacher!r} and {student!r} need the same clips' trajectories (found "
                         f"{len(teacher_files)} and {len(student_files)}; make the run with --trajectory)")
    rows = []
    for name in sorted(teacher_files):
        t, s = load_trajectory(teacher_files[name]), load_trajectory(student_files[name])
        for traj, path in ((t, teacher_files[name]), (s, student_files[name])):
            if int(traj.get("video_row_stride", 1)) != 1:
                raise SystemExit(f"{path}: rows were subsampled (video_row_stride {int(traj['video_row_stride'])})")
        teacher_motion = latent_motion(t["video_x0"][-1], frames)
        steps = [latent_motion(x, frames) for x in s["video_x0"]]
        if not np.isfinite([teacher_motion, *steps]).all() or teacher_motion <= 0:
            raise SystemExit(f"{run}: {name}: motion not finite or the teacher's is 0")
        rows.append({"clip": name.removesuffix(".traj.npz"), "teacher": teacher_motion, "student_steps": steps})
    shares = np.array([[m / r["teacher"] for m in r["student_steps"]] for r in rows])
    return {"clips": rows, "teacher_mean": float(np.mean([r["teacher"] for r in rows])),
            "student_step_means": [float(v) for v in np.mean([r["student_steps"] for r in rows], axis=0)],
            "step_shares": [float(v) for v in shares.mean(axis=0)], "mixture_share": float(shares.mean())}


def step_motion_main(argv: list[str] | None = None) -> None:
    from bench.lib import results as _results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=DIR", help="an A/B run with trajectories")
    parser.add_argument("--teacher", default="baseline")
    parser.add_argument("--student", default="turbo4-tiny")
    parser.add_argument("--frames", type=int, default=37, help="latent frames of the clips (the tiny's: 37)")
    parser.add_argument("--name", default="step_motion")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.run:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--run {item!r}: LABEL=DIR")
        runs[label] = run_motion(Path(path), args.teacher, args.student, args.frames)
    steps = len(next(iter(runs.values()))["step_shares"])
    md = (args.note.rstrip() + "\n\n" if args.note else "")
    md += (f"Latent motion (mean squared change between consecutive latent frames of the video x0 estimate) of "
           f"`{args.student}` after each of its steps, as a share of `{args.teacher}`'s final clip of the same prompt "
           "and seed, averaged over the clips; 'mixture' is the mean over the steps.\n\n")
    md += "| run | clips | teacher motion | " + " | ".join(f"step {i}" for i in range(steps)) + " | mixture |\n"
    md += "|---|---:|---:|" + "---:|" * (steps + 1) + "\n"
    for label, r in runs.items():
        md += (f"| {label} | {len(r['clips'])} | {r['teacher_mean']:.4f} | "
               + " | ".join(f"{v:.2f}" for v in r["step_shares"]) + f" | {r['mixture_share']:.2f} |\n")
    paths = _results.write(args.name, {"teacher": args.teacher, "student": args.student, "frames": args.frames,
                                       "runs": {k: {"dir": dict(i.partition("=")[::2] for i in args.run)[k], **v}
                                                for k, v in runs.items()}, "note": args.note}, md)
    print(md)
    print("wrote", *paths)


# ---- paired: two content-check records clip by clip (the CLI: bench/tiny_wider_dit/paired.py) ---------------------


CONTENT_PROPERTIES = ("colour", "shape", "direction", "pitch", "bounces", "sync")


def content_clips(path: Path, row: str) -> dict[tuple[str, int], dict]:
    data = json.loads(path.read_text())
    try:
        found = data["rows"][row]["clips"]
    except (KeyError, TypeError):
        raise ValueError(f"{path}: no row {row!r} with clips") from None
    return {(c["prompt_id"], int(c["seed"])): c for c in found}


def compare_content(ref: dict, model: dict) -> dict[str, dict]:
    """Per property: the model's and the reference's right counts over the clips both score, and McNemar."""
    from h3eval import stats as S

    if set(ref) != set(model):
        raise ValueError(f"the records hold other clips ({len(set(ref) ^ set(model))} differ)")
    out = {}
    for prop in CONTENT_PROPERTIES:
        keys = sorted(k for k in ref if ref[k].get(prop) is not None and model[k].get(prop) is not None)
        deltas = [int(bool(model[k][prop])) - int(bool(ref[k][prop])) for k in keys]
        m = S.mcnemar_exact(deltas) if keys else None
        out[prop] = {"clips": len(keys), "model_right": sum(bool(model[k][prop]) for k in keys),
                     "ref_right": sum(bool(ref[k][prop]) for k in keys),
                     "model_only": m.improved if m else 0, "ref_only": m.regressed if m else 0,
                     "p": m.pvalue if m else 1.0}
    return out


def paired_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("--model", type=Path, action="append", required=True)
    ap.add_argument("--row", default="baseline")
    ap.add_argument("--name", required=True)
    args = ap.parse_args(argv)
    from bench.lib import results as _results
    from h3eval.stats import holm

    try:
        ref = content_clips(args.ref, args.row)
        table = {str(p): compare_content(ref, content_clips(p, args.row)) for p in args.model}
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    flat = [(m, prop) for m in table for prop in CONTENT_PROPERTIES]
    adjusted = holm([table[m][prop]["p"] for m, prop in flat])
    for (m, prop), q in zip(flat, adjusted):
        table[m][prop]["p_holm"] = q
    lines = [f"Reference `{args.ref.name}`, row `{args.row}`; exact McNemar on the clips only one side gets right, "
             f"Holm over the {len(flat)} comparisons.\n", "| model | property | clips | model right | reference right "
             "| only the model | only the reference | p | p (Holm) |", "|---|---|---|---|---|---|---|---|---|"]
    for m, props in table.items():
        for prop, r in props.items():
            lines.append(f"| `{Path(m).name}` | {prop} | {r['clips']} | {r['model_right']} | {r['ref_right']} | "
                         f"{r['model_only']} | {r['ref_only']} | {r['p']:.3g} | {r['p_holm']:.3g} |")
    paths = _results.write(args.name, {"ref": str(args.ref), "row": args.row, "models": table}, "\n".join(lines))
    print("\n".join(lines))
    print("wrote", *paths)
    return 0


# ---- event_marks: do the latents mark the bounces? (the CLI: bench/tiny_event_weight/event_marks.py) ---------------

# Whether the latents' own second temporal difference marks the world's events (issue 55, session 34): the probe
# behind TrainConfig.dit_event_weight's choice of the ground truth (bench/tiny_event_weight/event_marks.py is its CLI).
# 
# For one-shape, one-bounce, no-pan, no-appearance scenes of the world (``sample_scenes(seed, n)``), encoded by the
# shipped tiny video VAE (posterior mode): per clip and latent frame f, ``e_f`` = mean over channels and space of
# ``|x[f+1] - 2 x[f] + x[f-1]|`` (edge frames their neighbour's), and the bounce's latent frame
# ``round(t / duration * (F - 1))``. Reported: ``e`` there against the clip's mean, and how often ``e``'s largest frame
# is within one latent frame of the bounce (by chance: about 3 of 37 frames, 8 %).



import argparse
import json
from pathlib import Path

import numpy as np
import torch


def second_difference(latents: torch.Tensor) -> np.ndarray:
    """(B, C, F, H, W) -> (B, F) mean |second temporal difference|, edge frames their neighbour's."""
    x = latents.float()
    second = (x[:, :, 2:] - 2 * x[:, :, 1:-1] + x[:, :, :-2]).abs().mean(dim=(1, 3, 4))
    return torch.cat([second[:, :1], second, second[:, -1:]], dim=1).numpy()


def event_marks_probe(seed: int, count: int, vae_dir: Path) -> dict:
    from diffusers import AutoencoderKLMiniMaxH3

    from h3.train.vaes import normalize_frames
    from h3.world.render import render_video
    from h3.world.scene import sample_scenes

    scenes = [s for s in sample_scenes(seed, 40 * count, two_shape_share=0.0)
              if len(s.shapes) == 1 and s.shapes[0].bounces == 1 and not s.shapes[0].appears and s.pan is None][:count]
    vae = AutoencoderKLMiniMaxH3.from_pretrained(str(vae_dir)).eval()
    with torch.no_grad():
        latents = vae.encode(normalize_frames(render_video(scenes))).latent_dist.mode()
    e = second_difference(latents)
    frames = e.shape[1]
    ratios, distances = [], []
    for row, scene in zip(e, scenes):
        bounce = int(round(scene.bounce_times(scene.shapes[0])[0] / scene.duration * (frames - 1)))
        ratios.append(float(row[bounce] / row.mean()))
        distances.append(abs(int(np.argmax(row)) - bounce))
    return {"seed": seed, "clips": len(scenes), "latent_frames": frames,
            "ratio_at_bounce": {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios)},
            "argmax_within_1": sum(d <= 1 for d in distances), "distances": distances}


def event_marks_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--vae", type=Path, default=Path("h3/assets/tiny/vae"))
    parser.add_argument("--out", type=Path, required=True, help="the record (.md)")
    parser.add_argument("--command", required=True)
    args = parser.parse_args(argv)
    result = event_marks_probe(args.seed, args.count, args.vae)
    r = result["ratio_at_bounce"]
    text = (f"# Do the latents' second differences mark the bounce? (issue 55)\n\n- command: `{args.command}`\n"
            f"- {result['clips']} one-shape one-bounce clips (world seed {args.seed}), shipped tiny video VAE, "
            f"{result['latent_frames']} latent frames\n\n| measure | value |\n|---|---|\n"
            f"| e at the bounce / the clip's mean e (median, min, max) | {r['median']:.2f}, {r['min']:.2f}, "
            f"{r['max']:.2f} |\n| clips whose largest e is within 1 latent frame of the bounce | "
            f"{result['argmax_within_1']} of {result['clips']} (chance ~8 %) |\n\n```json\n"
            f"{json.dumps(result)}\n```\n")
    from h3.atomic import atomic_write_text

    atomic_write_text(args.out, text)
    print(text)
    return 0


# ---- count_probe: does the DiT read the bounce count? (the CLI: bench/tiny_event_weight/count_probe.py) -------------

# The held-out captions of one shape that does not appear, each rewritten to every bounce count (none, once, twice,
# three times: only the clause "; it bounces ..." changes), generated with the same seeds, so the noise is the same
# across the four versions of a caption and seed. Read from the clips (h3.world.detect): the shape's reversals (what
# the content check counts as bounces) and its centroid track. Reported: the mean reversals per captioned count and
# their Spearman correlation (scipy) over every clip; and how far the track moves when only the count word changes
# (mean |centroid difference| in pixels over the frames both tracks see, each version against the "none" one) beside
# how far it moves when only the seed changes (same caption, seeds s and s+1). A DiT that reads the count draws more
# reversals for more bounces and moves the track about as much for a count word as for a seed.

COUNT_WORDS = {0: "", 1: "; it bounces once", 2: "; it bounces twice", 3: "; it bounces three times"}
SOFT_TURN = {"window": 12, "min_swing_px": 6.0}
"""A second reading of the reversals, for turns drawn slowly (the shape easing into the wall and out): the extreme of
12 frames (0.5 s) either side, 6 px beyond both ends, against the content check's 5 frames and 3 px."""


def with_bounces(caption: str, count: int) -> str:
    """``caption`` (one shape) with its bounce clause set to ``count`` (0: none)."""
    first, _, rest = caption.partition("; the background is")
    for words in COUNT_WORDS.values():
        if words and first.endswith(words):
            first = first[: -len(words)]
    return first + COUNT_WORDS[count] + "; the background is" + rest


def _path_px(track, axis: int) -> float:
    """Distance the shape's centroid travels along its motion axis (px): the sum of |steps| between consecutive
    tracked frames (a bounce adds its way back)."""
    return float(np.abs(np.diff(track.centroids[:, axis])).sum()) if len(track.frames) > 1 else 0.0


def _turn_readings(track) -> dict | None:
    """A shape's colour track read along its motion axis (h3.world.detect's initial direction): its reversals as the
    content check reads them, as :data:`SOFT_TURN` reads them, and its path (:func:`_path_px`); None without a track."""
    from h3.world.detect import initial_direction, reversals
    from h3.world.scene import DIRECTIONS

    if track is None or not len(track.frames):
        return None
    direction = initial_direction(track)
    axis = 0 if direction is None or DIRECTIONS[direction][0] else 1
    return {"reversals": len(reversals(track, axis)), "soft_reversals": len(reversals(track, axis, **SOFT_TURN)),
            "path_px": _path_px(track, axis)}


def _track_gap(a, b) -> float | None:
    """Mean |centroid difference| (px) over the frames two colour tracks share; None when they share none."""
    common, ia, ib = np.intersect1d(a.frames, b.frames, return_indices=True)
    if not len(common):
        return None
    return float(np.abs(a.centroids[ia] - b.centroids[ib]).sum(axis=1).mean())


def count_probe(model: str, seeds: list[int], limit: int, workdir: Path, size: int = 128) -> dict:
    from scipy.stats import spearmanr

    from h3.media import decode_video
    from h3.recipe import load_recipe
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.world.detect import parse_caption, track_colours
    from h3.world.suites import suite_lines

    lines = [ln for ln in suite_lines("world-heldout")
             if len(parse_caption(ln["prompt"])) == 1 and not parse_caption(ln["prompt"])[0].get("appears")][:limit]
    runtime = H3Runtime.load(model, load_recipe("baseline"), "cpu")
    clips = []
    for line in lines:
        colour = parse_caption(line["prompt"])[0]["colour"]
        for seed in seeds:
            for count in COUNT_WORDS:
                out = workdir / f"{line['id']}-c{count}-s{seed}.mp4"
                runtime.generate(GenerateRequest(prompt=with_bounces(line["prompt"], count), seed=seed,
                                                 height=size, width=size), out)
                track = track_colours(decode_video(out)[0]).get(colour)
                read = _turn_readings(track) or dict.fromkeys(("reversals", "soft_reversals", "path_px"))
                clips.append({"id": line["id"], "seed": seed, "count": count, **read, "track": track})
    seen = [c for c in clips if c["reversals"] is not None]
    rho = spearmanr([c["count"] for c in seen], [c["reversals"] for c in seen])
    by = {(c["id"], c["seed"], c["count"]): c["track"] for c in clips}
    word_gaps = [g for (i, s, k), t in by.items() if k and t is not None and by.get((i, s, 0)) is not None
                 and (g := _track_gap(t, by[(i, s, 0)])) is not None]
    seed_gaps = [g for (i, s, k), t in by.items() if t is not None and by.get((i, s + 1, k)) is not None
                 and (g := _track_gap(t, by[(i, s + 1, k)])) is not None]
    return {"model": model, "captions": [ln["id"] for ln in lines], "seeds": seeds, "clips": len(clips),
            "tracked": len(seen),
            "mean_reversals": {k: float(np.mean([c["reversals"] for c in seen if c["count"] == k]))
                               for k in COUNT_WORDS if any(c["count"] == k for c in seen)},
            "mean_path_px": {k: float(np.mean([c["path_px"] for c in seen if c["count"] == k]))
                             for k in COUNT_WORDS if any(c["count"] == k for c in seen)},
            "mean_soft_reversals": {k: float(np.mean([c["soft_reversals"] for c in seen if c["count"] == k]))
                                    for k in COUNT_WORDS if any(c["count"] == k for c in seen)},
            "exact": {reading: {k: sum(c[reading] == k for c in seen if c["count"] == k) for k in COUNT_WORDS}
                      for reading in ("reversals", "soft_reversals")},
            "per_count": {k: sum(c["count"] == k for c in seen) for k in COUNT_WORDS},
            "spearman": {"rho": float(rho.statistic), "p": float(rho.pvalue)},
            "gap_px": {"count_word": {"median": float(np.median(word_gaps)), "n": len(word_gaps)} if word_gaps
                       else None,
                       "seed": {"median": float(np.median(seed_gaps)), "n": len(seed_gaps)} if seed_gaps else None},
            "per_clip": [{k: v for k, v in c.items() if k != "track"} for c in clips]}


def count_on_renders(limit: int) -> dict:
    """The control: the same reading on the world's own renders of the held-out split's one-shape scenes (the
    captions' own counts), where the count is known: how often the reversals read equal the scene's bounces."""
    from h3.world.detect import track_colours
    from h3.world.render import render_video
    from h3.world.scene import sample_scene
    from h3.world.suites import SUITES

    split, seed, _, _ = SUITES["world-heldout"]
    pairs, index = [], 0
    while len(pairs) < limit and index < 50 * limit:
        scene = sample_scene(seed, index, split)
        index += 1
        if len(scene.shapes) != 1 or scene.shapes[0].appears:
            continue
        track = track_colours(render_video([scene])[0].numpy()).get(scene.shapes[0].colour)
        pairs.append((scene.shapes[0].bounces, _turn_readings(track) or {}))
    counts = sorted({b for b, _ in pairs})
    return {"scenes": len(pairs), "exact": sum(r.get("reversals") == b for b, r in pairs),
            "exact_soft": sum(r.get("soft_reversals") == b for b, r in pairs),
            "by_count": {k: sum(1 for b, _ in pairs if b == k) for k in counts},
            "mean_path_px": {k: float(np.mean([r["path_px"] for b, r in pairs if b == k and r])) for k in counts}}


def probe_parser(description: str, seeds: str) -> argparse.ArgumentParser:
    """The probes' common arguments: the model rendered, its seeds, the record's name."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seeds", default=seeds)
    ap.add_argument("--name", required=True)
    return ap


def count_probe_main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = probe_parser("Does the DiT read the bounce count? (bench.lib.tiny count_probe)", "0,1")
    ap.add_argument("--limit", type=int, default=8, help="one-shape held-out captions")
    args = ap.parse_args(argv)
    from bench.lib import results as _results

    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        r = count_probe(args.model, seeds, args.limit, Path(tmp))
    r["renders"] = count_on_renders(40)
    gaps = r["gap_px"]
    lines = [f"Model `{r['model']}`; {len(r['captions'])} one-shape held-out captions x {len(COUNT_WORDS)} bounce "
             f"counts x seeds {seeds}: {r['clips']} clips, the shape tracked in {r['tracked']}.\n",
             "| captioned bounces | " + " | ".join(str(k) for k in r["mean_reversals"]) + " |",
             "|---|" + "---|" * len(r["mean_reversals"]),
             "| mean reversals drawn | " + " | ".join(f"{v:.2f}" for v in r["mean_reversals"].values()) + " |",
             "| mean reversals drawn, soft-turn reading | "
             + " | ".join(f"{v:.2f}" for v in r["mean_soft_reversals"].values()) + " |",
             "| clips drawn with exactly the captioned count (content check's reading / soft-turn reading) | "
             + " | ".join(f"{r['exact']['reversals'][k]} / {r['exact']['soft_reversals'][k]} of {r['per_count'][k]}"
                          for k in r["mean_reversals"]) + " |",
             "| mean path along the motion axis drawn (px) | "
             + " | ".join(f"{v:.1f}" for v in r["mean_path_px"].values()) + " |",
             "| the world's renders: mean path (px) | " + " | ".join(
                 f"{r['renders']['mean_path_px'][k]:.1f}" if k in r["renders"]["mean_path_px"] else "-"
                 for k in r["mean_path_px"]) + " |",
             f"\nSpearman rho (captioned count, reversals drawn) {r['spearman']['rho']:.3f}, "
             f"p {r['spearman']['p']:.3g}.",
             "Track change, median |centroid difference| (px): count word only "
             + (f"{gaps['count_word']['median']:.2f} (n {gaps['count_word']['n']})" if gaps["count_word"] else "-")
             + "; seed only " + (f"{gaps['seed']['median']:.2f} (n {gaps['seed']['n']})" if gaps["seed"] else "-")
             + ".", f"Control, the same reading on the world's own renders of {r['renders']['scenes']} one-shape "
             f"held-out scenes (bounces {r['renders']['by_count']}): the count read exactly in "
             f"{r['renders']['exact']} (soft-turn reading: {r['renders']['exact_soft']})."]
    paths = _results.write(args.name, r, "\n".join(lines))
    print("\n".join(lines))
    print("wrote", *paths)
    return 0


# ---- sync_probe (the CLI: bench/tiny_event_weight/sync_probe.py) -------------------------------------------------------
# Issue 55: is a clip's sound in step with the turns it draws? The content check's sync matches a clip's video events
# (its reader's sharp reversals and the appearances) with its click onsets, within 2 frames, none left over. Read with
# the soft turns (SOFT_TURN) as the video events instead, on the same held-out clips, and on the world's own renders
# as the control (where every turn is sharp and every click is on its event).


def soft_events(frames: np.ndarray) -> list[float]:
    """A clip's video events with turns read as :data:`SOFT_TURN` reads them: each colour track's reversals along its
    motion axis, and its appearance."""
    from h3.world.detect import appearance_time, initial_direction, reversals, track_colours
    from h3.world.scene import DIRECTIONS

    out: list[float] = []
    for track in track_colours(frames).values():
        direction = initial_direction(track)
        axis = 0 if direction is None or DIRECTIONS[direction][0] else 1
        out += reversals(track, axis, **SOFT_TURN)
        if (t := appearance_time(track)) is not None:
            out.append(t)
    return sorted(out)


def sync_reading(frames: np.ndarray, audio: np.ndarray, rate: int, expected: list[dict]) -> dict | None:
    """One clip's sync by the content check's reading and by the soft-turn reading (None when its caption names no
    event), and each onset's distance in frames to the nearest soft event."""
    from h3.world.detect import FPS, SYNC_TOLERANCE_FRAMES, describe_clip, match_events, score_clip

    description = describe_clip(frames, audio, rate)
    score = score_clip(description, expected)
    if score.sync is None:
        return None
    soft = soft_events(frames)
    matched, unmatched_v, unmatched_a = match_events(soft, description.onsets, SYNC_TOLERANCE_FRAMES / FPS)
    gaps = [min(abs(o - t) for t in soft) * FPS for o in description.onsets] if soft else []
    return {"sync": bool(score.sync), "sync_soft": bool(soft) and unmatched_v == 0 and unmatched_a == 0,
            "events_named": score.details["events_named"], "video_events": len(description.video_events),
            "soft_events": len(soft), "onsets": len(description.onsets), "soft_matched": matched,
            "onset_gap_frames": [round(g, 2) for g in gaps]}


def sync_on_renders(limit: int) -> list[dict]:
    """The control: the world's own renders (picture and sound) of the held-out split's scenes that have an event."""
    from h3.world.detect import parse_caption
    from h3.world.render import SAMPLE_RATE, render_audio, render_video
    from h3.world.scene import caption, sample_scene
    from h3.world.suites import SUITES

    split, seed, _, _ = SUITES["world-heldout"]
    out, index = [], 0
    while len(out) < limit and index < 50 * limit:
        scene = sample_scene(seed, index, split)
        index += 1
        frames = (render_video([scene])[0].numpy())
        audio = render_audio([scene])[0].numpy()
        reading = sync_reading(frames, audio, SAMPLE_RATE, parse_caption(caption(scene)))
        if reading is not None:
            out.append(reading)
    return out


def sync_probe(model: str, seeds: list[int], workdir: Path, size: int = 128) -> list[dict]:
    from h3.media import decode_audio, decode_video
    from h3.recipe import load_recipe
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.world.detect import parse_caption
    from h3.world.suites import suite_lines

    runtime = H3Runtime.load(model, load_recipe("baseline"), "cpu")
    clips = []
    for line in suite_lines("world-heldout"):
        for seed in seeds:
            out = workdir / f"{line['id']}-s{seed}.mp4"
            runtime.generate(GenerateRequest(prompt=line["prompt"], seed=seed, height=size, width=size), out)
            audio, rate = decode_audio(out)
            reading = sync_reading(decode_video(out)[0], audio, rate, parse_caption(line["prompt"]))
            if reading is not None:
                clips.append({"id": line["id"], "seed": seed, **reading})
    return clips


def _sync_summary(clips: list[dict]) -> dict:
    gaps = [g for c in clips for g in c["onset_gap_frames"]]
    return {"clips": len(clips), "sync": sum(c["sync"] for c in clips), "sync_soft": sum(c["sync_soft"] for c in clips),
            "onsets": len(gaps), "onsets_within_2_frames": int(sum(g <= 2 for g in gaps)),
            "onset_gap_median_frames": float(np.median(gaps)) if gaps else None,
            "events_named": sum(c["events_named"] for c in clips), "soft_events": sum(c["soft_events"] for c in clips),
            "video_events": sum(c["video_events"] for c in clips),
            "onsets_per_clip": float(np.mean([c["onsets"] for c in clips])) if clips else None}


def sync_probe_main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = probe_parser("Is a clip's sound in step with the turns it draws? (bench.lib.tiny)", "0,1,2,3")
    ap.add_argument("--renders", type=int, default=40, help="held-out scenes with an event in the control")
    args = ap.parse_args(argv)
    from bench.lib import results as _results

    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        clips = sync_probe(args.model, seeds, Path(tmp))
    renders = sync_on_renders(args.renders)
    rows = {"model": _sync_summary(clips), "renders": _sync_summary(renders)}
    lines = [f"Model `{args.model}`, the held-out captions that name an event x seeds {seeds}; the control: the "
             f"world's own renders of {len(renders)} held-out scenes with an event.\n",
             "| clips | n | sync, content check's reading | sync, soft turns as the video events | onsets within 2 "
             "frames of a soft event | median onset gap (frames) | onsets a clip | events named | soft events read "
             "| sharp events read |", "|---|" + "---|" * 9]
    for label, s in (("model", rows["model"]), ("world renders", rows["renders"])):
        lines.append(f"| {label} | {s['clips']} | {s['sync']} | {s['sync_soft']} | {s['onsets_within_2_frames']} of "
                     f"{s['onsets']} | {s['onset_gap_median_frames']} | {s['onsets_per_clip']:.2f} | "
                     f"{s['events_named']} | {s['soft_events']} | {s['video_events']} |")
    paths = _results.write(args.name, {"summary": rows, "clips": clips, "renders": renders}, "\n".join(lines))
    print("\n".join(lines))
    print("wrote", *paths)
    return 0


# ---- colour_misses (the CLI: bench/tiny_event_weight/colour_misses.py) -------------------------------------------------
# Issue 55: which held-out colour-shape pairs miss their colour in a content check's record, what is drawn instead,
# and (with --model) the mean RGB of the blob drawn for a missed pair's caption, against the world's palette.


def colour_key(shape: dict) -> str:
    """A named shape's row: its colour and shape, and whether it appears mid-clip or is there from the start."""
    return f"{shape['colour']} {shape['shape']} ({'appears' if shape.get('appears') else 'from the start'})"


def colour_misses(check: dict, row: str = "baseline") -> dict:
    """Per named (colour, shape, appears or not) of a content check's clips: how often the colour is not seen, and the colours
    seen that the caption does not name."""
    from h3.world.detect import parse_caption
    from h3.world.suites import suite_lines

    prompts = {ln["id"]: ln["prompt"] for ln in suite_lines(check["prompts"])}
    named, missed, extra = {}, {}, {}
    for clip in check["rows"][row]["clips"]:
        shapes = parse_caption(prompts[clip["prompt_id"]])
        seen = set(clip["details"]["colours_seen"])
        for s in shapes:
            key = colour_key(s)
            named[key] = named.get(key, 0) + 1
            missed[key] = missed.get(key, 0) + (s["colour"] not in seen)
        for colour in seen - {s["colour"] for s in shapes}:
            extra[colour] = extra.get(colour, 0) + 1
    return {"named": named, "missed": missed, "extra_colours": extra}


def blob_colours(model: str, prompt_ids: list[str], seeds: list[int], workdir: Path, size: int = 128) -> list[dict]:
    """The mean RGB (0-255) of each non-background blob h3.world.detect labels in clips of ``prompt_ids``, and the
    palette colour it is nearest to."""
    from h3.media import decode_video
    from h3.recipe import load_recipe
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.world.detect import label_colours
    from h3.world.scene import COLOURS
    from h3.world.suites import suite_lines

    prompts = {ln["id"]: ln["prompt"] for ln in suite_lines("world-heldout")}
    names = list(COLOURS)
    runtime = H3Runtime.load(model, load_recipe("baseline"), "cpu")
    out = []
    for pid in prompt_ids:
        for seed in seeds:
            path = workdir / f"{pid}-s{seed}.mp4"
            runtime.generate(GenerateRequest(prompt=prompts[pid], seed=seed, height=size, width=size), path)
            frames = decode_video(path)[0]
            labels = label_colours(frames)
            for label in [int(v) for v in np.unique(labels) if v >= 0]:
                rgb = frames[labels == label].reshape(-1, 3).mean(0)
                out.append({"id": pid, "seed": seed, "label": names[label], "pixels": int((labels == label).sum()),
                            "mean_rgb": [round(float(v), 1) for v in rgb]})
    return out


def colour_misses_main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description="Which held-out colour-shape pairs miss their colour (bench.lib.tiny)")
    ap.add_argument("--check", type=Path, required=True, help="a content check's JSON record")
    ap.add_argument("--model", default=None, help="render the clips of --ids with this model and read their blobs")
    ap.add_argument("--ids", default="", help="held-out prompt ids whose blobs to read, comma-separated")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--name", required=True)
    args = ap.parse_args(argv)
    from bench.lib import results as _results
    from h3.world.scene import COLOURS

    r = colour_misses(json.loads(args.check.read_text()))
    lines = [f"Content check `{args.check}`: per named colour-shape (there from the start or "
             "appearing mid-clip), the clips whose drawn colours lack the named colour.\n", "| named | missed | of |", "|---|---|---|"]
    lines += [f"| {k} | {r['missed'][k]} | {n} |" for k, n in sorted(r["named"].items())]
    lines.append("\nColours drawn that the caption does not name (clips): "
                 + (", ".join(f"{c} {n}" for c, n in sorted(r["extra_colours"].items())) or "none") + ".")
    if args.model and args.ids:
        with tempfile.TemporaryDirectory() as tmp:
            r["blobs"] = blob_colours(args.model, args.ids.split(","), [int(s) for s in args.seeds.split(",")],
                                      Path(tmp))
        lines += ["", f"Blobs drawn by `{args.model}` (mean RGB 0-255; palette: "
                  + ", ".join(f"{k} {tuple(round(255 * v) for v in rgb)}" for k, rgb in COLOURS.items()) + "):", "",
                  "| prompt | seed | labelled | pixels | mean RGB |", "|---|---|---|---|---|"]
        lines += [f"| {b['id']} | {b['seed']} | {b['label']} | {b['pixels']} | {tuple(b['mean_rgb'])} |"
                  for b in r["blobs"]]
    paths = _results.write(args.name, r, "\n".join(lines))
    print("\n".join(lines))
    print("wrote", *paths)
    return 0
