#!/usr/bin/env bash
# Session 2's last H200 call (2 GPUs, about 4 minutes): GPU 0 the 85%-sparse recipe at 5 s 768x1344; GPU 1 the
# gpu-marked tests, then the mixed-vs-repeated protocol for the compiled recipes.
#   bash bench/device/h200_last.sh OUTDIR
set -u
out=$1; mkdir -p "$out"
BUDGET_S=${BUDGET_S:-230}
source bench/device/common.sh
( CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/full_size_speed/h200_recipes_speed.py --out "$out/recipes_768_sparse.json" \
    --shapes 5s-768x1344 --variants turbo4-sparse+sparse85+fp8+compile 2>&1 | grep -v "W1" | sed 's/^/[gpu0] /' ) >>"$out/run.log" &
( CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 -m pytest -m gpu -p no:cacheprovider -q -rs \
    --junitxml="$out/gpu_tests.xml" tests/test_levers.py tests/test_opcheck.py tests/test_gate_fidelity.py 2>&1 \
    | tail -8 | sed 's/^/[pytest] /'
  CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 bench/full_size_speed/h200_protocol.py --out "$out/protocol.json" --shape 5s-544x960 \
    --requests ${PROTOCOL_REQUESTS:-3} --variants turbo4-fp8-sage+compile,turbo4+compile 2>&1 | grep -v "W1" \
    | sed 's/^/[protocol] /' ) >>"$out/run.log" &
wait
echo "done at ${SECONDS}s" >>"$out/run.log"; grep -v "kept in float32\|experimental feature" "$out/run.log" | tail -40
