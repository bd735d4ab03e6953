"""The mux with the AAC track encoded beside the video (h3.media.encode_mp4) against the one-thread encode it
replaced, side by side on one machine: same frames and audio, the two encodes interleaved, each file's bytes compared.

    python bench/mux_threads/mux_threads.py [--clip MP4] [--repeats 10] [--name mux_threads]

The clip (default: a 5 s 128x128 clip of the trained tiny, made here through the runtime) is decoded back to frames
and PCM, which both encoders then write. Writes results/<name>.{json,md}.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.media import mux_threads_main  # noqa: E402

if __name__ == "__main__":
    mux_threads_main()
