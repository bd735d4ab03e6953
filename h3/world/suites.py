"""Prompt suites of the world, with their ground truth: ``python -m h3.world.suites`` writes prompts/world-*.jsonl.

Each line: ``id``, ``prompt`` (the caption), ``source``, ``split`` (train / heldout), ``world_seed`` and
``world_index`` (``h3.world.scene.sample_scene(world_seed, world_index, split)`` rebuilds the scene), and
``ground_truth``: what the caption names and what the generator drew for that scene (colours, shapes, directions,
pitches, bounce and appearance times; per-frame trajectories are left out, the scene rebuilds them).
"""

from __future__ import annotations

import json
from pathlib import Path

from h3.world.scene import sample_scene

SUITES = {
    # name: (split, seed, count, description)
    "world-heldout": ("heldout", 1729, 24, "held-out colour-shape pairs (never in a training caption): the content check"),
    "world-train": ("train", 1730, 12, "training-split captions (in distribution)"),
    "world-demo": ("train", 1731, 4, "the demo's world prompts"),
}


def suite_lines(name: str) -> list[dict]:
    split, seed, count, description = SUITES[name]
    lines, index = [], 0
    while len(lines) < count:
        scene = sample_scene(seed, index, split)
        index += 1
        if name == "world-demo" and not any(s.bounces for s in scene.shapes):
            continue  # the demo shows bounces with their clicks
        gt = scene.ground_truth(trajectories=False)
        lines.append({"id": f"{name.removeprefix('world-')}-{len(lines):02d}", "prompt": scene.caption(),
                      "source": f"h3.world.suites {name}: {description}", "split": split, "world_seed": seed,
                      "world_index": scene.index, "ground_truth": gt})
    return lines


def write_suites(folder: Path) -> list[Path]:
    out = []
    for name in SUITES:
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in suite_lines(name)))
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_suites(Path(__file__).resolve().parents[2] / "prompts"):
        print(p)
