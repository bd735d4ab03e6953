#!/usr/bin/env bash
# On a 2-GPU H200 machine, one command (about 6 minutes): GPU 0 the offload bench (bench/full_size_speed/h200_offload.py); GPU 1 the
# gpu-marked tests (junit XML) and the gates' speed on a 5 s 768x1344 pair (bench/gates_speed/gates_speed.py --device cuda).
#
#   bash bench/device/h200_extras.sh OUTDIR
set -u
out=$1
mkdir -p "$out"
BUDGET_S=${BUDGET_S:-400}
source bench/device/common.sh
(
  CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/full_size_speed/h200_offload.py --out "$out/offload.json" 2>&1 \
    | sed 's/^/[offload] /'
) >>"$out/run.log" &
(
  CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 -m pytest -m gpu -p no:cacheprovider -q -rs \
    --junitxml="$out/gpu_tests.xml" tests/test_levers.py tests/test_opcheck.py tests/test_gate_fidelity.py 2>&1 \
    | tail -30 | sed 's/^/[pytest] /'
  CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 bench/gates_speed/gates_speed.py --device cuda -o lpips_trunk=rand \
    --out "$out" --repeat 2 2>&1 | tail -30 | sed 's/^/[gates] /'
) >>"$out/run.log" &
wait
echo "done at ${SECONDS}s" >>"$out/run.log"
cat "$out/run.log"
