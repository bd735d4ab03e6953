"""Which held-out colour-shape pairs miss their colour in a content check, what is drawn instead, and the mean RGB
of the blobs a model draws for them (bench.lib.tiny's colour_misses).

    python bench/tiny_event_weight/colour_misses.py --check bench/tiny_event_weight/results/s34_g8ev_heldout24.json \
        --model /tmp/g8s34/tiny --ids heldout-01,heldout-13 --seeds 0,1 --name colour_misses_g8ev
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import colour_misses_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(colour_misses_main())
