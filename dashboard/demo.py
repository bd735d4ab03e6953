"""A review run of known content for the dashboard's tests and benchmark: synthetic clips
(h3eval.synth.make_synthetic_run) plus hand-written gate results, heatmaps and a verdict.

Nothing here scores anything: the gate files are written with chosen values so that a test can check that the
page shows exactly those values. The ``faster`` candidate carries a planted ghost (a faint displaced copy of the
moving square) so that the amplified difference and the heatmap have something real to show.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from gates.base import GateResult, Metric, PairRef
from h3.atomic import atomic_write_bytes, atomic_write_json
from h3.record import ClipRecord
from h3eval.store import RunStore, clip_stem
from h3eval.synth import make_synthetic_run, moving_square_frames, tone_pcm

logger = logging.getLogger(__name__)

BASELINE = "base"
GHOST_STRENGTH = 0.25
"""Opacity of the planted ghost in the ``faster`` candidate."""


def ghosted(frames: np.ndarray, shift: int = 6, strength: float = GHOST_STRENGTH) -> np.ndarray:
    """Frames with a faint copy of themselves shifted ``shift`` px right blended in (a second rendering)."""
    shifted = np.roll(frames.astype(np.float32), shift, axis=2)
    return np.clip((1 - strength) * frames + strength * shifted, 0, 255).astype(np.uint8)


def base_latency(prompt_id: str, seed: int) -> float:
    """Request-to-file seconds of the baseline clip: varies by prompt and seed so that CIs are not degenerate."""
    return 10.0 + 2.0 * (sum(map(ord, prompt_id)) % 5) + 0.5 * seed


CANDIDATE_FACTOR = {"fast": 0.5, "faster": 0.25, "fastest": 0.2}
"""Candidate latency as a fraction of the baseline's, before per-pair jitter."""


def latency(recipe: str, prompt_id: str, seed: int) -> float:
    if recipe == BASELINE:
        return base_latency(prompt_id, seed)
    jitter = 1.0 + 0.05 * ((seed + len(prompt_id)) % 3 - 1)
    return base_latency(prompt_id, seed) * CANDIDATE_FACTOR[recipe] * jitter


def lpips_series(candidate: str, prompt_id: str, seed: int, num_frames: int) -> list[float]:
    level = {"fast": 0.02, "faster": 0.06, "fastest": 0.12}[candidate]
    return [round(level + 0.001 * ((i + seed) % 7) + 0.002 * (sum(map(ord, prompt_id)) % 3), 6)
            for i in range(num_frames)]


def ghost_series(candidate: str, num_frames: int) -> list[float]:
    level = {"fast": 0.05, "faster": 0.6, "fastest": 0.3}[candidate]
    return [round(level + 0.01 * (i % 4), 6) for i in range(num_frames)]


GHOST_THRESHOLD = 0.4


def make_review_run(
    root: str | Path,
    *,
    candidates: tuple[str, ...] = ("fast", "faster"),
    prompt_ids: tuple[str, ...] = ("p-cat", "p-car"),
    seeds: tuple[int, ...] = (0, 1),
    num_frames: int = 24,
    size: int = 64,
    gates: bool = True,
    trajectory: bool = True,
    verdict: bool = True,
    warmup: tuple[str, str, int] | None = None,
    error_pair: tuple[str, str, int] | None = None,
    hourly_rate: float | None = 13.16,
    schedule_differs: tuple[str, ...] = (),
) -> RunStore:
    """Write the review run. ``warmup``: a (recipe, prompt, seed) whose record is marked as a warm-up request;
    ``error_pair``: a (candidate, prompt, seed) whose lpips result is an error with no value; ``schedule_differs``:
    candidates whose trajectory result is the trajectory gate's own on a 29-step baseline against an 8-step candidate
    (:func:`schedule_trajectories`)."""
    seconds = num_frames / 24

    def frames_fn(recipe: str, pid: str, seed: int) -> np.ndarray:
        frames = moving_square_frames(num_frames=num_frames, size=size, seed=seed + 10 * len(pid))
        return ghosted(frames) if recipe == "faster" else frames

    def audio_fn(recipe: str, pid: str, seed: int) -> np.ndarray:
        return tone_pcm(seconds, freq=440.0 if recipe == BASELINE else 440.0 * 1.02)

    store = make_synthetic_run(root, baseline=BASELINE, candidates=list(candidates), prompt_ids=list(prompt_ids),
                               seeds=list(seeds), frames_fn=frames_fn, audio_fn=audio_fn, latency_fn=latency)
    manifest = store.read_manifest()
    if hourly_rate is not None:
        manifest.args["gpu_hourly_rate"] = hourly_rate
    store.write_manifest(manifest)
    if warmup is not None:
        recipe, pid, seed = warmup
        record = store.load_record(recipe, pid, seed)
        record.extra["warmup"] = True
        record.timings.generation_side_latency_s = 1000.0  # a compile-laden first request: must not count
        atomic_write_json(store.record_path(recipe, pid, seed), record.model_dump(mode="json"))
    if gates:
        for cand in candidates:
            for pid in prompt_ids:
                for seed in seeds:
                    _write_gates(store, cand, pid, seed, num_frames, size, error=(cand, pid, seed) == error_pair,
                                 trajectory=trajectory, schedule_differs=cand in schedule_differs)
    if verdict:
        atomic_write_json(store.verdict_path, demo_verdict(candidates))
    return store


def demo_verdict(candidates: tuple[str, ...]) -> dict:
    """A verdict in h3eval.verdict's shape (``outcome`` everywhere; candidates, gates and metrics as lists)."""
    out: dict = {"schema": "h3eval.verdict", "version": 1, "policy_name": "demo", "baseline": BASELINE,
                 "outcome": "FAIL", "exit_code": 1, "reasons": ["faster: ghosting flagged"],
                 "warnings": ["4 pairs per candidate: too few to detect a 0.01 LPIPS margin"], "candidates": []}
    for cand in candidates:
        ghost_fail = cand == "faster"
        out["candidates"].append({
            "candidate": cand,
            "outcome": "FAIL" if ghost_fail else "PASS",
            "reasons": ["ghosting flagged on every pair"] if ghost_fail else ["all gates within margins"],
            "gates": [
                {"gate": "lpips", "candidate": cand, "outcome": "PASS", "reasons": [],
                 "metrics": [{"gate": "lpips", "metric": "lpips_mean", "candidate": cand, "outcome": "PASS",
                              "reasons": [f"lpips_mean within margin for {cand}"],
                              "pairs": [{"prompt_id": "p-cat", "seed": 0, "value": 0.02, "file": "x"}]}]},
                {"gate": "ghosting", "candidate": cand, "outcome": "FAIL" if ghost_fail else "PASS",
                 "reasons": ["ghost_score_max above 0.4 on 4 of 4 pairs"] if ghost_fail else [], "metrics": []},
            ],
            "speed": {"candidate": cand, "outcome": "PASS", "reasons": [], "warnings": [], "latency": "generation_side",
                      "min_speedup": 1.5},
        })
    return out


def _png(path: Path, image: np.ndarray) -> None:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())


SCHEDULE_STEPS = (29, 8)
"""Baseline and candidate steps of a ``schedule_differs`` candidate (the field report's 29 against a distilled 8)."""


def schedule_trajectories(seed: int, final_rel_l2: float, rows: int = 64, channels: int = 4
                          ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Latent trajectories (h3.trajectory's keys) of a 29-step baseline and an 8-step candidate of the same seed: the
    same start (noise level 1, same noise, same first x0 prediction), no other noise level in common, and final x0
    predictions ``final_rel_l2`` apart in relative L2."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((rows, channels)).astype(np.float32)
    target = rng.standard_normal((rows, channels)).astype(np.float32)
    away = rng.standard_normal((rows, channels))
    away = (away / np.linalg.norm(away) * np.linalg.norm(target) * final_rel_l2).astype(np.float32)

    def side(steps: int, end: np.ndarray) -> dict[str, np.ndarray]:
        t = np.linspace(1.0, 1.0 / steps, steps)
        w = np.linspace(0.0, 1.0, steps)[:, None, None].astype(np.float32)
        x0 = (1 - w) * target + w * end  # the first prediction is ``target`` on both sides
        xt = t[:, None, None].astype(np.float32) * noise + (1 - t[:, None, None]).astype(np.float32) * x0
        return {"video_t": t, "video_xt": xt, "video_x0": x0}

    return side(SCHEDULE_STEPS[0], target), side(SCHEDULE_STEPS[1], target + away)


def _write_gates(store: RunStore, cand: str, pid: str, seed: int, num_frames: int, size: int, *, error: bool,
                 trajectory: bool, schedule_differs: bool = False) -> None:
    pair = PairRef(baseline=BASELINE, candidate=cand, prompt_id=pid, seed=seed)
    stem = clip_stem(pid, seed)
    lp = lpips_series(cand, pid, seed, num_frames)
    if error:
        lpips = GateResult(gate="lpips", pair=pair, metrics={"lpips_mean": Metric(value=None, higher_is_better=False)},
                           error="decode failed: candidate clip truncated at frame 7", status="error")
    else:
        lpips = GateResult(
            gate="lpips", pair=pair,
            metrics={"lpips_mean": Metric(value=float(np.mean(lp)), higher_is_better=False),
                     "ssim_mean": Metric(value=1.0 - 2 * float(np.mean(lp)), higher_is_better=True)},
            series={"lpips": lp, "ssim": [round(1.0 - 2 * v, 6) for v in lp]},
        )
    atomic_write_json(store.gate_result_path("lpips", cand, pair.prompt_id, pair.seed), lpips.model_dump(mode="json"))

    gs = ghost_series(cand, num_frames)
    flagged_frames = [i for i, v in enumerate(gs) if v > GHOST_THRESHOLD]
    artifacts = []
    for f in (0, num_frames // 2):
        path = store.gate_result_dir("ghosting", cand) / f"{stem}_heatmap_f{f:04d}.png"
        heat = np.zeros((size, size, 3), dtype=np.uint8)
        heat[..., 0] = int(255 * gs[f])
        _png(path, heat)
        artifacts.append(store.relative(path))
    ghost = GateResult(
        gate="ghosting", pair=pair,
        metrics={"ghost_score_max": Metric(value=max(gs), higher_is_better=False)},
        series={"ghost_score": gs},
        flagged=bool(flagged_frames),
        flags=[f"ghost_score above {GHOST_THRESHOLD} on {len(flagged_frames)} frames"] if flagged_frames else [],
        artifacts=artifacts,
        info={"threshold": GHOST_THRESHOLD, "flagged_frames": flagged_frames,
              "worst_frames": [{"frame": 3, "ghost_score": gs[3], "lag": 0, "dy": 0, "dx": 6}]},
    )
    atomic_write_json(store.gate_result_path("ghosting", cand, pair.prompt_id, pair.seed),
                      ghost.model_dump(mode="json"))

    if trajectory and schedule_differs:
        from gates.trajectory import trajectory_divergence

        out = trajectory_divergence(*schedule_trajectories(seed + len(pid), 0.22))
        traj = GateResult(gate="trajectory", pair=pair, series=out["series"], info=out["info"],
                          metrics={k: Metric(value=v, higher_is_better=False) for k, v in out["metrics"].items()})
        atomic_write_json(store.gate_result_path("trajectory", cand, pair.prompt_id, pair.seed),
                          traj.model_dump(mode="json"))
    elif trajectory:
        steps = 8
        growth = {"fast": 0.01, "faster": 0.03, "fastest": 0.05}[cand]
        traj = GateResult(
            gate="trajectory", pair=pair,
            # The trajectory gate's own names (gates/trajectory.py), so the page is tested on what it will show.
            metrics={"video_x0_rel_l2_final": Metric(value=growth * steps * 1.5, higher_is_better=False)},
            series={"video_xt_rel_l2": [round(growth * (s + 1), 6) for s in range(steps)],
                    "video_x0_rel_l2": [round(growth * (s + 1) * 1.5, 6) for s in range(steps)]},
        )
        atomic_write_json(store.gate_result_path("trajectory", cand, pair.prompt_id, pair.seed),
                          traj.model_dump(mode="json"))


def record_of(store: RunStore, recipe: str, pid: str, seed: int) -> ClipRecord:
    return store.load_record(recipe, pid, seed)


def make_import_folders(root: str | Path, *, prompt_ids: tuple[str, ...] = ("p-cat", "p-car"),
                        seeds: tuple[int, ...] = (0,), num_frames: int = 24, size: int = 64) -> tuple[Path, Path]:
    """Two folders of ``<prompt>-s<seed>.mp4`` clips as another stack would leave them (no records, no timings), for
    ``h3eval import``: ``baseline/`` and ``candidate/`` (the planted ghost of ``faster``). Returns both folders."""
    from h3.media import encode_mp4

    root = Path(root)
    folders = (root / "baseline", root / "candidate")
    for folder, ghost in zip(folders, (False, True)):
        folder.mkdir(parents=True, exist_ok=True)
        for pid in prompt_ids:
            for seed in seeds:
                frames = moving_square_frames(num_frames=num_frames, size=size, seed=seed + 10 * len(pid))
                encode_mp4(folder / f"{clip_stem(pid, seed)}.mp4", ghosted(frames) if ghost else frames,
                           tone_pcm(num_frames / 24), fps=24)
    return folders
