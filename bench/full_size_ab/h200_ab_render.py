"""Render the production-scale A/B chain's work folder (bench/full_size_ab/h200_ab.py) into the recorded results:

    python bench/full_size_ab/h200_ab.py render --work W --out-dir bench/full_size_ab/results

writes, per shape, ``h200_ab_<shape>.json`` and ``.md`` (request-to-file and generation-side latency p50/p90 with the
stage anatomy, peak device memory, gate time per pair against the candidate's generation time, configured versus
executed, the recompile flag and off-identity as ``h3eval ab`` reported them, and the measured request against the
benchmark's projection with the stage that makes the difference), and the summary ``h200_ab.json``:
``{"<recipe>": {"<shape>": {"request_to_file_p50_s", "generation_side_p50_s", "peak_memory_gb",
"gate_time_fraction", "pairs", "partial"}}}``. A shape whose chain did not finish is marked partial, in both.
``--merge`` keeps the other shapes of an existing summary (one work folder per shape, as one-shape device calls
leave them).

The gate time per pair counts the pairs the gates scored: a pair whose every gate errored (a clip the time box left
unmade fails each gate in milliseconds) is left out, and gates that errored on a scored pair are named beside it
(their time is not in the figure).

The projection is the one bench/full_size_speed/results/h200_recipes_speed.md states (bench/h200_recipes_table.project): text
encoding (0.06 s, the conditioner resident) + the recipe's DiT forwards (timed alone) + video decode with the recipe's
tiles + audio decode + the frames' download; the baseline's is 29 stock forwards with the stock tiles.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.ab import RESULTS, ROOT, from_returned  # noqa: E402

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="A returned h200_ab device call into bench/full_size_ab/results: "
                                                 "python bench/full_size_ab/h200_ab_render.py RETURNED_DIR")
    parser.add_argument("returned", type=Path, help="the call's OUTDIR as it came back (state.tgz, clips.tgz)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=Path("/tmp/h200_ab_returned"))
    parser.add_argument("--no-screenshot", action="store_true")
    ns = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.exit(from_returned(ns.returned, ns.out_dir, ns.work, not ns.no_screenshot))
