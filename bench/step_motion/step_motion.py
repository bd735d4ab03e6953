"""Latent motion of a few-step student at each of its steps, against its teacher's clips (issue 18, run 22).

Reads the recorded trajectories of A/B runs made with ``h3eval ab ... --trajectory`` (``<clip>.traj.npz``: the x0
estimate after every step). Motion is the mean squared change between consecutive latent frames of an x0 estimate
(rows frame-major, as h3.trajectory records them). For each run it reports the teacher's final motion and the
student's at each step, as a share of the teacher's, averaged over the clips, and the mean over the student's steps:
the motion of the mixture of its steps' estimates, which is what a fake score trained on a random step's estimate sees
(h3.train.dmd, ``dmd_student_step`` -1).

    h3eval ab --baseline baseline --candidate turbo4-tiny --prompts world-demo --model tiny --seeds 0,1 --warmup 0 \
        --trajectory --out RUN
    python bench/step_motion/step_motion.py --run regression=RUN --run dmd=RUN2 --name step_motion_run22
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import step_motion_main  # noqa: E402

if __name__ == "__main__":
    step_motion_main()
