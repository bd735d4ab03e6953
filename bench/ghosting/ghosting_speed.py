"""Time the ghosting gate on a production-size pair: 124 frames of 768x1344 (5 s at 24 fps), baseline vs candidate.

The clips are synthetic (a textured background with a moving textured patch; the candidate carries a planted lag-1
ghost of strength 0.10) and are written with h3.media.encode_mp4 like real clips. Timed: the whole
``GhostingGate.evaluate`` (both decodes, scoring, strip PNG) and, separately, ``ghost_scores`` alone on frames
already decoded; wall and process CPU time both, since the machine is shared (the load average is recorded).
Budget (issue 19): all per-pair gates of such a pair <= 30 s on the 2-core CPU and <= 1 s on a GPU with frames
decoded once. Run:

    PYTHONPATH=. python bench/ghosting/ghosting_speed.py [--frame-stride 1]            # CPU (numpy)
    PYTHONPATH=. python bench/ghosting/ghosting_speed.py --device cuda                 # GPU (torch), ghosting_speed_cuda.*
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import ndimage

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gates.base import ClipSide, PairContext, PairRef, get_gate  # noqa: E402
from gates.ghosting import GhostingConfig, ghost_scores  # noqa: E402
from h3.atomic import atomic_write_json, atomic_write_text  # noqa: E402
from h3.media import decode_video, encode_mp4  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def synthetic_pair(num_frames: int, height: int, width: int, alpha: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    small = ndimage.gaussian_filter(rng.standard_normal((height // 4, width // 4, 3)), sigma=(1.5, 1.5, 0))
    background = np.kron(small / small.std(), np.ones((4, 4, 1)))[:height, :width] * 40 + 128
    patch_small = rng.standard_normal((height // 12, height // 12, 3))
    patch = np.kron(patch_small, np.ones((4, 4, 1))) * 50 + 128
    ph, pw = patch.shape[:2]
    frames = []
    for t in range(num_frames + 1):
        frame = background.copy()
        y, x = height // 4 + t, width // 10 + 6 * t
        frame[y : y + ph, x : x + pw] = patch
        frames.append(frame)
    frames = np.stack(frames)
    base = frames[1:]
    cand = (1 - alpha) * frames[1:] + alpha * frames[:-1]
    to8 = lambda a: np.clip(np.rint(a), 0, 255).astype(np.uint8)  # noqa: E731
    return to8(base), to8(cand)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--frame-stride", type=int, default=GhostingConfig().frame_stride)
    parser.add_argument("--device", default="cpu", help="cpu (numpy) or a CUDA device (torch)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the result files go (default: bench/ghosting/results)")
    args = parser.parse_args(argv)
    base, cand = synthetic_pair(args.frames, args.height, args.width, alpha=0.10)
    with tempfile.TemporaryDirectory(prefix="ghostspeed-") as tmp:
        run = Path(tmp) / "run"
        paths = {}
        for recipe, frames in (("baseline", base), ("candidate", cand)):
            paths[recipe] = run / "clips" / recipe / "p0-s0.mp4"
            encode_mp4(paths[recipe], frames, None, fps=24)
        artifact_dir = run / "gates" / "ghosting" / "candidate"
        artifact_dir.mkdir(parents=True)
        ctx = PairContext(
            run_dir=run, pair=PairRef(baseline="baseline", candidate="candidate", prompt_id="p0", seed=0),
            baseline=ClipSide("baseline", paths["baseline"], {}), candidate=ClipSide("candidate", paths["candidate"], {}),
            artifact_dir=artifact_dir, options={"frame_stride": args.frame_stride}, device=args.device,
        )
        load_before = os.getloadavg()
        w0, c0 = time.perf_counter(), time.process_time()
        result = get_gate("ghosting").evaluate(ctx)
        gate_wall, gate_cpu = time.perf_counter() - w0, time.process_time() - c0
        w0, c0 = time.perf_counter(), time.process_time()
        dec_base, _ = decode_video(paths["baseline"])
        dec_cand, _ = decode_video(paths["candidate"])
        decode_wall, decode_cpu = time.perf_counter() - w0, time.process_time() - c0
        config = GhostingConfig(frame_stride=args.frame_stride)
        w0, c0 = time.perf_counter(), time.process_time()
        fs = ghost_scores(dec_base, dec_cand, config, device=args.device)
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            w0, c0 = time.perf_counter(), time.process_time()  # the first call paid CUDA's start-up: time a warm one
            fs = ghost_scores(dec_base, dec_cand, config, device=args.device)
            torch.cuda.synchronize()
        score_wall, score_cpu = time.perf_counter() - w0, time.process_time() - c0
        load_after = os.getloadavg()
    import av
    import scipy

    report = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
                     "av": av.__version__},
        "command": "PYTHONPATH=. python bench/ghosting/ghosting_speed.py " + " ".join(argv or sys.argv[1:]),
        "clip": {"frames": args.frames, "height": args.height, "width": args.width, "fps": 24},
        "frame_stride": args.frame_stride,
        "load_average_before_after": [load_before, load_after],
        "gate_evaluate": {"wall_s": gate_wall, "cpu_s": gate_cpu},
        "decode_both": {"wall_s": decode_wall, "cpu_s": decode_cpu},
        "ghost_scores": {"wall_s": score_wall, "cpu_s": score_cpu},
        "device": args.device,
        "budget_s": 1.0 if args.device.startswith("cuda") else 30.0,
        "result": {"flagged": result.flagged, "ghost_strength": result.metrics["ghost_strength"].value,
                   "ghost_score_max": result.metrics["ghost_score_max"].value,
                   "ghost_frames": result.metrics["ghost_frames"].value,
                   "median_score": float(np.median(fs.score[fs.scored]))},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.device == "cpu" else "_cuda"
    atomic_write_json(args.out / f"ghosting_speed{suffix}.json", report)
    md = [
        "# Ghosting gate speed", "",
        f"- date: {report['date']}", f"- machine: {report['machine']}",
        f"- versions: {report['versions']}", f"- command: `{report['command']}`",
        f"- clip: {args.frames} frames of {args.height}x{args.width}, frame_stride {args.frame_stride}, device {args.device}",
        f"- load average (1/5/15 min) before / after: {load_before} / {load_after} (shared machine: CPU time is "
        "the figure that transfers; wall time includes waiting for other processes)", "",
        "| part | wall s | CPU s |", "|---|---:|---:|",
        f"| gate evaluate (decode + score + strip) | {gate_wall:.2f} | {gate_cpu:.2f} |",
        f"| decode both clips | {decode_wall:.2f} | {decode_cpu:.2f} |",
        f"| ghost_scores | {score_wall:.2f} | {score_cpu:.2f} |", "",
        f"Budget (all per-pair gates): {report['budget_s']:g} s. Planted ghost (alpha 0.10, lag 1): flagged={result.flagged}, "
        f"pooled strength {report['result']['ghost_strength']:.4f}, median frame score "
        f"{report['result']['median_score']:.4f}, {report['result']['ghost_frames']:.0f} ghost frames listed.", "",
    ]
    atomic_write_text(args.out / f"ghosting_speed{suffix}.md", "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
