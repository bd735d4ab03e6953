"""Where a content table's sync misses come from (issue 17), read per clip from a content_check JSON.

    python bench/content_misses.py [--check bench/results/content_check.json] [--row baseline] [--prompts world-heldout]
                                   [--name content_misses]

Two readings, no generation: (1) for the one-shape captions with exactly one bounce, how many clips show no bounce of
their shape in the video (the detector's ``bounces_seen``); (2) per seed, the audio onset times the detector found,
rounded to 10 ms, with how many clips sound each (a time that recurs across captions is the seed's habit, not the
caption's event). The ground truth comes from the prompt suite the check ran on (its sha256 must match the record's).
Writes bench/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_misses(check: dict, suite_lines: list[str], row: str) -> dict:
    truths = {entry["id"]: entry["ground_truth"] for entry in map(json.loads, filter(str.strip, suite_lines))}
    clips = check["rows"][row]["clips"]
    once, onsets = [], {}
    for clip in clips:
        truth = truths[clip["prompt_id"]]
        bounces = [e for e in truth["events"] if e["kind"] == "bounce"]
        if len(truth["shapes"]) == 1 and len(bounces) == 1:
            seen = sum(len(v) for v in clip["details"]["bounces_seen"].values())
            once.append({"prompt_id": clip["prompt_id"], "seed": clip["seed"], "bounces_seen": seen})
        onsets.setdefault(str(clip["seed"]), []).extend(clip["details"]["onsets"])
    habits = {seed: Counter(round(t, 2) for t in times).most_common() for seed, times in onsets.items()}
    return {"clips": len(clips), "one_bounce_clips": once,
            "one_bounce_without_bounce": sum(o["bounces_seen"] == 0 for o in once), "onsets_by_seed": habits}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", default=str(ROOT / "bench" / "results" / "content_check.json"))
    parser.add_argument("--row", default="baseline")
    parser.add_argument("--prompts", default="world-heldout")
    parser.add_argument("--name", default="content_misses")
    args = parser.parse_args()
    check = json.loads(Path(args.check).read_text())
    if args.row not in check.get("rows", {}):
        raise SystemExit(f"{args.check}: no row {args.row!r} (rows: {', '.join(check.get('rows', {}))})")
    suite = ROOT / "prompts" / f"{args.prompts}.jsonl"
    data = suite.read_bytes()
    recorded = str(check.get("prompts_sha256", ""))
    if recorded and hashlib.sha256(data).hexdigest() != recorded:
        raise SystemExit(f"{suite}: not the prompt suite {args.check} was made on (sha256 {recorded[:12]})")
    result = read_misses(check, data.decode("utf-8").splitlines(), args.row)
    table = (f"From `{Path(args.check).name}`, row `{args.row}` ({result['clips']} clips), ground truth from "
             f"`prompts/{args.prompts}.jsonl`.\n\n"
             f"- one-shape captions with one bounce: **{result['one_bounce_without_bounce']} of "
             f"{len(result['one_bounce_clips'])} clips show no bounce** of their shape in the video\n\n"
             "| seed | onset times the detector found (s), clips sounding each, most frequent first |\n|---|---|\n")
    for seed, habits in result["onsets_by_seed"].items():
        table += f"| {seed} | " + ", ".join(f"{t:.2f} ({n})" for t, n in habits[:8]) + " |\n"
    from bench import _results

    _results.write(args.name, {"check": args.check, "row": args.row, "prompts": args.prompts, **result}, table)
    print(table)


if __name__ == "__main__":
    main()
