"""What one generation request asks for, and the device it runs on: the clip's duration and canvas rules
(:func:`resolve_request`), the default canvases, and ``--device`` checking (:func:`check_device`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from h3.conditioning import ROLES, ConditioningError, ImageInput, workflow_of
from h3.record import ConditioningImage

FPS = 24
MIN_SECONDS, MAX_SECONDS = 5.0, 15.0
MAX_FRAMES = 345
"""The longest clip: 17 * 20 + 5 frames = 14.375 s (the next, 362 frames, is 15.083 s)."""
# 128x128, not 64x64: libx264 output was seen to vary run to run on 64x64 frames (uninitialized reads on tiny
# frames; bench notes in h3/media.py), never at 128 or 256.
TINY_DEFAULT_SIZE = (128, 128)

# MiniMax-H3's own 16:9 canvas (diffusers' resolve_canvas_size(16, 9) with the released short edge 768).
FULL_DEFAULT_SIZE = (768, 1344)


class RequestError(ValueError):
    """A generation request H3 cannot run (shape, duration, seed)."""


class DeviceError(RequestError):
    """A ``--device`` this process cannot run on (not a device string torch knows, not a CPU or a CUDA GPU, or a GPU
    this machine does not have); the message says which and what there is."""


def check_device(device: str | None) -> str:
    """``device`` as the runtime will use it (None: the GPU if there is one, else the CPU), or a DeviceError in one
    sentence: checked before any weight loads, so a wrong ``--device`` costs no build and shows no traceback."""
    if device is None:
        return default_device()
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise DeviceError(f"--device {device!r} is not a device; use 'cpu' or 'cuda' (or 'cuda:N')") from None
    if parsed.type == "cpu":
        return str(device)
    if parsed.type != "cuda":
        raise DeviceError(f"--device {device!r}: h3 runs on 'cpu' or 'cuda' (or 'cuda:N'), not {parsed.type!r}")
    if not torch.cuda.is_available():
        built = f"torch {torch.__version__}" + (f" built with CUDA {torch.version.cuda}" if torch.version.cuda
                                                else " built without CUDA")
        raise DeviceError(f"--device {device!r}: no CUDA GPU is visible to this process ({built}); use --device cpu")
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise DeviceError(f"--device {device!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    return str(device)


@dataclass
class GenerateRequest:
    prompt: str
    seed: int
    num_frames: int | None = None
    seconds: float | None = None
    height: int | None = None
    width: int | None = None
    prompt_id: str | None = None
    first_frame: ImageInput | None = None
    """Keyframe the clip starts from (fl2va)."""
    last_frame: ImageInput | None = None
    """Keyframe the clip ends on (fl2va)."""
    reference: ImageInput | None = None
    """Reference image whose subject the clip keeps (ref2va)."""

    @property
    def workflow(self) -> str:
        return workflow_of(self.first_frame, self.last_frame, self.reference)

    def images(self) -> dict[str, ImageInput]:
        """The image inputs present, by role, in role order."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role) is not None}

    def conditioning_spec(self) -> list[ConditioningImage]:
        return [ConditioningImage(role=role, sha256=image.sha256, width=image.width, height=image.height,
                                  media_type=image.media_type) for role, image in self.images().items()]


def snap_num_frames(num_frames: int) -> int:
    """Snap up to the next ``17 * n + 5`` the video VAE can decode (diffusers' own arithmetic)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import align_num_frames

    return align_num_frames(num_frames, 17, 5)


def resolve_request(request: GenerateRequest, default_size: tuple[int, int], canvas_multiple: int = 32) -> tuple[int, int, int]:
    """(num_frames, height, width) H3 will generate for ``request``, or a RequestError that says why not."""
    if not isinstance(request.prompt, str) or not request.prompt.strip():
        raise RequestError("the prompt is empty")
    if not isinstance(request.seed, int) or isinstance(request.seed, bool) or request.seed < 0:
        raise RequestError(f"seed must be a non-negative integer, got {request.seed!r}")
    if request.seed >= 2**63:
        raise RequestError(f"seed must be below 2**63, got {request.seed}")
    if request.num_frames is not None and request.seconds is not None:
        raise RequestError("give either num_frames or seconds, not both")
    if request.seconds is not None:
        seconds = request.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise RequestError(f"seconds must be a finite number, got {seconds!r}")
        if not seconds > 0:
            raise RequestError(f"seconds must be positive, got {seconds}")
        if seconds > MAX_SECONDS:  # checked before seconds * FPS, which overflows for 1e308
            raise RequestError(f"MiniMax-H3 generates {MIN_SECONDS:g} to {MAX_SECONDS:g} s, got {seconds:g} s")
        wanted = max(1, int(round(seconds * FPS)))
    elif request.num_frames is not None:
        if isinstance(request.num_frames, bool) or not isinstance(request.num_frames, int):
            raise RequestError(f"num_frames must be an integer, got {request.num_frames!r}")
        if request.num_frames < 1:
            raise RequestError(f"num_frames must be positive, got {request.num_frames}")
        wanted = int(request.num_frames)
    else:
        wanted = int(MIN_SECONDS * FPS)
    snapped = snap_num_frames(wanted)
    if request.seconds is not None and snapped > MAX_FRAMES and wanted <= MAX_SECONDS * FPS:
        # A duration up to 15 s (360 frames) snaps up to 362 = 15.083 s, past what diffusers accepts: the longest
        # clip below it instead. (An explicit num_frames keeps diffusers' own rule: up to the next 17n+5.)
        snapped = MAX_FRAMES
    duration = snapped / FPS
    if not MIN_SECONDS <= duration <= MAX_SECONDS:
        raise RequestError(
            f"{wanted} frames snap up to {snapped} (17n+5) = {duration:.3f} s at {FPS} fps; MiniMax-H3 generates "
            f"{MIN_SECONDS:g} to {MAX_SECONDS:g} s, i.e. num_frames {int(MIN_SECONDS * FPS)} to {MAX_FRAMES}"
        )
    if (request.height is None) != (request.width is None):
        raise RequestError("give height and width together, or neither")
    height, width = (request.height, request.width) if request.height is not None else default_size
    for label, value in (("height", height), ("width", width)):
        if not isinstance(value, int) or value <= 0 or value % canvas_multiple:
            raise RequestError(f"{label} must be a positive multiple of {canvas_multiple}, got {value}")
    ratio = width / height
    if not 0.25 <= ratio <= 4.0:
        raise RequestError(f"aspect ratio {width}x{height} is outside MiniMax-H3's 1:4 to 4:1")
    try:
        request.workflow
    except ConditioningError as exc:
        raise RequestError(str(exc)) from None
    return snapped, height, width


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
