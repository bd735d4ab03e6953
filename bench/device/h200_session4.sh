#!/usr/bin/env bash
# What the speed table still lacks after session 3 (bench/results/h200_recipes_speed.md, its coverage section), in
# three calls of about 9 minutes on a 2-GPU H200 machine (carry .whl as h200_speed_table.sh says):
#
#   bash bench/device/h200_session4.sh a OUTDIR  # GPU0: every shipped recipe as shipped at 5 s 544x960 (eager int8,
#                                                #       fp8, fp8-sage, sparse) and the new turbo4-fp8-sage-compile;
#                                                # GPU1: offload re-measured after the resident top-level group, then
#                                                #       turbo4-fp8-sage-compile at 15 s 768x1344
#   bash bench/device/h200_session4.sh b OUTDIR  # GPU0: 5 s 768x1344 eager int8 and sparse, and the sparse recipe
#                                                #       compiled after the routing fix; GPU1: the block-sparse
#                                                #       recipes and INT8 at 15 s 768x1344
#   bash bench/device/h200_session4.sh c OUTDIR  # 15 s 768x1344 as shipped: GPU0 eager FP8 and FP8 + Sage, GPU1
#                                                #       eager INT8 and block-sparse
#   bash bench/device/h200_session4.sh d OUTDIR  # the mixed-vs-repeated protocol at 5 s 544x960 with the flex graph
#                                                #       counter: GPU0 the block-sparse recipe compiled, GPU1 the
#                                                #       shipped turbo4-fp8-sage-compile recipe
#   bash bench/device/h200_session4.sh e OUTDIR  # the gpu-marked tests (JUnit XML into OUTDIR), one GPU
#
# Then copy the JSONs into bench/results/ (h200_recipes_*.json, h200_offload.json) and render the table with
# `python bench/h200_recipes_table.py > bench/results/h200_recipes_speed.md`.
set -u
phase=$1; out=$2
source bench/device/common.sh
case $phase in
a)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) $R --out "$out/h200_recipes_544_shipped.json" --shapes 5s-544x960 \
      --variants stock,turbo4-fp8-sage-compile,turbo4-int8+compile,turbo4-int8,turbo4-fp8,turbo4-fp8-sage,turbo4-sparse \
      2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 bench/h200_offload.py --out "$out/h200_offload.json" --profile \
      2>&1 | grep -v "W1" | sed 's/^/[offload] /'
    CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_15s_compiled.json" --shapes 15s-768x1344 \
      --repeats 1 --variants turbo4-fp8-sage-compile 2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
b)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) $R --out "$out/h200_recipes_768_shipped.json" --shapes 5s-768x1344 \
      --variants stock,turbo4-sparse+compile,turbo4-fp8-sage-compile,turbo4-int8,turbo4-sparse \
      2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_15s_sparse.json" --shapes 15s-768x1344 \
      --repeats 1 --variants turbo4-sparse+sparse85+fp8+compile,turbo4-sparse+compile,turbo4-int8+compile \
      2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
c)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) $R --out "$out/h200_recipes_15s_eager_fp8.json" --shapes 15s-768x1344 \
      --repeats 1 --variants turbo4-fp8,turbo4-fp8-sage 2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_15s_eager_int8.json" --shapes 15s-768x1344 \
      --repeats 1 --variants turbo4-int8,turbo4-sparse 2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
d)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/h200_protocol.py --out "$out/h200_protocol_sparse.json" \
      --shape 5s-544x960 --requests 4 --variants turbo4-sparse+compile \
      2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 bench/h200_protocol.py --out "$out/h200_protocol_shipped.json" \
      --shape 5s-544x960 --requests 4 --variants turbo4-fp8-sage-compile \
      2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
e)
  timeout $(left) $T 2>&1 | tail -5 >>"$out/run.log"
  ;;
*) echo "phase must be a, b, c, d or e" >&2; exit 2 ;;
esac
wait
echo "done at ${SECONDS}s" >>"$out/run.log"; grep -v "kept in float32\|experimental feature" "$out/run.log" | tail -40
