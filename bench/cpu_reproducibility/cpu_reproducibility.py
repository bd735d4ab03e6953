"""What MKL's reproducibility mode costs on the tiny preset, and what it buys (issue 16).

    python bench/cpu_reproducibility/cpu_reproducibility.py [--rounds 3] [--clips 3] [--modes off,COMPATIBLE,AUTO,AVX2] [--model tiny]
        [--name cpu_reproducibility]

Each mode runs in its own process (MKL reads ``MKL_CBWR`` once, when it first runs): ``off`` is
``H3_CPU_REPRODUCIBLE=0`` (MKL picks kernels by CPU and alignment), the others set ``MKL_CBWR``. Per process: load the
tiny preset with the shipped ``baseline`` recipe (bf16), one warm-up clip, then ``--clips`` timed clips
(request-to-file); and the alignment check, in float32 (the tests' 2-step recipe; the CPU runs bf16 matmuls in oneDNN,
float32 ones in MKL): the loaded transformer's outputs against a deep copy re-homed at 4- and 16-byte offsets (the
failure of issue 16), counted as differing elements. Modes are interleaved round by round so machine load hits them alike;
the ratio to ``off`` is of medians over all rounds. CPU time (``time.process_time``, both threads) is
reported beside wall time: on a machine shared with other work it is the steadier measure of cost. Writes bench/cpu_reproducibility/results/cpu_reproducibility.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

_CHILD = r"""
import copy, json, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import h3, torch
from h3.determinism import numerics_platform
from h3.recipe import load_recipe
from h3.runtime import GenerateRequest, H3Runtime
from test_determinism import realign
runtime = H3Runtime.load({model!r}, load_recipe("baseline"), "cpu")
calls = []
hook = runtime.pipe.transformer.register_forward_pre_hook(
    lambda m, a, k: calls.append({{n: (v.clone() if torch.is_tensor(v) else v) for n, v in k.items()}}),
    with_kwargs=True)
times, cpu_times = [], []
with tempfile.TemporaryDirectory() as tmp:
    for i in range({clips} + 1):
        cpu0 = time.process_time()
        rec = runtime.generate(GenerateRequest(prompt="a red circle bounces", seed=i), Path(tmp) / f"{{i}}.mp4")
        cpu1 = time.process_time()
        if i == 0:
            hook.remove()
        else:
            times.append(rec.timings.request_to_file_latency_s)
            cpu_times.append(cpu1 - cpu0)
# The alignment check in float32 (the tests' recipe): bf16 matmuls on the CPU run in oneDNN, not MKL.
from conftest import FAST_RECIPE
from h3.recipe import recipe_from_dict
runtime = H3Runtime.load({model!r}, recipe_from_dict(FAST_RECIPE), "cpu")
calls = []
hook = runtime.pipe.transformer.register_forward_pre_hook(
    lambda m, a, k: calls.append({{n: (v.clone() if torch.is_tensor(v) else v) for n, v in k.items()}}),
    with_kwargs=True)
with tempfile.TemporaryDirectory() as tmp:
    runtime.generate(GenerateRequest(prompt="a red circle bounces", seed=0), Path(tmp) / "f.mp4")
hook.remove()
differing = {{}}
with torch.no_grad():
    ref = [runtime.pipe.transformer(**c)[0] for c in calls[:4]]
    for offset in (4, 16):
        moved = realign(copy.deepcopy(runtime.pipe.transformer), offset)
        differing[offset] = sum(int((moved(**c)[0] != r).sum()) for c, r in zip(calls[:4], ref))
print(json.dumps({{"times": times, "cpu_times": cpu_times, "differing": differing, "numerics": numerics_platform("cpu")}}))
"""


def run_mode(mode: str, clips: int, model: str = "tiny-random") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "H3_CPU_REPRODUCIBLE")}
    env["PYTHONPATH"] = str(ROOT)
    if mode == "off":
        env["H3_CPU_REPRODUCIBLE"] = "0"
    else:
        env["MKL_CBWR"] = mode
    code = _CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"), clips=clips, model=model)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"mode {mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clips", type=int, default=3)
    parser.add_argument("--modes", default="off,COMPATIBLE,AUTO,AVX2")
    parser.add_argument("--model", default="tiny-random", help="the preset to time (tiny: the trained one)")
    parser.add_argument("--name", default="cpu_reproducibility", help="results file name in results/")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "off" not in modes:
        raise SystemExit("--modes must include 'off' (the reference the cost is measured against)")

    from bench.lib import results as _results

    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes:
            result = run_mode(mode, args.clips, args.model)
            runs[mode].append(result)
            print(f"round {r} {mode}: median {statistics.median(result['times']):.3f} s, "
                  f"differing {result['differing']}", flush=True)
    summary = {}
    for mode in modes:
        times = [t for run in runs[mode] for t in run["times"]]
        differing = {off: max(run["differing"][off] for run in runs[mode]) for off in runs[mode][0]["differing"]}
        cpu_times = [t for run in runs[mode] for t in run["cpu_times"]]
        summary[mode] = {"median_s": statistics.median(times), "median_cpu_s": statistics.median(cpu_times),
                         "n": len(times), "differing_elements": differing,
                         "mkl_cbwr_active": runs[mode][0]["numerics"]["mkl_cbwr_active"]}
    for mode in modes:
        summary[mode]["ratio_to_off"] = summary[mode]["median_s"] / summary["off"]["median_s"]
        summary[mode]["cpu_ratio_to_off"] = summary[mode]["median_cpu_s"] / summary["off"]["median_cpu_s"]
    cpu = runs[modes[0]][0]["numerics"]
    table = (f"CPU: {cpu['cpu_model']} ({cpu['cpu_vendor']}), ATen capability {cpu['aten_cpu_capability']}, "
             f"{cpu['torch_threads']} threads. Preset `{args.model}`, `baseline` recipe (29 steps, 128×128, 5 s), "
             f"{args.rounds} interleaved rounds × {args.clips} clips per mode.\n\n"
             "| mode | MKL CNR on | median CPU time per clip (s) | vs off | median request-to-file (s) | vs off | "
             "float32 elements differing after re-homing the weights at a 4 / 16-byte offset |\n"
             "|---|---|---|---|---|---|---|\n")
    for mode in modes:
        s = summary[mode]
        d = s["differing_elements"]
        table += (f"| {mode} | {s['mkl_cbwr_active']} | {s['median_cpu_s']:.3f} (n={s['n']}) | "
                  f"{s['cpu_ratio_to_off']:.3f}× | {s['median_s']:.3f} | {s['ratio_to_off']:.3f}× "
                  f"| {' / '.join(str(d[k]) for k in sorted(d, key=int))} |\n")
    table += ("\n`off` is `H3_CPU_REPRODUCIBLE=0`; the runtime's default is `MKL_CBWR=AUTO` "
              "(h3/determinism.py; COMPATIBLE before session 21). A non-zero count means the same weights at "
              "another alignment gave other bits: what broke byte identity in issue 16.\n")
    _results.write(args.name, {"modes": summary, "runs": runs, "rounds": args.rounds, "clips": args.clips,
                               "model": args.model}, table)
    print(table)


if __name__ == "__main__":
    main()
