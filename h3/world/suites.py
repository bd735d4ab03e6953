"""Prompt suites of the world, with their ground truth: ``python -m h3.world.suites`` writes prompts/world-*.jsonl.

The keyframe (FL2VA) and reference-image (Ref2VA) suites also name their images, PNGs rendered from the same scene
and written beside the suite (``prompts/world-fl2va/``, ``prompts/world-ref2va/``; paths relative to ``prompts/``):
``keyframes`` {"first", "last"} (the scene's first and last frames) and ``references`` [the first shape alone on the
scene's background, as training presents it], with ``prompt`` the caption that names that shape only as "the shape
in picture 1".

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
    "world-fl2va": ("heldout", 1732, 8, "first/last keyframe workflow (FL2VA) on held-out pairs: keyframes + caption"),
    "world-ref2va": ("heldout", 1733, 8, "reference-image workflow (Ref2VA) on held-out pairs: picture 1 + caption"),
    "world-heldout-b": ("heldout", 1734, 8, "held-out colour-shape pairs, a second draw made after every signoff "
                        "threshold was chosen: fresh held-out signoff pools (issue 50)"),
    "world-heldout-c": ("heldout", 1735, 8, "held-out colour-shape pairs, a third draw made after the session-28 "
                        "revision of the resample judge was chosen on pools 4-6: its fresh held-out pools (issue 50)"),
    "world-heldout-d": ("heldout", 1736, 8, "held-out colour-shape pairs, a fourth draw made after session 29's motion "
                        "mask of the ghosting fit was chosen on pool 7: its fresh held-out pools (issue 50)"),
    "world-heldout-e": ("heldout", 1737, 8, "held-out colour-shape pairs, a fifth draw made after session 30's opening "
                        "window and displacement reach of the ghosting gate were chosen on pools 6 and 11: fresh "
                        "held-out pools (issue 50)"),
    "world-heldout-f": ("heldout", 1738, 8, "held-out colour-shape pairs, a sixth draw made with the fifth: the third "
                        "fresh pool of session 30 takes its last 4 (its 4th repeats a world-heldout caption; issue 50)"),
    "world-heldout-g": ("heldout", 1739, 8, "held-out colour-shape pairs, a seventh draw made after session 31's "
                        "copy-share rule of the ghosting gate was chosen on pools 4-14: fresh held-out pools (issue 50)"),
    "world-heldout-h": ("heldout", 1740, 8, "held-out colour-shape pairs, an eighth draw made with the seventh: the "
                        "third fresh pool of session 31 takes captions of it that no other pool uses (issue 50)"),
    "world-heldout-i": ("heldout", 1741, 8, "held-out colour-shape pairs, a ninth draw made in session 31 before the near "
                        "judge's departed-pairs rule was chosen on pools 15-17, whose clips were made and gated without "
                        "being read until that rule was committed: fresh held-out pools (issue 50)"),
    "world-heldout-j": ("heldout", 1742, 8, "held-out colour-shape pairs, a tenth draw made with the ninth: the third "
                        "fresh pool of that judgement takes captions of it that no other pool uses (issue 50)"),
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
        line_id = f"{name.removeprefix('world-')}-{len(lines):02d}"
        line = {"id": line_id, "prompt": scene.caption(), "source": f"h3.world.suites {name}: {description}",
                "split": split, "world_seed": seed, "world_index": scene.index, "ground_truth": gt}
        if name == "world-fl2va":
            line["keyframes"] = {"first": f"{name}/{line_id}-first.png", "last": f"{name}/{line_id}-last.png"}
        elif name == "world-ref2va":
            line["prompt"] = scene.caption(refer_first=True)
            line["references"] = [f"{name}/{line_id}-ref1.png"]
        lines.append(line)
    return lines


def suite_images(line: dict) -> dict[str, "np.ndarray"]:
    """The PNGs a keyframe or reference line names, rendered from its scene: {relative path: uint8 (H, W, 3)}."""
    from h3.world.render import reference_image, render_video

    scene = sample_scene(line["world_seed"], line["world_index"], line["split"])
    images = {}
    if "keyframes" in line:
        frames = render_video([scene])[0]
        images[line["keyframes"]["first"]] = frames[0].numpy()
        images[line["keyframes"]["last"]] = frames[-1].numpy()
    for path in line.get("references", []):
        images[path] = reference_image(scene).numpy()
    return images


def write_suites(folder: Path) -> list[Path]:
    from PIL import Image

    out = []
    for name in SUITES:
        path = folder / f"{name}.jsonl"
        lines = suite_lines(name)
        for line in lines:
            for rel, pixels in suite_images(line).items():
                target = folder / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(target, optimize=True)
                out.append(target)
        path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_suites(Path(__file__).resolve().parents[2] / "prompts"):
        print(p)
