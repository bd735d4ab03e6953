#!/usr/bin/env bash
# The speed table and the mixed-vs-repeated protocol of the speed issue on a 2-GPU H200 machine, one command
# (about 9 minutes):
#
#   bash bench/device/h200_speed_table.sh OUTDIR
#
# GPU 0: every recipe variant at 5 s 768x1344, then the protocol (bench/full_size_speed/h200_protocol.py) at 5 s 544x960.
# GPU 1: every recipe variant at 5 s 544x960, then a subset at 15 s 768x1344 (one repeat: a forward is ~40 s).
# Each GPU runs its own process with its own full-size model, so every ratio within one file is measured side by
# side in one process. Wheels the machine lacks travel in .whl/ (diffusers 0.42.1, pydantic, SageAttention 2.2.0
# built for sm_90 by bench/device/build_sageattention.sh).
set -u
out=$1
mkdir -p "$out"
BUDGET_S=${BUDGET_S:-560}
source bench/device/common.sh

V=stock,turbo4+compile,turbo4-fp8+compile,turbo4-fp8-sage+compile,turbo4-fp8+cudnn+compile,turbo4-sparse+sparse85+fp8+compile,turbo4-sparse+compile,turbo4-int8+compile
(
  CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/full_size_speed/h200_recipes_speed.py --out "$out/recipes_768.json" \
    --shapes 5s-768x1344 --variants $V 2>&1 | sed 's/^/[gpu0] /'
  CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/full_size_speed/h200_protocol.py --out "$out/protocol.json" \
    --shape 5s-544x960 --requests ${PROTOCOL_REQUESTS:-5} 2>&1 | sed 's/^/[gpu0-protocol] /'
) >>"$out/run.log" &
(
  CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 bench/full_size_speed/h200_recipes_speed.py --out "$out/recipes_544_15s.json" \
    --shapes 5s-544x960,15s-768x1344 --variants $V,turbo4-fp8-sage,turbo4-int8,turbo4-sparse \
    --shape-variants 15s-768x1344=stock,turbo4-fp8-sage+compile,turbo4-sparse+sparse85+fp8+compile \
    --shape-repeats 15s-768x1344=1 2>&1 | sed 's/^/[gpu1] /'
) >>"$out/run.log" &
wait
echo "done at ${SECONDS}s" >>"$out/run.log"
grep -v "^\[gpu.\] W1" "$out/run.log" | tail -60
