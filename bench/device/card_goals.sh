#!/usr/bin/env bash
# Issue 54: the forward and decode goals on ONE card (an H100 or an H200), each beside stock diffusers in the same
# process: bench/full_size_speed/h200_goals.py --stock on seeded random full-size weights (no text encoder: these rows
# never encode, and 62 GiB of it would not fit an 80 GB card beside the bf16 DiT).
#
#   bash bench/device/card_goals.sh        (from the repository root, on the device; results under $OUT)
#
# Order in the process: build the bf16 DiT and VAEs; stock's forward at 5 s 768x1344 (first apart, CG_REPEATS+1 timed);
# the dense recipe's levers (turbo4-fp8-sage-compile: FP8 linears for good, Sage, compile); the 15 s 768x1344 decode
# (eager at 256x256, stock's tile; at 304x320 eager, then compiled: a first compiled decode apart, CG_DECODE_REPEATS
# timed); the dense forward; the 85 % sparse forward; CG_EXTRA's dense variants last (set but empty: none).
# CG_CALL_S (560) is the box from this script's start.
# Needs .whl_prod/site.tar.xz and the Sage wheel beside it (bench/device/site.sh). Then, here:
#   python bench/card_goals/card_goals.py --from FILES_AT --name NAME --command "..." --commit SHA
set -u
t0=$SECONDS
PY=${CG_PY:-python3}
R=/tmp/cg; rm -rf $R; mkdir -p $R
source "$(dirname "$0")/site.sh"
if [ "${CG_UNPACK:-1}" = 1 ]; then unpack_site "$PY" || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >$R/card.txt 2>&1
box=$(( ${CG_CALL_S:-560} - (SECONDS - t0) - 8 ))
echo "goals start at $((SECONDS - t0)) s with a ${box} s box"
timeout -k 5 $box $PY bench/full_size_speed/h200_goals.py --out "$R/h200_goals_raw.json" --budget-s $((box - 15)) \
  --stock --rows decode15,dense768,sparse768 --repeats ${CG_REPEATS:-3} --decode-repeats ${CG_DECODE_REPEATS:-2} \
  --decode-tiles 256x256 --decode-levers compile --lever-tiles 304x320 \
  --dense-extra "${CG_EXTRA-turbo4-fp8-sage-compile+graphs}" ${CG_ARGS:-} 2>&1 \
  | grep -v "W1\|FutureWarning\|WeightNorm.apply" >$R/goals.log
echo "exit ${PIPESTATUS[0]} at $((SECONDS - t0)) s" | tee -a $R/goals.log
tail -c 4000 $R/goals.log
cp $R/h200_goals_raw.json $R/goals.log $R/card.txt "$OUT/" 2>/dev/null
ls -la "$OUT"
