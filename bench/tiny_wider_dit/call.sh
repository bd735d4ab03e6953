#!/usr/bin/env bash
# One device call of issue 55 on ONE GPU: the shipped DiT shape (s) and the 8-layer one (l8) trained side by side from
# the shipped VAEs (h3/assets/tiny, --fresh dit) for the same wall time, each through bench/device/train_tiny.sh with
# its own SITE and RUN_DIR, then the returns packed for the lending tool (8 files of 16 MiB, 2 folders down):
#
#   WHEELS=.whl COMMIT=<sha> BUDGET_S=470 bash bench/tiny_wider_dit/call.sh $OUT
#
# returns OUTDIR/logs.tgz (both train.log and stdout, a GPU-memory trace) and per shape OUTDIR/<n>/:
#   tiny-slim.tgz      the export less the weight files byte-identical to h3/assets/tiny's (cmp on the device; the
#                      video VAE and text encoder), with export.sha256 of the whole export: rebuild it with
#                      bench/tiny_wider_dit/rebuild.sh (copies those files back from h3/assets/tiny, checks the sums);
#   dit.pack.part-*    `h3.train pack` of the DiT's state alone (weights and EMA exact, AdamW moments in bf16): the
#                      VAE states are the shipped checkpoint's, `unpack --from h3/assets/tiny --fresh dit` rebuilds
#                      them (bench/tiny_wider_dit/README.md says how to merge the two into a whole pack).
# Environment: BUDGET_S (470, each training's), STAGE_SECONDS (dit=400,distill=40,export=20: the DiT gets what the
# pool leaves), TMPROOT (/tmp), EXTRA (more --set for both; the CPU rehearsal's smoke sizes), DEVICE, PYTHON, WHEELS,
# COMMIT (passed on to train_tiny.sh).
set -u
source "$(dirname "$0")/slim.sh"
out=$1
BUDGET_S=${BUDGET_S:-470}
tmp=${TMPROOT:-/tmp}
PY=${PYTHON:-python3}
X="--set pool_two_shape_share=0.6 --set export_dit_dtype=bfloat16 --set ranks=1 ${EXTRA:-}"
mkdir -p "$out" "$tmp"
if command -v nvidia-smi >/dev/null; then
  (while :; do nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader; sleep 15; done \
    >"$tmp/gpu.log" 2>&1) &
  trace=$!
fi

train() {  # NAME [--set ...]: one training, its own site and run folder
  local n=$1
  shift
  SITE=$tmp/site-$n RUN_DIR=$tmp/run-$n RESUME_FROM=h3/assets/tiny FRESH=dit PACK=0 BUDGET_S=$BUDGET_S \
    STAGE_SECONDS=${STAGE_SECONDS:-dit=400,distill=40,export=20} EXTRA_ARGS="$X $*" \
    timeout $((BUDGET_S + 30)) bash bench/device/train_tiny.sh "$tmp/ret-$n" >"$tmp/ret-$n.out" 2>&1
  echo "$n: train_tiny.sh exit $?" >>"$tmp/ret-$n.out"
}
train s &
p1=$!
train l8 --set dit_num_layers=8 &
p2=$!
wait $p1 $p2
[ -n "${trace:-}" ] && kill "$trace"

export PYTHONPATH=$tmp/site-s:$PWD
for n in s l8; do
  r=$tmp/run-$n
  mkdir -p "$out/$n"
  slim_export "$r" "$out/$n" "$n"
  if [ -f "$r/state/dit/state.pt" ]; then
    mkdir -p "$tmp/dp-$n/state/dit"
    cp "$r/state/dit/state.pt" "$tmp/dp-$n/state/dit/"
    timeout 90 $PY -m h3.train pack --out "$tmp/dp-$n" --to "$tmp/dp-$n/dit.pack" --moments bf16 \
      && split -b 15m "$tmp/dp-$n/dit.pack" "$out/$n/dit.pack.part-"
    echo "$n: dit pack exit $?"
  fi
  echo "== $n"
  tail -n 25 "$tmp/ret-$n.out"
done
(cd "$tmp" && tar -czf "$out/logs.tgz" ret-s.out ret-l8.out ret-s/train.log ret-l8/train.log \
  $(ls gpu.log 2>/dev/null))
ls -la "$out" "$out"/*/
echo "call.sh done at $SECONDS s"
