"""Render scenes (h3.world.scene) to video frames and stereo audio with torch, batched, on any device.

Shapes are drawn from signed distance functions with one pixel of anti-aliasing; the background is a plain colour or
a striped / checkered texture that scrolls when the camera pans. The soundtrack is the sum of one tone per visible
shape (phase-continuous from t = 0, 10 ms attack at its appearance) and a decaying 3 kHz click at every event, the
same event times the picture shows (a bounce is the instant the centre reaches the wall). Both channels carry the same
signal.

Rendering is a function of the scene records alone; on the GPU it renders a training batch in milliseconds.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from h3.world.scene import (
    CLICK_AMPLITUDE, CLICK_DECAY_S, CLICK_FREQUENCY, CLICK_GRID, COLOURS, DIRECTIONS, FPS, PITCHES, SAMPLE_RATE, SHAPES,
    TONE_AMPLITUDE, TONE_ATTACK_S, Scene,
)

MAX_SHAPES = 2
_SHAPE_INDEX = {name: i for i, name in enumerate(SHAPES)}


def _shape_tables(scenes: list[Scene], num_frames: int, device) -> dict[str, torch.Tensor]:
    batch = len(scenes)
    times = np.arange(num_frames) / FPS
    centres = np.zeros((batch, MAX_SHAPES, num_frames, 2), np.float32)
    visible = np.zeros((batch, MAX_SHAPES, num_frames), bool)
    rgb = np.zeros((batch, MAX_SHAPES, 3), np.float32)
    kind = np.zeros((batch, MAX_SHAPES), np.int64)
    size = np.ones((batch, MAX_SHAPES), np.float32)
    for b, scene in enumerate(scenes):
        for k, spec in enumerate(scene.shapes):
            centres[b, k] = scene.positions(spec, times)
            visible[b, k] = times >= spec.appear_t
            rgb[b, k] = COLOURS[spec.colour]
            kind[b, k] = _SHAPE_INDEX[spec.shape]
            size[b, k] = spec.size
    as_t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return {"centres": as_t(centres), "visible": as_t(visible), "rgb": as_t(rgb), "kind": as_t(kind),
            "size": as_t(size)}


def _sdf(kind: torch.Tensor, px: torch.Tensor, py: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """Signed distance (pixels, negative inside) of a circle / square / upward triangle centred at the origin."""
    circle = torch.sqrt(px * px + py * py) - size
    qx, qy = px.abs() - size, py.abs() - size
    square = torch.sqrt(qx.clamp(min=0) ** 2 + qy.clamp(min=0) ** 2) + torch.maximum(qx, qy).clamp(max=0)
    # Equilateral triangle of half side ``r`` pointing up (Quilez's exact SDF, y up), its bounding box centred on the
    # origin: the SDF's centroid sits r / (2 sqrt 3) below the box centre.
    r = size * 1.15
    k = math.sqrt(3.0)
    x = px.abs() - r
    y = (-py + r / (2 * k)) + r / k
    fold = (x + k * y) > 0
    nx = torch.where(fold, (x - k * y) / 2, x)
    ny = torch.where(fold, (-k * x - y) / 2, y)
    nx = nx - torch.maximum(nx, -2 * r).clamp(max=0)
    triangle = -torch.sqrt(nx * nx + ny * ny) * torch.sign(ny)
    return torch.where(kind == 0, circle, torch.where(kind == 1, square, triangle))


@torch.no_grad()
def render_video(scenes: list[Scene], device="cpu", frame_chunk: int = 32, frame_start: int = 0,
                 frame_count: int | None = None, return_mask: bool = False):
    """uint8 frames (B, T, H, W, 3) of ``scenes`` (all of one size and length), frames ``frame_start`` to
    ``frame_start + frame_count``; with ``return_mask`` also the shapes' coverage (B, T, H, W) in [0, 1]."""
    first = scenes[0]
    height, width, total = first.height, first.width, first.num_frames
    if any((s.height, s.width, s.num_frames) != (height, width, total) for s in scenes):
        raise ValueError("render_video renders scenes of one size and frame count per batch")
    num_frames = total - frame_start if frame_count is None else frame_count
    tables = _shape_tables(scenes, total, device)
    batch = len(scenes)
    ys = torch.arange(height, device=device, dtype=torch.float32) + 0.5
    xs = torch.arange(width, device=device, dtype=torch.float32) + 0.5
    bg1 = torch.tensor([s.background_rgb for s in scenes], device=device, dtype=torch.float32)
    bg2 = torch.tensor([s.background_rgb2 for s in scenes], device=device, dtype=torch.float32)
    texture = torch.tensor([("plain", "striped", "checkered").index(s.background) for s in scenes], device=device)
    period = torch.tensor([s.texture_period for s in scenes], device=device, dtype=torch.float32)
    # Camera panning left moves the picture right (+x), and the other way round.
    pan_velocity = torch.tensor([(s.pan_speed if s.pan == "left" else -s.pan_speed) if s.pan else 0.0
                                 for s in scenes], device=device, dtype=torch.float32)
    out = torch.empty((batch, num_frames, height, width, 3), dtype=torch.uint8, device=device)
    mask = torch.zeros((batch, num_frames, height, width), device=device) if return_mask else None
    for start in range(frame_start, frame_start + num_frames, frame_chunk):
        stop = min(frame_start + num_frames, start + frame_chunk)
        t = torch.arange(start, stop, device=device, dtype=torch.float32) / FPS  # (T,)
        shift = pan_velocity[:, None] * t[None]  # (B, T)
        u = (xs[None, None, None, :] - shift[:, :, None, None]) / period[:, None, None, None]
        v = ys[None, None, :, None] / period[:, None, None, None]
        stripes = torch.floor(u).remainder(2)
        checks = (torch.floor(u) + torch.floor(v)).remainder(2)
        tex = torch.where(texture[:, None, None, None] == 1, stripes.expand(-1, -1, height, -1),
                          torch.where(texture[:, None, None, None] == 2, checks, torch.zeros_like(checks)))
        frame = bg1[:, None, None, None, :] + tex[..., None] * (bg2 - bg1)[:, None, None, None, :]
        for k in range(MAX_SHAPES):
            c = tables["centres"][:, k, start:stop]  # (B, T, 2)
            px = xs[None, None, None, :] - c[..., 0, None, None]
            py = ys[None, None, :, None] - c[..., 1, None, None]
            dist = _sdf(tables["kind"][:, k, None, None, None], px, py, tables["size"][:, k, None, None, None])
            cover = (0.5 - dist).clamp(0.0, 1.0) * tables["visible"][:, k, start:stop, None, None]
            frame = frame + cover[..., None] * (tables["rgb"][:, k, None, None, None, :] - frame)
            if mask is not None:
                mask[:, start - frame_start:stop - frame_start] = torch.maximum(
                    mask[:, start - frame_start:stop - frame_start], cover)
        out[:, start - frame_start:stop - frame_start] = (frame.clamp(0, 1) * 255.0).round().to(torch.uint8)
    return (out, mask) if return_mask else out


def reference_still(scene: Scene) -> Scene:
    """The ref2va reference of a scene's first shape as a one-shape scene: that shape, still, centred on a plain dark
    background."""
    from dataclasses import replace

    spec = scene.shapes[0]
    dx = DIRECTIONS[spec.direction][0]
    lo, hi = scene.axis_range(spec)
    centre = replace(spec, direction="left to right" if dx else "top to bottom", bounces=0, appears=False,
                     appear_t=0.0, lane=(scene.height if dx else scene.width) / 2, start_offset=(hi - lo) / 2,
                     distance=0.0)
    return replace(scene, shapes=[centre], background="plain", background_rgb=REFERENCE_BACKGROUND,
                   background_rgb2=REFERENCE_BACKGROUND, pan=None, pan_speed=0.0)


def reference_images(scenes: list[Scene], device="cpu") -> torch.Tensor:
    """uint8 (B, H, W, 3): the reference image (:func:`reference_still`) of every scene."""
    return render_video([reference_still(s) for s in scenes], device=device, frame_count=1)[:, 0]


def reference_image(scene: Scene, device="cpu") -> torch.Tensor:
    return reference_images([scene], device)[0]


REFERENCE_BACKGROUND = (0.12, 0.12, 0.12)


def click_kernel(sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """One click: a 3 kHz sine with a 4 ms exponential decay, 20 ms long, starting at phase 0."""
    n = int(0.02 * sample_rate)
    t = torch.arange(n, dtype=torch.float64) / sample_rate
    return (CLICK_AMPLITUDE * torch.exp(-t / CLICK_DECAY_S) * torch.sin(2 * math.pi * CLICK_FREQUENCY * t)).float()


@torch.no_grad()
def render_audio(scenes: list[Scene], device="cpu", num_samples: int | None = None, return_click_mask: bool = False):
    """float32 stereo audio (B, 2, N) of ``scenes`` at 32 kHz; N defaults to the clip's duration in samples. With
    ``return_click_mask`` also (B, N) in {0, 1}: the samples a click sounds in (what the audio VAE's loss weighs)."""
    first = scenes[0]
    if num_samples is None:
        num_samples = int(round(first.num_frames / FPS * SAMPLE_RATE))
    batch = len(scenes)
    t = torch.arange(num_samples, device=device, dtype=torch.float64) / SAMPLE_RATE
    signal = torch.zeros((batch, num_samples), device=device, dtype=torch.float64)
    impulses = torch.zeros((batch, num_samples), device=device, dtype=torch.float32)
    for b, scene in enumerate(scenes):
        for spec in scene.shapes:
            freq = PITCHES[spec.pitch]
            envelope = ((t - spec.appear_t) / TONE_ATTACK_S).clamp(0.0, 1.0)
            signal[b] += TONE_AMPLITUDE * envelope * torch.sin(2 * math.pi * freq * t)
        for event in scene.events():
            index = int(round(event["t"] * SAMPLE_RATE / CLICK_GRID)) * CLICK_GRID
            if 0 <= index < num_samples:
                impulses[b, index] += 1.0
    kernel = click_kernel(SAMPLE_RATE).to(device)
    clicks = torch.nn.functional.conv1d(
        torch.nn.functional.pad(impulses[:, None], (kernel.numel() - 1, 0)), kernel.flip(0)[None, None])[:, 0]
    mono = (signal.float() + clicks).clamp(-1.0, 1.0)
    stereo = mono[:, None].expand(-1, 2, -1).contiguous()
    if not return_click_mask:
        return stereo
    window = torch.ones(1, 1, kernel.numel(), device=device)
    mask = torch.nn.functional.conv1d(torch.nn.functional.pad(impulses[:, None], (kernel.numel() - 1, 0)), window)
    return stereo, (mask[:, 0] > 0).float()


__all__ = ["click_kernel", "reference_image", "reference_images", "reference_still", "render_audio", "render_video"]
