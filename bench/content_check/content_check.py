"""The content check: does a model draw and sound what a world caption names? Scored by the model-independent
detector of h3.world.detect on held-out captions (colour-shape pairs no training caption has).

    python bench/content_check/content_check.py [--model tiny-trained] [--prompts world-heldout] [--seeds 0,1]
                                  [--rows baseline,random,fewer-steps,turbo4-tiny,turbo4-tiny-int8,fbc-cache,fbc-cache-tiny]

Rows (model, recipe): the 29-step ``baseline``; the random-weight preset under ``baseline`` (``random``: the chance
control); ``fewer-steps`` (8 steps, no LoRA); ``turbo4-tiny`` (the distilled 4-step LoRA); ``turbo4-tiny-int8`` (it,
fused, INT8 W8A8); ``fbc-cache`` (29 steps with diffusers' first-block cache, the shipped recipe: it caches no step
of the trained tiny) and ``fbc-cache-tiny`` (bench/recipes: the same at a threshold that does). Each clip goes through
the runtime to
an MP4 and is decoded back before the detector reads it. Per metric: the share of clips right, with a Wilson 95%
interval; sync counts only captions that name an event (a bounce or an appearance), "right" meaning every detected
video event has an audio onset within 2 frames and every onset an event. Targets (issue 17): colour >= 90%,
direction >= 80%, pitch >= 90%, sync >= 80%; turbo4-tiny within 5 points of the baseline; 8-step no-LoRA worse.

``--model PATH`` scores a checkpoint directory; its ``lora/turbo4-tiny.safetensors`` stands in for '@turbo4-tiny'.
A checkpoint directory's requests default to the full-size 768x1344 canvas: pass ``--size 128`` for the tiny's.
Writes bench/content_check/results/content_check*.{json,md}; ``--study NAME``: bench/NAME/results/ (a study that
runs the check on its own models, e.g. tiny_wider_dit, keeps the records beside its others).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

METRICS = ("colour", "shape", "direction", "pitch", "bounces", "sync")
TARGETS = {"colour": 0.9, "direction": 0.8, "pitch": 0.9, "sync": 0.8}
ROWS = {
    "baseline": ("MODEL", "baseline", "29-step baseline"),
    "random": ("tiny-random", "baseline", "random weights, 29 steps (chance control)"),
    "fewer-steps": ("MODEL", "fewer-steps", "8 steps, no LoRA"),
    "turbo4-tiny": ("MODEL", "turbo4-tiny", "turbo4-tiny (distilled 4-step LoRA)"),
    "turbo4-tiny-int8": ("MODEL", "turbo4-tiny-int8", "turbo4-tiny + INT8 W8A8"),
    "fbc-cache": ("MODEL", "fbc-cache", "29 steps + first-block cache"),
    # the shipped fbc-cache caches no step of the trained tiny at its threshold; this one does (bench/recipes)
    "fbc-cache-tiny": ("MODEL", str(Path(__file__).resolve().parents[1] / "recipes" / "fbc-cache-tiny.toml"),
                       "29 steps + first-block cache at the trained tiny's threshold"),
}


def wilson(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def score_row(model: str, recipe_name: str, prompts, seeds, workdir: Path, size: int | None = None) -> dict:
    from h3.media import decode_audio, decode_video
    from h3.recipe import load_recipe, with_lora_file
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.world.detect import describe_clip, parse_caption, score_clip

    recipe = load_recipe(recipe_name)
    if recipe.lora.enabled and recipe.lora.path == "@turbo4-tiny" and Path(model).is_dir():
        recipe = with_lora_file(recipe, Path(model) / "lora" / "turbo4-tiny.safetensors")
    runtime = H3Runtime.load(model, recipe, "cpu")
    clips, seconds, steps = [], [], {"computed": 0, "cached": 0}
    for prompt in prompts:
        expected = parse_caption(prompt.prompt)
        for seed in seeds:
            out = workdir / f"{recipe.name}-{prompt.id}-s{seed}.mp4"
            started = time.perf_counter()
            record = runtime.generate(GenerateRequest(prompt=prompt.prompt, seed=seed, prompt_id=prompt.id,
                                                      height=size, width=size), out)
            seconds.append(time.perf_counter() - started)
            cache = record.executed.levers.get("cache") or {}
            steps["computed"] += cache.get("computed_steps") or record.executed.forward_passes
            steps["cached"] += cache.get("cached_steps") or 0
            frames, _ = decode_video(out)
            audio, rate = decode_audio(out)
            result = score_clip(describe_clip(frames, audio, rate), expected)
            clips.append({"prompt_id": prompt.id, "seed": seed, **{m: getattr(result, m) for m in METRICS},
                          "details": result.details})
    summary = {}
    for metric in METRICS:
        values = [c[metric] for c in clips if c[metric] is not None]
        k, n = sum(values), len(values)
        summary[metric] = {"right": k, "n": n, "share": k / n if n else None, "wilson95": wilson(k, n)}
    return {"model": model, "recipe": recipe.name, "model_sha256": runtime.model_sha256, "summary": summary,
            "seconds_per_clip_median": sorted(seconds)[len(seconds) // 2], "clips": clips,
            # DiT steps over the row's requests, from each clip record (a step cache's skipped steps as it reported them)
            "dit_steps": steps}


def recipe_caches(name: str) -> bool:
    from h3.recipe import load_recipe

    return load_recipe(name).cache.kind != "none"


def table(rows: dict) -> str:
    head = "| row | model | recipe | " + " | ".join(METRICS) + " | s/clip |\n|---|---|---|" + "---|" * len(METRICS) + "---|\n"
    lines = []
    for label, row in rows.items():
        cells = []
        for metric in METRICS:
            s = row["summary"][metric]
            if not s["n"]:
                cells.append("n/a")
                continue
            lo, hi = s["wilson95"]
            mark = ""
            if metric in TARGETS and label == "baseline":
                mark = " ✓" if s["share"] >= TARGETS[metric] else " ✗"
            cells.append(f"{100 * s['share']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] ({s['right']}/{s['n']}){mark}")
        lines.append(f"| {ROWS[label][2]} | `{row['model']}` | `{row['recipe']}` | " + " | ".join(cells)
                     + f" | {row['seconds_per_clip_median']:.1f} |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-trained")
    parser.add_argument("--prompts", default="world-heldout")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--limit", type=int, help="only the first N prompts")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--name", default="content_check")
    parser.add_argument("--note", default="", help="a line for the Markdown (what the model is)")
    parser.add_argument("--size", type=int, default=None, help="square frame side (a checkpoint folder as the model "
                                                               "defaults to the full-size shape); default: the model's")
    parser.add_argument("--study", default=None, help="write the records into bench/STUDY/results (the study that "
                                                      "runs this check) instead of this study's")
    args = parser.parse_args()

    from bench.lib import results as _results

    if args.study:
        try:
            _results.RESULTS = _results.study_results(args.study)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(3)
    from h3eval.prompts import load_prompts, parse_seeds

    suite = load_prompts(args.prompts)
    prompts = suite.prompts[: args.limit] if args.limit else suite.prompts
    seeds = parse_seeds(args.seeds)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in args.rows.split(","):
            model, recipe, _ = ROWS[label]
            model = args.model if model == "MODEL" else model
            rows[label] = score_row(model, recipe, prompts, seeds, Path(tmp), args.size)
            print(label, {m: rows[label]["summary"][m]["share"] for m in METRICS}, flush=True)
    md = table(rows)
    if args.note:
        md = args.note.rstrip() + "\n\n" + md
    cached = {label: row["dit_steps"] for label, row in rows.items() if row["dit_steps"]["cached"]
              or recipe_caches(ROWS[label][1])}
    if cached:
        md += "\nStep caches, over each row's requests: " + "; ".join(
            f"`{rows[label]['recipe']}` {s['cached']} of {s['computed'] + s['cached']} steps cached" for label, s in cached.items()) + ".\n"
    md += (f"\nPrompts: `{args.prompts}` ({len(prompts)} captions, sha256 {suite.sha256[:12]}), seeds {seeds}; "
           "shares with Wilson 95% intervals. Targets on the baseline row: colour >= 90%, direction >= 80%, "
           "pitch >= 90%, sync >= 80% (✓/✗).\n")
    payload = {"model": args.model, "prompts": args.prompts, "prompts_sha256": suite.sha256, "seeds": seeds,
               "targets": TARGETS, "rows": rows, "note": args.note}
    paths = _results.write(args.name, payload, md)
    print(md)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
