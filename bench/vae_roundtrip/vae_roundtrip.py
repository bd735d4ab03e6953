"""The VAEs' share of the content check: the world's own clips through a checkpoint's video and audio VAEs, read by the
model-independent detector (h3.world.detect). What the generated clips can score at best; a training run whose VAEs
lose colour, shape or clicks here cannot pass the content check whatever its DiT learns.

    python bench/vae_roundtrip/vae_roundtrip.py CHECKPOINT_DIR [--prompts world-heldout] [--limit 8] [--name vae_roundtrip]

Per clip: render the ground truth (h3.world.render), encode -> posterior mode -> decode with the checkpoint's
``vae`` (ImageNet-normalized frames, as training) and ``audio_vae`` (mono, as the pipeline), score the rendered clip
and the round trip with the same detector, and the round trip's PSNR against the rendered frames. The rendered clip
must score right on everything (the detector's control). Writes results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

METRICS = ("colour", "shape", "direction", "pitch", "bounces", "sync")


def roundtrip(checkpoint: Path, lines: list[dict]) -> list[dict]:
    import numpy as np
    import torch
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    from h3.train.vaes import IMAGENET_MEAN, IMAGENET_STD, normalize_frames
    from h3.world.detect import describe_clip, parse_caption, score_clip
    from h3.world.render import render_audio, render_video
    from h3.world.scene import SAMPLE_RATE, scene_from_ground_truth

    for part in ("vae", "audio_vae"):
        if not (checkpoint / part / "config.json").is_file():
            raise SystemExit(f"{checkpoint / part / 'config.json'}: not a checkpoint in the Hugging Face layout")
    vae = AutoencoderKLMiniMaxH3.from_pretrained(checkpoint / "vae").eval()
    audio_vae = AutoencoderKLMiniMaxH3Audio.from_pretrained(checkpoint / "audio_vae").eval()
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1)
    rows = []
    for line in lines:
        gt = line["ground_truth"]
        scene = scene_from_ground_truth(gt)
        frames = render_video([scene])
        audio = render_audio([scene])[0]
        with torch.no_grad():
            rec = vae.decode(vae.encode(normalize_frames(frames)).latent_dist.mode()).sample
            rec_audio = audio_vae.decode(audio_vae.encode(audio[:, None]).latent_dist.mode()).sample[:, 0]
        rec = ((rec * std + mean).clamp(0, 1) * 255).round().to(torch.uint8)[0].permute(1, 2, 3, 0).numpy()
        truth = frames[0].numpy()
        expected = parse_caption(gt["caption"])
        row = {"prompt_id": line.get("id"), "caption": gt["caption"]}
        for name, (video, sound) in {"rendered": (truth, audio.numpy()),
                                     "roundtrip": (rec[:truth.shape[0]], rec_audio.numpy())}.items():
            score = score_clip(describe_clip(video, sound, SAMPLE_RATE), expected)
            row[name] = {m: getattr(score, m) for m in METRICS}
            row[name]["details"] = score.details
        mse = float(((rec[:truth.shape[0]].astype(np.float64) - truth) ** 2).mean())
        row["psnr_db"] = 10 * np.log10(255.0 ** 2 / max(mse, 1e-12))
        rows.append(row)
    return rows


def summary(rows: list[dict], which: str) -> dict:
    out = {}
    for metric in METRICS:
        values = [r[which][metric] for r in rows if r[which][metric] is not None]
        out[metric] = {"right": int(sum(values)), "n": len(values)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--prompts", default="world-heldout")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--name", default="vae_roundtrip")
    args = parser.parse_args()
    import torch

    from bench.lib import results as _results

    suite = Path(__file__).resolve().parents[2] / "prompts" / f"{args.prompts}.jsonl"
    if not suite.is_file():
        raise SystemExit(f"{suite}: no such prompt suite")
    lines = [json.loads(text) for text in suite.read_text().splitlines() if text.strip()][:args.limit]
    if not lines or any("ground_truth" not in line for line in lines):
        raise SystemExit(f"{suite}: a world suite with ground truth is needed")
    torch.set_num_threads(2)
    started = time.perf_counter()
    rows = roundtrip(args.checkpoint, lines)
    payload = {"checkpoint": str(args.checkpoint), "prompts": args.prompts, "clips": len(rows),
               "seconds": round(time.perf_counter() - started, 1), "rendered": summary(rows, "rendered"),
               "roundtrip": summary(rows, "roundtrip"), "psnr_db": [round(float(r["psnr_db"]), 2) for r in rows],
               "rows": json.loads(json.dumps(rows, default=str))}
    psnr = sorted(payload["psnr_db"])
    table = ["| clips | " + " | ".join(METRICS) + " | PSNR dB (min / median) |", "|---" * (len(METRICS) + 2) + "|"]
    for which in ("rendered", "roundtrip"):
        cells = [f"{payload[which][m]['right']}/{payload[which][m]['n']}" for m in METRICS]
        tail = f"{psnr[0]:.1f} / {psnr[len(psnr) // 2]:.1f}" if which == "roundtrip" else "-"
        table.append(f"| {which} | " + " | ".join(cells) + f" | {tail} |")
    table.append(f"\nCheckpoint `{args.checkpoint}`, prompts `{args.prompts}` ({len(rows)} clips): the rendered ground "
                 "truth and its round trip through the checkpoint's video and audio VAEs, read by h3.world.detect.")
    json_path, md_path = _results.write(args.name, payload, "\n".join(table))
    print("\n".join(table))
    print(f"wrote {json_path} {md_path}")


if __name__ == "__main__":
    main()
