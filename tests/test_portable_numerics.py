"""Portable numerics (h3/determinism.py, ``H3_PORTABLE_NUMERICS=1``): the environment it sets, what a process started
with it runs, and the property it exists for: the same floats whatever vector ISA the libraries are allowed.

The ISA check caps this CPU's libraries at a Zen 1's ceiling (AVX2) in one child process and leaves them at the CPU's
best in another, and compares the bits of the ops the trained tiny runs (bf16 linears, attention, norms, activations,
float32 convolutions and matmuls). In the default mode the two differ on a CPU with AVX-512 (the control: what broke
issue 50's chain between the Intel and the Zen 1 VMs); in the portable mode they must not. The clip-level figures are
bench/portable_numerics's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3.determinism import PORTABLE_SWITCH, PORTABLE_THREADS, _cpu_flags, portable_numerics_env

ROOT = Path(__file__).resolve().parent.parent
HAS_AVX512 = "avx512f" in _cpu_flags()
HAS_AVX2 = {"avx2", "fma"} <= _cpu_flags()

_OPS = r"""
import hashlib, json
import h3, torch
import torch.nn.functional as F
from h3.determinism import numerics_platform
g = torch.Generator().manual_seed(0)
x = torch.randn(2, 96, 160, generator=g)
w = torch.randn(192, 160, generator=g) / 13
q, k, v = (torch.randn(2, 4, 96, 40, generator=g).bfloat16() for _ in range(3))
video = torch.randn(1, 8, 5, 24, 24, generator=g)
kernel = torch.randn(8, 8, 3, 3, 3, generator=g) / 15
outs = {
    "linear_bf16": F.linear(x.bfloat16(), w.bfloat16()),
    "sdpa_bf16": F.scaled_dot_product_attention(q, k, v),
    "norm_silu_bf16": F.silu(F.layer_norm(x.bfloat16(), (160,))),
    "gelu_softmax_f32": F.softmax(F.gelu(x), dim=-1),
    "matmul_f32": x @ w.T,
    "conv3d_f32": F.conv3d(video, kernel, padding=1),
    "conv3d_bf16": F.conv3d(video.bfloat16(), kernel.bfloat16(), padding=1),
}
print(json.dumps({"hashes": {n: hashlib.sha256(t.float().contiguous().numpy().tobytes()).hexdigest()
                             for n, t in outs.items()}, "numerics": numerics_platform("cpu")}))
"""
_ZEN1_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
_BEST = {"ATEN_CPU_CAPABILITY": "avx512"}


def _child(portable: bool, caps: dict[str, str], code: str = _OPS) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in (PORTABLE_SWITCH, "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                        "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")
    env.update(caps)
    if portable:
        env[PORTABLE_SWITCH] = "1"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_environment_pins_every_library_and_caps_avx512_only_where_the_cpu_has_it():
    intel = portable_numerics_env({"avx2", "fma", "avx512f", "amx_bf16"})
    zen1 = portable_numerics_env({"avx2", "fma"})
    for env in (intel, zen1):
        assert env[PORTABLE_SWITCH] == "1" and env["MKL_CBWR"] == "COMPATIBLE"
        assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["OMP_NUM_THREADS"] == str(PORTABLE_THREADS) == "2"
        assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["OPENCV_IPP"] == "disabled"
    assert intel["NPY_DISABLE_CPU_FEATURES"] == "X86_V4 AVX512_ICL AVX512_SPR"
    assert intel["OPENCV_CPU_DISABLE"] == "AVX512F,AVX512-COMMON,AVX512-SKX"
    # A CPU without AVX-512 loads numpy and OpenCV as it always does (naming a feature it lacks would warn)
    assert set(intel) - set(zen1) == {"NPY_DISABLE_CPU_FEATURES", "OPENCV_CPU_DISABLE"}


@pytest.mark.skipif(not HAS_AVX2, reason="portable numerics is AVX2's code path: this CPU has no AVX2 + FMA")
def test_a_process_started_portable_overrides_the_users_values_and_records_the_mode():
    code = "import json, h3; from h3.determinism import numerics_platform; print(json.dumps(numerics_platform()))"
    numerics = _child(True, {"MKL_CBWR": "AUTO", "OMP_NUM_THREADS": "1", **_BEST}, code)
    assert (numerics["mkl_cbwr"], numerics["aten_cpu_capability"], numerics["torch_threads"]) == ("COMPATIBLE", "AVX2", 2)
    assert numerics["portable_numerics"] is True and numerics["onednn_enabled"] is False
    if numerics["mkl_cbwr_active"] is not None:  # None: a torch without MKL
        assert numerics["mkl_cbwr_active"] is True
    default = _child(False, {}, code)
    assert "portable_numerics" not in default and default["mkl_cbwr"] == "AUTO"  # the default mode's records unchanged


@pytest.mark.skipif(not HAS_AVX2, reason="portable numerics is AVX2's code path: this CPU has no AVX2 + FMA")
def test_portable_bits_do_not_depend_on_the_isa_the_libraries_may_use():
    best, capped = _child(True, _BEST), _child(True, _ZEN1_CAPS)
    assert best["numerics"]["onednn_enabled"] is False
    differing = sorted(n for n in best["hashes"] if best["hashes"][n] != capped["hashes"][n])
    assert differing == [], f"portable mode: {differing} differ between the CPU's best ISA and AVX2"
    if HAS_AVX512:  # the control: the default mode's bits do follow the ISA on this CPU
        best, capped = _child(False, _BEST), _child(False, _ZEN1_CAPS)
        differing = sorted(n for n in best["hashes"] if best["hashes"][n] != capped["hashes"][n])
        assert "linear_bf16" in differing, differing
