"""Portable numerics (issue 50): does ``H3_PORTABLE_NUMERICS=1`` give a trained-tiny clip the same bytes whatever the
CPU's vector ISA, where the default mode does not, and what does it cost a request?

    python bench/portable_numerics/portable_numerics.py [--recipes turbo4-tiny,fewer-steps] [--prompts 1]
        [--modes default,portable,portable-onednn] [--isas native,avx2] [--name portable_numerics]

One machine cannot be a Zen 1 and an Intel Xeon at once; it can run with its libraries capped at a Zen 1's ISA. Each
(mode, ISA) runs in its own process (the libraries read their variables when they load):

- ISA ``native``: every library at this CPU's best (here AVX-512 with AMX; ``ATEN_CPU_CAPABILITY=avx512``).
- ISA ``avx2``: a Zen 1's ceiling: ``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``,
  ``MKL_ENABLE_INSTRUCTIONS=AVX2``, numpy's and OpenCV's AVX-512 dispatch off. It does not hide the CPU from torch's
  own cpuinfo checks (torch still sends bf16 matmuls to oneDNN here, as it would not on a Zen 1), nor change cache
  sizes, the vendor or the core count: the capped run is a Zen 1 only in its ISA.
- mode ``default``: the runtime's default (``MKL_CBWR=AUTO``); ``portable``: ``H3_PORTABLE_NUMERICS=1``
  (h3/determinism.py: MKL COMPATIBLE, ATen AVX2, oneDNN off, numpy/OpenCV below AVX-512, 2 threads), which overrides
  the ATen, numpy and OpenCV caps, so between its two ISAs only oneDNN's and MKL's caps vary; ``portable-onednn``:
  the portable mode with oneDNN switched back on (what turning oneDNN off buys).

Per process: the trained tiny with each recipe, the first ``--prompts`` world-demo captions at seed i, each clip's
sha256 (the MP4's bytes: what the run store compares) with its request-to-file wall time and CPU time
(``time.process_time``, both threads: the steadier measure on a shared machine). All processes run 2 threads.
Writes bench/portable_numerics/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

_CHILD = r"""
import hashlib, json, os, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {root!r})
import h3, torch
if {keep_onednn!r}:
    torch.backends.mkldnn.enabled = True
from h3.determinism import numerics_platform
from h3.recipe import load_recipe
from h3.runtime import GenerateRequest, H3Runtime
prompts = [json.loads(l)["prompt"] for l in open({suite!r}, encoding="utf-8")][:{prompts}]
clips = []
with tempfile.TemporaryDirectory() as tmp:
    for name in {recipes!r}:
        runtime = H3Runtime.load("tiny", load_recipe(name), "cpu")
        for i, prompt in enumerate(prompts):
            out = Path(tmp) / f"{{name}}-{{i}}.mp4"
            cpu0 = time.process_time()
            rec = runtime.generate(GenerateRequest(prompt=prompt, seed=i), out)
            clips.append({{"recipe": name, "prompt": i, "seed": i,
                          "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
                          "wall_s": rec.timings.request_to_file_latency_s, "cpu_s": time.process_time() - cpu0}})
        del runtime
print(json.dumps({{"clips": clips, "numerics": numerics_platform("cpu"), "onednn": torch.backends.mkldnn.enabled}}))
"""

ISAS = {
    "native": {"ATEN_CPU_CAPABILITY": "avx512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
             "OPENCV_CPU_DISABLE": "AVX512F,AVX512-COMMON,AVX512-SKX"},
}
_OURS = ("MKL_CBWR", "H3_CPU_REPRODUCIBLE", "H3_PORTABLE_NUMERICS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
         "MKL_ENABLE_INSTRUCTIONS", "NPY_DISABLE_CPU_FEATURES", "OPENCV_CPU_DISABLE", "OPENCV_IPP",
         "OPENBLAS_CORETYPE", "OMP_NUM_THREADS")


def run(mode: str, isa: str, recipes: list[str], prompts: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _OURS}
    env.update(ISAS[isa], PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")
    if mode.startswith("portable"):
        env["H3_PORTABLE_NUMERICS"] = "1"
    code = _CHILD.format(root=str(ROOT), suite=str(ROOT / "prompts" / "world-demo.jsonl"), prompts=prompts,
                         recipes=recipes, keep_onednn=mode == "portable-onednn")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:  # recorded as a result (the last line of the error), not a missing row
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="turbo4-tiny,fewer-steps")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--modes", default="default,portable,portable-onednn")
    parser.add_argument("--isas", default="native,avx2")
    parser.add_argument("--name", default="portable_numerics")
    args = parser.parse_args()
    recipes = [r for r in args.recipes.split(",") if r]
    modes = [m for m in args.modes.split(",") if m]
    isas = [i for i in args.isas.split(",") if i]

    from bench.lib import results as _results

    runs: dict[str, dict[str, dict]] = {m: {} for m in modes}
    for mode in modes:
        for isa in isas:
            runs[mode][isa] = run(mode, isa, recipes, args.prompts)
            print(mode, isa, runs[mode][isa].get("error") or [(c["recipe"], c["sha256"][:12], round(c["cpu_s"], 2))
                                                              for c in runs[mode][isa]["clips"]], flush=True)
    failed = {f"{m}/{i}": runs[m][i]["error"] for m in modes for i in isas if "error" in runs[m][i]}
    modes = [m for m in modes if not any(f.startswith(f"{m}/") for f in failed)]
    if not modes:
        raise SystemExit(f"every mode failed: {failed}")

    keys = [(c["recipe"], c["prompt"]) for c in runs[modes[0]][isas[0]]["clips"]]
    table = ("| mode | clip (recipe, prompt, seed) | " + " | ".join(f"sha256 under {i}" for i in isas)
             + " | same bytes | " + " | ".join(f"CPU s under {i}" for i in isas) + " |\n|---|---|"
             + "---|" * (2 * len(isas) + 1) + "\n")
    summary: dict[str, dict] = {}
    for mode in modes:
        same_all = True
        for k, key in enumerate(keys):
            clips = [runs[mode][isa]["clips"][k] for isa in isas]
            same = len({c["sha256"] for c in clips}) == 1
            same_all &= same
            table += (f"| {mode} | {key[0]}, demo-{key[1]:02d}, s{key[1]} | "
                      + " | ".join(f"`{c['sha256'][:12]}`" for c in clips) + f" | {'yes' if same else 'NO'} | "
                      + " | ".join(f"{c['cpu_s']:.2f}" for c in clips) + " |\n")
        cpu_native = {c["recipe"]: c["cpu_s"] for c in runs[mode][isas[0]]["clips"]}
        summary[mode] = {"identical_across_isas": same_all, "cpu_s_native": cpu_native}
    if "default" in modes:
        table += "\nCPU time per request on the native ISA, against the default mode:\n\n| recipe | default | "
        others = [m for m in modes if m != "default"]
        table += " | ".join(others) + " |\n|---|---|" + "---|" * len(others) + "\n"
        for recipe in recipes:
            base = summary["default"]["cpu_s_native"][recipe]
            table += f"| {recipe} | {base:.2f} s | " + " | ".join(
                f"{summary[m]['cpu_s_native'][recipe]:.2f} s ({summary[m]['cpu_s_native'][recipe] / base:.2f}x)"
                for m in others) + " |\n"
    for name, error in failed.items():
        table += f"\n`{name}` failed: `{error}`\n"
    numerics = {f"{m}/{i}": runs[m][i]["numerics"] for m in modes for i in isas}
    table += ("\nISA `avx2` caps ATen, oneDNN, MKL, numpy and OpenCV at AVX2 (a Zen 1's ceiling) on this CPU; the portable "
              "mode pins ATen, numpy and OpenCV itself, so between its two ISAs only oneDNN's and MKL's caps vary. "
              "Each clip's first request in its process (no warm-up): the CPU times include first-call costs alike "
              "in every mode.\n")
    _results.write(args.name, {"runs": runs, "summary": summary, "recipes": recipes, "prompts": args.prompts,
                               "modes": modes, "failed": failed, "isas": isas, "isa_env": ISAS, "numerics": numerics}, table)
    print(table)


if __name__ == "__main__":
    main()
