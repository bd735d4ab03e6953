"""What every training stage shares: its configuration, deterministic per-step seeds, resumable state, the learning
rate schedule, the EMA of the weights, and a wall-clock budget that ends a slice cleanly."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


@dataclass
class TrainConfig:
    """Every knob of ``python -m h3.train``; the training record stores it whole. The step counts are maxima: with
    ``--finish-on-budget`` a stage ends where its wall-clock budget does (the record's ``reproduce`` line gives the
    counts that ran)."""

    seed: int = 17
    device: str = "cuda"
    # video VAE
    video_vae_steps: int = 5000
    video_vae_batch: int = 48
    video_vae_frames: int = 22  # 17 + 5: one encoder chunk plus the overlap the decoder blends
    video_vae_lr: float = 1e-3
    video_vae_kl: float = 1e-3
    # audio VAE
    audio_vae_steps: int = 5000
    audio_vae_batch: int = 96
    audio_vae_latents: int = 40  # 1 s crops, hop-aligned
    audio_vae_lr: float = 2e-3
    audio_vae_kl: float = 1e-4
    """Weight of an L2 penalty on the posterior mean (the audio VAE is trained on its mean, as it is used)."""
    # latent pool
    pool_size: int = 5120
    pool_keyframe_share: float = 0.25
    """Share of the pool that also carries fl2va keyframe and ref2va reference presentations."""
    # DiT
    dit_steps: int = 30000
    dit_batch: int = 192
    dit_lr: float = 1.5e-3
    dit_warmup: int = 300
    dit_ema: float = 0.999
    dit_task_mix: tuple = (0.76, 0.12, 0.12)
    """t2va, fl2va (first, last or both keyframes), ref2va."""
    dit_audio_weight: float = 1.0
    dit_text_noise: float = 0.02
    """Gaussian noise (relative to the embeddings' std) on the text rows: the runtime encodes in the recipe's dtype."""
    # distillation
    distill_teacher_samples: int = 1024
    distill_teacher_steps: int = 29
    distill_student_steps: int = 4
    distill_steps: int = 3000
    distill_batch: int = 48
    distill_lr: float = 1e-3
    lora_rank: int = 16
    lora_adaln_rank: int = 4
    checkpoint_every: int = 500
    log_every: int = 50

    @classmethod
    def smoke(cls, **overrides) -> "TrainConfig":
        """A few steps of everything at tiny batch sizes: the CPU tests and a dry run of the whole command."""
        base = dict(device="cpu", video_vae_steps=3, video_vae_batch=2, audio_vae_steps=3, audio_vae_batch=2,
                    audio_vae_latents=8, pool_size=8, pool_keyframe_share=0.5, dit_steps=4, dit_batch=2,
                    dit_warmup=2, distill_teacher_samples=4, distill_teacher_steps=3, distill_steps=2,
                    distill_batch=2, checkpoint_every=2, log_every=1)
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict:
        return asdict(self)


def step_seed(seed: int, stage: str, step: int) -> int:
    """A 63-bit seed for (run seed, stage, step): any step's batch is drawn without drawing the steps before it."""
    digest = hashlib.sha256(f"h3.train/{seed}/{stage}/{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def generators(seed: int, stage: str, step: int, device) -> tuple[torch.Generator, torch.Generator]:
    """(CPU generator, device generator) for one step."""
    s = step_seed(seed, stage, step)
    cpu = torch.Generator().manual_seed(s)
    dev = torch.Generator(device=device).manual_seed(s) if torch.device(device).type != "cpu" else cpu
    return cpu, dev


def lr_at(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then constant (the DiT ships its EMA). The rate never depends on the step count, so a stage
    that a wall-clock budget ends after N steps is reproduced exactly by running N steps."""
    return peak * min(1.0, (step + 1) / warmup)


class EMA:
    """Exponential moving average of a module's floating-point parameters."""

    def __init__(self, module: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, module: torch.nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        for k, v in module.state_dict().items():
            if k in self.shadow:
                self.shadow[k].lerp_(v.detach(), 1 - decay)

    def copy_to(self, module: torch.nn.Module) -> None:
        state = module.state_dict()
        state.update({k: v.to(state[k].dtype) for k, v in self.shadow.items()})
        module.load_state_dict(state)


class Budget:
    """Ends a slice when its wall-clock budget is spent (checked between steps; the state is saved first)."""

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def expired(self) -> bool:
        return self.left() <= 0


def save_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: Path, device="cpu") -> dict | None:
    return torch.load(path, map_location=device, weights_only=False) if path.is_file() else None


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


@dataclass
class StageLog:
    """Loss numbers of a stage, one row per logged step."""

    rows: list = field(default_factory=list)

    def add(self, step: int, **values) -> None:
        self.rows.append({"step": step, **{k: round(float(v), 6) for k, v in values.items()}})


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def autocast(device):
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)
