"""trajectory: same-seed latent trajectories, baseline versus candidate — divergence per denoising step.

The per-op gate of seed 001 compared one attention call and passed; the video ghosted because error accumulated
across steps. This gate compares what the two requests' schedulers saw at every step (h3.trajectory): the relative
L2 divergence ``||c - b|| / ||b||`` of x_t and of the model's x0 prediction, per modality, per step, and per latent
frame for video (which frames diverge first), with a growth flag when divergence grows faster than a set rate.

Steps are matched by noise level (the timestep ``t``). When the two recipes ran different schedules (4 steps
against 29), only the noise levels both visited are compared, and the result says so; the final x0 of each side
(its last prediction, which decodes into the clip) is always compared.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from gates.base import Gate, GateOptions, GateResult, Metric, MetricSpec, PairContext, register_gate
from h3.trajectory import load_trajectory, trajectory_path

logger = logging.getLogger(__name__)

# A step's divergence counts as "started" above this (float32 round-off of identical math is exactly 0).
DIVERGENCE_EPS = 1e-6
# Growth flag: between consecutive common steps, video x0 divergence multiplied by more than GROWTH_RATE while the
# final divergence exceeds GROWTH_MIN_FINAL. A deterministic lever (bit-identical AdaLN precompute) gives 0; a
# candidate whose error compounds across steps (seed 001's ghosting) shows a run of ratios above 1.
GROWTH_RATE = 2.0
GROWTH_MIN_FINAL = 0.01
TIMESTEP_MATCH = 1e-6


def rel_l2(candidate: np.ndarray, baseline: np.ndarray) -> float:
    """||c - b|| / ||b|| in float64 (0 when both are zero; inf when only the baseline is)."""
    c, b = candidate.astype(np.float64), baseline.astype(np.float64)
    num, den = np.linalg.norm(c - b), np.linalg.norm(b)
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return float(num / den)


def common_steps(t_base: np.ndarray, t_cand: np.ndarray) -> list[tuple[int, int]]:
    """Index pairs (baseline step, candidate step) at the same noise level."""
    pairs = []
    for i, t in enumerate(t_base):
        j = np.nonzero(np.abs(t_cand - t) <= TIMESTEP_MATCH)[0]
        if len(j):
            pairs.append((i, int(j[0])))
    return pairs


def frame_of_rows(num_rows: int, stride: int, num_frames: int, total_rows: int) -> np.ndarray:
    """Latent frame of each kept row (rows are frame-major; every ``stride``-th row was kept)."""
    rows_per_frame = total_rows // num_frames
    return (np.arange(num_rows) * stride) // rows_per_frame


def per_frame_rel_l2(cand: np.ndarray, base: np.ndarray, frames: np.ndarray, num_frames: int) -> list[float | None]:
    out: list[float | None] = []
    for f in range(num_frames):
        mask = frames == f
        out.append(rel_l2(cand[mask], base[mask]) if mask.any() else None)
    return out


def trajectory_divergence(base: dict[str, np.ndarray], cand: dict[str, np.ndarray], num_latent_frames: int | None = None,
                          growth_rate: float = GROWTH_RATE, growth_min_final: float = GROWTH_MIN_FINAL) -> dict[str, Any]:
    """The gate's numbers for one pair of trajectories (pure function; tests call it directly)."""
    series: dict[str, list[float | None]] = {}
    info: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    for modality in ("video", "audio"):
        if f"{modality}_t" not in base or f"{modality}_t" not in cand:
            continue
        tb, tc = base[f"{modality}_t"], cand[f"{modality}_t"]
        pairs = common_steps(tb, tc)
        info[f"{modality}_steps"] = [int(len(tb)), int(len(tc))]
        info[f"{modality}_common_t"] = [float(tb[i]) for i, _ in pairs]
        if len(tb) != len(tc) or len(pairs) != len(tb):
            info[f"{modality}_note"] = (
                f"schedules differ ({len(tb)} vs {len(tc)} steps): x_t and x0 compared on the {len(pairs)} common "
                "noise level(s); the final x0 of each side compared as well")
        if base[f"{modality}_xt"].shape[1:] != cand[f"{modality}_xt"].shape[1:]:
            raise ValueError(f"{modality} latent shapes differ: {base[f'{modality}_xt'].shape[1:]} vs "
                             f"{cand[f'{modality}_xt'].shape[1:]}")
        for kind in ("xt", "x0"):
            series[f"{modality}_{kind}_rel_l2"] = [
                rel_l2(cand[f"{modality}_{kind}"][j], base[f"{modality}_{kind}"][i]) for i, j in pairs]
        metrics[f"{modality}_x0_rel_l2_final"] = rel_l2(cand[f"{modality}_x0"][-1], base[f"{modality}_x0"][-1])
        x0 = series[f"{modality}_x0_rel_l2"]
        first = next((k for k, d in enumerate(x0) if d is not None and d > DIVERGENCE_EPS), None)
        info[f"{modality}_first_divergent_step"] = None if first is None else int(pairs[first][0])
        if modality == "video" and num_latent_frames and pairs:
            stride = int(base.get("video_row_stride", np.array(1)))
            total = base["video_xt"].shape[1] * stride
            frames = frame_of_rows(base["video_xt"].shape[1], stride, num_latent_frames, total)
            grid = [per_frame_rel_l2(cand["video_x0"][j], base["video_x0"][i], frames, num_latent_frames)
                    for i, j in pairs]
            info["video_x0_rel_l2_per_frame"] = grid
            if first is not None:
                row = np.array([v if v is not None else 0.0 for v in grid[first]])
                info["video_frames_diverging_first"] = [int(f) for f in np.argsort(-row)[:3]]
    video = series.get("video_x0_rel_l2", [])
    ratios = [b / max(a, DIVERGENCE_EPS) for a, b in zip(video[:-1], video[1:]) if a is not None and b is not None]
    growth = max(ratios) if ratios else 0.0
    info["video_x0_max_step_growth"] = growth
    grows = bool(video) and growth > growth_rate and (video[-1] or 0.0) > growth_min_final
    return {"metrics": metrics, "series": series, "info": info, "growth_flag": grows}


def _heatmap_png(grid: list[list[float | None]], path: Path) -> None:
    """Steps (rows) × latent frames (columns) of x0 divergence, as a small PNG (log scale)."""
    from PIL import Image

    data = np.array([[v if v is not None else np.nan for v in row] for row in grid], dtype=np.float64)
    logd = np.log10(np.clip(np.nan_to_num(data, nan=0.0), 1e-6, None))
    norm = (logd + 6.0) / 6.0  # 1e-6 .. 1 -> 0 .. 1
    norm = np.clip(norm, 0.0, 1.0)
    rgb = np.stack([norm, 0.2 + 0.0 * norm, 1.0 - norm], axis=-1)
    image = Image.fromarray((rgb * 255).astype(np.uint8)).resize(
        (max(1, data.shape[1]) * 12, max(1, data.shape[0]) * 12), Image.NEAREST)
    image.save(path)


class TrajectoryOptions(GateOptions):
    growth_rate: float = GROWTH_RATE
    """Flag a pair whose video x0 divergence grows by more than this factor in one step..."""
    growth_min_final: float = GROWTH_MIN_FINAL
    """...and ends above this relative L2 (a growth from nothing to nearly nothing is not drift)."""


@register_gate
class TrajectoryGate(Gate):
    name = "trajectory"
    needs = ("latents",)
    description = "per-step divergence of same-seed latent trajectories (x_t and x0), per modality and latent frame"
    Options = TrajectoryOptions
    metrics = {f"{modality}_x0_rel_l2_final": MetricSpec(higher_is_better=False) for modality in ("video", "audio")}

    def evaluate(self, ctx: PairContext) -> GateResult:
        options = self.parse_options(ctx.options)
        result = GateResult(gate=self.name, pair=ctx.pair)
        imported = [side.recipe for side in (ctx.baseline, ctx.candidate)
                    if "imported_from" in (ctx.run.recipes.get(side.recipe) or {})]
        if imported:
            result.status = "not_applicable"
            result.info["reason"] = (f"cannot apply to imported clips ({' and '.join(imported)}: made by another "
                                     "stack, which records no latent trajectory)")
            return result
        paths = {side.recipe: trajectory_path(side.mp4) for side in (ctx.baseline, ctx.candidate)}
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            result.status, result.error = "error", (
                "no latent trajectory recorded for " + ", ".join(missing)
                + " (generate the run with trajectory recording on: `h3eval ab ... --trajectory`)")
            return result
        base = load_trajectory(trajectory_path(ctx.baseline.mp4))
        cand = load_trajectory(trajectory_path(ctx.candidate.mp4))
        frames = (ctx.baseline.record.get("shape") or {}).get("num_latent_frames")
        try:
            out = trajectory_divergence(base, cand, frames, growth_rate=options.growth_rate,
                                        growth_min_final=options.growth_min_final)
        except ValueError as exc:
            result.status, result.error = "error", str(exc)
            return result
        result.metrics = {name: Metric(value=value, higher_is_better=False) for name, value in out["metrics"].items()}
        result.series = out["series"]
        result.info = out["info"]
        if out["growth_flag"]:
            result.flagged = True
            result.flags.append(
                f"video x0 divergence grows {out['info']['video_x0_max_step_growth']:.1f}x in one step "
                f"(> {GROWTH_RATE}x) and ends at {out['series']['video_x0_rel_l2'][-1]:.3g}")
        grid = out["info"].get("video_x0_rel_l2_per_frame")
        if grid:
            png = ctx.artifact_dir / f"{ctx.pair.prompt_id}-s{ctx.pair.seed}.trajectory.png"
            _heatmap_png(grid, png)
            result.artifacts.append(str(png.relative_to(ctx.run_dir)))
        return result
