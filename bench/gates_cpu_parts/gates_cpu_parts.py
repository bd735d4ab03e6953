"""The CPU figures behind session 7's demo changes, measured on a finished demo run (2-core CPU):

    python bench/demo_cpu/demo_time.py --out /tmp/demo        # makes /tmp/demo/run
    python bench/gates_cpu_parts/gates_cpu_parts.py --run /tmp/demo/run [--repeat 1]

- a latent trajectory's write and load, compressed (np.savez_compressed, before) and not (np.savez, now);
- reference_free and prompt_faithfulness on the run's bit-identical pairs with their identical_result shortcut and
  without it (the full evaluation of both clips);
- the demo's seven gates over every pair, and its floor's five gates, one gate after another and two side by side
  ($H3EVAL_GATE_THREADS=1 / 2: why side by side is not the default on few cores).

Each gate pass starts from empty result folders and empty caches, in this one process (imports and LPIPS are loaded
before the first timed pass). Writes bench/gates_cpu_parts/results/gates_cpu_parts.{json,md}.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3eval.demo import CPU_GATES as DEMO_GATES, floor_gates  # noqa: E402  (what the demo runs)

FLOOR_GATES = tuple(floor_gates())
OPTIONS = {"fidelity.lpips_trunk": "rand"}


def _clear() -> None:
    from gates import media_cache, reference_free

    media_cache.clear()
    reference_free.clear_cache()


def trajectory_io(run: Path) -> dict[str, float]:
    import numpy as np

    from h3.trajectory import load_trajectory

    arrays = load_trajectory(sorted((run / "clips" / "baseline").glob("*.traj.npz"))[0])
    out = {}
    for name, save in (("compressed", np.savez_compressed), ("uncompressed", np.savez)):
        buffer = io.BytesIO()
        t0 = time.perf_counter()
        save(buffer, **arrays)
        out[f"{name}_write_s"] = time.perf_counter() - t0
        out[f"{name}_mib"] = buffer.tell() / 2**20
        buffer.seek(0)
        t0 = time.perf_counter()
        with np.load(buffer) as data:
            {k: data[k] for k in data.files}
        out[f"{name}_load_s"] = time.perf_counter() - t0
    return out


def gates_pass(run: Path, gates, threads: int, candidates=None) -> float:
    from h3eval.gaterun import run_gates

    os.environ["H3EVAL_GATE_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run"
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("gates", "speed", "warmup"))
        _clear()
        t0 = time.perf_counter()
        summary = run_gates(copy, list(gates), device="cpu", options=OPTIONS, progress=False, candidates=candidates)
        seconds = time.perf_counter() - t0
    if summary.errors:
        raise SystemExit(f"gate errors: {summary.errors[:3]}")
    return seconds


def floor_pass(run: Path, threads: int) -> float:
    from h3eval.floor import newseed_floor_from_run

    os.environ["H3EVAL_GATE_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        _clear()
        t0 = time.perf_counter()
        newseed_floor_from_run(run, "baseline", Path(tmp) / "floor", gates=FLOOR_GATES, device="cpu",
                               gate_options=OPTIONS, progress=False)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True, help="a finished demo run (bench/demo_cpu/demo_time.py --out D: D/run)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    from bench.lib import results as _results
    from gates.prompt_faithfulness import PromptFaithfulnessGate
    from gates.reference_free import ReferenceFreeGate

    run = Path(args.run)
    load_before = os.getloadavg()
    io_s = trajectory_io(run)
    gates_pass(run, ("fidelity",), 1, candidates=["identity"])  # imports and LPIPS loaded once, untimed
    rows = {}
    identical = ("reference_free", "prompt_faithfulness")
    rows["identical pairs: reference_free + prompt_faithfulness, shortcut"] = [
        gates_pass(run, identical, 1, candidates=["identity"]) for _ in range(args.repeat)]
    saved = {g: g.identical_result for g in (ReferenceFreeGate, PromptFaithfulnessGate)}
    for cls in saved:
        del cls.identical_result
    try:
        rows["identical pairs: reference_free + prompt_faithfulness, full evaluation"] = [
            gates_pass(run, identical, 1, candidates=["identity"]) for _ in range(args.repeat)]
    finally:
        for cls, method in saved.items():
            cls.identical_result = method
    for threads in (1, 2):
        rows[f"demo's 7 gates, all pairs, {threads} at a time"] = [
            gates_pass(run, DEMO_GATES, threads) for _ in range(args.repeat)]
    for threads in (1, 2):
        rows[f"floor's 5 gates, new-seed pairs, {threads} at a time"] = [
            floor_pass(run, threads) for _ in range(args.repeat)]
    os.environ.pop("H3EVAL_GATE_THREADS", None)
    payload = {"run": str(run), "trajectory_io": io_s, "seconds": rows, "load_average_before": load_before,
               "load_average_after": os.getloadavg()}
    table = ("| measure | wall s (each repeat) |\n|---|---|\n"
             + "".join(f"| {k} | {', '.join(f'{v:.1f}' for v in vs)} |\n" for k, vs in rows.items())
             + f"| one trajectory write, compressed / uncompressed | {io_s['compressed_write_s']:.3f} / "
               f"{io_s['uncompressed_write_s']:.3f} ({io_s['compressed_mib']:.1f} / "
               f"{io_s['uncompressed_mib']:.1f} MiB) |\n"
             + f"| one trajectory load, compressed / uncompressed | {io_s['compressed_load_s']:.3f} / "
               f"{io_s['uncompressed_load_s']:.3f} |\n"
             + f"| load average before / after | {load_before} / {os.getloadavg()} |\n")
    print(table)
    print("wrote", *_results.write("gates_cpu_parts", payload, table))


if __name__ == "__main__":
    main()
