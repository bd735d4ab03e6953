#!/usr/bin/env bash
# The whole speed table of the speed issue in one command, on a machine with one or two H200s and no time limit per
# call (about 50 minutes on two GPUs, 75 on one: an estimate from the slices' timings; it has not run whole here):
#
#   bash bench/device/h200_full.sh OUTDIR     # then read OUTDIR/h200_recipes_speed.md
#
# It writes the JSONs bench/full_size_speed/h200_recipes_table.py reads and renders the table from them:
#   h200_speed_stock.json    the chip's ceilings, stock diffusers, VAE decode and text encoding (bench/full_size_speed/h200_speed.py)
#   h200_recipes_<shape>.json  stock and every shipped recipe as shipped, plus the compiled and 85 %-sparse forms,
#                            side by side in one process per shape (bench/full_size_speed/h200_recipes_speed.py)
#   h200_protocol.json       mixed versus repeated prompts (bench/full_size_speed/h200_protocol.py)
#   h200_offload.json        offload streaming against the pinned ceiling (bench/full_size_speed/h200_offload.py)
# With two GPUs the two lanes below run side by side, each its own process and its own full-size model; with one they
# run one after the other. The lending machine here allows 10-minute calls, so the recorded table was measured in
# slices of this (session 4's numbered scripts, in git history). Wheels the machine lacks travel in .whl/.
set -u
out=$1
BUDGET_S=${BUDGET_S:-86400}
source bench/device/common.sh
V=shipped,turbo4+compile,turbo4-fp8+compile,turbo4-fp8-sage+compile,turbo4-int8+compile,turbo4-sparse+compile,turbo4-sparse+sparse85+fp8+compile
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
lane_b_gpu=$([ "$ngpu" -ge 2 ] && echo 1 || echo 0)
lane_a() {
  python3 bench/full_size_speed/h200_speed.py --out "$out/h200_speed_stock.json"
  $R --out "$out/h200_recipes_768.json" --shapes 5s-768x1344 --variants $V
  python3 bench/full_size_speed/h200_protocol.py --out "$out/h200_protocol.json" --shape 5s-544x960 --requests 4 \
    --variants turbo4-fp8-sage-compile,turbo4-sparse+compile,turbo4-fp8-sage+compile
}
lane_b() {
  $R --out "$out/h200_recipes_544.json" --shapes 5s-544x960 --variants $V
  $R --out "$out/h200_recipes_15s.json" --shapes 15s-768x1344 --repeats 1 --variants $V
  python3 bench/full_size_speed/h200_offload.py --out "$out/h200_offload.json" --profile
}
( export CUDA_VISIBLE_DEVICES=0; lane_a 2>&1 | sed 's/^/[a] /' ) >>"$out/run.log" &
[ "$lane_b_gpu" = 0 ] && wait
( export CUDA_VISIBLE_DEVICES=$lane_b_gpu; lane_b 2>&1 | sed 's/^/[b] /' ) >>"$out/run.log" &
wait
python3 bench/full_size_speed/h200_recipes_table.py --results "$out" >"$out/h200_recipes_speed.md" && echo "wrote $out/h200_recipes_speed.md"
