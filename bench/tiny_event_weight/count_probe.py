"""Does the tiny DiT read the bounce count of its caption? (bench.lib.tiny's count_probe; records into results/)

    python bench/tiny_event_weight/count_probe.py --model /tmp/g8s34/tiny --seeds 0,1 --limit 8 --name count_probe_g8ev
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import count_probe_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(count_probe_main())
