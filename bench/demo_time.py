"""Wall time of the main job (`h3eval demo`) on this machine; the target is ≤ 3 min on a 2-core CPU.

    python bench/demo_time.py [--out /tmp/demo-bench]

Runs the demo from scratch into a fresh directory (the tiny preset cache is reused if present: it is built once per
machine) and writes bench/results/demo_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET_S = 180.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/h3eval-demo-bench")
    args = parser.parse_args()
    from bench import _results
    from h3eval.demo import run_demo

    shutil.rmtree(args.out, ignore_errors=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    result = run_demo(args.out, progress=False)
    wall = time.perf_counter() - t0
    payload = {"wall_s": wall, "target_s": TARGET_S, "met": wall <= TARGET_S, "overall": result.overall,
               "identical": result.identical, "lpips_trunk": result.lpips_trunk, "load_average_before": load_before,
               "load_average_after": os.getloadavg(), "gate_errors": len(result.gate_errors)}
    table = ("| measure | value |\n|---|---|\n"
             f"| `h3eval demo` wall time | {wall:.0f} s (target ≤ {TARGET_S:.0f} s: {'met' if wall <= TARGET_S else 'missed'}) |\n"
             f"| verdict | {result.overall} |\n"
             f"| identical to baseline | {result.identical} |\n"
             f"| LPIPS trunk | {result.lpips_trunk} |\n"
             f"| load average before / after | {load_before} / {os.getloadavg()} |\n")
    print(table)
    print("wrote", *_results.write("demo_cpu", payload, table))


if __name__ == "__main__":
    main()
