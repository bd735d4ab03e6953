"""Clip-by-clip comparison of two content-check records on the same captions and seeds (issue 55): for each content
property, how many clips only the model gets right, how many only the reference, and the exact McNemar p-value on
those discordant clips (h3eval.stats.mcnemar_exact); Holm-adjusted over every (model, property) compared.

    python bench/tiny_wider_dit/paired.py --ref results/s33_shipped_heldout24.json \
        --model results/s33_g8s32_heldout24.json --model results/s33_g8s33_heldout24.json --name s33_paired

Records: the JSON content_check.py writes (row ``baseline`` unless --row). Clips are matched on (prompt_id, seed);
a property a clip has no value for (sync on a caption without an event) is left out of that property. The records
must hold the same clips (else exit 3). Writes results/NAME.{json,md}.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import paired_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(paired_main())
