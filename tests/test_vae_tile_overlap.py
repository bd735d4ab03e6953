"""A recipe's VAE tile must be wider than its overlap (h3.levers.vae.VaeConfig): diffusers' tiled MiniMax-H3 VAE adds
tiles until they cover the frame, and a tile no wider than the overlap adds no coverage, so its decode never returns
(found in session 35: a 32-pixel tile under the default 64-pixel overlap hung a decode). The bound is checked against
diffusers' own tile layout: the smallest accepted tile covers the frame, the largest refused one loops."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from h3.levers.vae import VaeConfig

SPLIT = ("from diffusers import AutoencoderKLMiniMaxH3\n"
         "from h3 import tiny\n"
         "vae = AutoencoderKLMiniMaxH3(**tiny.VAE_CONFIG)\n"
         "print(vae._split_tiles({length}, {tile}, {overlap}))\n")


@pytest.mark.parametrize("kwargs, where", [
    ({"tile_height": 64, "tile_overlap": 64}, "tile_height 64 must exceed tile_overlap 64"),
    ({"tile_width": 48}, "tile_width 48 must exceed tile_overlap 64"),
    ({"tiles": {"768x1344": [304, 32]}}, "tiles.768x1344 32 must exceed tile_overlap 64"),
    ({"tile_height": 128, "tile_width": 128, "tile_overlap": 128}, "tile_height 128 must exceed tile_overlap 128"),
])
def test_a_tile_no_wider_than_the_overlap_is_refused(kwargs, where):
    with pytest.raises(ValidationError, match=where):
        VaeConfig(**kwargs)


def test_tiling_off_does_not_check_the_unused_default_tile_but_still_the_per_resolution_ones():
    assert VaeConfig(tiling=False, tile_height=32, tile_overlap=64).tile_height == 32
    with pytest.raises(ValidationError, match="tiles.544x960 48 must exceed"):
        VaeConfig(tiling=False, tiles={"544x960": [48, 320]})


def _split(length: int, tile: int, overlap: int, timeout: float):
    return subprocess.run([sys.executable, "-c", SPLIT.format(length=length, tile=tile, overlap=overlap)],
                          capture_output=True, text=True, timeout=timeout)


def test_the_bound_is_diffusers_own():
    """16 px above the overlap (the smallest tile a multiple of 16 can be): diffusers lays tiles that cover 1344 px
    with at least the overlap; at the overlap itself its layout loop does not end (killed after 20 s)."""
    VaeConfig(tile_width=80, tile_overlap=64)  # accepted
    proc = _split(1344, 80, 64, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    starts, lengths, overlaps = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own print of lists
    assert starts[-1] + lengths[-1] == 1344 and min(overlaps) >= 64 and set(lengths) == {80}
    with pytest.raises(subprocess.TimeoutExpired):
        _split(1344, 64, 64, timeout=20)
