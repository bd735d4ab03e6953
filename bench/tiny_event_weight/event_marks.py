"""CLI of bench.lib.tiny's event_marks: do the tiny's video latents mark the world's bounces by themselves?

    python bench/tiny_event_weight/event_marks.py --out bench/tiny_event_weight/results/event_marks_s34.md --command "..."
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import event_marks_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(event_marks_main())
