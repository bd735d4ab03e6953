"""Stage 3: the latent pool the DiT trains on.

``pool_size`` world clips (scene stream of the run seed) are rendered and encoded once with the trained VAEs: the
video latents (posterior mode) and the audio latents (posterior mode, the two stereo channels as two batch items, as
the pipeline decodes them). Their per-channel mean and std become the VAEs' ``latents_mean`` / ``latents_std`` (the
pipeline normalizes with them), and the pool is stored normalized.

Every clip's caption is encoded by the frozen text encoder as the t2va presentation; the first
``pool_keyframe_share`` of the clips also get the fl2va presentations (first keyframe, last keyframe, both) with their
keyframe conditioning latents, and the ref2va presentations of a reference image of their first shape (the plain
caption, and the caption that names that shape only as "the shape in picture 1"), with the reference's latents.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from h3.train import conditioning
from h3.train.common import TrainConfig, autocast
from h3.train.vaes import normalize_frames, scene_stream
from h3.world.render import reference_images, render_audio, render_video
from h3.world.scene import sample_scenes

logger = logging.getLogger(__name__)

TASKS = ("t2va", "fl2va-first", "fl2va-last", "fl2va-both", "ref2va", "ref2va-refer")


@dataclass
class Pool:
    video: torch.Tensor  # (N, 24, 37, 8, 8) normalized
    audio: torch.Tensor  # (N, 2, 32, 207) normalized
    keyframe_first: torch.Tensor  # (K, 24, 1, 8, 8) normalized conditioning latents
    keyframe_last: torch.Tensor
    reference: torch.Tensor
    texts: list  # per presentation: (T, 32) float tensor
    tags: list  # per presentation: tuple of modality tags
    clips: list  # per presentation: clip index
    tasks: list  # per presentation: task name
    captions: list = field(default_factory=list)  # per clip
    video_stats: tuple = ()
    audio_stats: tuple = ()
    event_times: torch.Tensor | None = None
    """(N, E) per clip the seconds of its events (a shape appearing, a bounce: h3.world.scene.Scene.events),
    NaN-padded; None in a pool built before they were recorded (``dit_event_weight`` needs them)."""
    duration: float = 0.0
    """The clips' seconds."""

    def groups(self) -> dict[tuple[str, int], list[int]]:
        out: dict[tuple[str, int], list[int]] = {}
        for i, (task, text) in enumerate(zip(self.tasks, self.texts)):
            out.setdefault((task, int(text.shape[0])), []).append(i)
        return out

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.__dict__, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, device) -> "Pool":
        return cls(**torch.load(path, map_location=device, weights_only=False))


def latent_stats(pool: "Pool") -> dict:
    """The per-channel statistics ``pool`` is normalized with, as a DiT state keeps them."""
    return {"video": [list(pool.video_stats[0]), list(pool.video_stats[1])],
            "audio": [list(pool.audio_stats[0]), list(pool.audio_stats[1])]}


def latent_stats_of(dit_state: dict | None) -> dict | None:
    """The latent statistics a DiT state was trained with (None: a fresh DiT, or a state from before they were kept)."""
    return None if dit_state is None else dit_state.get("latent_stats")


def _channel_stats(x: torch.Tensor, dim: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std; a channel the KL term switched off (std far below the others') is scaled as if it had
    a twentieth of the median std, not blown up to unit variance."""
    moved = x.transpose(0, dim).reshape(x.shape[dim], -1).double()
    std = moved.std(1)
    return moved.mean(1).tolist(), std.clamp(min=0.05 * float(std.median())).clamp(min=1e-6).tolist()


@torch.no_grad()
def _encode_chunk(vae, audio_vae, batch, device, n_keyed: int) -> dict:
    frames = render_video(batch, device)
    with autocast(device):
        video = vae.encode(normalize_frames(frames)).latent_dist.mode().float().to(torch.bfloat16)
    audio = render_audio(batch, device)
    mono = audio.reshape(-1, 1, audio.shape[-1])
    lat = audio_vae.encode(mono).latent_dist.mode().float()
    out = {"video": video, "audio": lat.reshape(len(batch), 2, *lat.shape[1:]).to(torch.bfloat16)}
    if n_keyed:
        out["first"] = frames[:n_keyed, 0].permute(0, 3, 1, 2).contiguous()
        out["last"] = frames[:n_keyed, -1].permute(0, 3, 1, 2).contiguous()
        out["refs"] = reference_images(batch[:n_keyed], device).permute(0, 3, 1, 2).contiguous()
    return out


@torch.no_grad()
def _presentations(scenes: list, captions: list[str], keyed: int, images: tuple[list, list, list], tokenizer,
                   processor) -> tuple[list, list, list, list]:
    """(items, tags, clips, tasks) of the pool's presentations: every clip's t2va, then the first ``keyed`` clips'
    fl2va (first, last, both keyframes) and ref2va (two captions) ones. Token ids depend on the caption and the image
    grid only, so the vision features are computed for all images (``images``: first and last keyframes, references)
    at once and sliced per presentation."""
    first, last, refs = images
    items, tags, clips, tasks = [], [], [], []
    for i, text in enumerate(captions):
        ids, tg = conditioning.t2va_tokens(tokenizer, text)
        items.append((ids, None)); tags.append(tuple(tg)); clips.append(i); tasks.append("t2va")
    if keyed:
        def sliced(images):
            feats = conditioning.image_features(processor, images)
            rows = [int(g.prod()) for g in feats["image_grid_thw"]]
            pix = torch.split(feats["pixel_values"], rows)
            return [{"pixel_values": p, "image_grid_thw": g[None]} for p, g in zip(pix, feats["image_grid_thw"])]

        f_feats, l_feats, r_feats = sliced(first), sliced(last), sliced(refs)
        count = lambda f: conditioning.image_token_counts(processor, f)[0]  # noqa: E731
        for i in range(keyed):
            for task, feats in (("fl2va-first", [f_feats[i]]), ("fl2va-last", [l_feats[i]]),
                                ("fl2va-both", [f_feats[i], l_feats[i]])):
                ids, tg = conditioning.fl2va_tokens(tokenizer, captions[i], [count(f) for f in feats])
                vision = {"pixel_values": torch.cat([f["pixel_values"] for f in feats]),
                          "image_grid_thw": torch.cat([f["image_grid_thw"] for f in feats])}
                items.append((ids, vision)); tags.append(tuple(tg)); clips.append(i); tasks.append(task)
            for task, text in (("ref2va", captions[i]), ("ref2va-refer", scenes[i].caption(refer_first=True))):
                ids, tg = conditioning.ref2va_tokens(tokenizer, text, count(r_feats[i]))
                items.append((ids, r_feats[i])); tags.append(tuple(tg)); clips.append(i); tasks.append(task)
    return items, tags, clips, tasks


def build_pool(components: dict, cfg: TrainConfig, chunk: int = 64, devices: list | None = None,
               stats: dict | None = None) -> Pool:
    """``devices``: the chunks of clips are rendered and encoded on these in turn (a thread and a copy of the VAEs
    per device); everything lands on ``cfg.device``. The result does not depend on how many devices encode.

    ``stats`` (``{"video": [mean, std], "audio": [mean, std]}``, per channel): normalize with these instead of the
    pool's own statistics — the ones a DiT that continues was trained with (:func:`latent_stats_of`). A pool drawn
    otherwise (another ``pool_two_shape_share``) has other statistics: session 9's first call moved the audio latents'
    means by up to 1.2 (their typical size 0.9) under a DiT trained on the old ones."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    device = cfg.device
    vae, audio_vae = components["vae"].eval(), components["audio_vae"].eval()
    text_encoder, tokenizer, processor = components["text_encoder"], components["tokenizer"], components["processor"]
    scenes = sample_scenes(scene_stream(cfg.seed, "pool"), cfg.pool_size, two_shape_share=cfg.pool_two_shape_share)
    keyed = int(round(cfg.pool_size * cfg.pool_keyframe_share))
    devices = list(devices or [device])
    def replica(module, d):  # not deepcopy: weight-normed convolutions refuse it
        copy = type(module).from_config(module.config)
        copy.load_state_dict(module.state_dict())
        return copy.to(d).eval()

    models = [(vae, audio_vae) if i == 0 and torch.device(d) == torch.device(device) else
              (replica(vae, d), replica(audio_vae, d)) for i, d in enumerate(devices)]
    starts = list(range(0, len(scenes), chunk))

    def worker(k: int) -> dict:
        done = {}
        for n, start in enumerate(starts):
            if n % len(devices) != k:
                continue
            batch = scenes[start:start + chunk]
            done[start] = {key: t.to(device) for key, t in _encode_chunk(
                *models[k], batch, devices[k], max(0, min(len(batch), keyed - start))).items()}
            if k == 0:
                logger.info("pool: encoded %d/%d clips", min(start + chunk, len(scenes)), len(scenes))
        return done

    if len(devices) == 1:
        parts = worker(0)
    else:
        with ThreadPoolExecutor(len(devices)) as ex:
            parts = {}
            for d in ex.map(worker, range(len(devices))):
                parts.update(d)
    videos = [parts[s]["video"] for s in starts]
    audios = [parts[s]["audio"] for s in starts]
    first = [f for s in starts if "first" in parts[s] for f in parts[s]["first"]]
    last = [f for s in starts if "last" in parts[s] for f in parts[s]["last"]]
    refs = [f for s in starts if "refs" in parts[s] for f in parts[s]["refs"]]
    video, audio = torch.cat(videos), torch.cat(audios)

    if stats is None:
        vmean, vstd = _channel_stats(video.float(), 1)
        amean, astd = _channel_stats(audio.float(), 2)  # (N, stereo, 32, L): channel dim 2
    else:
        (vmean, vstd), (amean, astd) = ([list(map(float, v)) for v in stats[k]] for k in ("video", "audio"))
    vae.register_to_config(latents_mean=vmean, latents_std=vstd)
    audio_vae.register_to_config(latents_mean=amean, latents_std=astd)
    vm, vs = torch.tensor(vmean, device=device).view(1, -1, 1, 1, 1), torch.tensor(vstd, device=device).view(1, -1, 1, 1, 1)
    am, as_ = torch.tensor(amean, device=device).view(1, 1, -1, 1), torch.tensor(astd, device=device).view(1, 1, -1, 1)
    video = ((video.float() - vm) / vs).to(torch.bfloat16)
    audio = ((audio.float() - am) / as_).to(torch.bfloat16)

    def cond(frames_list):
        if not frames_list:
            return torch.zeros(0, 24, 1, 8, 8, device=device)
        return torch.cat([conditioning.keyframe_latents(vae, torch.stack(frames_list[i:i + 256]))
                          for i in range(0, len(frames_list), 256)])

    keyframe_first, keyframe_last, reference = cond(first), cond(last), cond(refs)
    logger.info("pool: conditioning latents of %d keyframes and references in %.1f s", len(first) + len(last) + len(refs),
                time.monotonic() - started)

    captions = [s.caption() for s in scenes]
    items, tags, clips, tasks = _presentations(scenes, captions, keyed, (first, last, refs), tokenizer, processor)
    logger.info("pool: %d presentations tokenized (image features included) at %.1f s", len(items),
                time.monotonic() - started)
    texts = [t.to(torch.bfloat16) for t in conditioning.encode(text_encoder, processor, items)]
    logger.info("pool: %d clips, %d presentations, text encoded at %.1f s", len(scenes), len(texts),
                time.monotonic() - started)
    return Pool(video=video, audio=audio, keyframe_first=keyframe_first, keyframe_last=keyframe_last,
                reference=reference, texts=texts, tags=tags, clips=clips, tasks=tasks, captions=captions,
                video_stats=(vmean, vstd), audio_stats=(amean, astd), event_times=event_table(scenes, device),
                duration=float(scenes[0].duration))


def event_table(scenes: list, device) -> torch.Tensor:
    """(N, E) the seconds of each scene's events, NaN-padded to the most any scene has (at least one column)."""
    times = [[float(e["t"]) for e in scene.events()] for scene in scenes]
    table = torch.full((len(scenes), max([1, *map(len, times)])), float("nan"))
    for i, row in enumerate(times):
        table[i, :len(row)] = torch.tensor(row, dtype=torch.float)
    return table.to(device)
