"""Compare two `h3eval demo` output folders: the sha256 of every clip (the run's quality clips, the floor's clips) and
latent trajectory, pairing files by their path under the folder (warm-ups are listed by recipe: their file names carry
the session id), and each candidate's, gate's and metric's outcome (with mean and CI) from run/verdict.json.

    .venv/bin/python bench/demo_time/compare_runs.py BEFORE AFTER

Prints a markdown summary: clips and trajectories byte-identical or not (each differing path named), verdict rows
that differ."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def digests(root: Path, pattern: str) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob(pattern)):
        rel = path.relative_to(root)
        if "warmup" in rel.parts:
            continue
        out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def warmups(root: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in sorted((root / "run" / "warmup").rglob("*.mp4")):
        out.setdefault(path.parent.name, []).append(hashlib.sha256(path.read_bytes()).hexdigest()[:12])
    return out


def verdict_rows(root: Path) -> dict[str, str]:
    v = json.loads((root / "run" / "verdict.json").read_text())
    rows = {"run": v["outcome"]}

    def add(prefix: str, c: dict) -> None:
        rows[prefix] = f"{c['outcome']} (judge {c.get('judge')})"
        for g in c.get("gates", []):
            rows[f"{prefix} / {g['gate']}"] = g["outcome"]
            for m in g.get("metrics", []):
                rows[f"{prefix} / {g['gate']} / {m['metric']}"] = (f"{m['outcome']}, n {m.get('n_pairs')}, mean "
                                                                   f"{m.get('mean_value')}, CI [{m.get('ci_low')}, "
                                                                   f"{m.get('ci_high')}]")
        if c.get("speed"):
            rows[f"{prefix} / speed (timed)"] = c["speed"]["outcome"]
        if c.get("against_baseline"):
            add(f"{prefix} (ladder top)", c["against_baseline"])

    for c in v["candidates"]:
        add(c["candidate"], c)
    return rows


def main(before: Path, after: Path) -> None:
    for label, pattern in (("clips", "*.mp4"), ("trajectories", "*.npz")):
        a, b = digests(before, pattern), digests(after, pattern)
        common = sorted(set(a) & set(b))
        same = [k for k in common if a[k] == b[k]]
        print(f"- {label}: {len(same)} of {len(common)} in both byte-identical; only before: {len(set(a) - set(b))}, "
              f"only after: {len(set(b) - set(a))}")
        for k in common:
            if a[k] != b[k]:
                print(f"  - differs: {k}")
        if a and b:  # one side without any (a demo that records no trajectories): the counts say it
            for k in sorted(set(a) ^ set(b)):
                print(f"  - in one only: {k}")
    wa, wb = warmups(before), warmups(after)
    print(f"- warm-ups before: {wa}")
    print(f"- warm-ups after: {wb}")
    va, vb = verdict_rows(before), verdict_rows(after)
    diff = [k for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]
    print(f"- verdict rows: {len(va)} before, {len(vb)} after, {len(diff)} differ"
          + (" (speed rows are timings: not expected to repeat)" if diff else ""))
    for k in diff:
        print(f"  - {k}: {va.get(k, 'absent')} -> {vb.get(k, 'absent')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
