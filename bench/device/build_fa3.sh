#!/usr/bin/env bash
# Build a FlashAttention-3 wheel (flash_attn_3: Hopper forward kernels, head dimension 128, bf16 and FP8 e4m3 only) on a
# machine with nvcc >= 12.3 and torch (the device machine: nvcc 13.0, torch 2.11), from a carried source tarball:
#
#   bash bench/device/build_fa3.sh SRC_TGZ WHEEL_DIR
#
# SRC_TGZ holds flash-attention/hopper (Dao-AILab/flash-attention at 0251105a) and flash-attention/csrc/cutlass/include
# (NVIDIA/cutlass at 7127592, the submodule's commit), 2.7 MB:
#   git -C <flash-attention> archive HEAD hopper | tar -C T/flash-attention -xf -
#   git -C <cutlass> archive 7127592069c2fe01b041e174ba4345ef9b279671 include | tar -C T/flash-attention/csrc/cutlass -xf -
#   git -C <flash-attention> show HEAD:README.md > T/flash-attention/README.md   # setup.py reads ../README.md (the
#   git -C <flash-attention> show HEAD:LICENSE > T/flash-attention/LICENSE       # first call of 2026-12-02 lacked it)
#   tar -czf .carry/fa3/fa3-src.tgz -C T flash-attention
# The wheel it makes (flash_attn_3 3.0.0, cp310-abi3, 1.7 MB) can be carried to later calls instead (.carry/fa3whl).
# Every FLASH_ATTENTION_DISABLE_* switch is on except FP8 and HDIM128 (bf16 stays: it is not switchable), so the build
# compiles two forward instantiations (hdim128 bf16 and e4m3, sm90a), the scheduler and the API. With CUDA >= 13 the
# setup uses the system nvcc (no toolchain download); the `git submodule update` it runs is patched out (no network).
set -euo pipefail
tgz=$(realpath "$1"); out=$(mkdir -p "$2" && cd "$2" && pwd)
work=${FA3_WORK:-/tmp/fa3-build}; rm -rf "$work"; mkdir -p "$work"
tar -C "$work" -xzf "$tgz"
cd "$work/flash-attention/hopper"
python3 - <<'PY'
s = open("setup.py").read()
line = 'subprocess.run(["git", "submodule", "update", "--init", "../csrc/cutlass"])'
assert line in s, "setup.py changed: the submodule line is not there"
open("setup.py", "w").write(s.replace(line, "pass  # no network: csrc/cutlass/include is carried"))
PY
for f in BACKWARD SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP PACKGQA FP16 VARLEN CLUSTER HDIM64 HDIM96 HDIM192 HDIM256 SM80 \
         HDIMDIFF64 HDIMDIFF192; do
  export FLASH_ATTENTION_DISABLE_$f=TRUE
done
export FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-16} NVCC_THREADS=${NVCC_THREADS:-4}
nvcc --version | tail -2
python3 -m pip wheel --no-build-isolation --no-deps -w "$out" . 2>&1 | grep -v "^\s*$" | tail -15
ls -la "$out"
