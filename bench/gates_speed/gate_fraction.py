"""Turn one device call of bench/device/gate_fraction.sh into this study's record and the goals' entry (issue 54:
every per-pair release gate over real decoded clips of the fast recipe at 5 s 768x1344, at most 2 % of generation).

    python bench/gates_speed/gate_fraction.py --from FILES_AT --name NAME --command "CMD" [--commit SHA]

FILES_AT holds what the call returned (gate_fraction.tgz). The gating time of a pair is what ``h3eval gate`` prints
for it ("gates: i/n pairs, <candidate>/<pair> (X s)": every chosen gate on that pair, clips decoded once, inside the
process, so the interpreter's start and imports are not counted); the warm figure is the median over the pairs of the
runs after the first (the first loads LPIPS and warms the kernels). The generation time is the candidate's warm
generation-side p50 from the run's speed.json (the mixed protocol). Writes results/gpu_fraction/NAME.{json,md} and the
entry "gate fraction ..." of bench/full_size_speed/results/h200_goals.json (met when the fraction is <= 2 %).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.goals import gate_fraction_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(gate_fraction_main())
