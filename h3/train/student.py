"""The student's side shared by both distillation objectives (regression, h3.train.distill; DMD, h3.train.dmd): its
step grid on the pipeline's schedules, the learning-rate warmup, and the exported snapshots of its LoRA."""

from __future__ import annotations

from pathlib import Path

import torch

from h3.train.common import TrainConfig
from h3.train.packing import AUDIO_SHIFT, VIDEO_SHIFT

DISTILL_WARMUP = 100


def student_grid(steps: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from diffusers import MiniMaxH3Scheduler

    sv, sa = MiniMaxH3Scheduler(shift=VIDEO_SHIFT), MiniMaxH3Scheduler(shift=AUDIO_SHIFT)
    sv.set_timesteps(steps + 1, device=device)
    sa.set_timesteps(steps + 1, device=device)
    return sv.timesteps, sv.sigmas, sa.timesteps, sa.sigmas


def snapshot(lora, state_path: Path, step: int, cfg: TrainConfig) -> Path | None:
    """Every ``distill_snapshot_every`` steps, the student LoRA as exported (``lora/turbo4-tiny.safetensors``'s format)
    in ``snapshots/`` beside the stage's state, named by its step; None between them."""
    if not cfg.distill_snapshot_every or step % cfg.distill_snapshot_every:
        return None
    target = state_path.parent / "snapshots" / f"turbo4-tiny-step{step:05d}.safetensors"
    target.parent.mkdir(parents=True, exist_ok=True)
    lora.save(target)
    return target
