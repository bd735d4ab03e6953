"""The integrity gate: does each clip of the pair decode, and is it what its record says it is?

Per side (baseline and candidate, each judged on its own; :func:`check_clip` also works on a single clip):

- every video frame and every audio sample decodes (PyAV, through ``h3.media``);
- frame count, fps, resolution and duration match the clip's record (when there is one);
- the audio track is 32 kHz stereo (the format of H3's audio VAE and of the seeds' servers) and its length matches
  the video's within one frame (AAC pads the last packet: up to 1024 samples, less than one frame at 24 fps);
- no NaN/Inf audio samples; the frames are uint8 after decoding, so a NaN frame of the generator shows up as an
  all-black frame, which is checked;
- no all-black frames, no frozen runs (consecutive frames that do not change), no silent track or channel,
  no clipping.

In a pair, a frozen run is the candidate's defect only where it is a stall: a run that opens the clip (a still
opening, the scene at rest before it moves, which the generator draws: the run starts at frame
``frozen_opening_frames`` or earlier, the causal VAE's frame 0 differing from the rest, or before the clip first moves,
no frame after frame 1 having changed by more than ``opening_max_diff`` before it) or that the baseline's clip of the
same pair also holds (overlapping frames: the same still in both) is reported in ``info``, not flagged, and the
baseline's own frozen runs are reported, not flagged (the candidate is not at fault). Measured need (issue 50, bench/recipe_signoff/results/
recipe_signoff_fresh.md): on held-out pool 5 the baseline of heldout-23-s53 opens with 12 still frames, so the byte-
identical `identity` candidate FAILed integrity in 44 of 100 runs, and turbo4-tiny's still openings (s53, s57) FAILed
77 of 100. Session 28: on held-out pool 6 turbo4-tiny's clip of heldout-b-03-s65 is still for its first 17 frames
(every change below 0.5 levels) while its object has not appeared, but the tiny's causal VAE adds a faint blip every
4 frames (0.37 levels at frame 4), so the still run began at frame 5, past the opening rule, and FAILed integrity in
59 of 100 runs (bench/recipe_signoff/results/recipe_signoff_fresh3_s27.md): a still opening is a still before the
clip first moves, wherever a blip splits it. A single clip's check (:func:`check_clip`) still lists every frozen run
among its problems (an opening one worded so: :data:`OPENING`).

Between the sides it flags a difference in resolution, fps, frame count or audio length (pairs are compared
like for like; a mismatch is reported, not silently compared).

A clip that does not decode is the pair's ``error`` (and flagged); a clip that decodes with defects is flagged.
Thresholds are gate options (``--option black_max_mean=4`` ...) and are written to ``info``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gates.base import Gate, GateOptions, GateResult, MetricSpec, PairContext, register_gate
from gates.common import luma32, metric, new_result

logger = logging.getLogger(__name__)

EXPECTED_SAMPLE_RATE = 32000
"""H3's audio VAE and the seeds' MP4s: 32 kHz stereo AAC (DESIGN.md, seed 000)."""
EXPECTED_CHANNELS = 2


class IntegrityThresholds(GateOptions):
    """What counts as a defect (the gate's options). Levels are on the 0-255 scale of decoded 8-bit frames, audio in
    full scale [-1, 1]."""

    black_max_mean: float = 4.0
    """A frame whose mean luma is at most this is all-black (limited-range black, Y=16, decodes to RGB 0)."""
    frozen_max_diff: float = 0.25
    """Consecutive frames whose mean absolute luma difference is at most this do not change."""
    frozen_min_frames: int = 12
    """A run of this many unchanging frames (0.5 s at H3's 24 fps) is frozen."""
    frozen_opening_frames: int = 1
    """In a pair, a frozen run that starts at or before this frame is a still opening, reported, not flagged."""
    opening_max_diff: float = 1.0
    """In a pair, a frozen run before which no frame after frame 1 changed by more than this (mean absolute luma,
    levels) is a still opening too: the clip has not moved yet (the tiny's moving subjects change 1.5-5 levels a frame;
    its VAE's blips every 4 frames of a still scene 0.4-0.6)."""
    silence_dbfs: float = -60.0
    """A track or channel whose RMS is below this (dBFS) is silent."""
    clip_level: float = 0.99
    """A sample at or above this magnitude is at full scale (AAC decoding rings around a hard clip, so not 1.0)."""
    clip_max_fraction: float = 1e-3
    """More than this fraction of samples at full scale is clipping."""
    fps_tolerance: float = 1e-3


@dataclass
class ClipIntegrity:
    """What the integrity check found in one clip."""

    path: str
    decode_error: str | None = None
    """Why the clip (or its audio) does not decode; the other fields are then partial."""
    problems: list[str] = field(default_factory=list)
    """One human-readable line per defect found."""
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    num_frames: int | None = None
    duration_s: float | None = None
    has_audio: bool = False
    audio_sample_rate: int | None = None
    audio_channels: int | None = None
    num_audio_samples: int | None = None
    audio_rms_dbfs: list[float | None] = field(default_factory=list)
    """Per channel RMS in dBFS (None for digital silence, whose level is minus infinity)."""
    audio_peak: float | None = None
    clipped_fraction: float | None = None
    nonfinite_samples: int | None = None
    black_frames: list[int] = field(default_factory=list)
    frozen_runs: list[list[int]] = field(default_factory=list)
    """[first frame, length] of each frozen run."""
    frame_diff: list[float | None] = field(default_factory=list)
    """Mean absolute luma difference of each frame to the previous one (None for frame 0)."""
    first_motion: int | None = None
    """The first frame after frame 1 that changed by more than ``opening_max_diff`` from the one before (None: none
    did); a frozen run that starts before it is a still opening."""

    @property
    def ok(self) -> bool:
        return self.decode_error is None and not self.problems

    @property
    def frozen_frames(self) -> int:
        return int(sum(length for _, length in self.frozen_runs))

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("frame_diff")
        return data


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True in a 1-D boolean array."""
    runs, start = [], None
    for index, value in enumerate(mask.tolist()):
        if value and start is None:
            start = index
        elif not value and start is not None:
            runs.append((start, index - start))
            start = None
    if start is not None:
        runs.append((start, len(mask) - start))
    return runs


def _dbfs(rms: float) -> float | None:
    return None if rms <= 0.0 else 20.0 * math.log10(rms)


def _frame_levels(frames) -> tuple[np.ndarray, np.ndarray]:
    """(mean luma of each frame, mean |luma change| to the next frame) of uint8 (T, H, W, 3) frames, on every other
    row and column (enough for a mean level and a frame-to-frame change, and 4x cheaper). ``frames`` a numpy array
    (the CPU, float32) or a torch tensor on a GPU (float32 luma, means accumulated in float64)."""
    if isinstance(frames, np.ndarray):
        # Frame by frame (the same float32 luma; a whole 768x1344 clip at once made ~1 GB of temporaries).
        means = np.empty(len(frames), np.float32)
        diffs = np.empty(max(0, len(frames) - 1), np.float32)
        previous = None
        for t in range(len(frames)):
            luma = luma32(frames[t, ::2, ::2])
            means[t] = luma.mean()
            if previous is not None:
                diffs[t - 1] = np.abs(luma - previous).mean()
            previous = luma
        return means, diffs
    import torch

    with torch.inference_mode():
        luma = luma32(frames[:, ::2, ::2])
        means = luma.reshape(len(luma), -1).double().mean(dim=1)
        diffs = torch.diff(luma, dim=0).abs_().reshape(len(luma) - 1, -1).double().mean(dim=1)
        return means.cpu().numpy(), diffs.cpu().numpy()


def check_video(frames, result: ClipIntegrity, th: IntegrityThresholds) -> None:
    """Black frames and frozen runs of decoded uint8 (T, H, W, 3) frames (numpy, or a torch tensor on a GPU), into
    ``result``."""
    means, diffs = _frame_levels(frames)
    result.black_frames = [int(i) for i in np.flatnonzero(means <= th.black_max_mean)]
    if result.black_frames:
        shown = ", ".join(map(str, result.black_frames[:10])) + (" ..." if len(result.black_frames) > 10 else "")
        result.problems.append(f"{len(result.black_frames)} all-black frame(s) (mean luma <= {th.black_max_mean}): {shown}")
    if len(means) > 1:
        result.frame_diff = [None] + [float(d) for d in diffs]
        # A run of k unchanging transitions is k + 1 frames that look the same.
        still = diffs <= th.frozen_max_diff
        for start, length in _runs(still):
            if length + 1 >= th.frozen_min_frames:
                result.frozen_runs.append([int(start), int(length + 1)])
        moved = np.flatnonzero(diffs[1:] > th.opening_max_diff)  # diffs[i]: frame i -> i + 1
        result.first_motion = int(moved[0]) + 2 if moved.size else None
        for start, length in result.frozen_runs:
            opening = result.first_motion is None or start < result.first_motion
            result.problems.append(
                f"frozen run of {length} frames from frame {start} (mean |change| <= {th.frozen_max_diff} levels"
                + (f"; {OPENING})" if opening else ")")
            )
    else:
        result.frame_diff = [None]


def check_audio(audio: np.ndarray, result: ClipIntegrity, th: IntegrityThresholds) -> None:
    """Non-finite samples, silence and clipping of decoded float audio (channels, N), into ``result``."""
    finite = np.isfinite(audio)
    result.nonfinite_samples = int(audio.size - finite.sum())
    if result.nonfinite_samples:
        result.problems.append(f"{result.nonfinite_samples} NaN/Inf audio sample(s)")
    clean = np.where(finite, audio, 0.0).astype(np.float64)
    if clean.size == 0:
        result.problems.append("the audio track has no samples")
        return
    rms = np.sqrt(np.mean(clean**2, axis=1))
    result.audio_rms_dbfs = [_dbfs(float(r)) for r in rms]
    total = _dbfs(float(np.sqrt(np.mean(clean**2))))
    if total is None or total < th.silence_dbfs:
        result.problems.append(f"silent audio track (RMS {_fmt_db(total)} < {th.silence_dbfs} dBFS)")
    else:
        for channel, level in enumerate(result.audio_rms_dbfs):
            if level is None or level < th.silence_dbfs:
                result.problems.append(f"silent audio channel {channel} (RMS {_fmt_db(level)} < {th.silence_dbfs} dBFS)")
    result.audio_peak = float(np.abs(clean).max())
    result.clipped_fraction = float(np.mean(np.abs(clean) >= th.clip_level))
    if result.clipped_fraction > th.clip_max_fraction:
        result.problems.append(
            f"clipping: {result.clipped_fraction:.2%} of samples at full scale (|x| >= {th.clip_level})"
        )


def _fmt_db(value: float | None) -> str:
    return "-inf dBFS" if value is None else f"{value:.1f} dBFS"


def check_clip(
    path: str | Path, record: dict[str, Any] | None = None, thresholds: IntegrityThresholds | None = None,
    device: str = "cpu",
) -> ClipIntegrity:
    """Check one clip: decode everything, compare with its record (a ClipRecord as dict) when given. On a GPU
    ``device`` the frame statistics run on the clip cache's device copy (uploaded once for every gate of the pair)."""
    from gates.media_cache import load_audio, load_video, load_video_on
    from h3.media import MediaError

    th = thresholds or IntegrityThresholds()
    result = ClipIntegrity(path=str(path))
    try:
        frames, fps = load_video(path)
    except MediaError as exc:
        result.decode_error = str(exc)
        return result
    result.num_frames, result.height, result.width = int(frames.shape[0]), int(frames.shape[1]), int(frames.shape[2])
    result.fps = float(fps)
    result.duration_s = result.num_frames / fps if fps else None
    if not fps or fps <= 0:
        result.problems.append(f"video stream has no frame rate ({fps!r})")
    check_video(load_video_on(path, device)[0] if device.startswith("cuda") else frames, result, th)

    try:
        audio, rate = load_audio(path)
    except MediaError as exc:
        if "no audio stream" in str(exc):
            result.problems.append("no audio stream")
        else:
            result.decode_error = str(exc)
        audio = None
    if audio is not None:
        result.has_audio = True
        result.audio_sample_rate, result.audio_channels = int(rate), int(audio.shape[0])
        result.num_audio_samples = int(audio.shape[1])
        if rate != EXPECTED_SAMPLE_RATE:
            result.problems.append(f"audio sample rate {rate} Hz, expected {EXPECTED_SAMPLE_RATE}")
        if audio.shape[0] != EXPECTED_CHANNELS:
            result.problems.append(f"{audio.shape[0]} audio channel(s), expected {EXPECTED_CHANNELS} (stereo)")
        if result.duration_s and rate:
            audio_s = audio.shape[1] / rate
            if abs(audio_s - result.duration_s) > 1.0 / result.fps:
                result.problems.append(
                    f"audio lasts {audio_s:.3f} s, video {result.duration_s:.3f} s: more than one frame apart"
                )
        check_audio(audio, result, th)

    if record is not None:
        _check_against_record(result, record, th)
    return result


def _check_against_record(result: ClipIntegrity, record: dict[str, Any], th: IntegrityThresholds) -> None:
    shape = record.get("shape") or {}
    for name in ("num_frames", "height", "width"):
        expected = shape.get(name)
        actual = getattr(result, name)
        if expected is not None and actual is not None and int(expected) != actual:
            result.problems.append(f"{name} {actual} in the MP4, {expected} in its record")
    expected_fps = shape.get("fps")
    if expected_fps and result.fps and abs(result.fps - float(expected_fps)) > th.fps_tolerance:
        result.problems.append(f"fps {result.fps:g} in the MP4, {expected_fps} in its record")
    expected_s = shape.get("duration_s")
    if expected_s and result.duration_s and result.fps and abs(result.duration_s - float(expected_s)) > 1.0 / result.fps:
        result.problems.append(f"duration {result.duration_s:.3f} s in the MP4, {float(expected_s):.3f} s in its record")
    expected_samples = shape.get("num_audio_samples")
    rate = result.audio_sample_rate
    if expected_samples and result.num_audio_samples is not None and rate and result.fps:
        gap_s = abs(result.num_audio_samples - int(expected_samples)) / rate
        if gap_s > 1.0 / result.fps:  # AAC pads the last packet (< 1024 samples), well within one frame
            result.problems.append(
                f"{result.num_audio_samples} audio samples in the MP4, {expected_samples} in its record "
                f"({gap_s * 1000:.1f} ms apart, more than one frame)"
            )
    expected_rate = shape.get("audio_sample_rate")
    if expected_rate and result.audio_sample_rate and int(expected_rate) != result.audio_sample_rate:
        result.problems.append(f"audio sample rate {result.audio_sample_rate} in the MP4, {expected_rate} in its record")


FROZEN = "frozen run of "
"""How :func:`check_video` words a frozen run among a clip's problems."""
FROZEN_LINE = re.compile(r"^frozen run of (\d+) frames from frame (\d+) ")
OPENING = "before the clip first moves"
"""How :func:`check_video` marks a frozen run that starts before the clip first moves (a still opening in a pair)."""


def frozen_runs_in(problems: list[str]) -> list[list[int]]:
    """[first frame, length] of each frozen run a clip's problem lines name (as :func:`check_video` words them): for
    callers that kept a clip's problems and not its :class:`ClipIntegrity`."""
    return [[int(m[2]), int(m[1])] for m in map(FROZEN_LINE.match, problems) if m]


def pair_flags(base_problems: list[str], base_frozen: list[list[int]], cand_problems: list[str],
               cand_frozen: list[list[int]], th: IntegrityThresholds, info: dict) -> list[str]:
    """The pair's flags from each side's problems: every problem but a frozen run, each prefixed with its side, then
    the candidate's frozen stalls (:func:`frozen_flags`)."""
    flags = [f"{side}: {p}" for side, problems in (("baseline", base_problems), ("candidate", cand_problems))
             for p in problems if not p.startswith(FROZEN)]
    openings = {int(m[2]) for p in cand_problems if (m := FROZEN_LINE.match(p)) and OPENING in p}
    return flags + frozen_flags(base_frozen, cand_frozen, th, info, openings)


def frozen_flags(base_frozen: list[list[int]], cand_frozen: list[list[int]], th: IntegrityThresholds,
                 info: dict, openings: set[int] = frozenset()) -> list[str]:
    """The candidate's frozen runs that are stalls (see the module docstring): neither a still opening (starting by
    ``frozen_opening_frames``, or at a frame in ``openings``: before the clip first moves) nor a still the baseline
    also holds; the others, and the baseline's own, go to ``info["frozen_not_flagged"]``."""
    flags, reported = [], []
    for start, length in base_frozen:
        reported.append(f"baseline: frozen run of {length} frames from frame {start} (the baseline's own)")
    for start, length in cand_frozen:
        shared = any(start < b_start + b_length and b_start < start + length for b_start, b_length in base_frozen)
        why = ("a still opening" if start <= th.frozen_opening_frames or start in openings
               else "the baseline holds the same still" if shared else None)
        line = f"candidate: frozen run of {length} frames from frame {start} (mean |change| <= {th.frozen_max_diff} levels)"
        if why is None:
            flags.append(line)
        else:
            reported.append(f"{line}: {why}")
    if reported:
        info["frozen_not_flagged"] = reported
    return flags


@register_gate
class IntegrityGate(Gate):
    name = "integrity"
    needs = ("video", "audio")
    description = "Both clips decode fully and match their records; no black frames, frozen stalls, silence or clipping."
    Options = IntegrityThresholds
    metrics = {f"{side}_{what}": MetricSpec(higher_is_better=False) for side in ("baseline", "candidate")
               for what in ("problems", "black_frames", "frozen_frames", "clipped_fraction")}

    def evaluate(self, ctx: PairContext) -> GateResult:
        th = self.parse_options(ctx.options)
        result = new_result(self.name, ctx)
        result.info["thresholds"] = th.model_dump()
        sides = {"baseline": ctx.baseline, "candidate": ctx.candidate}
        checks: dict[str, ClipIntegrity] = {}
        errors = []
        device = ctx.device if str(ctx.device).startswith("cuda") else "cpu"
        for side, clip in sides.items():
            check = check_clip(clip.mp4, clip.record, th, device)
            checks[side] = check
            result.info[side] = check.summary()
            if check.decode_error:
                errors.append(f"{side}: {check.decode_error}")
                result.flags.append(f"{side}: does not decode: {check.decode_error}")
            decoded = check.decode_error is None
            result.metrics[f"{side}_problems"] = metric(len(check.problems) + (0 if decoded else 1), False)
            result.metrics[f"{side}_black_frames"] = metric(len(check.black_frames) if decoded else None, False)
            result.metrics[f"{side}_frozen_frames"] = metric(check.frozen_frames if decoded else None, False)
            result.metrics[f"{side}_clipped_fraction"] = metric(check.clipped_fraction if decoded else None, False)
            if check.frame_diff:
                result.series[f"{side}_frame_diff"] = check.frame_diff

        base, cand = checks["baseline"], checks["candidate"]
        result.flags.extend(pair_flags(base.problems, base.frozen_runs, cand.problems, cand.frozen_runs, th, result.info))
        if base.decode_error is None and cand.decode_error is None:
            for name in ("width", "height", "num_frames"):
                if getattr(base, name) != getattr(cand, name):
                    result.flags.append(f"pair: {name} differs (baseline {getattr(base, name)}, candidate {getattr(cand, name)})")
            if base.fps and cand.fps and abs(base.fps - cand.fps) > th.fps_tolerance:
                result.flags.append(f"pair: fps differs (baseline {base.fps:g}, candidate {cand.fps:g})")
            if base.num_audio_samples is not None and cand.num_audio_samples is not None and base.fps:
                rate = base.audio_sample_rate or EXPECTED_SAMPLE_RATE
                gap = abs(base.num_audio_samples - cand.num_audio_samples) / rate
                if gap > 1.0 / base.fps:
                    result.flags.append(f"pair: audio lengths differ by {gap * 1000:.1f} ms (more than one frame)")

        result.flagged = bool(result.flags)
        if errors:
            result.error = "; ".join(errors)
            result.status = "error"
        return result
