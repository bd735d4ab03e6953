"""Latent motion of a few-step student at each of its steps, against its teacher's clips (issue 18, run 22).

Reads the recorded trajectories of A/B runs made with ``h3eval ab ... --trajectory`` (``<clip>.traj.npz``: the x0
estimate after every step). Motion is the mean squared change between consecutive latent frames of an x0 estimate
(rows frame-major, as h3.trajectory records them). For each run it reports the teacher's final motion and the
student's at each step, as a share of the teacher's, averaged over the clips, and the mean over the student's steps:
the motion of the mixture of its steps' estimates, which is what a fake score trained on a random step's estimate sees
(h3.train.dmd, ``dmd_student_step`` -1).

    h3eval ab --baseline baseline --candidate turbo4-tiny --prompts world-demo --model tiny --seeds 0,1 --warmup 0 \\
        --trajectory --out RUN
    python bench/step_motion.py --run regression=RUN --run dmd=RUN2 --name step_motion_run22
"""

from __future__ import annotations

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


def main(argv: list[str] | None = None) -> None:
    from bench import _results

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


if __name__ == "__main__":
    main()
