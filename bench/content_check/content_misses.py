"""Where a content table's sync misses come from (issue 17), read per clip from a content_check JSON.

    python bench/content_check/content_misses.py [--check bench/content_check/results/content_check.json] [--row baseline] [--prompts world-heldout]
                                   [--name content_misses]

Two readings, no generation: (1) for the one-shape captions with exactly one bounce, how many clips show no bounce of
their shape in the video (the detector's ``bounces_seen``); (2) per seed, the audio onset times the detector found,
rounded to 10 ms, with how many clips sound each (a time that recurs across captions is the seed's habit, not the
caption's event). The ground truth comes from the prompt suite the check ran on (its sha256 must match the record's).
Writes bench/<study>/results/NAME.{json,md}.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import content_misses_main  # noqa: E402

if __name__ == "__main__":
    content_misses_main()
