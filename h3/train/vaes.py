"""Stages 1 and 2: the video VAE and the audio VAE, trained on freshly rendered world clips; then the shipped video
decoder and audio decoder on their frozen encoders.

Video VAE: 22-frame windows (one 17-frame encoder chunk plus the 5 frames the decoder cross-fades), through the real
``encode`` -> posterior sample -> ``decode`` path in ImageNet-normalized pixel space; L1 + L2 reconstruction with the
shapes' pixels weighted 5x (they are the content; the background fills most of a frame), plus a small KL.

Audio VAE: 1 s hop-aligned mono crops through ``encode`` -> posterior mean (+ 5% noise) -> ``decode``, the way the
pipeline uses it (encode takes the mode, decode the DiT's latents); waveform L1 + L2, plain and pre-emphasized, plus a
small L2 on the mean.

Video decoder (``video-decoder``): the wider decoder of h3.tiny_trained.VAE_DECODER_CONFIG, from its seeded
initialization, on the latents of the video-vae stage's encoder, which it copies and freezes (with ``quant_conv``): the
same windows, posterior sample and loss as the video VAE, only the decoder side learns. The latent space stays the
one the pool and the DiT use, so the decoder can train beside the DiT.

Audio decoder (``audio-decoder``): the audio-vae stage's decoder, continued on whole clips with the encoder frozen. The
encoder's causal attention (``pre_block``) sees a whole clip's past in the pipeline but at most 1 s in the audio-vae
stage's crops, so on whole clips that decoder put a pre-echo 20-50 ms before every click after the first (onsets read
49 ms early) and a transient 40 ms before the end (run 7: sync 2/8 on the VAEs' round trip alone; 7/8 after this
stage's 4000 steps in run 8). Whole clips (``audio_decoder_latents`` None), encoded as the pipeline encodes them,
decoded and cropped to the clip's length; the audio-vae stage's loss. Its latent space stays the pool's, so it trains
beside the DiT too.

All four stages are resumable (state every ``checkpoint_every`` steps) and draw each step's batch from (seed, step)
alone.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from h3.train.common import (
    Budget, StageLog, TrainConfig, autocast, generators, load_state, lr_at, save_state, set_lr,
    step_seed,
)
from h3.world.render import render_audio, render_video
from h3.world.scene import sample_scenes

logger = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HOP = 800


def scene_stream(seed: int, stage: str) -> int:
    return step_seed(seed, f"{stage}/scenes", 0) % (2**31)


def normalize_frames(frames: torch.Tensor) -> torch.Tensor:
    """uint8 (B, T, H, W, 3) -> the video VAE's input (B, 3, T, H, W), ImageNet-normalized over [0, 1]."""
    x = frames.permute(0, 4, 1, 2, 3).float().div(255.0)
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1, 1)
    return (x - mean) / std


def _kl(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    return 0.5 * (mean.float() ** 2 + logvar.float().exp() - 1.0 - logvar.float()).mean()


def video_vae_loss(vae, cfg: TrainConfig, step: int, stage: str = "video-vae",
                   batch: int | None = None) -> tuple[torch.Tensor, dict]:
    device = cfg.device
    batch = batch or cfg.video_vae_batch
    cpu_g, dev_g = generators(cfg.seed, stage, step, device)
    scenes = sample_scenes(scene_stream(cfg.seed, stage), batch, start=step * batch)
    total = scenes[0].num_frames
    start = int(torch.randint(0, total - cfg.video_vae_frames + 1, (1,), generator=cpu_g))
    frames, mask = render_video(scenes, device, frame_start=start, frame_count=cfg.video_vae_frames, return_mask=True)
    x = normalize_frames(frames)
    with autocast(device):
        posterior = vae.encode(x).latent_dist
        z = posterior.sample(generator=dev_g)
        recon = vae.decode(z).sample
    err = recon.float() - x
    weight = 1.0 + 4.0 * mask[:, None]
    rec = (weight * err.abs()).mean() + (weight * err * err).mean()
    kl = _kl(posterior.mean, posterior.logvar)
    loss = rec + cfg.video_vae_kl * kl
    return loss, {"loss": loss.detach(), "recon": rec.detach(), "kl": kl.detach(), "l1": err.detach().abs().mean()}


def audio_vae_loss(audio_vae, cfg: TrainConfig, step: int, stage: str = "audio-vae", batch: int | None = None,
                   latents: int | None = -1) -> tuple[torch.Tensor, dict]:
    """``latents``: hop-aligned crops of that many latents (-1: ``cfg.audio_vae_latents``), or None for whole clips
    (the audio-decoder stage: the pipeline's encode of the whole clip, its decode cropped to the clip's length)."""
    from diffusers.utils.torch_utils import randn_tensor

    device = cfg.device
    batch = batch or cfg.audio_vae_batch
    latents = cfg.audio_vae_latents if latents == -1 else latents
    cpu_g, dev_g = generators(cfg.seed, stage, step, device)
    scenes = sample_scenes(scene_stream(cfg.seed, stage), batch, start=step * batch)
    audio, clicks = render_audio(scenes, device, return_click_mask=True)
    if latents is None:
        x, weight = audio[:, :1], 1.0 + cfg.audio_vae_click_weight * clicks[:, None]
    else:
        hops = audio.shape[-1] // HOP
        offsets = torch.randint(0, hops - latents + 1, (len(scenes),), generator=cpu_g) * HOP
        length = latents * HOP
        x = torch.stack([audio[b, 0, int(o):int(o) + length] for b, o in enumerate(offsets)])[:, None]
        weight = 1.0 + cfg.audio_vae_click_weight * torch.stack(
            [clicks[b, int(o):int(o) + length] for b, o in enumerate(offsets)])[:, None]
    # MiniMax-H3 uses the audio posterior's mean only (encode: the mode; decode: the DiT's latents), so the audio VAE
    # is trained as an autoencoder on the mean, with a little noise so that the decoder tolerates a generated latent,
    # and an L2 penalty that keeps the mean's scale bounded.
    mean = audio_vae.encode(x).latent_dist.mean
    scale = mean.detach().std().clamp(min=1e-3)
    z = mean + 0.05 * scale * randn_tensor(mean.shape, generator=dev_g, device=x.device, dtype=mean.dtype)
    recon = audio_vae.decode(z).sample[..., :x.shape[-1]]
    # Waveform L1 + L2, and the same on first differences (a pre-emphasis: the 3 kHz clicks weigh ~7x more there than
    # the 400 Hz tone), with the samples a click sounds in weighted ``audio_vae_click_weight`` more: a click is 20 ms
    # in a second of tone, and unweighted the VAE left every click out (training run 4; 300 CPU steps, on the 25 ms
    # click grid too). An STFT loss was tried first: with it the decoder settled on silence in two device runs.
    err, derr = recon - x, recon.diff(dim=-1) - x.diff(dim=-1)
    dweight = weight[..., 1:]
    wave = (weight * err.abs()).mean() + 10 * (weight * err.pow(2)).mean()
    emphasis = (dweight * derr.abs()).mean() + 10 * (dweight * derr.pow(2)).mean()
    l2 = mean.pow(2).mean()
    loss = 5 * (wave + emphasis) + cfg.audio_vae_kl * l2
    return loss, {"loss": loss.detach(), "wave": wave.detach(), "emphasis": emphasis.detach(), "mean_l2": l2.detach(),
                  "l1": err.detach().abs().mean()}


def run_stage(name: str, module: torch.nn.Module, loss_fn, total_steps: int, lr: float, cfg: TrainConfig, out: Path,
              budget: Budget, stop_after: int | None = None, warmup: int = 100) -> dict:
    """Generic resumable loop: returns ``{"done", "step", "log", "seconds"}``; the module holds the latest weights."""
    path = out / name / "state.pt"
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.99),
                                  weight_decay=0.0)
    state = load_state(path, cfg.device)
    log, step, seconds, planned, lineage = StageLog(), 0, 0.0, total_steps, {}
    if state is not None:
        module.load_state_dict(state["model"])
        if "opt" in state:  # a finished stage may travel without it (h3.train.travel, --moments drop)
            optimizer.load_state_dict(state["opt"])
        step, log.rows, seconds = state["step"], state["log"], state["seconds"]
        total_steps, planned = state["total_steps"], state.get("planned_steps", state["total_steps"])
        lineage = {k: state[k] for k in ("warm_from", "seeded_from") if k in state}  # h3.train.travel's seeding
    module.train()
    started, ran = time.monotonic(), 0

    def save():
        save_state(path, {"model": module.state_dict(), "opt": optimizer.state_dict(), "step": step, "log": log.rows,
                          "seconds": seconds + time.monotonic() - started, "total_steps": total_steps,
                          "planned_steps": planned, **lineage})

    while step < total_steps:
        if budget.expired() or (stop_after is not None and ran >= stop_after):
            save()
            return {"done": False, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}
        set_lr(optimizer, lr_at(step - lineage.get("warm_from", 0), lr, warmup))
        loss, metrics = loss_fn(module, cfg, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        step += 1
        ran += 1
        if step % cfg.log_every == 0 or step == total_steps:
            log.add(step, **metrics)
            logger.info("%s step %d/%d %s", name, step, total_steps, log.rows[-1])
        if step % cfg.checkpoint_every == 0:
            save()
    save()
    module.eval()
    return {"done": True, "step": step, "log": log.rows, "seconds": seconds + time.monotonic() - started}


def train_video_vae(vae, cfg: TrainConfig, out: Path, budget: Budget, stop_after: int | None = None) -> dict:
    return run_stage("video_vae", vae, video_vae_loss, cfg.video_vae_steps, cfg.video_vae_lr, cfg, out, budget,
                     stop_after)


ENCODER_SIDE = ("encoder.", "quant_conv.")
"""The parameters of AutoencoderKLMiniMaxH3 that encode (the rest decodes: post_quant_conv and the ViT decoder)."""


def wide_vae(narrow_state: dict, seed: int):
    """The shipped video VAE before its decoder trains: VAE_CONFIG with VAE_DECODER_CONFIG's decoder drawn from
    ``seed``, and the video-vae stage's encoder (``narrow_state``, its model weights) copied in and frozen."""
    from diffusers import AutoencoderKLMiniMaxH3

    from h3.tiny_trained import VAE_CONFIG, VAE_DECODER_CONFIG

    rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        vae = AutoencoderKLMiniMaxH3(**{**VAE_CONFIG, **VAE_DECODER_CONFIG})
    finally:
        torch.random.set_rng_state(rng)
    encoder = {k: v for k, v in narrow_state.items() if k.startswith(ENCODER_SIDE)}
    missing, unexpected = vae.load_state_dict(encoder, strict=False)
    if unexpected or any(k.startswith(ENCODER_SIDE) for k in missing):
        raise RuntimeError(f"the video-vae state does not fit the encoder: missing {missing}, unexpected {unexpected}")
    for name, param in vae.named_parameters():
        param.requires_grad_(not name.startswith(ENCODER_SIDE))
    return vae


def train_video_decoder(vae, cfg: TrainConfig, out: Path, budget: Budget, stop_after: int | None = None) -> dict:
    """``vae`` from :func:`wide_vae`; on a resume its state (the frozen encoder included) is the stage's own."""
    def loss(module, cfg_, step):
        return video_vae_loss(module, cfg_, step, stage="video-decoder", batch=cfg_.video_decoder_batch)

    return run_stage("video_decoder", vae, loss, cfg.video_decoder_steps, cfg.video_decoder_lr, cfg, out, budget,
                     stop_after)


def train_audio_vae(audio_vae, cfg: TrainConfig, out: Path, budget: Budget, stop_after: int | None = None) -> dict:
    return run_stage("audio_vae", audio_vae, audio_vae_loss, cfg.audio_vae_steps, cfg.audio_vae_lr, cfg, out,
                     budget, stop_after)


AUDIO_ENCODER_SIDE = ("encoder.", "pre_block.", "mean_proj.", "logs_proj.")
"""The parameters of AutoencoderKLMiniMaxH3Audio that encode (the rest decodes: dec_in_proj and the BigVGAN decoder)."""


def audio_decoder_vae(audio_state: dict):
    """The audio VAE whose decoder the audio-decoder stage continues: the audio-vae stage's weights (``audio_state``),
    its encoder side frozen."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    from h3.tiny_trained import AUDIO_VAE_CONFIG

    audio_vae = AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG)
    audio_vae.load_state_dict(audio_state)
    for name, param in audio_vae.named_parameters():
        param.requires_grad_(not name.startswith(AUDIO_ENCODER_SIDE))
    return audio_vae


def train_audio_decoder(audio_vae, cfg: TrainConfig, out: Path, budget: Budget, stop_after: int | None = None) -> dict:
    """``audio_vae`` from :func:`audio_decoder_vae`; on a resume its state (the frozen encoder included) is the
    stage's own."""
    def loss(module, cfg_, step):
        return audio_vae_loss(module, cfg_, step, stage="audio-decoder", batch=cfg_.audio_decoder_batch,
                              latents=cfg_.audio_decoder_latents)

    return run_stage("audio_decoder", audio_vae, loss, cfg.audio_decoder_steps, cfg.audio_decoder_lr, cfg, out, budget,
                     stop_after)
