#!/usr/bin/env bash
# Several GPUs (issue 21), one part of a call on the nvidia-h200-x2 kind (2 GPUs), BUDGET_S=270 seconds in all:
#   bash bench/device/h200_parallel.sh OUTDIR          (SMOKE=1: the same paths on a CPU, tiny preset)
#
# What it measures, with full-size seeded random weights (speed does not depend on weight values), turbo4-sparse as
# shipped (LoRA set aside), at 15 s (345 frames, h3.runtime.MAX_FRAMES) 768x1344, on 2 GPUs and on 1
# (bench/parallel/h200_parallel.py says how): per request the DiT steps, the video decode, the text encoding, the whole
# request (generation side; request-to-file too when PyAV is there), communication's share of each SP2 step; and the
# suite's parallel-versus-single check on the GPUs.
#
# Order, each step in its own time box; a step cut short leaves what it measured (a request's DiT forwards so far,
# marked partial, written straight into OUTDIR, so that even a kill of the whole driver from outside keeps them; the
# merge then is `python3 bench/parallel/h200_parallel.py merge --out OUTDIR OUTDIR/sp*.json OUTDIR/parallel_check*.json`),
# and a later step's failure keeps what the earlier ones wrote:
#   1. both GPUs (torchrun, box SP2_S=135 s): the SP2 15 s request (~25 s start and build, ~15 s text encoding and
#      flex compile, ~75 s request, estimated from the 2026-11-30 runs). Beside it, on the same 2 GPUs, the parallel
#      check on the tiny preset (bf16, 121 frames at 128x128, 2 steps: the shape that fits a box) on 4 prompt pairs,
#      and at the same time the check with the planted a2a_permutation bug on 2 pairs, which must FAIL (boxes
#      CHECK_S=130 s). The check's kernels are tiny; sharing the GPUs can only slow SP2, i.e. against the goals.
#      Meanwhile the SP1 process imports and waits (it cannot build: SP2 holds GPU 0's memory).
#   2. GPU 0 (the rest, ~125 s): the SP1 15 s request (~7 s build, ~20 s text encoding and flex compile, ~130 s
#      request: it may not finish in a 270 s call; its DiT forwards so far are kept, marked partial).
#   3. merge: h200_parallel.json, h200_parallel_details.json, h200_parallel.md, parallel_check*.json, sp*.json, run.log
#
# Back on the coordinator's machine, with the returned folder at RESULTS:
#   cp RESULTS/h200_parallel*.json RESULTS/h200_parallel.md bench/parallel/results/   (and the sp*/check files beside them)
# Issue 22 (4 or 8 GPUs): the same request with `--degree N` under `--nproc-per-node N`, and the check with
# `python3 bench/parallel/h200_parallel.py check --out DIR --nproc N --ring --pairs 4` (the tiny preset's 2 heads cannot be
# split over more than 2 Ulysses ranks; ring keeps heads whole).
set -u
out=${1:-${OUT:-}}
[ -n "$out" ] || { echo "usage: bash bench/device/h200_parallel.sh OUTDIR" >&2; exit 3; }
BUDGET_S=${BUDGET_S:-270}
source bench/device/common.sh
# The combined call pre-installs diffusers, transformers, pydantic and PyAV with pip --target /tmp/site.
[ -d "${H3_SITE:-/tmp/site}" ] && export PYTHONPATH="${H3_SITE:-/tmp/site}:$PWD"
mkdir -p "$out"
work=$(mktemp -d /tmp/h3par.XXXXXX)
P="python3 bench/parallel/h200_parallel.py"
if [ "${SMOKE:-0}" = 1 ]; then smoke=--smoke; s15=smoke-5s-128x128; else smoke=; s15=15s-768x1344; fi
SP2_S=${SP2_S:-135}; CHECK_S=${CHECK_S:-130}
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && l=$1; echo "$l"; }  # a step's time box: its cap or what is left
say() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$out/run.log"; }
quiet() { grep --line-buffered -v "kept in float32\|experimental feature\|Warning\|warn(\|WeightNorm\|Loading weights\|Writing model"; }
port() { echo $((20000 + RANDOM % 20000)); }

say "start (budget ${BUDGET_S}s); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tr '\n' ';')"
say "PyAV: $(python3 -c 'import av; print(av.__version__)' 2>&1 | tail -1)"
say "1/3 both GPUs: SP2 $s15 | beside it the parallel check (4 pairs) and the planted check (2 pairs); SP1 imports"
# SP1 starts ahead on GPU 0 and waits for $work/sp2.done before it builds.
( CUDA_VISIBLE_DEVICES=0 timeout "$(( $(left) - 8 ))" $P request --degree 1 --shapes "$s15" --out "$out/sp1_15s.json" \
  --wait-for "$work/sp2.done" $smoke 2>&1 | quiet | sed -u 's/^/[sp1] /' | tee -a "$out/run.log" ) &
sp1=$!
( $P check --out "$work/check" --pairs "${CHECK_PAIRS:-4}" --timeout "$(cap "$CHECK_S")" $smoke 2>&1 | quiet | sed -u 's/^/[check] /' \
  | tee -a "$out/run.log" | tail -3 ) &
chk=$!
( sleep 2; $P check --out "$work/planted" --plant a2a_permutation --pairs "${PLANT_PAIRS:-2}" --timeout "$(cap "$CHECK_S")" $smoke 2>&1 \
  | quiet | sed -u 's/^/[planted] /' | tee -a "$out/run.log" | tail -3 ) &
pla=$!
timeout "$(cap "$SP2_S")" python3 -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d \
  --rdzv-endpoint 127.0.0.1:$(port) --max-restarts 0 bench/parallel/h200_parallel.py request --degree 2 --shapes "$s15" \
  --out "$out/sp2.json" $smoke 2>&1 | quiet | sed -u 's/^/[sp2] /' | tee -a "$out/run.log"
touch "$work/sp2.done"
say "2/3 GPU 0: SP1 $s15 (box: what is left)"
wait $chk $pla
[ -f "$work/check/parallel_check.json" ] && cp "$work/check/parallel_check.json" "$out/parallel_check.json"
[ -f "$work/planted/parallel_check.json" ] && cp "$work/planted/parallel_check.json" "$out/parallel_check_planted.json"
say "checks done: $(ls "$out"/parallel_check*.json 2>/dev/null | tr '\n' ' ')"
wait $sp1

say "3/3 merge"
inputs=$(ls "$out"/sp*.json "$out"/parallel_check*.json 2>/dev/null)
if [ -n "$inputs" ]; then $P merge --out "$out" $inputs 2>&1 | tee -a "$out/run.log"; else say "nothing measured"; fi
say "done"
cat "$out/h200_parallel.md" 2>/dev/null
