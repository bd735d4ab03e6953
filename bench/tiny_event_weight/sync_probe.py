"""Is a clip's sound in step with the turns it draws? Sync read with the soft turns as the video events, beside the
content check's reading, on the held-out clips and on the world's own renders (bench.lib.tiny's sync_probe).

    python bench/tiny_event_weight/sync_probe.py --model /tmp/g8s34/tiny --seeds 0,1,2,3 --name sync_probe_g8ev
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import sync_probe_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(sync_probe_main())
