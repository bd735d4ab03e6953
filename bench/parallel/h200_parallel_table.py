"""Render the several-GPUs results (bench/parallel/h200_parallel.py) as Markdown, with the issue's goals met or missed.

    python bench/parallel/h200_parallel_table.py RESULTS [--out bench/parallel/results/h200_parallel.md]

``RESULTS`` is the folder the device call returned (``h200_parallel.json`` and, beside it,
``h200_parallel_details.json``) or the summary JSON itself. Goals (issue 21): with the optimized recipe, DiT scaling
efficiency >= 95 % at 15 s and >= 90 % at 5 s; video decode >= 1.8x on two GPUs; the 15 s ``turbo4-sparse`` request on
two H200s <= 20 s. A figure that is missing says so; it is never read as met.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.parallel import h200_parallel_table_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(h200_parallel_table_main())
