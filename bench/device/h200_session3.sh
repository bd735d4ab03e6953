#!/usr/bin/env bash
# Session 3's H200 calls (2-GPU machine, about 9 minutes each; carry .whl as h200_speed_table.sh says):
#
#   bash bench/device/h200_session3.sh c1 OUTDIR  # GPU0: 5 s 768x1344 variants not yet measured (eager fp8/sage/int8,
#                                                 #       int8+compile, fp8-sage with dynamic-shape compile), then
#                                                 #       offload (did not fit);
#                                                 # GPU1: the gpu-marked tests, then 15 s 768x1344 stock and fp8-sage
#   bash bench/device/h200_session3.sh c2 OUTDIR  # GPU0: the mixed-vs-repeated protocol (dynamic, compiled, sparse);
#                                                 # GPU1: the block-sparse variants at 5 s 768x1344 and 15 s
#   bash bench/device/h200_session3.sh c3 OUTDIR  # GPU0: offload profiled; GPU1: the gpu-marked tests, then the
#                                                 #       block-sparse variants at 5 s 544x960, and at 768x1344 after
#                                                 #       the routing's pooling stopped copying the sequence to float32
#   bash bench/device/h200_session3.sh c4 OUTDIR  # (one GPU) the gpu-marked tests again after the offload fix
#
# Then copy the JSONs into bench/results/ and render: python bench/h200_recipes_table.py > bench/results/h200_recipes_speed.md
set -u
phase=$1; out=$2
source bench/device/common.sh
case $phase in
c1)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) $R --out "$out/h200_recipes_768_eager.json" --shapes 5s-768x1344 \
      --variants stock,turbo4-fp8-sage+dynamic,turbo4-fp8,turbo4-fp8-sage,turbo4-int8+compile,turbo4-int8 \
      2>&1 | grep -v "W1" | sed 's/^/[gpu0] /'
    CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/h200_offload.py --out "$out/h200_offload.json" --profile \
      2>&1 | grep -v "W1" | sed 's/^/[offload] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout 120 $T 2>&1 | tail -8 | sed 's/^/[pytest] /'
    CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_15s.json" --shapes 15s-768x1344 --repeats 1 \
      --variants stock,turbo4-fp8-sage+compile,turbo4-fp8+compile \
      2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
c2)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/h200_protocol.py --out "$out/h200_protocol.json" \
      --shape 5s-544x960 --requests 4 --variants turbo4-fp8-sage+compile+bucket,turbo4-sparse+compile,turbo4-fp8-sage+dynamic \
      2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_sparse.json" --shapes 15s-768x1344,5s-768x1344 \
      --shape-repeats 15s-768x1344=1 --shape-variants 15s-768x1344=turbo4-sparse+compile \
      --variants turbo4-sparse+sparse85+fp8+compile,turbo4-sparse+compile \
      2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
c3)
  ( CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/h200_offload.py --out "$out/h200_offload.json" --profile \
      2>&1 | grep -v "W1" | sed 's/^/[offload] /' ) >>"$out/run.log" &
  ( CUDA_VISIBLE_DEVICES=1 timeout 90 $T 2>&1 | tail -8 | sed 's/^/[pytest] /'
    CUDA_VISIBLE_DEVICES=1 timeout $(left) $R --out "$out/h200_recipes_544_sparse.json" --shapes 5s-544x960,5s-768x1344 \
      --variants turbo4-sparse+sparse85+fp8+compile,turbo4-sparse+compile,turbo4-fp8-sage+compile+bucket \
      --shape-variants 5s-768x1344=turbo4-sparse+sparse85+fp8+compile,turbo4-fp8-sage+compile+bucket \
      2>&1 | grep -v "W1" | sed 's/^/[gpu1] /' ) >>"$out/run.log" &
  ;;
c4)  # one GPU is enough: the gpu-marked tests after the offload lever kept the top-level group resident
  timeout $(left) $T 2>&1 | tail -8 | sed 's/^/[pytest] /' >>"$out/run.log"
  ;;
*) echo "phase must be c1, c2, c3 or c4" >&2; exit 2 ;;
esac
wait
echo "done at ${SECONDS}s" >>"$out/run.log"; grep -v "kept in float32\|experimental feature" "$out/run.log" | tail -40
