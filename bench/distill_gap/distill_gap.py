"""How far the distilled 4-step student lands from its 29-step teacher on noise it was never distilled on.

    python bench/distill_gap.py [--model tiny-trained] [--lora FILE] [--prompts world-train,world-heldout]
                                [--limit 8] [--seeds 100,101] [--name distill_gap]

For each caption and seed, the teacher (``baseline``, 29 steps) and the student (``turbo4-tiny``, 4 steps; ``--lora``
puts another LoRA file in its place, e.g. a training probe's) generate through the runtime from the same seeded noise
with their latent trajectories recorded (h3.trajectory). The gap is the mean squared difference of the two final x0
latents, video and audio apart, in the pipeline's latent space: the quantity h3.train.distill regresses (its training
loss sums the two over the teacher set). A student that learned its teacher set rather than the teacher shows a gap on
fresh seeds far above the loss it ended training at. Seeds default to 100 and 101, outside what the demo and the
content check use. Writes bench/results/<name>.{json,md}.

    python bench/distill_gap.py --from-run RUN_DIR --student NAME [--student NAME ...] --name NAME

reads the trajectories an A/B run already recorded (``trajectory=True``, e.g. bench/lever_quality.py's run) instead of
generating: each student recipe's clips against the teacher's of the same prompt and seed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


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


def main() -> None:
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

    from bench import _results
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
    from bench import _results
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


if __name__ == "__main__":
    main()
