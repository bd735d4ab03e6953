"""Do the gates' numpy and OpenCV ops give the same bits under AVX-512 dispatch and under a Zen 1's AVX2 ceiling?

    python bench/portable_numerics/gate_ops.py [--name gate_ops]

The clips are not all a verdict reads: the gates compute on them in numpy (its own SIMD dispatch and OpenBLAS, which
picks a kernel per CPU model) and OpenCV (per-ISA dispatch; Farneback flow is the dynamic-degree gate's). Each
environment runs in its own process (both libraries read their variables at import): ``native`` (this CPU's best),
``avx2`` (numpy's and OpenCV's AVX-512 dispatch off: portable numerics' caps), ``avx2+haswell`` (and OpenBLAS's Haswell
kernels, as portable numerics sets: a Zen runs those, or kernels of its own), ``sse`` (OpenCV below AVX2: a CPU
portable numerics does not cover). Inputs: seeded random 128x128 frames and a 100k float32 vector; each output's
sha256. Writes bench/portable_numerics/results/<name>.{json,md}.
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
import hashlib, json, sys
sys.path.insert(0, {root!r})
import numpy as np
from gates.metrics.flow import downscale, flow, warp
rng = np.random.default_rng(0)
a = (rng.random((128, 128)) * 255).astype(np.float32)
b = np.roll(a, 3, axis=1) + rng.normal(0, 4, a.shape).astype(np.float32)
frames = (rng.random((6, 128, 128, 3)) * 255).astype(np.uint8)
x = rng.normal(size=100003).astype(np.float32)
m = x[:10000].reshape(100, 100)
outs = {{"cv2 Farneback flow": flow(a, b), "cv2 resize INTER_AREA": downscale(frames, 50), "cv2 remap": warp(a, flow(a, b)),
        "np exp f32": np.exp(x), "np tanh f32": np.tanh(x), "np sum f32": np.array(x.sum()), "np matmul f32": m @ m}}
print(json.dumps({{k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in outs.items()}}))
"""
_AVX2 = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
         "OPENCV_CPU_DISABLE": "AVX512F,AVX512-COMMON,AVX512-SKX"}
ENVS = {
    "native": {},
    "avx2": _AVX2,
    "avx2+haswell": {**_AVX2, "OPENBLAS_CORETYPE": "Haswell"},
    "sse": {**_AVX2, "OPENBLAS_CORETYPE": "Haswell", "OPENCV_CPU_DISABLE": "AVX512F,AVX512-COMMON,AVX512-SKX,AVX2,FMA3,AVX"},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="gate_ops")
    args = parser.parse_args()
    from bench.lib import results as _results

    drop = {"NPY_DISABLE_CPU_FEATURES", "OPENCV_CPU_DISABLE", "OPENBLAS_CORETYPE", "OPENCV_IPP"}
    hashes = {}
    for name, extra in ENVS.items():
        env = {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}
        proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT))], env=env, capture_output=True,
                              text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
        hashes[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    table = "| op | " + " | ".join(ENVS) + " |\n|---|" + "---|" * len(ENVS) + "\n"
    for op in hashes["native"]:
        table += f"| {op} | " + " | ".join(
            f"`{hashes[e][op][:12]}`" + ("" if hashes[e][op] == hashes["native"][op] else " (differs)") for e in ENVS) + " |\n"
    table += "\n" + "; ".join(f"`{e}`: {' '.join(f'{k}={v}' for k, v in extra.items()) or 'no caps'}"
                              for e, extra in ENVS.items()) + ".\n"
    _results.write(args.name, {"envs": ENVS, "hashes": hashes}, table)
    print(table)


if __name__ == "__main__":
    main()
