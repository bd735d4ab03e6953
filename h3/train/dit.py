"""Stage 4: the DiT, by flow matching on the latent pool, with the timestep shift the pipeline's schedulers sample.

Per request of a batch: a base level u ~ U(0, 1), the video rows at sigma_v = shift_12(u) and the audio rows at
sigma_a = shift_3(u) (MiniMaxH3Scheduler's exponential shift, video 12 and audio 3: the pair every denoising step of
the pipeline uses, one base grid point pushed through both shifts), x_t = t x_0 + (1 - t) noise with t = 1 - sigma, and
the target the model's data-ward velocity x_0 - noise (the scheduler's x_0 = x_t + sigma v). The conditioning is
what the pipeline feeds: the frozen text encoder's ``hidden_states[50]`` of the request's presentation as the text
rows, and for fl2va / ref2va the keyframe or reference latents noised to t = 0.999 in the leading video rows at
their timestep ``max(t, 0.999)``. Batches mix t2va, fl2va (first / last / both keyframes) and ref2va requests
(``dit_task_mix``), one layout per batch (h3.train.packing).

Weights: AdamW, linear warm-up then cosine decay, gradient clipping at 1, bf16 autocast on CUDA, and an EMA of the
weights (decay 0.999), which is what ships. AdaLN projections and output heads start at zero (the DiT recipe), so
every block starts as the identity.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from h3.train.common import (
    EMA, Budget, Dist, StageLog, TrainConfig, autocast, generators, load_state, lr_at, save_state, set_lr,
)
from h3.train.packing import (
    AUDIO_SHIFT, KEYFRAME_NOISE_AUG, PATCH, VIDEO_SHIFT, Layout, audio_rows, packed_forward, patchify, ref2va_layout,
    shifted_sigma, t2va_layout,
)
from h3.train.pool import Pool, latent_stats, latent_stats_of

logger = logging.getLogger(__name__)

FAMILIES = {"t2va": ("t2va",), "fl2va": ("fl2va-first", "fl2va-last", "fl2va-both"), "ref2va": ("ref2va", "ref2va-refer")}
ANCHORS = {"fl2va-first": ("first",), "fl2va-last": ("last",), "fl2va-both": ("first", "last")}


def init_dit(transformer: torch.nn.Module) -> None:
    """Zero the AdaLN projections and the output heads: every block starts as the identity and the first velocity is
    zero (the DiT paper's adaLN-Zero initialization)."""
    with torch.no_grad():
        for block in transformer.transformer_blocks:
            block.adaln_proj.linear.weight.zero_()
            block.adaln_proj.linear.bias.zero_()
        for head in (transformer.proj_out, transformer.audio_proj_out, transformer.norm_out.linear):
            head.weight.zero_()
            head.bias.zero_()


class Batches:
    """Draws the training batch of any step from the pool (and the step's seed) alone."""

    def __init__(self, pool: Pool, cfg: TrainConfig):
        self.pool, self.cfg = pool, cfg
        self.groups = pool.groups()
        self.families = {}
        for family, tasks in FAMILIES.items():
            keys = [k for k in sorted(self.groups) if k[0] in tasks]
            if keys:
                self.families[family] = (keys, torch.tensor([len(self.groups[k]) for k in keys], dtype=torch.float))
        self.layouts: dict[tuple, Layout] = {}
        self.text_std = float(torch.stack([t.float().std() for t in pool.texts[:512]]).mean())
        # Per group, its presentations' text rows stacked and their clips: a draw is then two index operations.
        device = pool.video.device
        self.stacked = {k: (torch.stack([pool.texts[p] for p in members]),
                            torch.tensor([pool.clips[p] for p in members], device=device))
                        for k, members in self.groups.items()}

    def layout(self, key: tuple[str, int], tags: tuple) -> Layout:
        if key not in self.layouts:
            tags_t = torch.tensor(tags, dtype=torch.long)
            self.layouts[key] = ref2va_layout(tags_t) if key[0].startswith("ref2va") else \
                t2va_layout(tags_t, ANCHORS.get(key[0], ()))
        return self.layouts[key]

    def draw(self, step: int, stage: str = "dit", batch: int | None = None, families=None) -> dict:
        cfg, pool = self.cfg, self.pool
        batch = batch or cfg.dit_batch
        cpu_g, dev_g = generators(cfg.seed, stage, step, cfg.device)
        names = [f for f in (families or FAMILIES) if f in self.families]
        mix = torch.tensor([cfg.dit_task_mix[list(FAMILIES).index(f)] for f in names])
        family = names[int(torch.multinomial(mix, 1, generator=cpu_g))]
        keys, sizes = self.families[family]
        key = keys[int(torch.multinomial(sizes, 1, generator=cpu_g))]
        members = self.groups[key]
        picks = torch.randint(len(members), (batch,), generator=cpu_g)
        texts, clip_table = self.stacked[key]
        clips = clip_table[picks.to(clip_table.device)]
        layout = self.layout(key, pool.tags[members[0]])
        text = texts[picks.to(texts.device)].float()
        cond = None
        if key[0] == "fl2va-first":
            cond = [pool.keyframe_first[clips]]
        elif key[0] == "fl2va-last":
            cond = [pool.keyframe_last[clips]]
        elif key[0] == "fl2va-both":
            cond = [pool.keyframe_first[clips], pool.keyframe_last[clips]]
        elif key[0].startswith("ref2va"):
            cond = [pool.reference[clips]]
        return {"key": key, "layout": layout, "clips": clips, "text": text, "cond": cond, "gen": dev_g}


def condition_rows(cond: list[torch.Tensor] | None, gen: torch.Generator) -> torch.Tensor | None:
    """Each conditioning latent noised to t = 0.999 (the pipeline's scale_noise) and packed, in packed order."""
    if not cond:
        return None
    rows = []
    for c in cond:
        noise = torch.randn(c.shape, generator=gen, device=c.device)
        rows.append(patchify(KEYFRAME_NOISE_AUG * c.float() + (1.0 - KEYFRAME_NOISE_AUG) * noise))
    return torch.cat(rows, dim=1)


EVENT_WINDOW = 1.0
"""Half-width, in latent frames, of the window around an event that ``dit_event_weight`` weighs (at the tiny
preset's 37 latent frames over 5.17 s: +-0.14 s; its video VAE puts a one-frame flash at pixel frame j in latent
frame ~j/3.35, one of the window's three frames)."""


def event_weights(event_times: torch.Tensor, duration: float, frames: int, steps: int, lam: float,
                  groups_per_frame: int, pt: int = PATCH[0]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss weights of a batch towards the moments its events happen (``cfg.dit_event_weight`` = ``lam``).

    ``event_times`` (B, E): each clip's events in seconds (h3.world.scene.Scene.events: a shape appearing, a bounce;
    each makes a click), NaN-padded; ``duration`` the clips' seconds. Video: latent frame f (of ``frames``) is in an
    event's window when ``|t / duration * (frames - 1) - f| <= EVENT_WINDOW``; audio latent step s (of ``steps``) when
    ``|t / duration * (steps - 1) - s| <= EVENT_WINDOW * (steps - 1) / (frames - 1)``, the same span of time. Each
    gets ``1 + lam`` in a window and 1 outside, divided by the clip's mean so that a clip's weights average 1 and the
    loss keeps its scale (a clip without events weighs 1 everywhere).

    Returns the weights of the rows of :func:`h3.train.packing.patchify` (B, (frames / pt) * groups_per_frame), a row's
    weight the mean of its ``pt`` frames', and of :func:`h3.train.packing.audio_rows` (B, 2 steps), row ``ch * steps +
    s`` weighing step s's.
    """
    if not lam >= 0:
        raise ValueError(f"dit_event_weight must be 0 or more, got {lam!r}")
    times = event_times.float()

    def weights(count: int, window: float) -> torch.Tensor:
        where = times / duration * (count - 1)  # (B, E) in latent units; NaN for padding
        grid = torch.arange(count, device=times.device, dtype=torch.float)
        near = ((where[:, :, None] - grid[None, None, :]).abs() <= window + 1e-6).any(dim=1)  # NaN compares False
        raw = 1.0 + lam * near.float()
        return raw / raw.mean(dim=1, keepdim=True)

    b = times.shape[0]
    wv = weights(frames, EVENT_WINDOW).reshape(b, frames // pt, pt).mean(dim=2)
    wv = wv.repeat_interleave(groups_per_frame, dim=1)
    wa = weights(steps, EVENT_WINDOW * (steps - 1) / (frames - 1)).repeat(1, 2)
    return wv, wa


def _event_rows(pool: Pool, clips: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`event_weights` of the drawn clips, from the pool's event table."""
    if pool.event_times is None:
        raise ValueError("dit_event_weight needs a pool with its clips' event times: this pool was built before "
                         "they were recorded; build it again (h3.train pool)")
    _, _, frames, h, w = pool.video.shape
    return event_weights(pool.event_times[clips], pool.duration, frames, pool.audio.shape[-1], lam,
                         (h // PATCH[1]) * (w // PATCH[2]))


def free_audio_levels(sa: torch.Tensor, share: float, gen: torch.Generator) -> torch.Tensor:
    """``sa`` with each request's audio level, at chance ``share``, replaced by one from its own base level
    (TrainConfig.dit_audio_level_free): a draw of the share's coins, then one of the new base levels, both uniform."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"dit_audio_level_free must be a share in [0, 1], got {share!r}")
    coins = torch.rand(sa.shape, generator=gen, device=sa.device)
    own = shifted_sigma(torch.rand(sa.shape, generator=gen, device=sa.device), AUDIO_SHIFT)
    return torch.where(coins < share, own, sa)


def flow_loss(transformer, batches: Batches, draw: dict, cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    pool, gen = batches.pool, draw["gen"]
    x0_v = patchify(pool.video[draw["clips"]].float())
    x0_a = audio_rows(pool.audio[draw["clips"]].float())
    b = x0_v.shape[0]
    u = torch.rand(b, generator=gen, device=x0_v.device)
    sv, sa = shifted_sigma(u, VIDEO_SHIFT), shifted_sigma(u, AUDIO_SHIFT)
    noise_v = torch.randn(x0_v.shape, generator=gen, device=x0_v.device)
    noise_a = torch.randn(x0_a.shape, generator=gen, device=x0_a.device)
    if cfg.dit_audio_level_free:  # drawn after the default draws: at 0 the stream is the one every run so far drew
        sa = free_audio_levels(sa, cfg.dit_audio_level_free, gen)
    xv = (1 - sv)[:, None, None] * x0_v + sv[:, None, None] * noise_v
    xa = (1 - sa)[:, None, None] * x0_a + sa[:, None, None] * noise_a
    text = draw["text"]
    if cfg.dit_text_noise:
        text = text + cfg.dit_text_noise * batches.text_std * torch.randn(text.shape, generator=gen,
                                                                          device=text.device)
    cond = condition_rows(draw["cond"], gen)
    n_cond = 0 if cond is None else cond.shape[1]
    video_in = xv if cond is None else torch.cat([cond, xv], dim=1)
    with autocast(cfg.device):
        pv, pa = packed_forward(transformer, draw["layout"], video_in, xa, text, 1 - sv, 1 - sa)
    if cfg.dit_event_weight == 0:
        loss_v = (pv[:, n_cond:].float() - (x0_v - noise_v)).pow(2).mean()
        loss_a = (pa.float() - (x0_a - noise_a)).pow(2).mean()
    else:  # the rows where the clip's events happen weigh more (TrainConfig.dit_event_weight)
        wv, wa = _event_rows(pool, draw["clips"], cfg.dit_event_weight)
        loss_v = (wv[:, :, None] * (pv[:, n_cond:].float() - (x0_v - noise_v)).pow(2)).mean()
        loss_a = (wa[:, :, None] * (pa.float() - (x0_a - noise_a)).pow(2)).mean()
    loss = loss_v + cfg.dit_audio_weight * loss_a
    # Detached tensors, not floats: reading them back syncs the GPU, so that happens only when a step is logged.
    return loss, {"loss": loss.detach(), "video": loss_v.detach(), "audio": loss_a.detach()}


def train_dit(transformer, pool: Pool, cfg: TrainConfig, out: Path, budget: Budget,
              stop_after: int | None = None, dist: Dist | None = None) -> dict:
    """Flow-matching training of ``transformer`` (resumable). With several ranks (``dist``) each draws its own batch
    of ``dit_batch`` requests and the gradients are averaged: the effective batch is ``ranks x dit_batch``."""
    dist = dist or Dist()
    path = out / "dit" / "state.pt"
    batches = Batches(pool, cfg)
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.dit_lr, betas=(0.9, 0.99), weight_decay=0.0)
    state = load_state(path, cfg.device)
    log, step, seconds, total, planned, lineage = StageLog(), 0, 0.0, cfg.dit_steps, cfg.dit_steps, {}
    if state is None:
        init_dit(transformer)
        ema = EMA(transformer, cfg.dit_ema)
    else:
        transformer.load_state_dict(state["model"])
        if "opt" in state:  # a finished stage may travel without it (h3.train.travel, --moments drop)
            optimizer.load_state_dict(state["opt"])
        ema = EMA(transformer, cfg.dit_ema)
        ema.shadow = state["ema"]
        step, log.rows, seconds = state["step"], state["log"], state["seconds"]
        total, planned = state["total_steps"], state.get("planned_steps", state["total_steps"])
        lineage = {k: state[k] for k in ("warm_from", "seeded_from") if k in state}  # h3.train.travel's seeding
        kept = latent_stats_of(state)
        if kept is not None and pool.video_stats and kept != latent_stats(pool):
            raise ValueError("the latent pool is normalized with other statistics than this DiT was trained with; "
                             "build the pool with the DiT state's latent_stats (h3.train.run's pool stage does)")
    if pool.video_stats:
        lineage["latent_stats"] = latent_stats(pool)
    # The cosine (dit_lr_final < 1) runs over dit_lr_steps counted from where this slice of training (re)started.
    plan = cfg.dit_lr_steps or max(1, total - lineage.get("warm_from", 0))
    dist.broadcast(transformer)
    transformer.train()
    started, ran = time.monotonic(), 0
    family_loss: dict[str, list] = {}
    stream = dist.stream("dit")

    def save():
        if not dist.main:
            return
        save_state(path, {"model": transformer.state_dict(), "opt": optimizer.state_dict(), "ema": ema.shadow,
                          "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started,
                          "total_steps": total, "planned_steps": planned, **lineage})

    while step < total:
        stop = stop_after is not None and ran >= stop_after
        if not stop and (dist.world == 1 or step % 10 == 0):  # the ranks agree every 10 steps (a GPU sync)
            stop = dist.any(budget.expired(), cfg.device)
        if stop:
            save()
            return {"done": False, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}
        since = step - lineage.get("warm_from", 0)
        set_lr(optimizer, lr_at(since, cfg.dit_lr, cfg.dit_warmup, plan, cfg.dit_lr_final))
        draw = batches.draw(step, stage=stream)
        loss, metrics = flow_loss(transformer, batches, draw, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        dist.average_grads(params)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        ema.update(transformer, step)
        step += 1
        ran += 1
        family_loss.setdefault(draw["key"][0].split("-")[0], []).append(metrics["loss"])
        if (step % cfg.log_every == 0 or step == total) and dist.main:
            extra = {f"loss_{k}": float(torch.stack(v).mean()) for k, v in family_loss.items()}
            log.add(step, **metrics, **extra)
            logger.info("dit step %d/%d %s", step, total, {k: round(float(v), 4) for k, v in metrics.items()})
        if step % cfg.log_every == 0 or step == total:
            family_loss.clear()
        if step % cfg.checkpoint_every == 0:
            save()
    save()
    return {"done": True, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}


def load_ema_into(transformer, out: Path, device) -> dict:
    """Put the DiT stage's EMA weights into ``transformer``; returns the stage state."""
    state = load_state(out / "dit" / "state.pt", device)
    if state is None:
        raise FileNotFoundError(f"{out / 'dit' / 'state.pt'}: run the dit stage first")
    ema = EMA(transformer, 0.0)
    ema.shadow = state["ema"]
    ema.copy_to(transformer)
    return state


@torch.no_grad()
def sample(transformer, layout: Layout, text: torch.Tensor, noise_v: torch.Tensor, noise_a: torch.Tensor,
           steps: int, cond: torch.Tensor | None = None, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's denoising loop for a packed batch: MiniMaxH3Scheduler (video shift 12, audio shift 3) with
    ``steps + 1`` grid points, one forward per step, conditioning rows held fixed."""
    from diffusers import MiniMaxH3Scheduler

    sv, sa = MiniMaxH3Scheduler(shift=VIDEO_SHIFT), MiniMaxH3Scheduler(shift=AUDIO_SHIFT)
    sv.set_timesteps(steps + 1, device=device)
    sa.set_timesteps(steps + 1, device=device)
    xv, xa = noise_v.float(), noise_a.float()
    n_cond = 0 if cond is None else cond.shape[1]
    b = xv.shape[0]
    for t, ta in zip(sv.timesteps, sa.timesteps):
        video_in = xv if cond is None else torch.cat([cond, xv], dim=1)
        with autocast(device):
            pv, pa = packed_forward(transformer, layout, video_in, xa, text, torch.full((b,), float(t), device=device),
                                    torch.full((b,), float(ta), device=device))
        xv = sv.step(pv[:, n_cond:].float(), t, xv, return_dict=False)[0]
        xa = sa.step(pa.float(), ta, xa, return_dict=False)[0]
    return xv, xa
