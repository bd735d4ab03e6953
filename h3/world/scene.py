"""The procedural world: scenes of one or two shapes with synchronized sound, their captions and ground truth.

A scene is a plain record (:class:`Scene`) drawn from a seed: one or two shapes (circle, square, triangle) in named
colours, each moving in a named direction and bouncing off the walls a named number of times, each humming a tone
whose pitch is named (low / high); a click sounds at every bounce and at every appearance, at the same instant the
picture shows it. The background is plain, striped or checkered, and a textured background may pan.

Everything is a deterministic function of ``(seed, index)``: :func:`sample_scene` draws scene ``index`` of a stream
without drawing the ones before it, so a training run, a prompt suite and a test can name the same scene. The
caption grammar (:func:`caption`) and the ground truth (:meth:`Scene.ground_truth`) are written from the same
record the renderer (h3.world.render) draws, so they cannot disagree.

Held-out split: the colour-shape pairs in :data:`HELD_OUT_PAIRS` never appear in a training caption (in any clause);
the content check scores captions made only of them.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

import numpy as np

FPS = 24
SAMPLE_RATE = 32000
DEFAULT_SIZE = (128, 128)
DEFAULT_NUM_FRAMES = 124  # 5 s snapped to 17n+5, the shortest clip MiniMax-H3 generates

# Saturated named colours, far apart in RGB (pairwise distance >= 0.55) and far from the dark, unsaturated
# backgrounds (brightness <= 0.45), so a nearest-colour segmentation separates them (h3.world.detect).
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.92, 0.12, 0.12),
    "green": (0.15, 0.80, 0.20),
    "blue": (0.15, 0.35, 0.95),
    "yellow": (0.95, 0.85, 0.10),
    "purple": (0.70, 0.20, 0.90),
    "white": (0.95, 0.95, 0.95),
}
SHAPES = ("circle", "square", "triangle")
# Unit direction in image coordinates (x right, y down).
DIRECTIONS: dict[str, tuple[int, int]] = {
    "left to right": (1, 0),
    "right to left": (-1, 0),
    "top to bottom": (0, 1),
    "bottom to top": (0, -1),
}
# Tone frequencies with a whole number of periods per audio-VAE hop (800 samples at 32 kHz: 10 and 25 periods), so a
# steady tone looks the same in every latent frame.
PITCHES: dict[str, float] = {"low": 400.0, "high": 1000.0}
BOUNCE_WORDS = {1: "once", 2: "twice", 3: "three times"}
BACKGROUNDS = ("plain", "striped", "checkered")
PANS = ("left", "right")
HELD_OUT_PAIRS: frozenset[tuple[str, str]] = frozenset({
    ("red", "triangle"), ("green", "circle"), ("blue", "square"),
    ("yellow", "triangle"), ("purple", "circle"), ("white", "square"),
})
TRAIN_PAIRS = tuple(sorted((c, s) for c in COLOURS for s in SHAPES if (c, s) not in HELD_OUT_PAIRS))
HELDOUT_PAIRS_SORTED = tuple(sorted(HELD_OUT_PAIRS))

TWO_SHAPE_SHARE = 0.3
"""The chance that a draw has two shapes (one otherwise): the prompt suites', and the training pool's by default. A
scene whose events fall too close together is drawn again, which two-shape draws need more often, so the realized share
is lower: between 15 and 30 % of 600 scenes at 0.3, and more than twice that at 0.6 (tests/test_train.py). Two-shape scenes are where the trained DiT fails (runs 10-12: held-out colour
right on 1 of 4 two-shape clips against 10 of 12 one-shape ones); a pool can weigh them more."""
TONE_AMPLITUDE = 0.2
CLICK_AMPLITUDE = 0.5
CLICK_FREQUENCY = 3000.0  # above both tones, so a high-pass envelope sees clicks only
CLICK_DECAY_S = 0.004
CLICK_GRID = 800
"""A click starts on the sample grid of the audio VAE's latent frames (800 samples, 25 ms at 32 kHz): at the grid
point nearest its event, at most 12.5 ms (0.3 of a video frame) from it, well inside the content check's 2-frame sync
tolerance. The tiny audio VAE writes each latent frame's 800 samples from a handful of learned waveforms; a click
that could start at any of 800 offsets, with a 3 kHz carrier whose phase flips every 5 samples, is a shape those
cannot hold, and the L2-trained decoder averaged clicks away to silence (no onset in any reconstruction of training
run 4). On the grid, one waveform holds every click."""
TONE_ATTACK_S = 0.01


@dataclass
class ShapeSpec:
    colour: str
    shape: str
    direction: str
    pitch: str
    bounces: int
    appears: bool
    appear_t: float
    size: float
    """Half extent in pixels: circle radius, half side of the square, half side of the triangle's base."""
    lane: float
    """The coordinate across the motion axis, in pixels (constant)."""
    start_offset: float
    """Distance from the starting wall at the appear time, in pixels, along the motion axis."""
    distance: float
    """Distance travelled from the appear time to the end of the clip, in pixels (reflections unfolded)."""


@dataclass
class Scene:
    seed: int
    index: int
    shapes: list[ShapeSpec]
    background: str
    background_rgb: tuple[float, float, float]
    background_rgb2: tuple[float, float, float]
    texture_period: float
    pan: str | None
    pan_speed: float
    """Pixels per second the background texture moves (camera panning left moves the picture right)."""
    height: int = DEFAULT_SIZE[0]
    width: int = DEFAULT_SIZE[1]
    num_frames: int = DEFAULT_NUM_FRAMES
    split: str = "train"

    @property
    def duration(self) -> float:
        return self.num_frames / FPS

    def caption(self, refer_first: bool = False) -> str:
        return caption(self, refer_first)

    def axis_range(self, spec: ShapeSpec) -> tuple[float, float]:
        """The (low, high) centre coordinate along the shape's motion axis: the walls it bounces off."""
        extent = self.width if DIRECTIONS[spec.direction][0] else self.height
        margin = spec.size + 2.0
        return margin, extent - margin

    def positions(self, spec: ShapeSpec, times: np.ndarray) -> np.ndarray:
        """Centre (x, y) in pixels at ``times`` (seconds), float64 (len(times), 2); before appearing, its appear spot."""
        lo, hi = self.axis_range(spec)
        span = hi - lo
        speed = spec.distance / max(self.duration - spec.appear_t, 1e-9)
        travelled = spec.start_offset + speed * np.clip(np.asarray(times, np.float64) - spec.appear_t, 0.0, None)
        fold = np.floor(travelled / span)
        rem = travelled - fold * span
        from_start = np.where(fold % 2 == 0, rem, span - rem)
        dx, dy = DIRECTIONS[spec.direction]
        sign = dx + dy
        along = lo + from_start if sign > 0 else hi - from_start
        out = np.empty((len(along), 2), np.float64)
        if dx:
            out[:, 0], out[:, 1] = along, spec.lane
        else:
            out[:, 0], out[:, 1] = spec.lane, along
        return out

    def bounce_times(self, spec: ShapeSpec) -> list[float]:
        lo, hi = self.axis_range(spec)
        span = hi - lo
        speed = spec.distance / max(self.duration - spec.appear_t, 1e-9)
        times, wall = [], span
        while wall <= spec.start_offset + spec.distance + 1e-9:
            times.append(spec.appear_t + (wall - spec.start_offset) / speed)
            wall += span
        return times

    def events(self) -> list[dict]:
        """Every audible event: bounces and appearances, sorted by time."""
        out = []
        for k, spec in enumerate(self.shapes):
            if spec.appears:
                out.append({"t": spec.appear_t, "kind": "appear", "shape": k})
            out.extend({"t": t, "kind": "bounce", "shape": k} for t in self.bounce_times(spec))
        return sorted(out, key=lambda e: (e["t"], e["shape"]))

    def ground_truth(self, trajectories: bool = True) -> dict:
        """What the caption names and what the renderer draws: colours, shapes, directions, pitches, events, and
        (with ``trajectories``) the per-frame centre of every shape."""
        frame_times = np.arange(self.num_frames) / FPS
        shapes = []
        for spec in self.shapes:
            entry = asdict(spec)
            entry["rgb"] = list(COLOURS[spec.colour])
            entry["frequency_hz"] = PITCHES[spec.pitch]
            entry["bounce_times"] = self.bounce_times(spec)
            if trajectories:
                visible = frame_times >= spec.appear_t
                pos = self.positions(spec, frame_times)
                entry["trajectory"] = [[round(x, 3), round(y, 3)] if v else None
                                       for (x, y), v in zip(pos.tolist(), visible)]
            shapes.append(entry)
        return {
            "seed": self.seed, "index": self.index, "split": self.split, "caption": self.caption(),
            "height": self.height, "width": self.width, "num_frames": self.num_frames, "fps": FPS,
            "sample_rate": SAMPLE_RATE, "background": self.background, "background_rgb": list(self.background_rgb),
            "background_rgb2": list(self.background_rgb2), "texture_period": self.texture_period, "pan": self.pan,
            "pan_speed": self.pan_speed, "shapes": shapes, "events": self.events(),
        }


REFERRED_SHAPE = "the shape in picture 1"
"""How a ref2va caption names the shape its reference image shows, instead of its colour and shape."""


def _clause(spec: ShapeSpec, first: bool, refer: bool = False) -> str:
    verb = "appears and moves" if spec.appears else "moves"
    subject = REFERRED_SHAPE if refer else f"a {spec.colour} {spec.shape}"
    text = f"{'' if first else 'then '}{subject} {verb} {spec.direction} while a {spec.pitch} tone hums"
    if spec.bounces:
        text += f"; it bounces {BOUNCE_WORDS[spec.bounces]}"
    return text


def caption(scene: Scene, refer_first: bool = False) -> str:
    """The caption grammar: one clause per shape, then the background ("a red circle moves left to right while a low
    tone hums; it bounces twice; the background is striped and the camera pans left"). With ``refer_first`` the first
    shape is named by its ref2va reference image ("the shape in picture 1 moves ...")."""
    parts = [_clause(spec, i == 0, refer_first and i == 0) for i, spec in enumerate(scene.shapes)]
    background = f"the background is {scene.background}"
    if scene.pan:
        background += f" and the camera pans {scene.pan}"
    return "; ".join(parts + [background])


def scene_rng(seed: int, index: int, salt: str = "scene") -> np.random.Generator:
    """An independent generator for scene ``index`` of stream ``seed`` (no draw depends on other scenes)."""
    digest = hashlib.sha256(f"h3.world/{salt}/{int(seed)}/{int(index)}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def sample_scene(seed: int, index: int, split: str = "train", height: int = DEFAULT_SIZE[0],
                 width: int = DEFAULT_SIZE[1], num_frames: int = DEFAULT_NUM_FRAMES,
                 max_shapes: int = 2, two_shape_share: float = TWO_SHAPE_SHARE) -> Scene:
    """Scene ``index`` of the stream ``seed``: training scenes use only :data:`TRAIN_PAIRS`, held-out scenes only
    :data:`HELD_OUT_PAIRS`. ``two_shape_share``: the chance of two shapes (when ``max_shapes`` allows them); the prompt
    suites use the default, a training pool may ask for more (``TrainConfig.pool_two_shape_share``)."""
    if not 0.0 <= two_shape_share <= 1.0:
        raise ValueError(f"two_shape_share must be in [0, 1], got {two_shape_share!r}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = scene_rng(seed, index, split)
    # Redraw (from the same stream, so still a function of (seed, index)) until every two events are apart enough
    # for a listener, and the detector, to tell them apart, and none falls at the very end of the clip.
    for _ in range(1000):
        scene = _draw_scene(rng, seed, index, split, height, width, num_frames, max_shapes, two_shape_share)
        times = [e["t"] for e in scene.events()]
        if all(b - a >= MIN_EVENT_GAP_S for a, b in zip(times, times[1:])) and \
                all(t <= scene.duration - MIN_EVENT_GAP_S for t in times):
            return scene
    raise RuntimeError(f"could not draw scene {index} of seed {seed} with separable events")


MIN_EVENT_GAP_S = 0.3


def _draw_scene(rng, seed, index, split, height, width, num_frames, max_shapes, two_shape_share) -> Scene:
    pairs = TRAIN_PAIRS if split == "train" else HELDOUT_PAIRS_SORTED
    scale = min(height, width) / 128.0
    n_shapes = 1 if max_shapes == 1 or rng.random() < 1.0 - two_shape_share else 2

    chosen: list[tuple[str, str]] = []
    while len(chosen) < n_shapes:
        pair = pairs[int(rng.integers(len(pairs)))]
        if all(pair[0] != c for c, _ in chosen):
            chosen.append(pair)

    directions = list(DIRECTIONS)
    specs: list[ShapeSpec] = []
    for k, (colour, shape) in enumerate(chosen):
        direction = directions[int(rng.integers(len(directions)))]
        bounces = int(rng.choice([0, 1, 2, 3], p=[0.3, 0.3, 0.25, 0.15]))
        appears = k == 1 or rng.random() < 0.25
        appear_t = float(rng.uniform(1.0, 2.5) if k == 1 else (rng.uniform(0.4, 1.5) if appears else 0.0))
        size = float(rng.uniform(12.0, 16.0) * scale)
        dx, _ = DIRECTIONS[direction]
        across = height if dx else width
        if n_shapes == 2 and len(specs) == 1 and (DIRECTIONS[specs[0].direction][0] != 0) == (dx != 0):
            # Same motion axis as the first shape: the other half of the frame, so the two never overlap.
            first_low = specs[0].lane < across / 2
            lane = float(rng.uniform(0.62, 0.75) if first_low else rng.uniform(0.25, 0.38)) * across
        elif n_shapes == 2 and k == 0:
            lane = float(rng.choice([rng.uniform(0.25, 0.38), rng.uniform(0.62, 0.75)])) * across
        else:
            lane = float(rng.uniform(0.3, 0.7)) * across
        extent = width if dx else height
        span = extent - 2 * (size + 2.0)
        start_offset = float(rng.uniform(0.0, 0.25)) * span
        to_wall = span - start_offset
        if bounces == 0:
            distance = float(rng.uniform(0.55, 0.9)) * to_wall
        else:
            distance = to_wall + (bounces - 1) * span + float(rng.uniform(0.3, 0.7)) * span
        specs.append(ShapeSpec(colour=colour, shape=shape, direction=direction,
                               pitch=("low", "high")[int(rng.integers(2))], bounces=bounces, appears=bool(appears),
                               appear_t=round(appear_t, 4), size=round(size, 3), lane=round(lane, 3),
                               start_offset=round(start_offset, 3), distance=round(distance, 3)))

    background = BACKGROUNDS[int(rng.choice(len(BACKGROUNDS), p=[0.5, 0.25, 0.25]))]
    level = float(rng.uniform(0.06, 0.28))
    tint = rng.uniform(-0.04, 0.04, size=3)
    rgb = tuple(float(np.clip(level + t, 0.0, 1.0)) for t in tint)
    step = float(rng.uniform(0.08, 0.15))
    rgb2 = tuple(float(np.clip(c + step, 0.0, 1.0)) for c in rgb)
    pan = None
    if background != "plain" and rng.random() < 0.5:
        pan = PANS[int(rng.integers(2))]
    return Scene(seed=int(seed), index=int(index), shapes=specs, background=background,
                 background_rgb=tuple(round(c, 4) for c in rgb), background_rgb2=tuple(round(c, 4) for c in rgb2),
                 texture_period=round(float(rng.uniform(14.0, 22.0)) * scale, 3), pan=pan,
                 pan_speed=round(float(rng.uniform(12.0, 30.0)) * scale, 3) if pan else 0.0,
                 height=height, width=width, num_frames=num_frames, split=split)


def sample_scenes(seed: int, count: int, split: str = "train", start: int = 0, **kwargs) -> list[Scene]:
    return [sample_scene(seed, start + i, split, **kwargs) for i in range(count)]


def scene_from_ground_truth(gt: dict) -> Scene:
    """Rebuild a scene from its :meth:`Scene.ground_truth` record (a prompt suite line carries one)."""
    shape_fields = ShapeSpec.__dataclass_fields__
    shapes = [ShapeSpec(**{k: v for k, v in s.items() if k in shape_fields}) for s in gt["shapes"]]
    return Scene(seed=gt["seed"], index=gt["index"], shapes=shapes, background=gt["background"],
                 background_rgb=tuple(gt["background_rgb"]), background_rgb2=tuple(gt["background_rgb2"]),
                 texture_period=gt["texture_period"], pan=gt["pan"], pan_speed=gt["pan_speed"],
                 height=gt["height"], width=gt["width"], num_frames=gt["num_frames"], split=gt["split"])


def caption_words() -> list[str]:
    """Every word the grammar can produce (the trained tokenizer's merges cover each as one token)."""
    words = {"a", "then", "appears", "and", "moves", "while", "tone", "hums", "it", "bounces", "the",
             "background", "is", "camera", "pans", "times", "to", "shape", "in", "picture", "1"}
    words |= set(COLOURS) | set(SHAPES) | set(PITCHES) | set(BACKGROUNDS) | set(PANS)
    for phrase in list(DIRECTIONS) + list(BOUNCE_WORDS.values()):
        words |= set(phrase.split())
    return sorted(words)


__all__ = [
    "BACKGROUNDS", "BOUNCE_WORDS", "CLICK_AMPLITUDE", "CLICK_DECAY_S", "CLICK_FREQUENCY", "COLOURS", "DIRECTIONS",
    "FPS", "HELD_OUT_PAIRS", "PITCHES", "SAMPLE_RATE", "SHAPES", "Scene", "ShapeSpec", "TONE_AMPLITUDE",
    "REFERRED_SHAPE", "TRAIN_PAIRS", "caption", "caption_words", "sample_scene", "sample_scenes", "scene_from_ground_truth",
    "scene_rng",
]
