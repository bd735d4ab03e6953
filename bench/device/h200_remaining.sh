#!/usr/bin/env bash
# What the speed table still lacks after session 2 (bench/results/h200_recipes_speed.md), in two calls of about
# 9 minutes on a 2-GPU H200 machine (carry .whl: diffusers, pydantic, transformers, av, lpips, pyloudnorm and the
# sm_90 SageAttention wheel built by bench/device/build_sageattention.sh):
#
#   bash bench/device/h200_remaining.sh a OUTDIR   # GPU0: the 5 s 768x1344 variants not yet measured; GPU1: 15 s
#   bash bench/device/h200_remaining.sh b OUTDIR   # GPU0: the protocol (compiled, dynamic-shape, block-sparse);
#                                                  # GPU1: the gpu-marked tests, offload profiled, the 544x960 variants not yet measured
# Then copy the JSONs into bench/results/ (h200_recipes_*.json, h200_protocol.json, h200_offload.json) and render
# the table with `python bench/h200_recipes_table.py > bench/results/h200_recipes_speed.md`.
set -u
phase=$1; out=$2
mkdir -p "$out"
BUDGET_S=${BUDGET_S:-540}
source bench/device/common.sh
R="python3 bench/h200_recipes_speed.py"
case $phase in
a)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) $R --out "$out/h200_recipes_768_more.json" --shapes 5s-768x1344 \
      --variants stock,turbo4-fp8,turbo4-fp8-sage,turbo4-int8+compile,turbo4-int8,turbo4-sparse+compile,turbo4-sparse \
      2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_15s.json" --shapes 15s-768x1344 --repeats 1 \
      --variants stock,turbo4-fp8-sage+compile,turbo4-sparse+sparse85+fp8+compile,turbo4-sparse+compile \
      2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
b)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/h200_protocol.py --out "$out/h200_protocol.json" \
      --shape 5s-544x960 --requests 4 --variants turbo4-fp8-sage+dynamic,turbo4+compile,turbo4-sparse+compile \
      2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 -m pytest -m gpu -p no:cacheprovider -q -rs \
      --junitxml="$out/gpu_tests.xml" tests/test_levers.py tests/test_opcheck.py tests/test_gate_fidelity.py 2>&1 \
      | tail -8 | sed 's/^/[pytest] /'
    CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 bench/h200_offload.py --out "$out/h200_offload.json" --profile \
      2>&1 | grep -v "W1" | sed 's/^/[offload] /'
    CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_544_more.json" --shapes 5s-544x960 \
      --variants stock,turbo4-fp8-sage+dynamic,turbo4-sparse+compile,turbo4-int8+compile,turbo4-fp8-sage,turbo4-sparse \
      2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
*) echo "phase must be a or b" >&2; exit 2 ;;
esac
wait
echo "done at ${SECONDS}s" >>"$out/run.log"; grep -v "kept in float32\|experimental feature" "$out/run.log" | tail -40
