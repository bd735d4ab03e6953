"""opcheck on the tiny preset (CPU): what capture costs a request, and how long replay and the sweep take.

    python bench/opcheck_tiny/opcheck_tiny.py [--repeats 2] [--candidate _native_math]

Times a plain request and the same request with op capture of every step and layer (attention + linear), checks
the clips are byte-identical, then replays the capture through the baseline (native SDPA, F.linear) and the
candidate attention backend against float64, and runs the random-shape sweep. Writes
bench/opcheck_tiny/results/opcheck_tiny_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--candidate", default="_native_math")
    args = parser.parse_args()

    from bench.lib import results as _results
    from gates.opcheck import Budget, replay_capture, sweep_op
    from h3.capture import CaptureConfig, OpCapture, load_index
    from h3.ops import ops_for_recipe
    from h3.recipe import load_recipe, recipe_from_dict
    from h3.runtime import GenerateRequest, H3Runtime

    base = load_recipe("baseline")
    recipe = recipe_from_dict({**base.resolved(), "dtype": "float32", "steps": 2, "name": "bench-fast"})
    runtime = H3Runtime.load("tiny-random", recipe, "cpu")
    request = GenerateRequest(prompt="A person is squat", seed=0)
    plain, captured, identical = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runtime.generate(request, tmp / "warmup.mp4")
        for i in range(args.repeats):
            t = time.perf_counter()
            runtime.generate(request, tmp / f"plain{i}.mp4")
            plain.append(time.perf_counter() - t)
            capture = OpCapture(tmp / f"cap{i}", CaptureConfig(kinds=("attention", "linear")))
            t = time.perf_counter()
            with capture.attach(runtime.pipe):
                runtime.generate(request, tmp / f"cap{i}.mp4")
            captured.append(time.perf_counter() - t)
            identical.append((tmp / f"cap{i}.mp4").read_bytes() == (tmp / f"plain{i}.mp4").read_bytes())
        index = load_index(tmp / "cap0")
        cand = {**recipe.resolved(), "name": "cand", "attention": {"backend": args.candidate}}
        t = time.perf_counter()
        rows, _ = replay_capture(tmp / "cap0", ops_for_recipe(recipe), ops_for_recipe(cand), "cpu", Budget())
        replay_s = time.perf_counter() - t
        example = next(r for r in index["records"] if r["kind"] == "attention")
        base_ops, cand_ops = ops_for_recipe(recipe), ops_for_recipe(cand)
        t = time.perf_counter()
        sweep = sweep_op("attention", base_ops.for_record(example), cand_ops.for_record(example), example, "cpu",
                         example["dtype"], Budget())
        sweep_s = time.perf_counter() - t
    payload = {
        "candidate_backend": args.candidate, "plain_s": plain, "captured_s": captured,
        "byte_identical": identical, "capture_records": len(index["records"]), "capture_bytes": index["bytes"],
        "replay_s": replay_s, "replayed_records": len(rows), "replay_failed": sum(r["status"] == "fail" for r in rows),
        "sweep_s": sweep_s, "sweep_records": len(sweep), "sweep_failed": sum(r["status"] == "fail" for r in sweep),
        "worst_rel_l2_ratio": max(r["rel_l2_ratio"] for r in rows + sweep if "rel_l2_ratio" in r),
    }
    med_plain, med_cap = statistics.median(plain), statistics.median(captured)
    table = ("| plain request (s) | with capture (s) | byte-identical | records | capture MiB | replay (s) | "
             "sweep (s) | failed | worst rel-L2 ratio |\n|---|---|---|---|---|---|---|---|---|\n"
             f"| {med_plain:.2f} | {med_cap:.2f} | {all(identical)} | {len(index['records'])} | "
             f"{index['bytes'] / 2**20:.1f} | {replay_s:.2f} | {sweep_s:.2f} | "
             f"{payload['replay_failed'] + payload['sweep_failed']} | {payload['worst_rel_l2_ratio']:.2f} |\n\n"
             f"Tiny preset, 2 steps, float32, every step and layer captured; candidate attention backend "
             f"`{args.candidate}` against native SDPA. Medians of {args.repeats} requests after one warm-up.\n")
    paths = _results.write("opcheck_tiny_cpu", payload, table)
    print(table)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
