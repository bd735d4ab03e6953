#!/usr/bin/env bash
# Issue 23's goals on ONE H200 as whole requests, inside a 280 s box (one part of a combined device call):
#
#   bash bench/device/h200_goals.sh OUTDIR     # from the snapshot's root; CUDA_VISIBLE_DEVICES picks the one GPU
#
# Needs diffusers 0.42.1, transformers 5.24.0, pydantic 2 and av 18.1.0 in /tmp/site (pip install --target). Writes
# OUTDIR/h200_goals_raw.json (rewritten after every row, so a cut keeps what was measured) and OUTDIR/h200_goals.log.
# GOALS_ARGS=--smoke runs it on a CPU with the tiny configs (the driver's own test). Then, here: copy the raw JSON
# to bench/full_size_speed/results/ and run `python bench/full_size_speed/h200_goals_table.py`.
set -u
out=$1; mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# The script stops starting rows at --budget-s (from its own start); timeout is the hard stop of the box. GOALS_BOX_S
# is the box this driver gets (a caller's own timeout shorter than it cuts the row under way; the rows done are kept).
box=${GOALS_BOX_S:-272}
timeout -k 3 $box python3 bench/full_size_speed/h200_goals.py --out "$out/h200_goals_raw.json" --budget-s $((box - 22)) \
  --decode-tiles 304x320,384x448 ${GOALS_ARGS:-} 2>&1 | grep -v "W1\|FutureWarning\|WeightNorm.apply" \
  >"$out/h200_goals.log"
echo "exit ${PIPESTATUS[0]} at ${SECONDS}s" >>"$out/h200_goals.log"
tail -c 3000 "$out/h200_goals.log"
