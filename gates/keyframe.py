"""The keyframe gate: does each clip still honour the images it was conditioned on, and how much of that did the
candidate lose against the baseline?

An accelerated recipe can break conditioning in ways a text-only request never shows (issue 25): the anchors of
MiniMax-H3's fl2va workflow (diffusers' ``MiniMaxH3FL2VACoreDenoiseStep``) and the reference block of ref2va ride
in the same packed sequence as the generated rows, through the same quantized, cached or sparse attention. This
gate scores **each side against the inputs** and writes both, so the verdict compares the candidate's adherence
with the baseline's own, clip by clip (``compare = "sides"``: the candidate is judged on adherence *lost*, not on
the model's own imperfection).

- **fl2va** (first and/or last keyframe): the first decoded frame against the first keyframe, the last against the
  last, each keyframe put onto the clip's canvas exactly as diffusers' ``MiniMaxH3ResizeStep`` puts it (the first of
  the keyframes given stretched with LANCZOS, a follower cover-cropped with the released model's rounding). LPIPS,
  SSIM and PSNR are the fidelity gate's own functions (:mod:`gates.fidelity`): ``keyframe_lpips``,
  ``keyframe_ssim``, ``keyframe_psnr``, the mean over the anchors, and ``<metric>.baseline`` for the baseline clip.
- **ref2va** (a reference image): whether the reference's subject stays itself through the clip, by colour and
  shape statistics (the procedural world's subjects are flat-coloured shapes on a plain reference background,
  ``h3.world.render``). The subject is the reference's pixels far from its border's median colour; in every frame,
  the foreground is the pixels far from that frame's border median. ``reference_colour_distance``: the share of the
  frame's foreground pixels farther than FOREGROUND_DISTANCE from every colour of the subject's palette (its colours
  quantized to 8 levels, those covering 99% of it), mean over frames (0: the foreground is all the subject's
  colours; 1: none of it is, or there is no foreground). Distances rather than histogram bins, so that a codec's
  few levels of chroma noise never move a colour across a bin edge. ``reference_shape_distance``: OpenCV's
  ``matchShapes`` (Hu-moment distance I1) between the subject's mask and the frame's connected foreground component
  closest to the subject's mean colour, mean over the frames where there is one (frames without are counted in
  ``info``). A reference with no separable subject (no plain background) is scored on the whole image's colours
  and its shape distance is None with the reason.
- A **t2va** pair (no image inputs) is ``not_applicable``; a pair whose two sides were conditioned on different
  images is an error (they are not a pair for this gate).

The images come from the run through ``ctx.read_input`` (the suite hands the gate a reader of the run's
``inputs/<sha256>.png``; the gate never opens the store).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from gates.base import Gate, GateInputError, GateOptions, GateResult, MetricSpec, PairContext, register_gate
from gates.common import metric, new_result, relative_to_run
from gates.fidelity import check_same_shape, load_lpips, lpips_per_frame, psnr_per_frame, ssim_per_frame

FOREGROUND_DISTANCE = 48.0
"""RGB distance (0-255 scale) from the border's median colour beyond which a pixel is foreground. The world's
backgrounds are two tones about 0.13 apart per channel (34 levels, ``h3.world.scene``: ``background_rgb2``), its
shapes saturated or white: 48 keeps a stripe or a checker in the background and every shape in the foreground."""
MIN_SUBJECT_FRACTION, MAX_SUBJECT_FRACTION = 0.001, 0.9
"""A reference whose foreground is outside this share of its pixels has no subject on a plain background."""
MIN_COMPONENT_PIXELS = 4
PALETTE_STEP = 8
"""Subject colours are quantized to multiples of this many levels for its palette."""
PALETTE_COVER, PALETTE_MAX = 0.99, 64
BORDER = 2
"""Pixels of each edge whose median colour is the background."""


# -- fl2va: keyframes onto the canvas --------------------------------------------------------------------------
def keyframe_targets(images: dict[str, Any], height: int, width: int) -> dict[str, np.ndarray]:
    """The keyframes as the pipeline put them onto a ``height`` x ``width`` canvas, by anchor (``first``, ``last``):
    the first keyframe given is stretched (PIL LANCZOS), a follower is cover-cropped (the released arithmetic of
    diffusers' ``MiniMaxH3ResizeStep``: scale to cover, round, crop centred at ``(resized - canvas) // 2``)."""
    from PIL import Image

    out = {}
    given = [(anchor, images[role]) for anchor, role in (("first", "first_frame"), ("last", "last_frame"))
             if images.get(role) is not None]
    for index, (anchor, image) in enumerate(given):
        pil = image.pil()
        if pil.size == (width, height):
            placed = pil
        elif index == 0:
            placed = pil.resize((width, height), Image.Resampling.LANCZOS)
        else:
            scale = max(width / pil.size[0], height / pil.size[1])
            size = (max(width, round(pil.size[0] * scale)), max(height, round(pil.size[1] * scale)))
            left, top = max(0, (size[0] - width) // 2), max(0, (size[1] - height) // 2)
            placed = pil.resize(size, Image.Resampling.LANCZOS).crop((left, top, left + width, top + height))
        out[anchor] = np.asarray(placed.convert("RGB"), dtype=np.uint8)
    return out


def anchor_frame(frames: np.ndarray, anchor: str) -> np.ndarray:
    return frames[0] if anchor == "first" else frames[-1]


def adherence(frames: np.ndarray, targets: dict[str, np.ndarray], model, scale: float, device: str
              ) -> dict[str, dict[str, float]]:
    """Per anchor: LPIPS, SSIM and PSNR of the clip's anchor frame against its placed keyframe."""
    out = {}
    for anchor, target in targets.items():
        frame = anchor_frame(frames, anchor)[None]
        t = target[None]
        psnr, _ = psnr_per_frame(frame, t)
        out[anchor] = {"lpips": float(lpips_per_frame(model, frame, t, scale, device)[0]),
                       "ssim": float(ssim_per_frame(frame, t, device)[0]), "psnr": float(psnr[0])}
    return out


# -- ref2va: the subject's colour and shape ----------------------------------------------------------------------
def border_colour(image: np.ndarray) -> np.ndarray:
    """Median RGB of the ``BORDER``-pixel ring of an (H, W, 3) image (float64)."""
    ring = np.concatenate([image[:BORDER].reshape(-1, 3), image[-BORDER:].reshape(-1, 3),
                           image[:, :BORDER].reshape(-1, 3), image[:, -BORDER:].reshape(-1, 3)])
    return np.median(ring.astype(np.float64), axis=0)


def foreground(image: np.ndarray) -> np.ndarray:
    """Boolean (H, W): pixels farther than FOREGROUND_DISTANCE from the border's median colour."""
    diff = image.astype(np.float64) - border_colour(image)
    return np.sqrt((diff * diff).sum(axis=-1)) > FOREGROUND_DISTANCE


def palette(pixels: np.ndarray) -> np.ndarray:
    """The colours (float64, (P, 3)) of quantized ``pixels`` that cover PALETTE_COVER of them, most frequent first."""
    quantized = (pixels.astype(np.int64) // PALETTE_STEP) * PALETTE_STEP + PALETTE_STEP // 2
    colours, counts = np.unique(quantized.reshape(-1, 3), axis=0, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    covered = np.cumsum(counts[order]) / counts.sum()
    keep = order[: min(PALETTE_MAX, int(np.searchsorted(covered, PALETTE_COVER)) + 1)]
    return colours[keep].astype(np.float64)


def off_palette_share(pixels: np.ndarray, colours: np.ndarray) -> float:
    """Share of (N, 3) pixels farther than FOREGROUND_DISTANCE from every palette colour (1.0 for no pixels)."""
    if len(pixels) == 0:
        return 1.0
    diff = pixels.astype(np.float64)[:, None, :] - colours[None, :, :]
    nearest = np.sqrt((diff * diff).sum(axis=-1)).min(axis=1)
    return float((nearest > FOREGROUND_DISTANCE).mean())


class ReferenceProfile:
    """The reference subject's colour palette, mean colour and mask (None without a plain background)."""

    def __init__(self, pixels: np.ndarray):
        mask = foreground(pixels)
        share = float(mask.mean())
        self.separable = MIN_SUBJECT_FRACTION <= share <= MAX_SUBJECT_FRACTION
        subject = pixels[mask] if self.separable else pixels.reshape(-1, 3)
        self.palette = palette(subject)
        self.mean_colour = subject.astype(np.float64).mean(axis=0)
        self.mask = mask.astype(np.uint8) * 255 if self.separable else None
        self.subject_fraction = share


def identity_distances(frames: np.ndarray, profile: ReferenceProfile) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: (colour distance, shape distance); the shape distance is NaN where the frame has no foreground
    component (or the reference no separable subject)."""
    import cv2

    colour = np.zeros(len(frames))
    shape = np.full(len(frames), np.nan)
    for i, frame in enumerate(frames):
        mask = foreground(frame)
        colour[i] = off_palette_share(frame[mask], profile.palette)
        if profile.mask is None or not mask.any():
            continue
        count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
        best, best_distance = None, np.inf
        for label in range(1, count):
            if stats[label, cv2.CC_STAT_AREA] < MIN_COMPONENT_PIXELS:
                continue
            component = labels == label
            distance = float(np.linalg.norm(frame[component].astype(np.float64).mean(axis=0) - profile.mean_colour))
            if distance < best_distance:
                best, best_distance = component, distance
        if best is not None:
            shape[i] = cv2.matchShapes(profile.mask, best.astype(np.uint8) * 255, cv2.CONTOURS_MATCH_I1, 0.0)
    return colour, shape


# -- the gate ----------------------------------------------------------------------------------------------------
class KeyframeOptions(GateOptions):
    lpips_trunk: str = Field(default_factory=lambda: os.environ.get("H3EVAL_LPIPS_TRUNK") or "alexnet")
    """``alexnet`` (the real metric) or ``rand`` (tests only), as in the fidelity gate."""
    lpips_scale: float = Field(default=1.0, gt=0, le=1)
    """Frames are resized by this factor before LPIPS (two frames per clip: full size by default)."""


SIDES = ("keyframe_lpips", "keyframe_ssim", "keyframe_psnr", "reference_colour_distance", "reference_shape_distance")


@register_gate
class KeyframeGate(Gate):
    name = "keyframe"
    needs = ("video",)
    description = ("fl2va: first/last decoded frame vs the given keyframe (LPIPS, SSIM, PSNR); ref2va: the reference's "
                   "subject held through the clip (colour and shape); each side scored, judged on adherence lost")
    Options = KeyframeOptions
    metrics = {
        name + suffix: spec
        for name, spec in {
            "keyframe_lpips": MetricSpec(higher_is_better=False),
            "keyframe_ssim": MetricSpec(higher_is_better=True),
            "keyframe_psnr": MetricSpec(higher_is_better=True, unit="dB"),
            "reference_colour_distance": MetricSpec(higher_is_better=False),
            "reference_shape_distance": MetricSpec(higher_is_better=False),
        }.items()
        for suffix in ("", ".baseline")
    }

    def evaluate(self, ctx: PairContext) -> GateResult:
        from gates.media_cache import load_video

        options = self.parse_options(ctx.options)
        result = new_result(self.name, ctx)
        base_inputs = _conditioning(ctx.baseline.record)
        cand_inputs = _conditioning(ctx.candidate.record)
        if base_inputs != cand_inputs:
            raise GateInputError(f"the baseline clip was conditioned on {_describe(base_inputs)} and the candidate on "
                                 f"{_describe(cand_inputs)}: not a pair for the keyframe gate")
        workflow = ctx.baseline.record.get("request", {}).get("workflow", "t2va")
        result.info["workflow"] = workflow
        if not base_inputs:
            result.status = "not_applicable"
            result.info["reason"] = "t2va: the clips were conditioned on no keyframe or reference image"
            return result
        if ctx.read_input is None:
            raise GateInputError("the suite gave the keyframe gate no reader of the run's image inputs")
        images = {role: ctx.read_input(sha) for role, sha in base_inputs}
        result.info["inputs"] = {role: sha for role, sha in base_inputs}

        base, base_fps = load_video(ctx.baseline.mp4)
        cand, cand_fps = load_video(ctx.candidate.mp4)
        check_same_shape(base, base_fps, cand, cand_fps, ctx)
        height, width = base.shape[1:3]
        values: dict[str, tuple[float | None, float | None]] = {}
        panels: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        targets = keyframe_targets(images, height, width)
        if targets:
            model = load_lpips(options.lpips_trunk, ctx.device)
            sides = {side: adherence(frames, targets, model, options.lpips_scale, ctx.device)
                     for side, frames in (("baseline", base), ("candidate", cand))}
            result.info.update(anchors={a: {s: sides[s][a] for s in sides} for a in targets},
                               lpips_trunk=options.lpips_trunk, lpips_scale=options.lpips_scale)
            for key in ("lpips", "ssim", "psnr"):
                values[f"keyframe_{key}"] = tuple(float(np.mean([sides[s][a][key] for a in targets]))
                                                  for s in ("candidate", "baseline"))
            panels += [(targets[a], anchor_frame(base, a), anchor_frame(cand, a)) for a in targets]
        if images.get("reference") is not None:
            profile = ReferenceProfile(images["reference"].pixels)
            per_side = {side: identity_distances(frames, profile) for side, frames in (("baseline", base),
                                                                                       ("candidate", cand))}
            values["reference_colour_distance"] = tuple(float(per_side[s][0].mean()) for s in ("candidate", "baseline"))
            shape_values = []
            for s in ("candidate", "baseline"):
                shape = per_side[s][1]
                shape_values.append(float(np.nanmean(shape)) if np.isfinite(shape).any() else None)
            values["reference_shape_distance"] = tuple(shape_values)
            result.info["reference"] = {
                "separable_subject": profile.separable, "subject_fraction": profile.subject_fraction,
                "frames_without_subject": {s: int((~np.isfinite(per_side[s][1])).sum()) for s in per_side},
            }
            if not profile.separable:
                result.info["reference"]["shape_distance"] = ("not computed: the reference has no subject on a plain "
                                                              "background (colour statistics of the whole image)")
            for s in per_side:
                result.series[f"reference_colour_distance.{s}"] = [float(v) for v in per_side[s][0]]
            mid = len(base) // 2
            panels.append((_fit(images["reference"].pixels, height, width), base[mid], cand[mid]))
        for name, (cand_value, base_value) in values.items():
            spec = self.metrics[name]
            result.metrics[name] = metric(cand_value, spec.higher_is_better, spec.unit)
            result.metrics[f"{name}.baseline"] = metric(base_value, spec.higher_is_better, spec.unit)
        if panels:
            png = Path(ctx.artifact_dir) / f"{ctx.pair.prompt_id}-s{ctx.pair.seed}-keyframes.png"
            _write_strip(png, panels)
            result.artifacts.append(relative_to_run(ctx, png))
        return result


def _conditioning(record: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["role"], c["sha256"]) for c in record.get("request", {}).get("conditioning", []) or []]


def _describe(inputs: list[tuple[str, str]]) -> str:
    return ", ".join(f"{role} {sha[:12]}" for role, sha in inputs) or "no image (t2va)"


def _fit(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(pixels).resize((width, height), Image.Resampling.LANCZOS))


def _write_strip(path: Path, panels: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """One row per input: the image as placed | the baseline's frame | the candidate's frame."""
    from h3.atomic import atomic_write_bytes
    import io

    from PIL import Image

    rows = [np.concatenate(row, axis=1) for row in panels]
    buffer = io.BytesIO()
    Image.fromarray(np.concatenate(rows, axis=0)).save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())
