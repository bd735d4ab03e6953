"""Render the trained tiny preset's clips the artifact detectors are calibrated on (MP4s, as production writes them).

Each clip is the turbo4-tiny recipe's 5 s render (124 frames, 128x128, 32 kHz stereo) of one (prompt, seed) of
prompts/world-heldout.jsonl on the CPU, cached under ``$H3_ARTIFACT_CACHE`` (default
``~/.cache/h3eval/artifact-detectors``) keyed by the checkpoint's training record. The split is by prompt: even
prompt indices to fit (tune) the detectors, odd ones to publish rates (:func:`split`).

    PYTHONPATH=. python bench/artifact_detectors/render_tiny.py --prompts 24 --seeds 0 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "prompts" / "world-heldout.jsonl"
RECIPE = "turbo4-tiny"


def cache_dir() -> Path:
    from h3.tiny_trained import TRAINED_DIR

    key = hashlib.sha256((TRAINED_DIR / "training_record.json").read_bytes()).hexdigest()[:16]
    root = Path(os.environ.get("H3_ARTIFACT_CACHE") or Path.home() / ".cache" / "h3eval" / "artifact-detectors")
    return root / key


def prompts() -> list[dict]:
    return [json.loads(line) for line in SUITE.read_text().splitlines() if line.strip()]


def clip_path(prompt_id: str, seed: int, recipe: str = RECIPE) -> Path:
    return cache_dir() / f"{recipe}-{prompt_id}-s{seed}.mp4"


def split(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(fit, publish): by the prompt's index in the suite, even to fit, odd to publish (no prompt on both sides)."""
    fit, publish = [], []
    for p in paths:
        index = int(p.stem.split("heldout-")[1].split("-")[0])
        (fit if index % 2 == 0 else publish).append(p)
    return fit, publish


def render(n_prompts: int, seeds: list[int], recipe_name: str = RECIPE) -> list[Path]:
    from h3.recipe import load_recipe
    from h3.runtime import GenerateRequest, H3Runtime

    todo = [(line, s) for line in prompts()[:n_prompts] for s in seeds]
    out = [clip_path(line["id"], s, recipe_name) for line, s in todo]
    missing = [(line, s) for (line, s), p in zip(todo, out) if not p.is_file()]
    if missing:
        runtime = H3Runtime.load("tiny-trained", load_recipe(recipe_name), "cpu")
        for line, seed in missing:
            path = clip_path(line["id"], seed, recipe_name)
            path.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            tmp = path.with_name(path.stem + f".tmp{os.getpid()}.mp4")
            runtime.generate(GenerateRequest(prompt=line["prompt"], seed=seed, prompt_id=line["id"]), tmp)
            os.replace(tmp, path)
            tmp.with_suffix(".json").unlink(missing_ok=True)
            print(f"rendered {path.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--recipe", default=RECIPE)
    args = parser.parse_args()
    paths = render(args.prompts, args.seeds, args.recipe)
    print(f"{len(paths)} clips in {cache_dir()}")


if __name__ == "__main__":
    main()
