"""What every training stage shares: its configuration, deterministic per-step seeds, resumable state, the learning
rate schedule, the EMA of the weights, and a wall-clock budget that ends a slice cleanly."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


DIT_SHAPE_SETTINGS = {"hidden_size": "dit_hidden_size", "num_layers": "dit_num_layers",
                      "num_attention_heads": "dit_num_attention_heads", "ffn_dim": "dit_ffn_dim"}
"""The DiT's diffusers config keys a run may set, and the TrainConfig setting of each (0: the shipped value)."""


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
    video_vae_lr: float = 1.5e-3
    video_vae_kl: float = 1e-3
    # video decoder (the shipped decoder, trained on the frozen encoder's latents: h3.tiny_trained.VAE_DECODER_CONFIG)
    video_decoder_steps: int = 40000
    video_decoder_batch: int = 48
    video_decoder_lr: float = 1e-3
    # audio VAE
    audio_vae_steps: int = 5000
    audio_vae_batch: int = 96
    audio_vae_latents: int = 40  # 1 s crops, hop-aligned
    audio_vae_lr: float = 2e-3
    audio_vae_click_weight: float = 30.0
    """Extra loss weight of the samples a click sounds in (1 + this; the rest weigh 1)."""
    audio_vae_kl: float = 1e-4
    """Weight of an L2 penalty on the posterior mean (the audio VAE is trained on its mean, as it is used)."""
    # audio decoder (the audio-vae stage's decoder continued on whole clips, its encoder frozen)
    audio_decoder_steps: int = 4000
    audio_decoder_batch: int = 24
    audio_decoder_latents: int | None = None  # None: whole clips, as the pipeline encodes and decodes them
    audio_decoder_lr: float = 5e-4
    # latent pool
    pool_size: int = 6144
    pool_keyframe_share: float = 0.25
    """Share of the pool that also carries fl2va keyframe and ref2va reference presentations."""
    pool_two_shape_share: float = 0.3
    """The pool's chance of a two-shape draw (h3.world.scene.TWO_SHAPE_SHARE: 0.3, the prompt suites', by default;
    0.6 gives more than twice the default's two-shape scenes: tests/test_train.py)."""
    # DiT
    dit_hidden_size: int = 0
    """The DiT's shape (issue 17: "widen the tiny configs as far as quality needs"); 0 keeps
    h3.tiny_trained.TRANSFORMER_CONFIG's. A run that widens it trains the DiT from its initial weights (a checkpoint's
    DiT seeds only a run of its own shape) and exports the wider transformer, whose config.json the runtime reads."""
    dit_num_layers: int = 0
    dit_num_attention_heads: int = 0
    dit_ffn_dim: int = 0
    dit_steps: int = 30000
    dit_batch: int = 192
    dit_lr: float = 2e-3
    dit_warmup: int = 300
    dit_lr_final: float = 1.0
    """The DiT's learning rate at the end of its plan, as a fraction of ``dit_lr``: a cosine from the warm-up's end over
    ``dit_lr_steps`` steps counted from where this slice of training (re)started (1.0, the default: constant, as up to
    run 12, whose DiT ships its EMA)."""
    dit_lr_steps: int | None = None
    """The steps the DiT's cosine is planned over, counted from the (re)start (None: the stage's remaining steps)."""
    dit_ema: float = 0.998
    dit_task_mix: tuple = (0.76, 0.12, 0.12)
    """t2va, fl2va (first, last or both keyframes), ref2va."""
    dit_audio_weight: float = 1.0
    dit_text_noise: float = 0.02
    """Gaussian noise (relative to the embeddings' std) on the text rows: the runtime encodes in the recipe's dtype."""
    dit_event_weight: float = 0.0
    """Extra weight of the flow-matching loss around each clip's events (:func:`h3.train.dit.event_weights`: the
    latent frames within one of an event of the world's ground truth, a shape appearing or bouncing, and the audio
    steps of the same span, where its click sounds get ``1 + lam`` against 1, normalized to mean 1 per clip so the
    loss keeps its scale). The events the content check counts are a few of 37 latent frames, weighed by the plain
    loss like any other: trained DiTs missed the bounce of 31 of 36 one-bounce captions and put audio onsets at
    seed-habitual times (bench/content_check/results/s33_g8s33_misses_probe.md). The latents' own second temporal
    difference marks them weakly (bench/tiny_event_weight/results/event_marks_s34.md: 1.11x the clip's mean at the
    bounce, median of 24 one-bounce clips; its largest frame near the bounce in 9 of 24), hence the ground truth.
    0 (the default, every run so far) leaves the loss exactly as before."""
    dit_audio_level_free: float = 0.0
    """The share of a batch's requests whose audio noise level is drawn on its own (its own base level through the
    audio shift) instead of from the video's base level. The pipeline's paired schedule (video shift 12, audio 3)
    leaves the audio cleaner than the video at every step, so a DiT trained on those pairs alone rarely has to time
    the audio from a drawn picture: trained tiny DiTs sound their clicks at the seed's habitual times whatever the
    caption (bench/content_check/results/s33_g8s33_misses_probe.md) and half their onsets miss the drawn turn by more
    than 2 frames (bench/tiny_event_weight/results/sync_probe_g8ev.md). Requests with a free audio level include
    clean pictures with noisy sound: sound from the picture. 0 (the default, every run so far) draws exactly as
    before."""
    # distillation
    distill_teacher_samples: int = 1024
    distill_teacher_steps: int = 29
    distill_student_steps: int = 4
    distill_steps: int = 3000
    distill_batch: int = 48
    distill_lr: float = 1e-3
    distill_lr_final: float = 1.0
    """The distillation's learning rate at its planned last step, as a fraction of ``distill_lr``: cosine from the
    warm-up's end (1.0, the default before run 11: constant)."""
    distill_lr_steps: int | None = None
    """The step count the cosine of ``distill_lr_final`` is planned over (None: ``distill_steps``). A run whose budget
    ended the stage after N of its planned P steps is reproduced by ``distill_steps=N`` with this set to P (the
    record's ``reproduce`` line does it)."""
    distill_moment_weight: float = 0.0
    """Weight of the moment term on the student's final x0 (:func:`h3.train.distill.moment_gap`): per sample and
    latent channel, its mean and standard deviation over the tokens against the teacher's. Regression to the
    teacher's latents alone lets a small LoRA shrink their spread (a quieter, flatter clip: runs 10 and 11 lost
    loudness or contrast in 15 of 16 pairs); 0 (the default, runs up to 11) leaves the term out."""
    distill_motion_weight: float = 0.0
    """Weight of a term on the student's final video x0 changes between consecutive latent frames against the teacher's
    (:func:`h3.train.distill.motion_gap`): the events the content check counts (bounces, direction) live in those
    changes, and runs 13-16's students lost 3-4 of the teacher's 6 bounces on world-demo's 16 pairs (session 14's
    signoff probes); 0 (the default, every run up to 16) leaves the term out."""
    distill_init: str = ""
    """A LoRA file in the shipped format (an earlier checkpoint's ``lora/turbo4-tiny.safetensors``) the distillation
    starts from instead of its seeded initialization ("" : none). One call distils ~2100 steps; starting from the last
    checkpoint's LoRA lets the next call add to them, against a teacher that may have trained on. The distill state
    and the training record name the file and its sha256."""
    distill_objective: str = "regression"
    """How the student learns: "regression" (every run up to 21: each step's x0 estimate against the teacher's final
    latents from the same noise, :func:`h3.train.distill.distill_loss`) or "dmd" (distribution matching against a
    fake score trained on the student's samples, :mod:`h3.train.dmd`)."""
    dmd_fake_rank: int = 64
    dmd_fake_adaln_rank: int = 16
    """The fake score's LoRA (on the frozen teacher; B = 0 at the start, so it starts as the teacher)."""
    dmd_fake_lr: float = 5e-4
    dmd_fake_updates: int = 2
    """Fake-score steps per student step (DMD2's two time-scale rule: the fake score must keep up with the student)."""
    dmd_fake_warmup: int = 100
    """Steps at the start that train the fake score alone, on the initial student's samples."""
    dmd_regression_weight: float = 0.0
    """Weight of the regression to the teacher's final latents beside the DMD term (the original DMD's anchor)."""
    dmd_student_step: int = -1
    """The student step whose x0 estimate the DMD term and the fake score see: -1 (the default, run 22) a random one
    per training step (DMD2's multi-step generator), else that step (0-based; ``distill_student_steps - 1`` the
    clip itself: the fake score then models the clips alone, not a mixture of the four steps' estimates)."""
    distill_snapshot_every: int = 0
    """Every this many distillation steps (0: never) the student LoRA is also written as
    ``<run>/distill/snapshots/turbo4-tiny-step<N>.safetensors``, in the exported format, so that one call yields the
    student at several lengths of training (the DMD students' overshoot grows with their steps)."""
    # the sparse-attention compensation LoRA (h3.train.compensate)
    compensate_steps: int = 0
    """Steps of the compensation LoRA (0, the default: no such stage, no such file; runs up to 16 had none)."""
    compensate_block_size: int = 32
    compensate_sparsity: float = 0.85
    """The routing the compensation LoRA trains under (the tiny's sparse recipes: 32-token blocks, 85 %, every step)."""
    compensate_streams: tuple[str, ...] = ("video",)
    """The token streams whose queries go sparse in the compensation's student: the ``sparse_attention`` lever's
    ``streams`` (default video only, as the lever's; issue 50). The file states them (``h3_sparse_streams``), and the
    ``compensation_lora`` lever refuses the file under a recipe that sparsifies other streams."""
    compensate_lr: float = 1e-3
    compensate_lr_final: float = 0.1
    compensate_lr_steps: int | None = None
    """The steps the compensation's cosine is planned over (None: ``compensate_steps``), as ``distill_lr_steps``."""
    lora_rank: int = 16
    lora_adaln_rank: int = 4
    export_dit_dtype: str = "float32"
    """The shipped DiT file's dtype: ``bfloat16`` halves it (what a DiT wider than ~2x the shipped one needs to stay in
    the 30 MB budget: bench/dit_width_cpu/results/dit_width_cpu.md); the modules diffusers keeps in float32 and the norms stay
    float32. The runtime runs the DiT in the recipe's dtype (bfloat16 for every shipped recipe) either way."""
    checkpoint_every: int = 500
    log_every: int = 50
    # devices
    ranks: int = 2
    """Data-parallel ranks of the dit and distill stages (torchrun, one per GPU; fewer when fewer GPUs are there). On
    a GPU host the audio VAE trains on the second GPU beside the video VAE, and the pool encodes on both."""

    @classmethod
    def smoke(cls, **overrides) -> "TrainConfig":
        """A few steps of everything at tiny batch sizes: the CPU tests and a dry run of the whole command."""
        base = dict(device="cpu", video_vae_steps=3, video_vae_batch=2, video_decoder_steps=3, video_decoder_batch=2,
                    audio_vae_steps=3, audio_vae_batch=2, audio_decoder_steps=3, audio_decoder_batch=2,
                    audio_decoder_latents=8,
                    audio_vae_latents=8, pool_size=8, pool_keyframe_share=0.5, dit_steps=4, dit_batch=2,
                    dit_warmup=2, distill_teacher_samples=4, distill_teacher_steps=3, distill_steps=2,
                    distill_batch=2, checkpoint_every=2, log_every=1, ranks=1)
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict:
        return asdict(self)

    def transformer_config(self) -> dict:
        """The DiT's diffusers config: TRANSFORMER_CONFIG with this run's ``dit_*`` shape settings over it."""
        from h3.tiny_trained import TRANSFORMER_CONFIG

        shape = {key: getattr(self, setting) for key, setting in DIT_SHAPE_SETTINGS.items()}
        bad = {k: v for k, v in shape.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
        if bad:
            raise ValueError(f"dit shape settings must be whole numbers >= 0 (0: the shipped one's), got {bad}")
        return {**TRANSFORMER_CONFIG, **{k: v for k, v in shape.items() if v}}


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


def lr_at(step: int, peak: float, warmup: int, total: int | None = None, final: float = 1.0) -> float:
    """Linear warm-up, then constant (the DiT ships its EMA): the rate never depends on the step count, so a stage
    that a wall-clock budget ends after N steps is reproduced exactly by running N steps. With ``final`` < 1 the rate
    then falls along a cosine to ``final * peak`` at step ``total`` (the planned count: a budget-ended stage is
    reproduced by the same plan stopped after N steps)."""
    rate = peak * min(1.0, (step + 1) / warmup)
    if final < 1.0 and total is not None and step >= warmup:
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        rate *= final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return rate


class EMA:
    """Exponential moving average of a module's floating-point parameters."""

    def __init__(self, module: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, module: torch.nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        current = module.state_dict()
        keys = [k for k in self.shadow if k in current]
        torch._foreach_lerp_([self.shadow[k] for k in keys], [current[k].detach() for k in keys], 1 - decay)

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
    """Atomically, through a temporary file of this writer's own (h3.atomic): stages of one run in processes beside
    each other write the same config.json at once, and a shared temporary name let one writer's rename take the file
    from under the other (FileNotFoundError: that stage's process died, and the export shipped without it)."""
    from h3.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")


@dataclass
class StageLog:
    """Loss numbers of a stage, one row per logged step."""

    rows: list = field(default_factory=list)

    def add(self, step: int, **values) -> None:
        self.rows.append({"step": step, **{k: round(float(v), 6) for k, v in values.items()}})


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class Dist:
    """The ranks of a data-parallel stage (``torchrun``-launched: WORLD_SIZE, RANK, LOCAL_RANK in the environment).

    With one rank every method is a no-op, so a stage runs the same code in a single process. With several, each rank
    draws its own batches (stage name + rank), the gradients are averaged by one all-reduce of a flat buffer per step
    (no DDP wrapper: the packed forward swaps attention processors on the bare module), and a stop decision is
    agreed on by every rank, so all ranks stop after the same step. Rank 0 alone writes state and logs."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    @classmethod
    def from_env(cls) -> "Dist":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() and os.environ.get("H3_TRAIN_GLOO") != "1" else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend)
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def main(self) -> bool:
        return self.rank == 0

    def stream(self, stage: str) -> str:
        """The name a rank's per-step draws are seeded with (rank 0 keeps the single-process stream)."""
        return stage if self.rank == 0 else f"{stage}/rank{self.rank}"

    def any(self, flag: bool, device) -> bool:
        if self.world == 1:
            return flag
        import torch.distributed as dist

        t = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(t)
        return bool(t.item() > 0)

    def average_grads(self, params) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        # Every parameter takes part (a zero where this rank's layout left it unused), so every rank's buffer has the
        # same length whatever task each one drew.
        params = list(params)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for p in params:
            part = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = part.clone()
            else:
                p.grad.copy_(part)
            offset += p.numel()

    def broadcast(self, module: torch.nn.Module) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        for t in module.state_dict().values():
            dist.broadcast(t, 0)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()


def autocast(device):
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)
