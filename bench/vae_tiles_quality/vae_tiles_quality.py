"""Quality cost of a per-resolution VAE tile on the tiny preset on the CPU: the same request decoded with the stock
256x256 tiles and with the tile a recipe ships for that resolution, compared frame by frame with the fidelity gate's
own PSNR and SSIM (gates.fidelity; codec included, as the gate sees clips).

Run: ``PYTHONPATH=. python bench/vae_tiles_quality/vae_tiles_quality.py [--size 544x960] [--tile 304x320]``; writes
bench/vae_tiles_quality/results/vae_tiles_quality_cpu.{json,md}. The speed side is on the H200 (bench/full_size_speed/results/h200_speed_stock.json:
at 544x960 the decode takes 3.73 s with 256x256 tiles, 2.83 s with 304x320).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.results import write  # noqa: E402

PROMPT, SEED, FRAMES = "A person is squat", 3, 124  # 5 s at 24 fps, the shortest clip H3 generates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="544x960")
    parser.add_argument("--tile", default="304x320")
    args = parser.parse_args()
    from gates.fidelity import psnr_per_frame, ssim_per_frame
    from h3.media import decode_video
    from h3.recipe import recipe_from_dict
    from h3.runtime import GenerateRequest, H3Runtime

    height, width = (int(v) for v in args.size.split("x"))
    tile = [int(v) for v in args.tile.split("x")]
    base = {"steps": 2, "dtype": "float32", "attention": {"backend": "native"},
            "vae": {"tiling": True, "tile_height": 256, "tile_width": 256, "tile_overlap": 64}}
    frames, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tiles in (("stock-256x256", {}), (f"tile-{args.tile}", {args.size: tile})):
            recipe = recipe_from_dict({**base, "name": name, "description": "bench: VAE tile",
                                       "vae": {**base["vae"], "tiles": tiles}})
            runtime = H3Runtime.load("tiny-random", recipe, "cpu")
            t0 = time.perf_counter()
            runtime.generate(GenerateRequest(prompt=PROMPT, seed=SEED, num_frames=FRAMES, height=height, width=width),
                             Path(tmp) / f"{name}.mp4")
            seconds[name] = time.perf_counter() - t0
            frames[name] = decode_video(Path(tmp) / f"{name}.mp4")[0]
    a, b = frames.values()
    psnr = psnr_per_frame(a, b)
    psnr = np.asarray(psnr[0] if isinstance(psnr, tuple) else psnr, dtype=np.float64)
    ssim = np.asarray(ssim_per_frame(a, b), dtype=np.float64)
    identical = int(sum(bool((x == y).all()) for x, y in zip(a, b)))
    payload = {"size": args.size, "tile": tile, "prompt": PROMPT, "seed": SEED, "frames": len(a),
               "identical_frames": identical, "psnr_db": {"mean": float(psnr.mean()), "min": float(psnr.min())},
               "ssim": {"mean": float(ssim.mean()), "min": float(ssim.min())}, "generate_s": seconds,
               "torch_threads": torch.get_num_threads()}
    md = ("| size | tile vs stock 256x256 | identical frames | PSNR mean / worst (dB, cap 60) | SSIM mean / worst |\n"
          "|---|---|---|---|---|\n"
          f"| {args.size} | {args.tile} | {identical} of {len(a)} | {psnr.mean():.2f} / {psnr.min():.2f} | "
          f"{ssim.mean():.5f} / {ssim.min():.5f} |\n\nTiny preset (2 steps, float32, seed {SEED}), CPU; the fidelity "
          "gate's PSNR and SSIM on the decoded MP4 frames of both clips.\n")
    write("vae_tiles_quality_cpu", payload, md)
    print(md)


if __name__ == "__main__":
    main()
