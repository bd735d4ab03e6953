#!/usr/bin/env bash
# Several GPUs (issue 21), one call on the nvidia-h200-x2 kind, about 8 minutes:
#   bash bench/device/h200_parallel.sh $OUT          (BUDGET_S=510 by default; SMOKE=1: the same on a CPU, tiny)
#
# What it measures, with full-size seeded random weights (speed does not depend on weight values), turbo4-sparse as
# shipped (LoRA set aside), at 5 s and 15 s 768x1344, on 1 GPU and on 2 (bench/h200_parallel.py says how):
#   dit_step_s    mean DiT forward of a whole 4-step request (1 dense + 3 block-sparse), from the clip record's anatomy
#   efficiency    dit_step_s(1 GPU) / (2 x dit_step_s(2 GPUs))
#   vae_decode_s  the request's video decode: diffusers' tiled decode on 1 GPU, tile-parallel on 2
#   request_s     the request's generation-side latency (text encode .. frame prep + D2H; MP4 mux excluded)
# plus: communication per step and each rank's device and times (details file), whether the tile-parallel decode
# is the 1-GPU decode bit for bit, and the suite's parallel-versus-single check on the GPUs (tiny preset, bf16,
# 4 pairs) with and without a planted a2a_permutation bug (the planted run must FAIL).
#
# Left out of this call, and why: turbo4-fp8-sage-compile (SageAttention needs a wheel built on the device,
# bench/device/build_sageattention.sh, ~2 min, and inductor compiles the DiT blocks once per process and shape,
# ~1 min each, for 4 processes: past the 9-minute call); the text encoder's tensor parallelism (not implemented,
# h3/levers/parallel.py says why; replicated it costs 0.06 s of a request, bench/results/h200_speed_stock.json).
#
# Order (each step time-boxed, every step prints progress; a step cut short leaves what it measured):
#   1. the parallel check, correct then planted (both GPUs, ~100 s)
#   2. one GPU each: 15 s on GPU 0 and 5 s on GPU 1 at once (~170 s)
#   3. two GPUs (torchrun): 5 s then 15 s, and the decode identity (~170 s)
#   4. merge: h200_parallel.json, h200_parallel_details.json, h200_parallel.md (+ parallel_check*.json, run.log)
#
# Back on the coordinator's machine, with the returned folder at RESULTS:
#   cp RESULTS/h200_parallel.json RESULTS/h200_parallel_details.json bench/results/
#   python bench/h200_parallel_table.py RESULTS --out bench/results/h200_parallel.md
#   cp RESULTS/parallel_check.json bench/results/h200_parallel_check.json
#   cp RESULTS/parallel_check_planted.json bench/results/h200_parallel_check_planted.json
set -u
out=${1:-${OUT:-}}
[ -n "$out" ] || { echo "usage: bash bench/device/h200_parallel.sh OUTDIR" >&2; exit 3; }
BUDGET_S=${BUDGET_S:-510}
source bench/device/common.sh
work=$(mktemp -d /tmp/h3par.XXXXXX)
P="python3 bench/h200_parallel.py"
if [ "${SMOKE:-0}" = 1 ]; then smoke=--smoke; s5=smoke-5s-128x128; s15=smoke-5s-128x128; else smoke=; s5=5s-768x1344; s15=15s-768x1344; fi
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && l=$1; echo "$l"; }  # a step's time box: its cap or what is left
say() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$out/run.log"; }
torchrun2() { python3 -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d \
  --rdzv-endpoint 127.0.0.1:$((20000 + RANDOM % 20000)) --max-restarts 0 "$@"; }

say "start (budget ${BUDGET_S}s); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tr '\n' ';')"
say "1/4 parallel check (correct, then planted a2a_permutation)"
timeout "$(cap 60)" $P check --out "$work/check" $smoke 2>&1 | grep -v "kept in float32\|experimental" \
  | sed 's/^/[check] /' | tee -a "$out/run.log" | tail -3
timeout "$(cap 60)" $P check --out "$work/planted" --plant a2a_permutation $smoke 2>&1 \
  | grep -v "kept in float32\|experimental" | sed 's/^/[planted] /' | tee -a "$out/run.log" | tail -3
[ -f "$work/check/parallel_check.json" ] && cp "$work/check/parallel_check.json" "$out/parallel_check.json"
[ -f "$work/planted/parallel_check.json" ] && cp "$work/planted/parallel_check.json" "$out/parallel_check_planted.json"

say "2/4 one GPU: $s15 on GPU 0, $s5 on GPU 1"
box=$(cap 200)
( CUDA_VISIBLE_DEVICES=0 timeout "$box" $P request --degree 1 --shapes "$s15" --out "$work/sp1_15s.json" $smoke 2>&1 \
  | grep -v "kept in float32\|experimental\|Warning" | sed 's/^/[gpu0] /' | tee -a "$out/run.log" ) &
( CUDA_VISIBLE_DEVICES=1 timeout "$box" $P request --degree 1 --shapes "$s5" --out "$work/sp1_5s.json" $smoke 2>&1 \
  | grep -v "kept in float32\|experimental\|Warning" | sed 's/^/[gpu1] /' | tee -a "$out/run.log" ) &
wait

say "3/4 two GPUs: $s5, then $s15"
timeout "$(( $(left) - 15 ))" torchrun2 bench/h200_parallel.py request --degree 2 --shapes "$s5,$s15" \
  --vae-check "$s5" --out "$work/sp2.json" $smoke 2>&1 | grep -v "kept in float32\|experimental\|Warning" \
  | sed 's/^/[sp2] /' | tee -a "$out/run.log"

say "4/4 merge"
inputs=$(ls "$work"/sp*.json "$out"/parallel_check*.json 2>/dev/null)
if [ -n "$inputs" ]; then $P merge --out "$out" $inputs 2>&1 | tee -a "$out/run.log"; else say "nothing measured"; fi
say "done"
cat "$out/h200_parallel.md" 2>/dev/null
