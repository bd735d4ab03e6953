"""Distribution-matching distillation (DMD) of the 4-step LoRA: the distill stage's objective with
``distill_objective = "dmd"``.

The x0-regression student (:func:`h3.train.distill.distill_loss`) learns the teacher's deterministic map from noise to
clip; a LoRA too small for that map learns its average, and the average of many bounces is no bounce (runs 13-20: the
students lost 3-4 of the teacher's 6 bounces on world-demo's 16 pairs). DMD (Yin et al. 2024; DMD2's multi-step
generator, backward simulation and two time-scale update) asks instead that the student's clips be distributed as the
teacher's: a second LoRA, the *fake score*, starts as the teacher (B = 0) and is trained by the DiT's own flow-matching
objective on the student's samples, so it tracks the distribution the student makes; the student is moved along the
difference of the two denoisers at a noised student sample, ``x0_fake - x0_teacher`` (the gradient of the KL between
the two distributions), normalised by the teacher's mean error on that sample.

Per step: a random student step ``k`` of 4 (``dmd_student_step``: a fixed one); the student runs steps ``0..k-1`` from the teacher set's noise without
gradient and step ``k`` with it, its x0 estimate ``x0_k`` being the sample (each of the student's steps is meant to
make a clip, as the regression stage trains them all to). Then

* the student's loss: the DMD term on ``x0_k``, plus ``dmd_regression_weight`` times the regression to the teacher's
  final latents from the same noise (the original DMD's anchor; 0 leaves it out);
* ``dmd_fake_updates`` steps of the fake score's flow-matching loss on ``x0_k`` (detached), fresh noise each.

The first ``dmd_fake_warmup`` steps train the fake score alone (the student starts from ``distill_init``, a regression
student whose distribution is already not the teacher's). The generator and the fake score noise at the DiT's own
shifted timesteps (video shift 12, audio shift 3), the base time drawn in ``[0.02, 0.98]``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from h3.train.common import (
    Dist, StageLog, TrainConfig, autocast, generators, load_state, lr_at, save_state, set_lr,
)
from h3.train.student import DISTILL_WARMUP, snapshot, student_grid
from h3.train.packing import AUDIO_SHIFT, VIDEO_SHIFT, packed_forward, shifted_sigma

logger = logging.getLogger(__name__)

DMD_TIME_RANGE = (0.02, 0.98)


def noised(x0v: torch.Tensor, x0a: torch.Tensor, gen: torch.Generator):
    """The DiT's training noise on a batch of clean rows: per sample a base time ``u`` in :data:`DMD_TIME_RANGE`,
    video and audio sigmas at their shifts, fresh Gaussian noise. Returns (xv, xa, sigma_v, sigma_a, noise_v,
    noise_a)."""
    b = x0v.shape[0]
    lo, hi = DMD_TIME_RANGE
    u = lo + (hi - lo) * torch.rand(b, generator=gen, device=x0v.device)
    sv, sa = shifted_sigma(u, VIDEO_SHIFT), shifted_sigma(u, AUDIO_SHIFT)
    nv = torch.randn(x0v.shape, generator=gen, device=x0v.device)
    na = torch.randn(x0a.shape, generator=gen, device=x0a.device)
    xv = (1 - sv)[:, None, None] * x0v + sv[:, None, None] * nv
    xa = (1 - sa)[:, None, None] * x0a + sa[:, None, None] * na
    return xv, xa, sv, sa, nv, na


def denoised(transformer, layout, xv, xa, text, sv, sa, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The x0 estimates ``x + sigma v`` of whatever adapters are attached to ``transformer``."""
    with autocast(device):
        pv, pa = packed_forward(transformer, layout, xv, xa, text, 1 - sv, 1 - sa)
    return xv + sv[:, None, None] * pv.float(), xa + sa[:, None, None] * pa.float()


def dmd_direction(x0: torch.Tensor, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """DMD's update direction for samples ``x0`` (batch, rows, values): ``fake - real`` over the mean absolute error
    of the real denoiser on each sample (the paper's weighting; it makes the step size independent of the noise
    level)."""
    weight = (x0 - real).abs().mean(dim=(1, 2), keepdim=True).clamp_min(1e-6)
    return (fake - real) / weight


def distribution_loss(x0: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient with respect to ``x0`` is ``direction / x0.numel()``: half the squared distance to the
    detached target ``x0 - direction``."""
    return 0.5 * (x0 - (x0 - direction).detach()).pow(2).mean()


def fake_score_loss(transformer, layout, x0v, x0a, text, gen, cfg: TrainConfig) -> torch.Tensor:
    """The DiT's flow-matching loss (h3.train.dit.flow_loss's, audio weighted alike) on the student's samples, through
    the attached fake-score LoRA."""
    xv, xa, sv, sa, nv, na = noised(x0v, x0a, gen)
    with autocast(cfg.device):
        pv, pa = packed_forward(transformer, layout, xv, xa, text, 1 - sv, 1 - sa)
    return (pv.float() - (x0v - nv)).pow(2).mean() + cfg.dit_audio_weight * (pa.float() - (x0a - na)).pow(2).mean()


def student_sample(transformer, layout, text, xv, xa, grid, k: int, device):
    """The student's x0 estimate at its step ``k`` (0-based) from noise ``(xv, xa)``: steps before ``k`` without
    gradient (the scheduler's Euler update from each x0 estimate), step ``k`` with it."""
    tv, sgv, ta, sga = grid
    b = xv.shape[0]
    with torch.no_grad():
        for i in range(k):
            with autocast(device):
                pv, pa = packed_forward(transformer, layout, xv, xa, text, tv[i].expand(b), ta[i].expand(b))
            x0v, x0a = xv + (1 - tv[i]) * pv.float(), xa + (1 - ta[i]) * pa.float()
            rv, ra = sgv[i + 1] / sgv[i], sga[i + 1] / sga[i]
            xv, xa = rv * xv + (1 - rv) * x0v, ra * xa + (1 - ra) * x0a
    with autocast(device):
        pv, pa = packed_forward(transformer, layout, xv, xa, text, tv[k].expand(b), ta[k].expand(b))
    return xv + (1 - tv[k]) * pv.float(), xa + (1 - ta[k]) * pa.float()


def _student_update(transformer, student, fake, opt_s, layout, text, x0: tuple, target: tuple, dev_g,
                    cfg: TrainConfig, dist) -> tuple[torch.Tensor, dict]:
    """One DMD step of ``student`` on the clip it sampled, ``x0`` = (video, audio) latents: the distribution-matching
    direction (the teacher's denoising of a noised copy against the fake score's), plus ``dmd_regression_weight`` x
    the regression to the teacher's latents ``target``. Returns the loss and its parts (detached)."""
    x0v, x0a = x0
    with torch.no_grad():
        xv, xa, sv, sa, _, _ = noised(x0v.detach(), x0a.detach(), dev_g)
        real_v, real_a = denoised(transformer, layout, xv, xa, text, sv, sa, cfg.device)
        fake.attach(transformer)
        try:
            fake_v, fake_a = denoised(transformer, layout, xv, xa, text, sv, sa, cfg.device)
        finally:
            fake.detach()
        dir_v = dmd_direction(x0v.detach(), real_v, fake_v)
        dir_a = dmd_direction(x0a.detach(), real_a, fake_a)
    loss = distribution_loss(x0v, dir_v) + distribution_loss(x0a, dir_a)
    parts = {"dmd": loss.detach()}
    if cfg.dmd_regression_weight:
        regression = (x0v - target[0]).pow(2).mean() + (x0a - target[1]).pow(2).mean()
        loss = loss + cfg.dmd_regression_weight * regression
        parts["regression"] = regression.detach()
    opt_s.zero_grad(set_to_none=True)
    loss.backward()
    dist.average_grads(student.parameters())
    torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
    opt_s.step()
    return loss, parts


def fit_dmd(transformer, student, fake, groups: list[dict], batches, cfg: TrainConfig, path: Path, plan, budget,
            stop_after: int | None = None, dist=None) -> dict:
    """Train ``student`` by DMD against the frozen ``transformer`` (the teacher), with ``fake`` as the fake score;
    resumable from the state at ``path`` (both LoRAs, both optimizers). The same return as
    :func:`h3.train.distill.fit_lora`."""
    dist = dist or Dist()
    if not -1 <= cfg.dmd_student_step < cfg.distill_student_steps:
        raise ValueError(f"dmd_student_step {cfg.dmd_student_step}: -1 (a random step) or a step of the student's "
                         f"{cfg.distill_student_steps} (0-based)")
    opt_s = torch.optim.AdamW(student.parameters(), lr=plan.lr, betas=(0.9, 0.99), weight_decay=0.0)
    opt_f = torch.optim.AdamW(fake.parameters(), lr=cfg.dmd_fake_lr, betas=(0.9, 0.99), weight_decay=0.0)
    state = load_state(path, cfg.device)
    log, step, seconds, total = StageLog(), 0, 0.0, plan.steps
    planned = plan.lr_steps or plan.steps
    record = dict(plan.record)
    if state is not None:
        record.update({k: state[k] for k in ("init_from",) if k in state})
        student.load_state_dict(state["lora"])
        fake.load_state_dict(state["fake"])
        if "opt" in state:  # a finished stage may travel without its moments (h3.train.travel)
            opt_s.load_state_dict(state["opt"])
        if "opt_fake" in state:
            opt_f.load_state_dict(state["opt_fake"])
        step, log.rows, seconds = state["step"], state["log"], state["seconds"]
        total, planned = state["total_steps"], state.get("planned_steps", state["total_steps"])
    dist.broadcast(student)
    dist.broadcast(fake)
    grid = student_grid(cfg.distill_student_steps, cfg.device)
    sizes = torch.tensor([len(g["presentations"]) for g in groups], dtype=torch.float)
    started, ran = time.monotonic(), 0

    def save():
        if not dist.main:
            return
        save_state(path, {"lora": student.state_dict(), "fake": fake.state_dict(), "opt": opt_s.state_dict(),
                          "opt_fake": opt_f.state_dict(), "step": step, "log": log.rows,
                          "seconds": seconds + time.monotonic() - started, "total_steps": total,
                          "planned_steps": planned, "objective": "dmd", **record})

    try:
        while step < total:
            if dist.any(budget.expired(), cfg.device) or (stop_after is not None and ran >= stop_after):
                save()
                return {"done": False, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}
            cpu_g, dev_g = generators(cfg.seed, dist.stream(plan.stage), step, cfg.device)
            group = groups[int(torch.multinomial(sizes, 1, generator=cpu_g))]
            index = torch.randint(len(group["presentations"]), (cfg.distill_batch,), generator=cpu_g).to(cfg.device)
            k = int(torch.randint(cfg.distill_student_steps, (1,), generator=cpu_g))  # drawn either way: same streams
            if cfg.dmd_student_step >= 0:
                k = cfg.dmd_student_step
            layout = batches.layout(group["key"], batches.pool.tags[group["presentations"][0]])
            text = torch.stack([batches.pool.texts[group["presentations"][int(i)]] for i in index]).float()
            student.attach(transformer)
            try:
                x0v, x0a = student_sample(transformer, layout, text, group["noise_v"][index], group["noise_a"][index],
                                          grid, k, cfg.device)
            finally:
                student.detach()
            train_student = step >= cfg.dmd_fake_warmup
            if train_student:
                set_lr(opt_s, lr_at(step - cfg.dmd_fake_warmup, plan.lr, DISTILL_WARMUP,
                                    max(1, planned - cfg.dmd_fake_warmup), plan.lr_final))
                loss, parts = _student_update(transformer, student, fake, opt_s, layout, text, (x0v, x0a),
                                              (group["x0_v"][index], group["x0_a"][index]), dev_g, cfg, dist)
            else:
                parts = {}
            sample_v, sample_a = x0v.detach(), x0a.detach()
            del x0v, x0a
            fake.attach(transformer)
            try:
                for _ in range(cfg.dmd_fake_updates):
                    fake_loss = fake_score_loss(transformer, layout, sample_v, sample_a, text, dev_g, cfg)
                    opt_f.zero_grad(set_to_none=True)
                    fake_loss.backward()
                    dist.average_grads(fake.parameters())
                    torch.nn.utils.clip_grad_norm_(fake.parameters(), 1.0)
                    opt_f.step()
            finally:
                fake.detach()
            parts["fake"] = fake_loss.detach()
            step += 1
            ran += 1
            if (step % cfg.log_every == 0 or step == total) and dist.main:
                values = {name: float(v) for name, v in parts.items()}
                log.add(step, **({"loss": float(loss.detach())} if train_student else {}), **values)
                logger.info("%s step %d/%d (dmd, student step %d) %s", plan.stage, step, total, k,
                            {name: round(v, 4) for name, v in values.items()})
            if step % cfg.checkpoint_every == 0:
                save()
            if dist.main:
                snapshot(student, path, step, cfg)
        save()
    finally:
        student.detach()
        fake.detach()
    return {"done": True, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}
