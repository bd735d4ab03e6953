"""Stage 5: the 4-step LoRA, distilled against the 29-step teacher.

The teacher is the trained DiT (its EMA weights) sampling t2va requests of the pool with the pipeline's own
29-step schedule (MiniMaxH3Scheduler, video shift 12 / audio shift 3), from seeded noise. The student is the same DiT,
frozen, plus a :class:`~h3.train.lora.DistillLora`, run on the 4-step schedule from the same noise: at each of its 4
steps it is trained so that the scheduler's x0 estimate (``x_t + sigma v``) equals the teacher's final latents, along
the student's own trajectory (each step's input is the student's previous output, detached). The last step's x0
estimate is the clip the student produces, so the final term is the output matching the teacher's. With
``distill_moment_weight`` the final x0 also matches the teacher's per-channel mean and spread (:func:`moment_gap`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from h3.train.common import (
    Budget, Dist, StageLog, TrainConfig, autocast, generators, load_state, lr_at, save_state, set_lr,
)
from h3.train.dit import Batches, sample
from h3.train.lora import DistillLora
from h3.train.packing import NUM_LATENT_FRAMES, VIDEO_ROW, packed_forward
from h3.train.pool import Pool
from h3.train.student import DISTILL_WARMUP, snapshot, student_grid  # noqa: F401 (h3.train.distill's names)

logger = logging.getLogger(__name__)

@torch.no_grad()
def teacher_set(transformer, pool: Pool, cfg: TrainConfig, chunk: int = 128, rank: int = 0,
                world: int = 1) -> list[dict]:
    """Teacher samples grouped by layout: presentation ids, noise and the teacher's 29-step latents. With several
    ranks, rank ``r`` makes (and trains on) every ``world``-th of the picked samples."""
    batches = Batches(pool, cfg)
    cpu_g, _ = generators(cfg.seed, "teacher/pick", 0, cfg.device)
    t2va = [i for i, task in enumerate(pool.tasks) if task == "t2va"]
    samples, presentations = teacher_count(pool, cfg)
    if samples > presentations:
        logger.info("teacher: %d samples over the pool's %d t2va presentations (one per clip), each drawn with "
                    "%d-%d noises", samples, presentations, samples // presentations, -(-samples // presentations))
    picks = [t2va[i] for i in teacher_picks(len(t2va), samples, cpu_g)]
    picks = picks[rank::world]
    by_len: dict[int, list[int]] = {}
    for p in picks:
        by_len.setdefault(int(pool.texts[p].shape[0]), []).append(p)
    groups = []
    for n, (length, members) in enumerate(sorted(by_len.items())):
        key = ("t2va", length)
        layout = batches.layout(key, pool.tags[members[0]])
        for start in range(0, len(members), chunk):
            part = members[start:start + chunk]
            _, gen = generators(cfg.seed, "teacher/noise" if rank == 0 else f"teacher/noise/rank{rank}",
                                n * 100000 + start, cfg.device)
            text = torch.stack([pool.texts[p] for p in part]).float()
            nv = torch.randn((len(part), len(layout.video_indices), VIDEO_ROW), generator=gen, device=cfg.device)
            na = torch.randn((len(part), len(layout.audio_indices), 32), generator=gen, device=cfg.device)
            xv, xa = sample(transformer, layout, text, nv, na, cfg.distill_teacher_steps, device=cfg.device)
            groups.append({"key": key, "presentations": part, "noise_v": nv, "noise_a": na, "x0_v": xv, "x0_a": xa})
        logger.info("teacher: %d/%d samples", sum(len(g["presentations"]) for g in groups), len(picks))
    return groups


def teacher_count(pool: Pool, cfg: TrainConfig) -> tuple[int, int]:
    """(teacher samples, distinct t2va presentations among them) over all ranks: ``distill_teacher_samples``
    samples; past the pool's t2va presentations (one per clip) a presentation recurs with another noise
    (:func:`teacher_picks`)."""
    available = sum(task == "t2va" for task in pool.tasks)
    return cfg.distill_teacher_samples, min(cfg.distill_teacher_samples, available)


def teacher_picks(available: int, samples: int, generator: torch.Generator) -> list[int]:
    """Indices into the ``available`` t2va presentations for ``samples`` teacher samples: a random permutation's first
    ``samples`` (what the teacher set always drew, so earlier runs reproduce), followed, when more are asked for than
    there are, by further permutations, so that each presentation recurs as evenly as possible; each occurrence gets
    its own noise (the teacher set draws noise per sample)."""
    if available <= 0:
        raise ValueError("the pool has no t2va presentation to distil on")
    picks: list[int] = []
    while len(picks) < samples:
        picks += torch.randperm(available, generator=generator).tolist()
    return picks[:samples]


def moment_gap(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared gap between the per-sample, per-channel means and (population) standard deviations over the
    tokens of ``x`` and ``target`` (batch, tokens, channels)."""
    mean_gap = (x.mean(dim=1) - target.mean(dim=1)).pow(2).mean()
    std_gap = (x.std(dim=1, unbiased=False) - target.std(dim=1, unbiased=False)).pow(2).mean()
    return mean_gap + std_gap


def motion_gap(x: torch.Tensor, target: torch.Tensor, frames: int = NUM_LATENT_FRAMES) -> torch.Tensor:
    """Mean squared gap between the changes from one latent frame to the next of ``x`` and of ``target`` (batch,
    video rows, values), the rows frame-major (h3.train.packing.patchify's order, t2va: no conditioning rows)."""
    if x.shape[1] % frames:
        raise ValueError(f"{x.shape[1]} video rows do not split into {frames} latent frames")
    step = lambda v: v.unflatten(1, (frames, -1)).diff(dim=1)  # noqa: E731
    return (step(x) - step(target)).pow(2).mean()


def distill_loss(transformer, batches: Batches, group: dict, index: torch.Tensor, grid, cfg: TrainConfig,
                 sparse: tuple | None = None):
    """The student's 4 steps from the teacher sample's noise, each step's x0 estimate against the teacher's final
    latents (``sparse``: the student attends block-sparsely, :func:`h3.train.packing.packed_forward`)."""
    tv, sgv, ta, sga = grid
    layout = batches.layout(group["key"], batches.pool.tags[group["presentations"][0]])
    text = torch.stack([batches.pool.texts[group["presentations"][int(i)]] for i in index]).float()
    xv, xa = group["noise_v"][index], group["noise_a"][index]
    target_v, target_a = group["x0_v"][index], group["x0_a"][index]
    b = xv.shape[0]
    total, parts = 0.0, {}
    for i in range(len(tv)):
        with autocast(cfg.device):
            pv, pa = packed_forward(transformer, layout, xv, xa, text, tv[i].expand(b), ta[i].expand(b), sparse)
        x0v = xv + (1 - tv[i]) * pv.float()
        x0a = xa + (1 - ta[i]) * pa.float()
        lv = (x0v - target_v).pow(2).mean()
        la = (x0a - target_a).pow(2).mean()
        total = total + lv + la
        parts[f"step{i}"] = (lv + la).item()
        if cfg.distill_moment_weight and i == len(tv) - 1:  # the clip the student makes: keep the teacher's spread
            moment = moment_gap(x0v, target_v) + moment_gap(x0a, target_a)
            total = total + len(tv) * cfg.distill_moment_weight * moment
            parts["moment"] = moment.item()
        if cfg.distill_motion_weight and i == len(tv) - 1:  # the clip's motion: its events are the content
            motion = motion_gap(x0v, target_v)
            total = total + len(tv) * cfg.distill_motion_weight * motion
            parts["motion"] = motion.item()
        rv, ra = sgv[i + 1] / sgv[i], sga[i + 1] / sga[i]
        xv = (rv * xv + (1 - rv) * x0v).detach()
        xa = (ra * xa + (1 - ra) * x0a).detach()
    return total / len(tv), parts


def train_distill(transformer, pool: Pool, cfg: TrainConfig, out: Path, budget: Budget,
                  stop_after: int | None = None, dist: Dist | None = None) -> tuple[DistillLora, dict]:
    """``transformer`` holds the teacher weights (frozen here); returns the trained LoRA (detached) and the log. With
    several ranks (``dist``) each makes its share of the teacher set and the LoRA's gradients are averaged."""
    dist = dist or Dist()
    if cfg.distill_objective not in ("regression", "dmd"):
        raise ValueError(f"distill_objective {cfg.distill_objective!r}: 'regression' or 'dmd'")
    transformer.requires_grad_(False)
    transformer.eval()
    groups = load_teacher_set(transformer, pool, cfg, out, dist)
    lora = DistillLora(transformer, cfg.lora_rank, cfg.lora_adaln_rank, seed=cfg.seed).to(cfg.device)
    init_from = None
    if cfg.distill_init and not (out / "distill" / "state.pt").is_file():
        init_from = {"file": cfg.distill_init, "sha256": lora.load_exported(cfg.distill_init)}
        logger.info("distill: the LoRA starts from %s", cfg.distill_init)
    samples, presentations = teacher_count(pool, cfg)
    plan = LoraPlan(stage="distill", steps=cfg.distill_steps, lr=cfg.distill_lr, lr_final=cfg.distill_lr_final,
                    lr_steps=cfg.distill_lr_steps,
                    record={"teacher_samples": samples, "teacher_presentations": presentations,
                            **({"init_from": init_from} if init_from else {})})
    if cfg.distill_objective == "dmd":
        from h3.train.dmd import fit_dmd

        fake = DistillLora(transformer, cfg.dmd_fake_rank, cfg.dmd_fake_adaln_rank, seed=cfg.seed + 2).to(cfg.device)
        result = fit_dmd(transformer, lora, fake, groups, Batches(pool, cfg), cfg, out / "distill" / "state.pt", plan,
                         budget, stop_after, dist)
    else:
        result = fit_lora(transformer, lora, groups, Batches(pool, cfg), cfg, out / "distill" / "state.pt", plan,
                          budget, stop_after, dist)
    return lora, result


def load_teacher_set(transformer, pool: Pool, cfg: TrainConfig, out: Path, dist: Dist) -> list[dict]:
    """The teacher set this rank trains on: made once by the distill stage, kept in its state folder."""
    teacher_path = out / "distill" / ("teacher.pt" if dist.world == 1 else f"teacher-{dist.rank}of{dist.world}.pt")
    groups = load_state(teacher_path, cfg.device)
    if groups is None:
        started = time.monotonic()
        groups = teacher_set(transformer, pool, cfg, rank=dist.rank, world=dist.world)
        save_state(teacher_path, groups)
        logger.info("teacher set in %.1f s", time.monotonic() - started)
    return groups


@dataclass
class LoraPlan:
    """What :func:`fit_lora` trains: the stage's name (its log lines and random stream), steps, learning rate (cosine
    from ``lr`` to ``lr * lr_final`` over ``lr_steps`` or ``steps``), the student's attention (``sparse``: block
    size and sparsity, and the token streams whose queries go sparse if given: :func:`h3.train.packing.packed_forward`;
    else dense), and what its state records besides the log."""

    stage: str
    steps: int
    lr: float
    lr_final: float
    lr_steps: int | None = None
    sparse: tuple | None = None
    record: dict = field(default_factory=dict)


def fit_lora(transformer, lora: DistillLora, groups: list[dict], batches: Batches, cfg: TrainConfig, path: Path,
             plan: LoraPlan, budget: Budget, stop_after: int | None = None, dist: Dist | None = None) -> dict:
    """Train ``lora`` (attached to ``transformer`` while it trains, detached after) so that the 4-step student's x0
    estimates meet the teacher's final latents (:func:`distill_loss`); resumable from the state at ``path``."""
    dist = dist or Dist()
    optimizer = torch.optim.AdamW(lora.parameters(), lr=plan.lr, betas=(0.9, 0.99), weight_decay=0.0)
    state = load_state(path, cfg.device)
    log, step, seconds, total = StageLog(), 0, 0.0, plan.steps
    planned = plan.lr_steps or plan.steps  # what the learning rate's cosine is planned over
    record = dict(plan.record)
    if state is not None:
        record.update({k: state[k] for k in ("init_from",) if k in state})
        lora.load_state_dict(state["lora"])
        if "opt" in state:  # a finished stage may travel without it (h3.train.travel, --moments drop)
            optimizer.load_state_dict(state["opt"])
        step, log.rows, seconds = state["step"], state["log"], state["seconds"]
        total, planned = state["total_steps"], state.get("planned_steps", state["total_steps"])
    dist.broadcast(lora)
    grid = student_grid(cfg.distill_student_steps, cfg.device)
    sizes = torch.tensor([len(g["presentations"]) for g in groups], dtype=torch.float)
    lora.attach(transformer)
    started, ran = time.monotonic(), 0

    def save():
        if not dist.main:
            return
        save_state(path, {"lora": lora.state_dict(), "opt": optimizer.state_dict(), "step": step, "log": log.rows,
                          "seconds": seconds + time.monotonic() - started, "total_steps": total,
                          "planned_steps": planned, **record})

    try:
        while step < total:
            if dist.any(budget.expired(), cfg.device) or (stop_after is not None and ran >= stop_after):
                save()
                return {"done": False, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}
            set_lr(optimizer, lr_at(step, plan.lr, DISTILL_WARMUP, planned, plan.lr_final))
            cpu_g, _ = generators(cfg.seed, dist.stream(plan.stage), step, cfg.device)
            group = groups[int(torch.multinomial(sizes, 1, generator=cpu_g))]
            index = torch.randint(len(group["presentations"]), (cfg.distill_batch,), generator=cpu_g).to(cfg.device)
            loss, parts = distill_loss(transformer, batches, group, index, grid, cfg, plan.sparse)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            dist.average_grads(lora.parameters())
            torch.nn.utils.clip_grad_norm_(lora.parameters(), 1.0)
            optimizer.step()
            step += 1
            ran += 1
            if (step % cfg.log_every == 0 or step == total) and dist.main:
                log.add(step, loss=loss.item(), **parts)
                logger.info("%s step %d/%d loss %.4f %s", plan.stage, step, total, loss.item(),
                            {k: round(v, 4) for k, v in parts.items()})
            if step % cfg.checkpoint_every == 0:
                save()
            if plan.stage == "distill" and dist.main:
                snapshot(lora, path, step, cfg)
        save()
    finally:
        lora.detach()
    return {"done": True, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}
