"""A detector for the procedural world that knows nothing of the model: what a clip shows and sounds like.

The functional core the content check (bench/content_check/content_check.py) and a later gate share:

- :func:`track_colours` segments every frame by nearest named colour (RGB distance below :data:`COLOUR_TOL`; the
  world's backgrounds are dark and unsaturated), keeps the largest connected blob per colour and frame, and returns
  one :class:`ColourTrack` per colour that is present in enough frames: centroid, area, bounding-box fill ratio.
- :func:`classify_shape` names a blob by its fill ratio (a disc fills pi/4 of its box, a square all, a triangle half).
- :func:`initial_direction` and :func:`reversals` read the centroid track: the first half second's displacement and
  the frames where the motion along an axis turns back (bounces); :func:`appearance_time` the first visible frame.
- :func:`tone_pitches` measures the energy in the low (400 Hz) and high (1 kHz) tone bands by FFT;
  :func:`onset_times` finds clicks as rising edges of the energy envelope above 2 kHz.
- :func:`describe_clip` puts these together; :func:`score_clip` compares a description with what a caption names
  (:func:`parse_caption` inverts the caption grammar of h3.world.scene).

Everything is numpy/scipy on decoded frames (uint8 (T, H, W, 3)) and audio ((channels, N) float in [-1, 1]).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from h3.world.scene import BOUNCE_WORDS, COLOURS, DIRECTIONS, FPS, PITCHES, SHAPES

COLOUR_TOL = 0.35
"""Max RGB distance (0..1 per channel) from a named colour; the closest two named colours are 0.57 apart and a
pixel half-way between a shape and the background is >= 0.4 from the shape's colour, so edges stay unassigned."""
MIN_BLOB_AREA = 40
"""Pixels (at 128x128; scaled by area for other sizes) a blob needs to count as the shape in a frame."""
MIN_PRESENT_FRACTION = 0.2
"""A colour is in the clip when its blob is found in at least this fraction of frames (a shape that appears late
is visible for at least half the clip in the world's scenes)."""
SYNC_TOLERANCE_FRAMES = 2
TONE_BANDS = {name: (f * 0.9, f * 1.1) for name, f in PITCHES.items()}
TONE_REFERENCE_BAND = (100.0, 2000.0)
TONE_MIN_SHARE = 0.15
TONE_MIN_RMS = 0.01
CLICK_HIGHPASS_HZ = 2000.0
ONSET_MIN_GAP_S = 0.15
EDGE_GUARD_S = 0.04

_COLOUR_NAMES = list(COLOURS)
_PALETTE = np.array([COLOURS[c] for c in _COLOUR_NAMES], np.float32)


@dataclass
class ColourTrack:
    colour: str
    frames: np.ndarray
    """Frame indices where the colour's blob was found."""
    centroids: np.ndarray
    """(len(frames), 2) centroid (x, y) in pixels."""
    areas: np.ndarray
    fill_ratios: np.ndarray
    """Blob area over its bounding-box area, per frame (NaN where the blob touches the frame border)."""


def _colour_lut(tol: float) -> np.ndarray:
    """Nearest named colour (or -1) of every 64-level RGB bin centre: a pixel is labelled by its bin (max error 2/255
    per channel, far below the tolerance), so a clip labels with one table lookup per pixel."""
    levels = (np.arange(64, dtype=np.float32) * 4 + 1.5) / 255.0
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    dist = np.sqrt(((grid[:, None, :] - _PALETTE[None]) ** 2).sum(-1))
    nearest = dist.argmin(-1)
    return np.where(dist[np.arange(len(grid)), nearest] < tol, nearest, -1).astype(np.int8)


_LUTS: dict[float, np.ndarray] = {}


def label_colours(frames: np.ndarray, tol: float = COLOUR_TOL) -> np.ndarray:
    """(T, H, W) int8: index into the named colours of each pixel's nearest colour within ``tol``, else -1."""
    if tol not in _LUTS:
        _LUTS[tol] = _colour_lut(tol)
    q = np.asarray(frames, np.uint8) >> 2
    index = (q[..., 0].astype(np.int32) << 12) | (q[..., 1].astype(np.int32) << 6) | q[..., 2]
    return _LUTS[tol][index]


def track_colours(frames: np.ndarray, tol: float = COLOUR_TOL) -> dict[str, ColourTrack]:
    """One track per named colour present in the clip (see the module docstring)."""
    from scipy import ndimage

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be (T, H, W, 3), got {frames.shape}")
    num_frames, height, width, _ = frames.shape
    min_area = MIN_BLOB_AREA * (height * width) / (128 * 128)
    labels = label_colours(frames, tol)
    tracks = {}
    for ci, name in enumerate(_COLOUR_NAMES):
        mask = labels == ci
        if mask.sum() < min_area * num_frames * MIN_PRESENT_FRACTION:
            continue
        idx, cents, areas, fills = [], [], [], []
        for f in range(num_frames):
            if mask[f].sum() < min_area:
                continue
            comp, n = ndimage.label(mask[f])
            sizes = ndimage.sum_labels(mask[f], comp, index=np.arange(1, n + 1))
            best = int(np.argmax(sizes)) + 1
            if sizes[best - 1] < min_area:
                continue
            ys, xs = np.nonzero(comp == best)
            idx.append(f)
            cents.append((xs.mean() + 0.5, ys.mean() + 0.5))
            areas.append(float(len(xs)))
            x0, x1, y0, y1 = xs.min(), xs.max(), ys.min(), ys.max()
            touches = x0 == 0 or y0 == 0 or x1 == width - 1 or y1 == height - 1
            fills.append(np.nan if touches else len(xs) / ((x1 - x0 + 1) * (y1 - y0 + 1)))
        if len(idx) >= MIN_PRESENT_FRACTION * num_frames:
            tracks[name] = ColourTrack(name, np.array(idx), np.array(cents, np.float64), np.array(areas),
                                       np.array(fills, np.float64))
    return tracks


def classify_shape(track: ColourTrack) -> str | None:
    """'circle', 'square' or 'triangle' from the median fill ratio (pi/4, 1, 1/2); None without a clean frame."""
    fills = track.fill_ratios[~np.isnan(track.fill_ratios)]
    if len(fills) == 0:
        return None
    fill = float(np.median(fills))
    if fill < 0.64:
        return "triangle"
    return "circle" if fill < 0.89 else "square"


def initial_direction(track: ColourTrack, window_s: float = 0.5, min_move_px: float = 3.0) -> str | None:
    """The named direction of the track's first ``window_s`` of motion, or None when it barely moves."""
    keep = _unoccluded(track)
    frames, cents = track.frames[keep], track.centroids[keep]
    if len(frames) < 4:
        return None
    start = frames[0]
    head = cents[frames <= start + 2]
    late = (frames >= start + window_s * FPS - 2) & (frames <= start + window_s * FPS + 2)
    if not late.any():
        return None
    move = np.median(cents[late], axis=0) - np.median(head, axis=0)
    axis = int(np.argmax(np.abs(move)))
    if abs(move[axis]) < min_move_px:
        return None
    sign = int(np.sign(move[axis]))
    for name, (dx, dy) in DIRECTIONS.items():
        if (dx, dy)[axis] == sign and (dx, dy)[1 - axis] == 0:
            return name
    return None


def _unoccluded(track: ColourTrack, min_share: float = 0.7) -> np.ndarray:
    """Frames whose blob keeps most of its usual area: an overlapping shape moves a partly hidden blob's centroid."""
    return track.areas >= min_share * float(np.median(track.areas))


def reversals(track: ColourTrack, axis: int, window: int = 5, min_swing_px: float = 3.0) -> list[float]:
    """Times (s) where the centroid's motion along ``axis`` turns back: a frame that is the extreme of the
    ``window`` frames on either side and at least ``min_swing_px`` beyond both ends of that window."""
    keep = _unoccluded(track)
    frames, pos = track.frames[keep], track.centroids[keep, axis]
    if len(frames) < 2 * window + 1:
        return []
    dense = np.interp(np.arange(frames[0], frames[-1] + 1), frames, pos)
    out: list[float] = []
    for i in range(window, len(dense) - window):
        seg, centre = dense[i - window:i + window + 1], dense[i]
        if centre == seg.max():
            swing = min(centre - seg[0], centre - seg[-1])
        elif centre == seg.min():
            swing = min(seg[0] - centre, seg[-1] - centre)
        else:
            continue
        t = (frames[0] + i) / FPS
        if swing >= min_swing_px and (not out or t - out[-1] > 2 * window / FPS):
            out.append(t)
    return out


def appearance_time(track: ColourTrack, min_delay_s: float = 0.15) -> float | None:
    """When the track's blob first shows, if that is after the clip's start (an appearance), else None."""
    t = track.frames[0] / FPS
    return t if t >= min_delay_s else None


def _spectrum(audio: np.ndarray, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    mono = np.asarray(audio, np.float64)
    mono = mono.mean(0) if mono.ndim == 2 else mono
    power = np.abs(np.fft.rfft(mono)) ** 2
    return np.fft.rfftfreq(len(mono), 1.0 / sample_rate), power


def tone_pitches(audio: np.ndarray, sample_rate: int) -> dict[str, float]:
    """Share of the 100 Hz - 2 kHz energy in each named tone band."""
    freqs, power = _spectrum(audio, sample_rate)
    ref = power[(freqs >= TONE_REFERENCE_BAND[0]) & (freqs <= TONE_REFERENCE_BAND[1])].sum()
    n = max(len(freqs) * 2 - 2, 1)
    shares = {}
    for name, (lo, hi) in TONE_BANDS.items():
        band = power[(freqs >= lo) & (freqs <= hi)].sum()
        # Parseval: band power -> RMS of the band-limited signal (one-sided spectrum, so twice the bins).
        rms = np.sqrt(2 * band) / n
        shares[name] = float(band / ref) if ref > 0 and rms >= TONE_MIN_RMS else 0.0
    return shares


def detected_pitches(audio: np.ndarray, sample_rate: int) -> set[str]:
    return {name for name, share in tone_pitches(audio, sample_rate).items() if share >= TONE_MIN_SHARE}


def onset_times(audio: np.ndarray, sample_rate: int, hop_s: float = 0.001, rel_threshold: float = 8.0,
                abs_threshold: float = 0.02) -> list[float]:
    """Click onsets (s): rising edges of the >2 kHz amplitude envelope (1 ms hops) above ``rel_threshold`` times
    its median and ``abs_threshold``, at least :data:`ONSET_MIN_GAP_S` apart."""
    mono = np.asarray(audio, np.float64)
    mono = mono.mean(0) if mono.ndim == 2 else mono
    spec = np.fft.rfft(mono)
    freqs = np.fft.rfftfreq(len(mono), 1.0 / sample_rate)
    spec[freqs < CLICK_HIGHPASS_HZ] = 0
    high = np.fft.irfft(spec, len(mono))
    hop = max(1, int(round(hop_s * sample_rate)))
    frames = len(high) // hop
    env = np.sqrt((high[: frames * hop].reshape(frames, hop) ** 2).mean(1))
    threshold = max(rel_threshold * float(np.median(env)), abs_threshold)
    above = env > threshold
    out: list[float] = []
    for i in np.nonzero(above[1:] & ~above[:-1])[0] + 1:
        t = i * hop / sample_rate
        if not out or t - out[-1] >= ONSET_MIN_GAP_S:
            out.append(t)
    duration = len(mono) / sample_rate
    # A track starts and stops abruptly: the edges are no events.
    return [t for t in out if EDGE_GUARD_S <= t <= duration - EDGE_GUARD_S]


@dataclass
class ShapeReading:
    colour: str
    shape: str | None
    direction: str | None
    bounces: list[float]
    appears_at: float | None


@dataclass
class ClipDescription:
    shapes: dict[str, ShapeReading]
    pitches: set[str]
    pitch_shares: dict[str, float]
    onsets: list[float]
    num_frames: int

    @property
    def video_events(self) -> list[float]:
        out = []
        for reading in self.shapes.values():
            out.extend(reading.bounces)
            if reading.appears_at is not None:
                out.append(reading.appears_at)
        return sorted(out)


def describe_clip(frames: np.ndarray, audio: np.ndarray, sample_rate: int) -> ClipDescription:
    tracks = track_colours(frames)
    shapes = {}
    for name, track in tracks.items():
        direction = initial_direction(track)
        axis = 0 if direction is None or DIRECTIONS[direction][0] else 1
        shapes[name] = ShapeReading(colour=name, shape=classify_shape(track), direction=direction,
                                    bounces=reversals(track, axis), appears_at=appearance_time(track))
    return ClipDescription(shapes=shapes, pitches=detected_pitches(audio, sample_rate),
                           pitch_shares=tone_pitches(audio, sample_rate), onsets=onset_times(audio, sample_rate),
                           num_frames=int(np.asarray(frames).shape[0]))


def match_events(video: list[float], audio: list[float], tolerance_s: float) -> tuple[int, int, int]:
    """Greedy one-to-one matching in time order: (matched, unmatched video events, unmatched audio onsets)."""
    used, matched = set(), 0
    for t in sorted(video):
        best = None
        for j, a in enumerate(audio):
            if j not in used and abs(a - t) <= tolerance_s and (best is None or abs(a - t) < abs(audio[best] - t)):
                best = j
        if best is not None:
            used.add(best)
            matched += 1
    return matched, len(video) - matched, len(audio) - matched


_CLAUSE = re.compile(
    r"^(?:then )?(?:a (?P<colour>\w+) (?P<shape>\w+)|(?P<referred>the shape in picture 1)) (?P<appears>appears and )?"
    r"moves (?P<direction>\w+ to \w+) while a (?P<pitch>\w+) tone hums$")
_BOUNCE = re.compile(r"^it bounces (?P<count>once|twice|three times)$")


def parse_caption(text: str, reference: tuple[str, str] | None = None) -> list[dict]:
    """The shapes a world caption names (inverse of h3.world.scene.caption); ValueError if it is not one.
    ``reference`` is the (colour, shape) a ref2va caption's "the shape in picture 1" stands for."""
    shapes: list[dict] = []
    words = {w: n for n, w in BOUNCE_WORDS.items()}
    for part in (p.strip() for p in text.strip().split(";")):
        if part.startswith("the background is"):
            continue
        m = _CLAUSE.match(part)
        if m and m["referred"]:
            if reference is None:
                raise ValueError(f"{part!r} refers to a reference image; pass the reference's (colour, shape)")
            m = _CLAUSE.match(part.replace("the shape in picture 1", f"a {reference[0]} {reference[1]}", 1))
        if m:
            if m["colour"] not in COLOURS or m["shape"] not in SHAPES or m["direction"] not in DIRECTIONS \
                    or m["pitch"] not in PITCHES:
                raise ValueError(f"not a world caption clause: {part!r}")
            shapes.append({"colour": m["colour"], "shape": m["shape"], "direction": m["direction"],
                           "pitch": m["pitch"], "appears": bool(m["appears"]), "bounces": 0})
            continue
        m = _BOUNCE.match(part)
        if m and shapes:
            shapes[-1]["bounces"] = words[m["count"]]
            continue
        raise ValueError(f"not a world caption clause: {part!r}")
    if not shapes:
        raise ValueError(f"not a world caption: {text!r}")
    return shapes


@dataclass
class ClipScore:
    colour: bool
    shape: bool
    direction: bool
    pitch: bool
    bounces: bool
    sync: bool | None
    """None when the caption names no event (nothing to synchronize)."""
    details: dict = field(default_factory=dict)


def score_clip(description: ClipDescription, expected: list[dict],
               tolerance_frames: int = SYNC_TOLERANCE_FRAMES) -> ClipScore:
    """Compare a clip's description with the shapes a caption names (:func:`parse_caption`)."""
    named = {s["colour"]: s for s in expected}
    seen = description.shapes
    colour = set(seen) == set(named)
    shape = all(c in seen and seen[c].shape == s["shape"] for c, s in named.items())
    direction = all(c in seen and seen[c].direction == s["direction"] for c, s in named.items())
    bounces = all(c in seen and len(seen[c].bounces) == s["bounces"] for c, s in named.items())
    pitch = description.pitches == {s["pitch"] for s in expected}
    n_events = sum(s["bounces"] + int(s["appears"]) for s in expected)
    sync = None
    matched = unmatched_v = unmatched_a = 0
    if n_events:
        video = description.video_events
        matched, unmatched_v, unmatched_a = match_events(video, description.onsets, tolerance_frames / FPS)
        sync = bool(video) and unmatched_v == 0 and unmatched_a == 0
    details = {
        "colours_seen": sorted(seen), "colours_named": sorted(named),
        "shapes_seen": {c: r.shape for c, r in seen.items()},
        "directions_seen": {c: r.direction for c, r in seen.items()},
        "bounces_seen": {c: [round(t, 3) for t in r.bounces] for c, r in seen.items()},
        "appear_seen": {c: r.appears_at for c, r in seen.items()},
        "pitches_seen": sorted(description.pitches), "pitch_shares": description.pitch_shares,
        "onsets": [round(t, 3) for t in description.onsets], "events_named": n_events,
        "sync_matched": matched, "sync_unmatched_video": unmatched_v, "sync_unmatched_audio": unmatched_a,
    }
    return ClipScore(colour=colour, shape=shape, direction=direction, pitch=pitch, bounces=bounces, sync=sync,
                     details=details)


__all__ = [
    "COLOUR_TOL", "ClipDescription", "ClipScore", "ColourTrack", "SYNC_TOLERANCE_FRAMES", "ShapeReading",
    "appearance_time", "classify_shape", "describe_clip", "detected_pitches", "initial_direction", "label_colours",
    "match_events", "onset_times", "parse_caption", "reversals", "score_clip", "tone_pitches", "track_colours",
]
