#!/usr/bin/env bash
# One device call of issue 55 on ONE GPU that trains and measures: the shipped DiT grown to 8 blocks that compute its
# function (g8: `h3.train unpack --grow-dit num_layers=8`, h3/train/grow.py) and the shipped 4-block DiT (s, the
# control), both continued from h3/assets/tiny for the same wall time side by side, then bench/content_check on the
# host's CPU cores for both exports (world-heldout, seeds 0,1, the first 8 captions, baseline row):
#
#   run(command="COMMIT=<sha> bash bench/tiny_wider_dit/call_grow.sh $OUT", carry=[".whl_prod"], timeout_s=560)
#
# (.whl_prod/site.tar.xz from bench/runtime_speed/pack_site.sh: diffusers 0.42.1, pydantic and PyAV, which the content
# check's MP4 round trip needs; the tree, ~40 MB, and it stay under the 64 MiB; .whl and .whl_prod together do not.)
#
# Steps, against one deadline of TOTAL_S seconds from the start: the site unpacked; both run folders seeded from the
# shipped checkpoint (`unpack --continue dit:CONT`, g8 with `--grow-dit num_layers=LAYERS,init=GROW_INIT`); the latent
# pool encoded ONCE (`h3.train pool` in s's folder, alone on the GPU; both DiTs keep the checkpoint's latent
# statistics and the pool depends on neither DiT, so g8 gets a copy instead of encoding it again side by side); both
# `h3.train all` side by side until TOTAL_S - CC_S - PACK_S (the DiT gets what distill and export leave; the
# distillation is a stand-in of DISTILL_S seconds on 128 teacher samples that the export needs, not a turbo4-tiny:
# the content check scores the baseline row only); the two content checks side by side on half the cores each until
# TOTAL_S - PACK_S; then the returns. Both DiTs: AdamW restarted, warm-up LR_WARMUP steps to dit_lr LR, a cosine to
# 0.1x over LR_STEPS_S / LR_STEPS_G steps (about what each makes in the call at session 25's rates: s 6.1 and l8 3.6
# steps/s sharing an H100, so that both end annealed), EMA decay 0.995 (the default 0.998 would keep a quarter of the
# shipped weights in g8's EMA after ~700 steps).
#
# Returns (7 or 8 files, ~50 MB; `bash bench/tiny_wider_dit/rebuild.sh RET/<n>/tiny-slim.tgz DEST` rebuilds an export):
#   content.tgz        both content-check records (<CC_NAME>_<n>_world-heldout.{json,md}) and their logs;
#   logs.tgz           the unpack, pool and training logs and a GPU-memory trace;
#   <n>/tiny-slim.tgz  the export less the weight files byte-identical to h3/assets/tiny's, with export.sha256;
#   <n>/dit.pack.part-* the DiT's state alone (weights and EMA exact, AdamW moments bf16), as call.sh packs it.
# Going on (session 26): FROM_SLIM=<an earlier call's g<LAYERS>/tiny-slim.tgz, carried> starts the grown arm from that
# export (rebuilt with rebuild.sh; no growing: it has LAYERS blocks already) instead of h3/assets/tiny; ARMS ("s
# g<LAYERS>"; e.g. "g8" alone, which then gets the whole GPU) picks the arms. Session 26's g8 export is ~5.5 MB.
# CPU rehearsal of going on (session 26, 2-core Intel VM, smoke sizes as below plus ARMS=g8
# FROM_SLIM=.packs_s26/g8/tiny-slim.tgz CONT=20971 CC_NAME=rehearsal_grow26): 201 s; rebuilt (20 files match), seeded
# at dit step 20965 with 8 blocks, pool in g8's folder, 6 steps, export, content check, slim export and pack.
# Environment: TOTAL_S (540), CC_S (100; 0: no content check, the time goes to training; session 27's call spent
# 122 of its 366 s training, the pool 74 s and the content check ~90 s), PACK_S (25), DISTILL_S (20), LAYERS (8), GROW_INIT (copy), CONT (30000: the
# DiT's re-opened total; the budget ends it first), LR (0.001), LR_WARMUP (100), LR_STEPS_S (1200), LR_STEPS_G (700),
# CC_LIMIT (8), CC_SEEDS (0,1), CC_NAME (tiny_grow_dit), PACK (1; 0: no DiT packs), EXTRA (more --set for both
# trainings: the CPU rehearsal's smoke sizes), SITE_TAR (.whl_prod/site.tar.xz if there), WHEELS (a folder of wheels
# instead: no PyAV, so no content check), DEVICE (cuda), PYTHON (python3), TMPROOT (/tmp), COMMIT.
#
# REF=1 adds a third content check, of h3/assets/tiny itself (the DiT both arms start from) on the same host; the
# cores are then split three ways. Without it the reference is run 13's VM probe (content_check_run13_probe.json's
# first 8 held-out captions x seeds 0,1: colour 13/16, direction 11/16, pitch 16/16, sync 5/16).
#
# CPU rehearsal (2-core Intel Xeon VM, smoke sizes, 1 caption x 1 seed; session 25, code 3b735e8): 240 s wall, both
# arms seeded, one pool, 6 DiT steps each (step 20117's loss identical in both, 0.2783 / 0.252 / 0.0263: the grown
# DiT is the shipped function through the whole training path), distill, export (g8: 8 blocks, its record's
# seeded_from_checkpoint.dit.grown), both content checks, slim exports (rebuild.sh: 20 files match) and DiT packs:
#   TMPROOT=/tmp/gr DEVICE=cpu PYTHON=.venv/bin/python SITE_TAR= COMMIT=3b735e8 TOTAL_S=1500 CC_S=500 CC_LIMIT=1 \
#     CC_SEEDS=0 CONT=20122 LR_STEPS_S=6 LR_STEPS_G=6 DISTILL_S=60 CC_NAME=rehearsal_grow OMP_NUM_THREADS=1 \
#     EXTRA="--set pool_size=8 --set pool_keyframe_share=0.5 --set dit_batch=2 --set dit_warmup=2 \
#     --set distill_teacher_samples=4 --set distill_teacher_steps=3 --set distill_steps=2 --set distill_batch=2 \
#     --set checkpoint_every=2 --set log_every=1" nice -n 10 bash bench/tiny_wider_dit/call_grow.sh /tmp/gr/OUT
# (it writes its content records into bench/content_check/results/ too: delete them after).
set -u
source "$(dirname "$0")/slim.sh"
out=$1
start=$(date +%s)
TOTAL_S=${TOTAL_S:-540}
CC_S=${CC_S:-100}
PACK_S=${PACK_S:-25}
train_end=$((start + TOTAL_S - CC_S - PACK_S))
cc_end=$((start + TOTAL_S - PACK_S))
tmp=${TMPROOT:-/tmp}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
LAYERS=${LAYERS:-8}
mkdir -p "$out" "$tmp"
left() { echo $(($1 - $(date +%s))); }

site=$tmp/site-grow
tar_=${SITE_TAR-.whl_prod/site.tar.xz}  # SITE_TAR= (empty): none, the interpreter has the packages
if [ -f "$tar_" ]; then
  mkdir -p "$site" && tar -xJf "$tar_" -C "$site" || exit 1
elif [ -n "${WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
  echo "WHEELS without PyAV: the content check will fail; carry .whl_prod for it"
fi
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1
echo "site ready at $(($(date +%s) - start)) s; $(nproc) cpus; $(nvidia-smi -L 2>/dev/null | head -1)"
if command -v nvidia-smi >/dev/null; then
  (while :; do nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader; sleep 15; done \
    >"$tmp/gpu.log" 2>&1) &
  trace=$!
fi

X="--set pool_two_shape_share=0.6 --set export_dit_dtype=bfloat16 --set ranks=1 --set dit_ema=0.995
  --set dit_lr=${LR:-0.001} --set dit_warmup=${LR_WARMUP:-100} --set dit_lr_final=0.1
  --set distill_teacher_samples=128 ${EXTRA:-}"
declare -A UNPACK=([s]="" [g$LAYERS]="--grow-dit num_layers=$LAYERS,init=${GROW_INIT:-copy}")
declare -A TRAIN=([s]="--set dit_lr_steps=${LR_STEPS_S:-1200}"
                  [g$LAYERS]="--set dit_num_layers=$LAYERS --set dit_lr_steps=${LR_STEPS_G:-700}")
arms=(${ARMS:-s g$LAYERS})
declare -A FROM=([s]=h3/assets/tiny [g$LAYERS]=h3/assets/tiny)
if [ -n "${FROM_SLIM:-}" ]; then  # the grown arm goes on from an earlier call's export (already LAYERS blocks)
  rm -rf "$tmp/g-from" && bash "$(dirname "$0")/rebuild.sh" "$FROM_SLIM" "$tmp/g-from" || exit 1
  FROM[g$LAYERS]=$tmp/g-from/tiny
  UNPACK[g$LAYERS]=""
fi

# every wait names its jobs: a bare `wait` would wait for the GPU trace too, which never ends
pids=()
for n in "${arms[@]}"; do
  rm -rf "$tmp/run-$n"
  $PY -m h3.train unpack --out "$tmp/run-$n" --from "${FROM[$n]}" --continue "dit:${CONT:-30000}" ${UNPACK[$n]} \
    >"$tmp/unpack-$n.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
for n in "${arms[@]}"; do
  grep -E "^(dit|error)" "$tmp/unpack-$n.log"
  [ -f "$tmp/run-$n/state/dit/state.pt" ] || { echo "$n: unpack failed"; cat "$tmp/unpack-$n.log"; exit 1; }
done
echo "seeded at $(($(date +%s) - start)) s"

# the pool once, in the first arm's folder (the pool reads no DiT setting), then a copy for the other arm
first=${arms[0]}
timeout $(($(left "$train_end") - 60)) $PY -m h3.train pool --out "$tmp/run-$first" --device "$DEVICE" $X \
  ${TRAIN[$first]} >"$tmp/pool.log" 2>&1
echo "pool exit $? at $(($(date +%s) - start)) s"
for n in "${arms[@]:1}"; do
  mkdir -p "$tmp/run-$n/state/pool" && cp "$tmp/run-$first/state/pool/pool.pt" "$tmp/run-$n/state/pool/" || exit 1
done

train() {  # NAME: h3.train all in its run folder until train_end (the pool is there: the run skips it)
  local n=$1 l
  l=$(left "$train_end")
  timeout $((l + 10)) $PY -m h3.train all --out "$tmp/run-$n" --device "$DEVICE" --finish-on-budget \
    --max-seconds $((l - 5)) --stage-seconds "dit=100000,distill=${DISTILL_S:-20},export=20" \
    --code-commit "${COMMIT:-}" $X ${TRAIN[$n]} >"$tmp/train-$n.log" 2>&1
  echo "$n: train exit $? at $(($(date +%s) - start)) s" >>"$tmp/train-$n.log"
}
pids=()
for n in "${arms[@]}"; do
  train "$n" &
  pids+=($!)
done
wait "${pids[@]}"
[ -n "${trace:-}" ] && kill "$trace"
for n in "${arms[@]}"; do
  echo "== $n"
  grep -E "stage |exported|train exit|Error|error" "$tmp/train-$n.log" | tail -12
  grep -E "dit step" "$tmp/train-$n.log" | tail -3
done

# the content check, the exports side by side on an equal share of the cores each
checked=("${arms[@]}")
declare -A MODEL=([s]=$tmp/run-s/tiny [g$LAYERS]=$tmp/run-g$LAYERS/tiny [ref]=h3/assets/tiny)
[ "${REF:-0}" = 1 ] && checked+=(ref)
threads=$(($(nproc) / ${#checked[@]}))
[ "$threads" -lt 1 ] && threads=1
mkdir -p "$tmp/cc"
pids=()
[ "$CC_S" -gt 0 ] || { echo "CC_S=0: no content check this call (every second is training's)"; checked=(); }
for n in "${checked[@]}"; do
  if [ -d "${MODEL[$n]}" ]; then
    OMP_NUM_THREADS=$threads timeout "$(left "$cc_end")" $PY bench/content_check/content_check.py \
      --model "${MODEL[$n]}" --size 128 --prompts world-heldout --seeds "${CC_SEEDS:-0,1}" \
      --limit "${CC_LIMIT:-8}" --rows baseline --name "${CC_NAME:-tiny_grow_dit}_${n}_world-heldout" \
      --note "issue 55, call_grow.sh ($n; code ${COMMIT:-?}): $(case $n in s) echo "the shipped DiT continued";;
        ref) echo "the shipped checkpoint as it is";; *) echo "the shipped DiT grown to $LAYERS blocks, continued";; esac)" \
      >"$tmp/cc/cc-$n.log" 2>&1 &
    pids+=($!)
  fi
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for n in "${checked[@]}"; do
  echo "$n: $(grep -E "^baseline|Error|error" "$tmp/cc/cc-$n.log" | tail -3)"
  cp bench/content_check/results/"${CC_NAME:-tiny_grow_dit}_${n}"_world-heldout.* "$tmp/cc/" 2>/dev/null
done
echo "content check done at $(($(date +%s) - start)) s"
tar -C "$tmp" -czf "$out/content.tgz" cc

for n in "${arms[@]}"; do
  r=$tmp/run-$n
  mkdir -p "$out/$n"
  slim_export "$r" "$out/$n" "$n"
  if [ "${PACK:-1}" = 1 ] && [ -f "$r/state/dit/state.pt" ]; then
    mkdir -p "$tmp/dp-$n/state/dit"
    cp "$r/state/dit/state.pt" "$tmp/dp-$n/state/dit/"
    timeout 60 $PY -m h3.train pack --out "$tmp/dp-$n" --to "$tmp/dp-$n/dit.pack" --moments bf16 >/dev/null \
      && split -b 15m "$tmp/dp-$n/dit.pack" "$out/$n/dit.pack.part-"
    echo "$n: dit pack exit $?"
  fi
done
(cd "$tmp" && tar -czf "$out/logs.tgz" unpack-*.log pool.log train-*.log $(ls gpu.log 2>/dev/null))
ls -la "$out" "$out"/*/
echo "call_grow.sh done at $(($(date +%s) - start)) s"
