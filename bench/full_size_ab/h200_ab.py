"""The whole signoff chain at production scale (issue 20): ``h3eval ab`` at full size, every gate on the GPU, the
verdict, the report, the dashboard screenshot, and the measured figures in ``bench/full_size_ab/results/h200_ab*``.

The model is ``h3-random`` (the released configs, seeded random weights drawn on the device: **random weights: speed
and memory are real, quality is not**) unless ``--model`` names a checkpoint directory. The turbo recipes read a seeded
random LoRA of the published turbo LoRA's format (``prepare``), since no turbo LoRA exists offline.

Subcommands (each one idempotent; ``bench/device/h200_ab.sh`` strings them together on the lending machine):

    python bench/full_size_ab/h200_ab.py chain --work W [--layout shared|servers] [--model h3-random] [--device cuda]
        Run (or resume) every step in order, each a subprocess with its own time limit, its output in W/logs/ and
        one line per event in W/progress.log; a finished step leaves W/steps/<step>.json and is never run again.
        layout ``shared`` (one GPU): one process, one shared model for the baseline and both candidates, the text
        encoder streamed from host memory (the memory plan: h3.memory.full_size_plan). layout ``servers`` (two
        GPUs): ``h3 serve --recipe baseline`` on GPU 0 (text encoder resident), ``h3 serve`` with both candidates
        on one shared model on GPU 1 (text encoder streamed), ``h3eval ab --backend http --url RECIPE=URL``.
    python bench/full_size_ab/h200_ab.py status --work W          what is done, what runs, how many clips
    python bench/full_size_ab/h200_ab.py snapshot --work W --out DIR [--max-mib 15]
        W without clips, trajectories, LoRA or server folders, as DIR/state.tgz (split into parts of at most
        --max-mib when larger; gate artifacts dropped first, and said so, if still larger)
    python bench/full_size_ab/h200_ab.py restore --state DIR --work W
    python bench/full_size_ab/h200_ab.py render --work W --out-dir bench/full_size_ab/results [--name h200_ab] [--merge]
        bench/full_size_ab/results/h200_ab_<shape>.{json,md} and the summary bench/full_size_ab/results/h200_ab.json (--merge: keeping the
        summary's shapes that W does not hold: one work folder per shape)
    python bench/full_size_ab/h200_ab.py screenshot --work W --out PNG   (needs chromium and playwright: here, not on the device)

On a fresh machine ``chain`` resumes from the steps W records as done; a shape whose report is not done yet and
whose clips did not travel has its A/B run again (the run directory resumes: finished records are kept, the missing
clips are made again, gate results of unchanged clips are reused).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.ab import h200_ab_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(h200_ab_main())
