"""VAE: the video VAE's spatial tile chosen per output resolution, and both VAEs kept resident (or parked on the CPU
between requests).

Seed 000: at 768x1344, 304x320 tiles instead of the stock 256x256 cut video decode by 39.5%. The tile is picked from
the latent's spatial size at each ``vae.decode`` call (16x spatial compression), so one runtime serves several
resolutions with the tile measured for each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from h3.levers.base import LeverHandle, mark_applied, unmark_applied

logger = logging.getLogger(__name__)

SPATIAL_COMPRESSION = 16


@dataclass
class VaeTilingConfig:
    tiles: dict[str, list[int]] = field(default_factory=dict)
    """``"HEIGHTxWIDTH" -> [tile_height, tile_width]`` in pixels."""
    resident: bool = True
    device: str = "cpu"


class VaeHandle(LeverHandle):
    name = "vae"

    def __init__(self, pipe, config: VaeTilingConfig):
        super().__init__()
        self.pipe, self.config = pipe, config
        self.tiles = {tuple(int(v) for v in key.split("x")): tuple(tile) for key, tile in config.tiles.items()}
        vae = pipe.vae
        self.default_tile = (vae.tile_sample_min_height, vae.tile_sample_min_width)
        self.used: list[list[int]] = []
        self.moves = 0
        self._wrapped = []
        self._wrap(vae, "decode", self._video_decode)
        if not config.resident:
            self._wrap(pipe.audio_vae, "decode", self._audio_decode)
            for module in (pipe.vae, pipe.audio_vae):
                module.to("cpu")

    def _wrap(self, owner, attr, fn):
        original = getattr(owner, attr)
        had = attr in vars(owner)

        def wrapped(*args, **kwargs):
            return fn(original, *args, **kwargs)

        setattr(owner, attr, wrapped)
        self._wrapped.append((owner, attr, original, had))

    def _onload(self, module):
        if not self.config.resident:
            module.to(self.config.device)
            self.moves += 1

    def _offload(self, module):
        if not self.config.resident:
            module.to("cpu")
            self.moves += 1

    def _video_decode(self, original, z, *args, **kwargs):
        vae = self.pipe.vae
        resolution = (int(z.shape[-2]) * SPATIAL_COMPRESSION, int(z.shape[-1]) * SPATIAL_COMPRESSION)
        tile = self.tiles.get(resolution, self.default_tile)
        vae.tile_sample_min_height, vae.tile_sample_min_width = tile
        self.used.append(list(tile))
        self._onload(vae)
        try:
            return original(z.to(self.config.device) if not self.config.resident else z, *args, **kwargs)
        finally:
            self._offload(vae)

    def _audio_decode(self, original, *args, **kwargs):
        self._onload(self.pipe.audio_vae)
        try:
            return original(*args, **kwargs)
        finally:
            self._offload(self.pipe.audio_vae)

    def begin_request(self) -> None:
        self.used, self.moves = [], 0

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "resolutions_configured": sorted(self.config.tiles),
            "tiles_used": self.used,
            "resident": self.config.resident,
            "vae_moves": self.moves,
        }

    def _remove(self) -> None:
        for owner, attr, original, had in reversed(self._wrapped):
            if had:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)
        vae = self.pipe.vae
        vae.tile_sample_min_height, vae.tile_sample_min_width = self.default_tile
        if not self.config.resident:
            for module in (self.pipe.vae, self.pipe.audio_vae):
                module.to(self.config.device)
        unmark_applied(vae, "vae")


def apply_vae(pipe, config: VaeTilingConfig) -> VaeHandle:
    mark_applied(pipe.vae, "vae")
    return VaeHandle(pipe, config)
