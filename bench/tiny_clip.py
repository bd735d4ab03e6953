"""One tiny clip on the CPU: the foundation's speed target (≤ 10 s per clip on a 2-core CPU).

    python bench/tiny_clip.py [--repeats 3] [--recipe baseline]

Times `H3Runtime.generate` for the tiny preset (load excluded, first request reported separately as warm-up) and
writes bench/results/tiny_clip_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipe", default="baseline")
    args = parser.parse_args()

    import torch

    from bench import _results
    from h3.recipe import load_recipe
    from h3.runtime import GenerateRequest, H3Runtime

    t0 = time.perf_counter()
    runtime = H3Runtime.load("tiny", load_recipe(args.recipe), "cpu")
    load_s = time.perf_counter() - t0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats + 1):
            t = time.perf_counter()
            record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=i), Path(tmp) / f"{i}.mp4")
            rows.append({"wall_s": time.perf_counter() - t,
                         "generation_side_s": record.timings.generation_side_latency_s,
                         "request_to_file_s": record.timings.request_to_file_latency_s,
                         "anatomy": record.timings.stage_anatomy.model_dump()})
    warm = rows[1:]
    median = statistics.median(r["request_to_file_s"] for r in warm)
    payload = {"recipe": args.recipe, "torch_threads": torch.get_num_threads(), "load_s": load_s,
               "warmup": rows[0], "runs": warm, "median_request_to_file_s": median, "target_s": TARGET_S,
               "met": median <= TARGET_S}
    a = warm[0]["anatomy"]
    table = ("| recipe | load (s) | first request (s) | median request-to-file (s) | target | met |\n"
             "|---|---|---|---|---|---|\n"
             f"| {args.recipe} | {load_s:.2f} | {rows[0]['request_to_file_s']:.2f} | {median:.2f} | ≤ {TARGET_S:.0f} s "
             f"| {'yes' if median <= TARGET_S else 'no'} |\n\n"
             "Stage anatomy of the first warm request (s): "
             + ", ".join(f"{k} {v if isinstance(v, float) else sum(v):.3f}" for k, v in a.items()) + "\n")
    paths = _results.write("tiny_clip_cpu", payload, table)
    print(table)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
