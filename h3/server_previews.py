"""Preview images of a finished clip for ``GET /v1/videos/{id}/content?variant=...``: the OpenAI videos API's
``thumbnail`` (here the first frame, lossless WebP) and ``spritesheet`` (a JPEG grid of evenly spaced frames)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

THUMBNAIL = ("thumbnail", ".thumbnail.webp", "image/webp")
SPRITESHEET = ("spritesheet", ".spritesheet.jpg", "image/jpeg")
SPRITE_FRAMES, SPRITE_COLUMNS, SPRITE_TILE_WIDTH = 16, 4, 256


def sprite_layout(num_frames: int, width: int, height: int) -> dict[str, Any]:
    """Which frames a spritesheet holds (evenly spaced, first and last included) and how they are laid out."""
    import numpy as np

    count = min(SPRITE_FRAMES, num_frames)
    frames = sorted({int(i) for i in np.linspace(0, num_frames - 1, count).round()})
    tile_w = min(width, SPRITE_TILE_WIDTH)
    tile_h = max(1, round(height * tile_w / width))
    columns = min(SPRITE_COLUMNS, len(frames))
    return {"frames": frames, "columns": columns, "rows": -(-len(frames) // columns), "tile": (tile_w, tile_h)}


def _decode_frames(path: Path, wanted: set[int]) -> dict[int, Any]:
    import av

    found: dict[int, Any] = {}
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for index, frame in enumerate(container.decode(stream)):
            if index in wanted:
                found[index] = frame.to_ndarray(format="rgb24")
            if len(found) == len(wanted):
                break
    return found


def make_preview(variant: str, mp4: Path, layout: dict[str, Any]) -> bytes:
    """The thumbnail (first frame, lossless WebP) or the spritesheet (a JPEG grid: :func:`sprite_layout`)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    if variant == "thumbnail":
        Image.fromarray(_decode_frames(mp4, {0})[0]).save(buffer, format="WEBP", lossless=True)
        return buffer.getvalue()
    frames = _decode_frames(mp4, set(layout["frames"]))
    tile_w, tile_h = layout["tile"]
    sheet = Image.new("RGB", (tile_w * layout["columns"], tile_h * layout["rows"]))
    for slot, index in enumerate(layout["frames"]):
        tile = Image.fromarray(frames[index])
        if tile.size != (tile_w, tile_h):
            tile = tile.resize((tile_w, tile_h), Image.Resampling.BILINEAR)
        sheet.paste(tile, ((slot % layout["columns"]) * tile_w, (slot // layout["columns"]) * tile_h))
    sheet.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()
