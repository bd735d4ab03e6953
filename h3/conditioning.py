"""Image inputs of a request: the first keyframe, the last keyframe, or a reference image.

diffusers 0.42.1 selects MiniMax-H3's workflow from what a request carries (``MiniMaxH3Blocks``):

- ``fl2va``: ``image`` (the keyframe the video starts from, stretched onto the canvas) and/or ``last_image`` (the
  keyframe it ends on; cover-cropped when both are given), denoised with the ``transformer/`` partition;
- ``ref2va``: ``references`` (here one :class:`MiniMaxH3ImageReference`: a subject to keep through the clip),
  denoised with the ``transformer_ref/`` partition;
- ``t2va``: the prompt alone.

A request holds each image as the bytes it was given (a file, an upload) plus its sha256, so the run record can name
exactly which image conditioned a clip and the run store can keep it. Images are decoded here once, with PIL, and
refused with one message naming the role when they cannot be used.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROLES = ("first_frame", "last_frame", "reference")
"""The image inputs a request may carry, in the order the record lists them."""
PIPELINE_INPUT = {"first_frame": "image", "last_frame": "last_image", "reference": "references"}
"""Which input of diffusers' MiniMax-H3 blocks each role is."""
MAX_SIDE = 8192
"""Longest image side accepted (a decompression bomb is refused before decoding its pixels)."""
MIN_ASPECT, MAX_ASPECT = 1 / 4, 4.0
"""diffusers refuses a reference outside 1:4 to 4:1; keyframes are held to the same range."""


class ConditioningError(ValueError):
    """An image input that cannot be used; the message names its role."""


@dataclass(frozen=True)
class ImageInput:
    """One image input: the bytes as given, their sha256, and the decoded RGB pixels."""

    data: bytes
    sha256: str
    pixels: np.ndarray
    """(height, width, 3) uint8 RGB."""
    media_type: str

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    def pil(self):
        from PIL import Image

        return Image.fromarray(self.pixels, mode="RGB")


def image_from_bytes(data: bytes, role: str = "image") -> ImageInput:
    """Decode image bytes (PNG, JPEG, WebP, ...) into an :class:`ImageInput`, or a ConditioningError naming ``role``."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ConditioningError(f"{role}: the image is empty")
    data = bytes(data)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
                raise ConditioningError(f"{role}: the image is {width}x{height}; each side must be 1 to {MAX_SIDE}")
            media_type = Image.MIME.get(image.format or "", "application/octet-stream")
            if getattr(image, "n_frames", 1) > 1:
                raise ConditioningError(f"{role}: the image has {image.n_frames} frames; give one still image")
            # RGBA and palette images become RGB (alpha dropped): the model conditions on RGB pixels.
            pixels = np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
    except ConditioningError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ConditioningError(f"{role}: not a readable image ({type(exc).__name__}: {exc})") from None
    ratio = pixels.shape[1] / pixels.shape[0]
    if not MIN_ASPECT <= ratio <= MAX_ASPECT:
        raise ConditioningError(f"{role}: aspect ratio {pixels.shape[1]}x{pixels.shape[0]} is outside 1:4 to 4:1")
    return ImageInput(data=data, sha256=hashlib.sha256(data).hexdigest(), pixels=pixels, media_type=media_type)


def image_from_file(path: str | os.PathLike, role: str = "image") -> ImageInput:
    """Read and decode an image file; a missing or unreadable file is a ConditioningError naming it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConditioningError(f"{role}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return image_from_bytes(data, role)
    except ConditioningError as exc:
        raise ConditioningError(f"{exc} (file {path})") from None


def image_from_array(pixels: np.ndarray, role: str = "image") -> ImageInput:
    """An in-memory (H, W, 3) uint8 image, stored as PNG bytes (so it has a file form and a sha256 like any other)."""
    from PIL import Image

    pixels = np.asarray(pixels)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ConditioningError(f"{role}: expected (height, width, 3) uint8 pixels, got {pixels.dtype} {pixels.shape}")
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buffer, format="PNG")
    return image_from_bytes(buffer.getvalue(), role)


def workflow_of(first_frame: Any = None, last_frame: Any = None, reference: Any = None) -> str:
    """The MiniMax-H3 workflow a request with these inputs runs, or a ConditioningError for a mix diffusers does not
    take (its blocks select ``ref2va`` on ``references`` and would silently ignore keyframes given with one)."""
    if reference is not None and (first_frame is not None or last_frame is not None):
        raise ConditioningError("reference: give keyframes (fl2va) or a reference image (ref2va), not both; "
                                "MiniMax-H3 runs one workflow per request")
    if reference is not None:
        return "ref2va"
    if first_frame is not None or last_frame is not None:
        return "fl2va"
    return "t2va"


def pipeline_inputs(first_frame: ImageInput | None, last_frame: ImageInput | None,
                    reference: ImageInput | None) -> dict[str, Any]:
    """The keyword inputs of diffusers' MiniMax-H3 blocks for these images (empty for t2va)."""
    workflow_of(first_frame, last_frame, reference)
    inputs: dict[str, Any] = {}
    if first_frame is not None:
        inputs["image"] = first_frame.pil()
    if last_frame is not None:
        inputs["last_image"] = last_frame.pil()
    if reference is not None:
        from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

        inputs["references"] = [MiniMaxH3ImageReference(image=reference.pil())]
    return inputs
