"""Render the speed issue's results table from the H200 JSONs: per shape and recipe variant the DiT forward, the
projected request latency, and every target reported met or missed with the measured number.

    python bench/full_size_speed/h200_recipes_table.py > bench/full_size_speed/results/h200_recipes_speed.md
    python bench/full_size_speed/h200_recipes_table.py --results OUTDIR > OUTDIR/h200_recipes_speed.md   # a run of h200_full.sh

Inputs (bench/full_size_speed/results/): ``h200_speed_stock.json`` (ceilings, VAE decode and text encoding at full size, from
bench/full_size_speed/h200_speed.py), ``h200_recipes_*.json`` (bench/full_size_speed/h200_recipes_speed.py; rows re-measured after a fix are listed
apart, see SUPERSEDED), ``h200_protocol*.json`` (bench/full_size_speed/h200_protocol.py), ``h200_offload.json``
(bench/full_size_speed/h200_offload.py). A turbo request is projected from the
anatomy as text encoding + the recipe's forwards (a block-sparse recipe: its dense first step, then sparse steps) +
video decode with the recipe's tiles (304x320 at 768x1344 for the turbo recipes, seed 000; 256x256 otherwise) + audio
decode + frame D2H at the measured pinned rate. Sections a variant sets aside (LoRA, VAE tiles, offload) are listed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.speed import h200_recipes_table_main  # noqa: E402

if __name__ == "__main__":
    h200_recipes_table_main()
