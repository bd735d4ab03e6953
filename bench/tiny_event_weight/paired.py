"""This study's records compared clip by clip (bench.lib.tiny's paired; the same as bench/tiny_wider_dit/paired.py,
writing into this study's results/):

    python bench/tiny_event_weight/paired.py --ref bench/tiny_wider_dit/results/s33_g8s33_heldout24.json \
        --model bench/tiny_event_weight/results/s34_g8ev_heldout24.json --name s34_paired_vs_g8s33
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import paired_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(paired_main())
