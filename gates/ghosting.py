"""Ghosting gate: a faint displaced copy of moving content in the candidate that the baseline lacks.

Field report 001: a sparse-attention config passed the per-op gate and LPIPS, yet every frame carried a faint second
rendering of the moving subject; only side-by-side same-seed frames caught it. This gate automates that look, and
is built so that what a codec does to a clip does not read as a ghost (issue 19). The estimator, its physics and its
calibrated null live in gates/metrics/: :mod:`gates.metrics.ghost` (the pooled fit, per window and per frame),
:mod:`gates.metrics.ghost_fit` (least squares and block statistics), :mod:`gates.metrics.ghost_pvalue` (window and
pair p-values), :mod:`gates.metrics.ghost_heatmap` (the strip) and :mod:`gates.metrics.ghost_backend` (numpy / torch).
This module declares the metrics and options and writes the strip. Two run-level decisions read them: the test over
the pairs' p-values (h3eval.stats.ghost_run_test, Benjamini-Hochberg: a ghost strong in one pair), and the pooled
test of :mod:`gates.metrics.ghost_run` on ``ghost_stale_evidence`` (a faint stale copy in every pair: seed 001's
ghost at alpha 0.05, which no single pair shows at BH's per-pair level).

Before the fit, the baseline is moved onto the candidate where the candidate's content is displaced
(:mod:`gates.metrics.ghost_motion`, option ``compensate_displacement``, on by default): a subject rendered a few
pixels aside, as INT8 over turbo4-tiny does, is not a second image (issue 50), while a faint copy on top of the
displaced content stays in the residual.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import asdict

import numpy as np

from pydantic import Field

from gates.base import Gate, GateInputError, GateOptions, GateResult, Metric, MetricSpec, PairContext, register_gate
from gates.common import host_workers
from gates.metrics import ghost_run
from gates.metrics.ghost import (clip_evidence, downsample_factor, ghost_frames, ghost_scores, is_flagged,
                                 pool_windows, to_luma)
from gates.metrics.ghost_config import FrameScores, GhostingConfig, PooledWindow
from gates.metrics.ghost_heatmap import local_ghost_map, png_bytes, render_strip
from gates.metrics.ghost_motion import compensate
from gates.metrics.ghost_pvalue import pair_p_value, simes, window_p_value

__all__ = ["FrameScores", "GhostingConfig", "GhostingGate", "GhostingOptions", "PooledWindow", "clip_evidence",
           "downsample_factor", "ghost_frames", "ghost_scores", "is_flagged", "local_ghost_map", "pair_p_value",
           "pool_windows", "render_strip", "simes", "to_luma", "window_p_value"]

logger = logging.getLogger(__name__)


class GhostingOptions(GateOptions):
    """The detector settings a run may change (defaults: :class:`GhostingConfig`'s, calibrated) and the strip."""

    flag_p: float = Field(default=GhostingConfig.flag_p, ge=0.0, le=1.0)
    """A pair is flagged (for reporting) when its p-value against the benign null is at most this; the release
    decision is the run-level test over the pairs' p-values, not this flag."""
    frame_threshold: float = GhostingConfig.frame_threshold
    pool_frames: int = Field(default=GhostingConfig.pool_frames, ge=1)
    frame_stride: int = Field(default=GhostingConfig.frame_stride, ge=1)
    strip_frames: int = 3
    """Worst frames shown in the strip artifact."""
    workers: int = 1
    """Threads of the displacement search (and, at least :func:`gates.common.host_workers`, of the displacement
    compensation: the same result for any number)."""
    compensate_displacement: bool = True
    """Move the baseline onto the candidate's displaced content before the fit (gates.metrics.ghost_motion); off, the
    fit reads the raw pair, as the calibration of bench/ghosting did."""


@register_gate
class GhostingGate(Gate):
    """Faint displaced copy of moving content in the candidate (field report 001); calibrated out of sample."""

    name = "ghosting"
    needs = ("video",)
    description = (
        "Strength of a displaced copy (temporal lag 0-4, spatial shift) of the baseline in the candidate, fitted "
        "jointly over windows of frames where the copy is visible and not aligned with the motion (what a codec "
        "leaks), after moving the baseline onto displaced content of the candidate; a p-value per pair against the "
        "benign null of held-out footage, for the run-level test."
    )

    Options = GhostingOptions
    metrics = {"ghost_strength": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_evidence": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_p_value": MetricSpec(higher_is_better=True, unit="p"),
               "ghost_score_max": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_score_mean": MetricSpec(higher_is_better=False, unit="alpha"),
               "ghost_frames": MetricSpec(higher_is_better=False, unit="frames"),
               "ghost_stale_evidence": MetricSpec(higher_is_better=False, unit="alpha")}

    def evaluate(self, ctx: PairContext) -> GateResult:
        from gates.common import relative_to_run
        from gates.media_cache import load_video
        from h3.atomic import atomic_write_bytes
        from h3.media import MediaError

        try:
            options = self.parse_options(ctx.options)
        except GateInputError as exc:
            return self._error(ctx, str(exc))
        config = dataclasses.replace(GhostingConfig(), flag_p=options.flag_p,
                                     frame_threshold=options.frame_threshold, pool_frames=options.pool_frames,
                                     frame_stride=options.frame_stride)
        strip_frames, workers = options.strip_frames, options.workers
        try:
            # Through the runner's per-pair cache: the other gates of this pair decode the same two files.
            base, _ = load_video(ctx.baseline.mp4)
            cand, _ = load_video(ctx.candidate.mp4)
        except MediaError as exc:
            return self._error(ctx, str(exc))
        if base.shape != cand.shape:
            return self._error(
                ctx, f"frame shape mismatch: baseline {ctx.baseline.mp4.name} {base.shape} vs candidate "
                f"{ctx.candidate.mp4.name} {cand.shape}")
        device = ctx.device if str(ctx.device).startswith("cuda") else "cpu"
        base, scored_base, scored_cand, displacement = _frames_to_score(ctx, base, cand, config, options, device)
        try:
            fs = ghost_scores(scored_base, scored_cand, config, workers=workers, device=device)
        except ValueError as exc:  # frames too small for the displacement search
            return self._error(ctx, f"{ctx.candidate.mp4.name}: {exc}")
        scored = fs.scored
        values = fs.score[scored]
        strength = clip_evidence(fs)
        p_value = pair_p_value(fs, config)
        flagged = p_value <= config.flag_p
        listed = ghost_frames(fs, config)
        top = min(fs.windows, key=lambda w: (w.p_value, -w.evidence)) if fs.windows else None
        metrics = {
            "ghost_strength": Metric(value=strength, higher_is_better=False, unit="alpha"),
            "ghost_evidence": Metric(value=max(0.0, top.evidence) if top else 0.0, higher_is_better=False,
                                     unit="alpha"),
            "ghost_p_value": Metric(value=p_value, higher_is_better=True, unit="p"),
            "ghost_score_max": Metric(value=float(values.max()), higher_is_better=False, unit="alpha"),
            "ghost_score_mean": Metric(value=float(values.mean()), higher_is_better=False, unit="alpha"),
            "ghost_frames": Metric(value=float(len(listed)), higher_is_better=False, unit="frames"),
            # Seed 001's stale copy, for the run-level test (gates.metrics.ghost_run: the mean over the run's pairs).
            "ghost_stale_evidence": Metric(value=ghost_run.pair_statistic(fs), higher_is_better=False, unit="alpha"),
        }
        series = {
            "ghost_score": [float(v) if ok else None for v, ok in zip(fs.score, scored)],
            "ghost_lag": [float(v) if ok and v >= 0 else None for v, ok in zip(fs.lag, scored)],
        }
        flags = _window_flags(fs, config, listed) if flagged else []
        worst = [int(i) for i in np.argsort(-np.where(scored, fs.score, -1.0), kind="stable")]
        worst = [i for i in worst if scored[i]][:strip_frames]
        artifacts = []
        if worst and fs.score[worst[0]] > 0:
            strip = render_strip(base, cand, fs, sorted(worst), config)
            path = ctx.artifact_dir / f"{ctx.pair.prompt_id}-s{ctx.pair.seed}-ghosting-strip.png"
            atomic_write_bytes(path, png_bytes(strip))
            artifacts.append(relative_to_run(ctx, path))
        return GateResult(
            gate=self.name, pair=ctx.pair, metrics=metrics, series=series, flagged=flagged, flags=flags,
            artifacts=artifacts,
            info={
                "config": asdict(config),
                "calibration": "bench/ghosting/results/ghosting_calibration.md",
                "device": device,
                "scored_frames": int(scored.sum()),
                "num_frames": int(base.shape[0]),
                "pair_p_value": p_value,
                "ghost_frame_indices": listed,
                "windows": [_window_info(w) for w in fs.windows],
                "downsample_factor": fs.factor,
                "displacement": None if displacement is None else {
                    "moved_fraction": displacement.fraction,
                    "max_frame_fraction": float(displacement.frame_fraction.max(initial=0.0)),
                    "mean_shift_px": displacement.mean_shift,
                    "how": "gates.metrics.ghost_motion.compensate: the baseline warped onto the candidate where it "
                           "explains it at most half the in-place squared error"},
                "strip_frames": sorted(worst),
                "worst_frames": [
                    {"frame": t, "ghost_score": float(fs.score[t]), "lag": int(fs.lag[t]), "dy": int(fs.dy[t]),
                     "dx": int(fs.dx[t])} for t in worst],
            },
        )

    def _error(self, ctx: PairContext, message: str) -> GateResult:
        logger.error("ghosting %s/%s-s%d: %s", ctx.pair.candidate, ctx.pair.prompt_id, ctx.pair.seed, message)
        return GateResult(gate=self.name, pair=ctx.pair, status="error", error=message)


def _frames_to_score(ctx: PairContext, base, cand, config: GhostingConfig, options: GhostingOptions, device: str):
    """(baseline as compared, baseline and candidate on ``device``, the displacement or None): the baseline moved
    onto the candidate's displaced content when ``compensate_displacement`` is on; on a GPU the clip cache's device
    copies (each clip uploaded once for all the gates of the pair), the compensated baseline this pair's own."""
    displacement = None
    if options.compensate_displacement:
        factor = downsample_factor(base.shape[1], base.shape[2], config.work_long_side)
        displacement = compensate(base, cand, factor, workers=max(options.workers, host_workers()))
        base = displacement.frames
    if device == "cpu":
        return base, base, cand, displacement
    import torch

    from gates.media_cache import load_video_on

    scored_base = (torch.from_numpy(base).to(device) if displacement is not None
                   else load_video_on(ctx.baseline.mp4, device)[0])
    return base, scored_base, load_video_on(ctx.candidate.mp4, device)[0], displacement


def _window_flags(fs, config: GhostingConfig, listed: list[int]) -> list[str]:
    """One flag line per window whose p-value is at or below ``flag_p``."""
    return [
        f"ghosting: frames {win.frames[0]}-{win.frames[-1]} carry a copy of frame t-{win.lag} shifted "
        f"by ({win.dy}, {win.dx}) px of pooled strength {win.score:.3f} +- {win.stderr:.3f} over "
        f"{win.blocks} blocks (p {win.p_value:.2g} against benign footage, flag_p {config.flag_p:.3g}); "
        f"{sum(t in listed for t in win.frames)} of its {len(win.frames)} scored frames at >= "
        f"{config.frame_threshold}"
        for win in fs.windows if win.p_value <= config.flag_p]


def _window_info(w) -> dict:
    """A window's fit, as the gate result's ``info["windows"]`` records it."""
    return {"first_frame": w.frames[0], "last_frame": w.frames[-1], "scored_frames": len(w.frames),
            "strength": float(w.score), "stderr": float(w.stderr), "evidence": float(w.evidence),
            "p_value": float(w.p_value), "blocks": int(w.blocks), "lag": int(w.lag), "dy": int(w.dy),
            "dx": int(w.dx), "fit_factor": int(w.factor), "coarse_evidence": float(w.coarse_evidence),
            "evidence_before_share": float(w.evidence_before_share),
            "fine_evidence": None if w.fine_evidence is None else float(w.fine_evidence),
            "stale_evidence": float(w.stale_evidence), "stale_lag": int(w.stale_lag),
            "stale_strength": float(w.stale_strength),
            "copy_share": None if w.copy_share is None else float(w.copy_share)}
