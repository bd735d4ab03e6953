#!/usr/bin/env bash
# Build a SageAttention 2 wheel for Hopper (sm_90a) only, on a machine with nvcc and torch (the device machine).
#
#   bash bench/device/build_sageattention.sh SRC_DIR WHEEL_DIR
#
# SRC_DIR: a checkout of https://github.com/thu-ml/SageAttention (built here from commit d1a57a5, version 2.2.0:
# csrc/, sageattention/, setup.py, pyproject.toml and README.md, which setup.py reads: without it the build stops at
# metadata). Session 26 built it on an H100 (torch 2.11.0+cu130, Python 3.12) in 76 s from
# `git archive d1a57a5 csrc sageattention setup.py pyproject.toml LICENSE MANIFEST.in README.md` carried as .sage_src:
# sageattention-2.2.0-cp312-cp312-linux_x86_64.whl, sha256 7addb4f6...; runtime_speed.sh installs it from .whl_prod.
# PyPI has only the Triton-only 1.0.6, and diffusers' "sage" backend needs >= 2.1.1.
# The patch below skips the sm_80 / sm_89 extensions (their kernels are not used on Hopper: sageattn() dispatches an
# sm_90 GPU to the sm_90 kernel, and sageattention/core.py imports each extension optionally), which cuts the build to
# the sm_90 kernel and the fused quantization kernels.
set -euo pipefail
src=$1; out=$2
cd "$src"
grep -q SAGE_ONLY_SM90 setup.py || python3 - <<'PY'
s = open("setup.py").read()
for cond in ("HAS_SM80 or HAS_SM86 or HAS_SM89 or HAS_SM90 or HAS_SM100 or HAS_SM120 or HAS_SM121",
             "HAS_SM89 or HAS_SM90 or HAS_SM100 or HAS_SM120 or HAS_SM121"):
    line = f"    if {cond}:"
    assert line in s, line
    s = s.replace(line, f'    if not os.getenv("SAGE_ONLY_SM90") and ({cond}):')
open("setup.py", "w").write(s)
PY
export TORCH_CUDA_ARCH_LIST=9.0 SAGE_ONLY_SM90=1 MAX_JOBS=${MAX_JOBS:-16} EXT_PARALLEL=2 CXX_APPEND_FLAGS=-g0
python3 -m pip wheel --no-build-isolation --no-deps -w "$out" .
