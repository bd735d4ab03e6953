"""FLOPs of MiniMax-H3's tiled video decode, counted on the meta device (no weights, no memory, no GPU).

    python bench/full_size_speed/vae_decode_flops.py --out bench/full_size_speed/results/vae_decode_flops.json [--shapes 5s-544x960,15s-768x1344]
        [--tiles 304x320,384x448]

``torch.utils.flop_counter.FlopCounterMode`` counts every convolution, matmul and attention call of diffusers'
``AutoencoderKLMiniMaxH3.decode`` (default config, its own tiling loop) at the shape's latent size. Counting a whole
15 s clip on the meta device takes many minutes of Python, so each shape is counted at 7, 12 and 17 latent frames
(22, 39 and 56 video frames; fewer than 7 give no decode chunk) and extended to the clip's latent frames with the
line through them; the record keeps the three counts and the deviation of the middle one from the line through the
outer two (0 when the decode's work is affine in frames: the decoder runs its latent frames in fixed-size chunks). The decode's achieved
TFLOP/s is then these FLOPs over the time bench/full_size_speed/h200_goals.py measures on the GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3.atomic import atomic_write_json  # noqa: E402
from bench.lib.speed import SHAPES, latent_geometry  # noqa: E402

POINTS = (7, 12, 17)


def decode_flops(vae, latent_frames: int, latent_hw: tuple[int, int], tile: tuple[int, int]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    vae.enable_tiling(tile_sample_min_height=tile[0], tile_sample_min_width=tile[1])
    z = torch.empty(1, vae.config.latent_channels, latent_frames, *latent_hw, device="meta", dtype=torch.bfloat16)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        vae.decode(z, return_dict=False)
    return int(counter.get_total_flops())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="5s-544x960,15s-768x1344")
    parser.add_argument("--tiles", default="304x320,384x448")
    parser.add_argument("--small", action="store_true", help="the tiny preset's VAE (a test of this script)")
    args = parser.parse_args()
    from diffusers import AutoencoderKLMiniMaxH3

    from h3 import tiny

    with torch.device("meta"):
        vae = AutoencoderKLMiniMaxH3(**(tiny.VAE_CONFIG if args.small else {})).to(torch.bfloat16).eval()
    result: dict = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                   time.gmtime()),
                    "torch": torch.__version__, "counter": "torch.utils.flop_counter.FlopCounterMode on meta",
                    "shapes": {}}
    for shape in args.shapes.split(","):
        num_frames, height, width = SHAPES[shape]
        geo = latent_geometry(num_frames, height, width)
        entry = result["shapes"].setdefault(shape, {"latent_frames": geo["latent_frames"], "tiles": {}})
        for spec in args.tiles.split(","):
            tile = tuple(int(v) for v in spec.split("x"))
            t0 = time.perf_counter()
            counts = [decode_flops(vae, f, geo["latent_hw"], tile) for f in POINTS]
            slope = (counts[2] - counts[0]) / (POINTS[2] - POINTS[0])
            line_mid = counts[0] + slope * (POINTS[1] - POINTS[0])
            entry["tiles"][spec] = {
                "counted_at_latent_frames": dict(zip(map(str, POINTS), counts)),
                "affine_deviation": abs(counts[1] - line_mid) / counts[1],
                "flops": int(round(counts[0] + slope * (geo["latent_frames"] - POINTS[0]))),
                "count_s": time.perf_counter() - t0}
            atomic_write_json(Path(args.out), result)
            print(shape, spec, entry["tiles"][spec], flush=True)


if __name__ == "__main__":
    main()
