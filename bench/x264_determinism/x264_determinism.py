"""Is libx264 (through this PyAV build) byte-stable: the same frames, encoded several times, one bitstream?

    python bench/x264_determinism/x264_determinism.py [--encodes 6] [--frames 24]

For each frame size and encoder setting, encodes the same textured, drifting frames ``--encodes`` times (CRF 18,
preset medium, yuv420p converted once up front, no audio) and counts the distinct bitstreams. Settings: one thread
with x264's defaults (what h3.media uses below 320x320), eight frame threads with defaults, and eight frame threads
with ``mbtree=0`` (what h3.media uses from 320x320 up), plus ``h3.media.encode_mp4`` itself. Writes
bench/x264_determinism/results/x264_determinism.{json,md}.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.media import x264_determinism_main  # noqa: E402

if __name__ == "__main__":
    x264_determinism_main()
