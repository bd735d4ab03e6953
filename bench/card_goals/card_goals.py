"""Record one device call of bench/device/card_goals.sh as the forward and decode goals of the card it ran on, each
beside stock diffusers timed in the same process (issue 54; bench.lib.goals's card_goals part).

    python bench/card_goals/card_goals.py --from FILES_AT --name NAME --command "CMD" [--commit SHA]

FILES_AT holds what the call returned (h200_goals_raw.json from ``h200_goals.py --stock``). Writes results/NAME.{json,md}
and, in bench/full_size_speed/results/h200_goals.json, one entry per goal named with its card (met or missed, ratio to
stock); exit 3 on a file that holds no measurement.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.goals import card_goals_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(card_goals_main())
