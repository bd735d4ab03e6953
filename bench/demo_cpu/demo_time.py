"""Wall time of the main job (`h3eval demo`) on this machine; the target is ≤ 3 min on a 2-core CPU.

    python bench/demo_cpu/demo_time.py [--out /tmp/demo-bench] [--name demo_cpu]

Runs the demo from scratch into a fresh directory (the trained tiny preset ships built; nothing is cached) and writes
bench/demo_cpu/results/demo_cpu.{json,md}: the wall time, the process's CPU time (user + system: on a machine shared with other
jobs the wall time grows with their load, the CPU time much less), the load average around it, the model, prompts and
seeds, the verdict (each candidate's outcome, the ladder's judges, where the sequential run stopped each candidate and
the requests it saved) and what the prompt faithfulness gate read from each recipe's clips.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGET_S = 180.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/h3eval-demo-bench")
    parser.add_argument("--name", default="demo_cpu", help="results file name in results/")
    args = parser.parse_args()
    from bench.lib import results as _results
    from h3eval.demo import DEMO_PROMPTS, DEMO_RECIPES, run_demo

    shutil.rmtree(args.out, ignore_errors=True)
    load_before = os.getloadavg()
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = run_demo(args.out, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    content = {recipe: {aspect: f"{right}/{scored}" for aspect, (right, scored) in aspects.items()}
               for recipe, aspects in result.content.items()}
    payload = {"wall_s": wall, "cpu_s": cpu, "target_s": TARGET_S, "met": wall <= TARGET_S, "model": result.model,
               "prompts": DEMO_PROMPTS, "seeds": list(result.seeds), "recipes": list(DEMO_RECIPES),
               "overall": result.overall, "identical": result.identical, "content": content,
               "lpips_trunk": result.lpips_trunk, "load_average_before": load_before,
               "load_average_after": os.getloadavg(), "gate_errors": len(result.gate_errors),
               "stage_seconds": result.stage_seconds, "gate_threads_env": os.environ.get("H3EVAL_GATE_THREADS"),
               "outcomes": result.outcomes, "ladder": result.ladder, "sequential": result.sequential,
               "requests_saved": result.saved, "baseline_determinism": list(result.determinism),
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    table = ("| measure | value |\n|---|---|\n"
             f"| `h3eval demo` wall time | {wall:.0f} s (target ≤ {TARGET_S:.0f} s: {'met' if wall <= TARGET_S else 'missed'}) |\n"
             f"| process CPU time (user + system) | {cpu:.0f} s |\n"
             f"| parts (wall s) | " + ", ".join(f"{k} {v:.0f}" for k, v in result.stage_seconds.items()) + " |\n"
             f"| gates of a pair at once | $H3EVAL_GATE_THREADS={os.environ.get('H3EVAL_GATE_THREADS') or 'unset (the default)'} |\n"
             f"| model, prompts, seeds | {result.model}, {DEMO_PROMPTS} ({result.prompts}), {list(result.seeds)} |\n"
             f"| verdict | {result.overall}: " + ", ".join(f"{k} {v}" for k, v in result.outcomes.items()) + " |\n"
             f"| the ladder | " + "<br>".join(line.strip() for line in result.ladder) + " |\n"
             f"| sequential stops | " + "<br>".join(line.strip() for line in result.sequential) + " |\n"
             f"| requests saved | {result.saved} |\n"
             f"| OMP_NUM_THREADS | {os.environ.get('OMP_NUM_THREADS') or 'unset (torch: one thread a core)'} |\n"
             f"| identical to baseline | {result.identical} |\n"
             f"| LPIPS trunk | {result.lpips_trunk} |\n"
             + "".join(f"| content, {recipe} (clips right / scored) | "
                       + ", ".join(f"{a} {v}" for a, v in aspects.items()) + " |\n"
                       for recipe, aspects in content.items())
             + f"| load average before / after | {load_before} / {os.getloadavg()} |\n")
    print(table)
    print("wrote", *_results.write(args.name, payload, table))


if __name__ == "__main__":
    main()
