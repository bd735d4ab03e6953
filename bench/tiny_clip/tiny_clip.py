"""One tiny clip on the CPU: the foundation's speed target (≤ 10 s per clip on a 2-core CPU).

    python bench/tiny_clip/tiny_clip.py [--repeats 3] [--recipe baseline] [--model tiny]

Times `H3Runtime.generate` for a tiny preset (``tiny``, the trained one, by default; ``tiny-random``) on a world
caption (load excluded, first request reported separately as warm-up) and writes bench/tiny_clip/results/tiny_clip_cpu.{json,md}
(``tiny_clip_cpu_random`` for the random preset). The record names the preset that ran.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGET_S = 10.0
PROMPT = "a red circle moves left to right while a low tone hums; it bounces twice; the background is plain"
"""A caption of the trained preset's world (any prompt costs the same: the text is a few dozen tokens)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipe", default="baseline")
    parser.add_argument("--model", default="tiny", help="tiny (the trained preset) or tiny-random")
    args = parser.parse_args()

    import torch

    from bench.lib import results as _results
    from h3.recipe import load_recipe
    from h3.runtime import GenerateRequest, H3Runtime

    t0 = time.perf_counter()
    runtime = H3Runtime.load(args.model, load_recipe(args.recipe), "cpu")
    load_s = time.perf_counter() - t0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats + 1):
            t = time.perf_counter()
            record = runtime.generate(GenerateRequest(prompt=PROMPT, seed=i), Path(tmp) / f"{i}.mp4")
            rows.append({"wall_s": time.perf_counter() - t,
                         "generation_side_s": record.timings.generation_side_latency_s,
                         "request_to_file_s": record.timings.request_to_file_latency_s,
                         "anatomy": record.timings.stage_anatomy.model_dump()})
    warm = rows[1:]
    median = statistics.median(r["request_to_file_s"] for r in warm)
    payload = {"model": runtime.model, "model_sha256": runtime.model_sha256, "prompt": PROMPT,
               "recipe": args.recipe, "torch_threads": torch.get_num_threads(), "load_s": load_s,
               "warmup": rows[0], "runs": warm, "median_request_to_file_s": median, "target_s": TARGET_S,
               "met": median <= TARGET_S}
    a = warm[0]["anatomy"]
    table = ("| model | recipe | load (s) | first request (s) | median request-to-file (s) | target | met |\n"
             "|---|---|---|---|---|---|---|\n"
             f"| {runtime.model} | {args.recipe} | {load_s:.2f} | {rows[0]['request_to_file_s']:.2f} | {median:.2f} "
             f"| ≤ {TARGET_S:.0f} s | {'yes' if median <= TARGET_S else 'no'} |\n\n"
             "Stage anatomy of the first warm request (s): "
             + ", ".join(f"{k} {v if isinstance(v, float) else sum(v):.3f}" for k, v in a.items()) + "\n")
    suffix = "" if runtime.model == "tiny-trained" else "_" + runtime.model.removeprefix("tiny-")
    name = "tiny_clip_cpu" + suffix
    paths = _results.write(name, payload, table)
    print(table)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
