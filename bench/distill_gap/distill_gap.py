"""How far the distilled 4-step student lands from its 29-step teacher on noise it was never distilled on.

    python bench/distill_gap/distill_gap.py [--model tiny-trained] [--lora FILE] [--prompts world-train,world-heldout]
                                [--limit 8] [--seeds 100,101] [--name distill_gap]

For each caption and seed, the teacher (``baseline``, 29 steps) and the student (``turbo4-tiny``, 4 steps; ``--lora``
puts another LoRA file in its place, e.g. a training probe's) generate through the runtime from the same seeded noise
with their latent trajectories recorded (h3.trajectory). The gap is the mean squared difference of the two final x0
latents, video and audio apart, in the pipeline's latent space: the quantity h3.train.distill regresses (its training
loss sums the two over the teacher set). A student that learned its teacher set rather than the teacher shows a gap on
fresh seeds far above the loss it ended training at. Seeds default to 100 and 101, outside what the demo and the
content check use. Writes results/<name>.{json,md}.

    python bench/distill_gap/distill_gap.py --from-run RUN_DIR --student NAME [--student NAME ...] --name NAME

reads the trajectories an A/B run already recorded (``trajectory=True``, e.g. bench/lever_quality/lever_quality.py's run) instead of
generating: each student recipe's clips against the teacher's of the same prompt and seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import distill_gap_main  # noqa: E402

if __name__ == "__main__":
    distill_gap_main()
