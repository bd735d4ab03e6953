"""Where a demo's wall time went, read from its own log (`h3eval demo` progress lines): the seconds each request took,
summed by part (the floor's clips, warm-ups, quality requests) and recipe, each gated pair's seconds by comparison
(the floor's new-seed pairs, each candidate against the baseline, a rung against its parent), and each stage's total.

    .venv/bin/python bench/demo_time/log_profile.py LOG [LOG ...]

Prints a markdown table per log. The seconds are the progress lines' own (wall, one request or one pair's gates)."""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

REQUEST = re.compile(r"^demo (?:1/4 clips|3/4 ab): \d+/\d+ (?:clips|requests), (?:(warmup|quality)/)?([\w.-]+)/\S+ "
                     r"\(([\d.]+) s\)")
PAIR = re.compile(r"^demo (2/4 floor gates|3/4 gates): \d+/\d+ pairs, ([\w.-]+)/\S+( vs [\w.-]+)? \(([\d.]+) s\)")
STAGE = re.compile(r"^(demo [^:]+): \d+/\d+ \w+ in (\d+):(\d+)$")


def profile(log: Path) -> dict[str, tuple[int, float]]:
    parts: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.split("\r")[-1]
        if m := REQUEST.match(line):
            kind = m.group(1) or "floor clip"
            parts[f"generate: {kind} {m.group(2)}"].append(float(m.group(3)))
        elif m := PAIR.match(line):
            where = "floor" if m.group(1).startswith("2/4") else "look"
            against = (m.group(3) or " vs baseline").removeprefix(" vs ")
            parts[f"gates ({where}): {m.group(2)} vs {against}"].append(float(m.group(4)))
        elif m := STAGE.match(line):
            parts[f"stage total: {m.group(1)}"].append(60 * int(m.group(2)) + int(m.group(3)))
    return {k: (len(v), sum(v)) for k, v in sorted(parts.items())}


def main(logs: list[str]) -> None:
    for log in logs:
        print(f"\n{log}\n\n| part | n | wall s |\n|---|---|---|")
        for part, (n, seconds) in profile(Path(log)).items():
            print(f"| {part} | {n} | {seconds:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
