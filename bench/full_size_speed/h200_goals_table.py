"""Issue 23's goals table from the measured rows of bench/full_size_speed/h200_goals.py: every goal met, missed or not measured.

    python bench/full_size_speed/h200_goals_table.py [--results bench/full_size_speed/results] [--raw h200_goals_raw.json --raw ...]

Reads the raw results of bench/full_size_speed/h200_goals.py on the H200 (``--raw``, in rising precedence, default
``h200_goals_raw.json``: each row is taken from the last file given that measured it, so calls that measured different
rows combine, and each goal names its file; the vae_decoder lever's variants are shown from every file that timed
them, beside the stock decode of the same process), ``h200_speed_stock.json`` (the chip's measured bf16
and fp8 matmul ceilings), ``h200_recipes_768.json`` (the dense forward's FLOPs at 5 s 768x1344, counted on the same
config) and ``vae_decode_flops.json`` (bench/full_size_speed/vae_decode_flops.py: the tiled decode's FLOPs) from ``--results``, and
writes there ``h200_goals.json`` in the issue's form, one entry per goal::

    {"<goal>": {"measured": <s>, "target": <s>, "unit": "s", "met": true|false, "source": "<file>"}}

(a goal not measured: ``"measured": null, "met": null`` and ``"not_measured"`` with the reason; never a number), and
``h200_goals.md``: the verdicts with the achieved TFLOP/s against the ceilings, the requests' stages, provenance.
Bad input (a missing file, a measured row without a finite positive time) is one clear error and exit 3.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.goals import h200_goals_table_main  # noqa: E402

if __name__ == "__main__":
    h200_goals_table_main()
