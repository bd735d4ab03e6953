"""Whether the latents' own second temporal difference marks the world's events (issue 55, session 34): the probe
behind TrainConfig.dit_event_weight's choice of the ground truth (bench/tiny_training/event_marks.py is its CLI).

For one-shape, one-bounce, no-pan, no-appearance scenes of the world (``sample_scenes(seed, n)``), encoded by the
shipped tiny video VAE (posterior mode): per clip and latent frame f, ``e_f`` = mean over channels and space of
``|x[f+1] - 2 x[f] + x[f-1]|`` (edge frames their neighbour's), and the bounce's latent frame
``round(t / duration * (F - 1))``. Reported: ``e`` there against the clip's mean, and how often ``e``'s largest frame
is within one latent frame of the bounce (by chance: about 3 of 37 frames, 8 %)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch


def second_difference(latents: torch.Tensor) -> np.ndarray:
    """(B, C, F, H, W) -> (B, F) mean |second temporal difference|, edge frames their neighbour's."""
    x = latents.float()
    second = (x[:, :, 2:] - 2 * x[:, :, 1:-1] + x[:, :, :-2]).abs().mean(dim=(1, 3, 4))
    return torch.cat([second[:, :1], second, second[:, -1:]], dim=1).numpy()


def probe(seed: int, count: int, vae_dir: Path) -> dict:
    from diffusers import AutoencoderKLMiniMaxH3

    from h3.train.vaes import normalize_frames
    from h3.world.render import render_video
    from h3.world.scene import sample_scenes

    scenes = [s for s in sample_scenes(seed, 40 * count, two_shape_share=0.0)
              if len(s.shapes) == 1 and s.shapes[0].bounces == 1 and not s.shapes[0].appears and s.pan is None][:count]
    vae = AutoencoderKLMiniMaxH3.from_pretrained(str(vae_dir)).eval()
    with torch.no_grad():
        latents = vae.encode(normalize_frames(render_video(scenes))).latent_dist.mode()
    e = second_difference(latents)
    frames = e.shape[1]
    ratios, distances = [], []
    for row, scene in zip(e, scenes):
        bounce = int(round(scene.bounce_times(scene.shapes[0])[0] / scene.duration * (frames - 1)))
        ratios.append(float(row[bounce] / row.mean()))
        distances.append(abs(int(np.argmax(row)) - bounce))
    return {"seed": seed, "clips": len(scenes), "latent_frames": frames,
            "ratio_at_bounce": {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios)},
            "argmax_within_1": sum(d <= 1 for d in distances), "distances": distances}


def event_marks_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--vae", type=Path, default=Path("h3/assets/tiny/vae"))
    parser.add_argument("--out", type=Path, required=True, help="the record (.md)")
    parser.add_argument("--command", required=True)
    args = parser.parse_args(argv)
    result = probe(args.seed, args.count, args.vae)
    r = result["ratio_at_bounce"]
    text = (f"# Do the latents' second differences mark the bounce? (issue 55)\n\n- command: `{args.command}`\n"
            f"- {result['clips']} one-shape one-bounce clips (world seed {args.seed}), shipped tiny video VAE, "
            f"{result['latent_frames']} latent frames\n\n| measure | value |\n|---|---|\n"
            f"| e at the bounce / the clip's mean e (median, min, max) | {r['median']:.2f}, {r['min']:.2f}, "
            f"{r['max']:.2f} |\n| clips whose largest e is within 1 latent frame of the bounce | "
            f"{result['argmax_within_1']} of {result['clips']} (chance ~8 %) |\n\n```json\n"
            f"{json.dumps(result)}\n```\n")
    from h3.atomic import atomic_write_text

    atomic_write_text(args.out, text)
    print(text)
    return 0
