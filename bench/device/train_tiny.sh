#!/usr/bin/env bash
# Device calls that train the tiny preset on one or two GPUs, from scratch or continuing an earlier call:
#
#   WHEELS=../../.whl COMMIT=<sha> bash bench/device/train_tiny.sh OUTDIR
#
# runs `python -m h3.train ${STAGE:-all}` with per-stage wall-clock budgets (--finish-on-budget: a stage ends when its
# budget is spent, its record says after how many of its planned steps) inside BUDGET_S seconds of the script's start
# (on two GPUs: the video VAE on the first beside the audio VAE on the second, the pool encoded on both, the DiT and
# the distillation data-parallel over both through torchrun), then packs for the lending tool's limits (8 files of
# 16 MiB back; 64 MiB carried, of which the wheels take 22 MiB). It returns in OUTDIR:
#   train.log           the unpack summary (when resuming) and the training log;
#   tiny.tgz.part-*     the exported checkpoint (for h3/assets/tiny), when the export stage ran (one part, ~15 MB);
#   state.pack.part-*   every stage's state for the next call (h3.train.travel: weights and EMA exact, AdamW moments
#                       in bfloat16 unless PACK_MOMENTS=fp32|drop; ~26 MB in 2 parts after a whole `all`, ~11 MB when
#                       only the VAEs are in it). The latent pool is not in it: each call rebuilds it from the seed.
# On a machine of your own, the one command is `python -m h3.train all --out DIR` (the record's "reproduce" line fixes
# the step counts).
#
# Environment: STAGE (default all; e.g. video-vae for a call that only continues the video VAE), STAGE_SECONDS
# (per-stage budgets, default video-vae=175,audio-vae=175,dit=235,distill=60,export=15), BUDGET_S (570), RESUME_FROM
# (a folder, carried with the call, holding an earlier call's state.pack.part-*), CONTINUE (with RESUME_FROM: stages a
# budget ended that this call re-opens, STAGE[:STEPS],...: video-vae or audio-vae drops the dit and distill states
# that depend on it, dit drops distill), PACK_MOMENTS (bf16), RUN_DIR (/tmp/h3-train; with RESUME_FROM it is emptied
# first when it is that default), PACK (1; 0 returns no state pack: a call seeded from the shipped checkpoint needs none),
# SITE (/tmp/site: where the wheels install; two runs side by side need their own SITE and RUN_DIR), CHECKPOINT (all;
# lora returns tiny-lora.tgz, the exported LoRAs and record alone, for a distillation from the shipped checkpoint),
# FRESH (with RESUME_FROM a checkpoint folder: dit leaves the DiT unseeded, so that it trains from its initial weights on
# the shipped VAEs: what a DiT of another shape, EXTRA_ARGS="--set dit_hidden_size=... --set dit_num_layers=...",
# needs; issue 17, session 21's plan in tiny_train_h200.md).
# With `--set distill_snapshot_every=N` the student's LoRA every N distillation steps comes back in snapshots.tgz.
#
# Session 18 (2026-12-03) ran run 23 (tiny_train_h200.md): the DMD term and the fake score on the last student step
# (dmd_student_step=3) with a regression anchor (dmd_regression_weight 0.5-1.0) keeps the teacher's motion; run 23d's
# snapshot at step 200 (from the run-13 LoRA, weight 0.5) PASSes the signoff and ships as turbo4-tiny. Its command:
#   X="--set pool_two_shape_share=0.6 --set distill_teacher_samples=2048 --set distill_steps=1200
#   --set distill_lr=0.0002 --set distill_lr_final=0.1 --set distill_objective=dmd --set dmd_student_step=3
#   --set distill_snapshot_every=200 --set dmd_regression_weight=0.5 \
#   --set distill_init=h3/assets/tiny/lora/turbo4-tiny-run13.safetensors"
#   SITE=/tmp/site-d RUN_DIR=/tmp/run-d WHEELS=.whl COMMIT=<sha> RESUME_FROM=h3/assets/tiny PACK=0 CHECKPOINT=lora
#   STAGE_SECONDS=distill=460,export=25 BUDGET_S=555 EXTRA_ARGS="$X" bash bench/device/train_tiny.sh $OUT/d
# (two such trainings side by side fit one call; the pool takes ~140 s of each, the machine start is charged too).
# The other snapshots sit at -0.03..-0.05 on faithfulness (one PASS in 12 probes): the next lever is content (more
# two-shape and bounce scenes in the teacher's pool), not the objective.
#
# Session 10 (2026-12-02) ran the plan below as runs 14a (DiT to 25116) and 14c (the distillation on from run 13's LoRA
# at distill_lr 5e-4): neither improved held-out content or the signoff (tiny_train_h200.md), run 13 stays shipped, and
# the next training needs a new lever (a wider DiT from run 13's VAEs, more caption variety per combination, or a
# distribution-matching distillation), not more calls of these.
#
# Plan written after run 13 (session 9; bench/tiny_training/results/tiny_train_h200.md): run 13a continued the
# DiT 15116 -> 20116 on a pool with more two-shape scenes (held-out colour 77 -> 85 %, direction 69 -> 73, sync 5 -> 18;
# two-shape scenes still the failure) and run 13b distilled the LoRA against it (turbo4-tiny INCONCLUSIVE on prompt
# faithfulness, not within 5 points of the teacher on colour and direction). CONTINUE=dit:STEPS names the stage's new
# total, not an increment. Since beb78c4 a continued DiT keeps the latent statistics it trained with, so the pool's
# draw chance can change between calls without moving them; since session 9 the distillation can start from the
# checkpoint's LoRA (distill_init), so each call adds its ~2100 steps to the last one's instead of starting over.
# Call 1: the DiT on to 25116 steps (the seconds left distil on from run 13's LoRA); calls 2 and 3: the distillation
# on from the LoRA of the checkpoint before (its tiny.tgz parts replace h3/assets/tiny between calls):
#   WHEELS=.whl COMMIT=<sha> RESUME_FROM=h3/assets/tiny CONTINUE=dit:25116 PACK=0 STAGE_SECONDS=dit=420,export=25 \
#     BUDGET_S=560 EXTRA_ARGS="--set pool_two_shape_share=0.6 --set dit_lr_final=0.1 --set dit_lr_steps=5000 \
#     --set distill_init=h3/assets/tiny/lora/turbo4-tiny.safetensors" bash bench/device/train_tiny.sh $OUT
#   WHEELS=.whl COMMIT=<sha> RESUME_FROM=h3/assets/tiny PACK=0 STAGE_SECONDS=distill=450,export=25 BUDGET_S=575 \
#     EXTRA_ARGS="--set pool_two_shape_share=0.6 --set distill_teacher_samples=2048 --set distill_steps=2300 \
#     --set distill_lr_final=0.1 --set distill_moment_weight=1.0 \
#     --set distill_init=h3/assets/tiny/lora/turbo4-tiny.safetensors" bash bench/device/train_tiny.sh $OUT
# Probe each on the CPU: `python bench/content_check/content_check.py --seeds 0,1 --rows baseline --name content_check_runN_probe`
# and `python bench/signoff_proof/signoff_proof.py --model tiny-trained --vbench-env /tmp/vbench-env --out FRESH --name ...`.
#
# Earlier plan (2026-12-01 after runs 5-7, bench/tiny_training/results/tiny_train_h200.md): the shipped checkpoint
# (h3/assets/tiny, run 7: video VAE 629 + decoder 4016, audio VAE 2632, DiT 7413 at 14 steps/s of 192 alone on one
# H200, distill 227) is the starting point; no state pack survives a session. It is part of the tree (~20 MB), so a
# call no longer fits a 36 MB pack beside it and the wheels (64 MiB): every call seeds from a checkpoint instead, run
# from the repository root with only .whl carried:
#   WHEELS=.whl COMMIT=<sha> RESUME_FROM=h3/assets/tiny CONTINUE=dit STAGE_SECONDS=distill=90,export=30 \
#     bash bench/device/train_tiny.sh $OUT
# and between calls its returned tiny.tgz.part-* replace h3/assets/tiny in the working tree (uncommitted until the
# last), so the next call seeds from them (AdamW restarts and warms up 300 steps each call: ~20 s; the DiT continues
# from its EMA). Pool ~120 s, then ~5000 DiT steps a call. Since 2026-12-01 (session 4) the audio-decoder stage (the
# audio VAE's decoder continued on whole clips, encoder frozen: the pool's latents do not move) trains beside them:
#   WHEELS=.whl COMMIT=<sha> RESUME_FROM=h3/assets/tiny CONTINUE=dit PACK=0 \
#     STAGE_SECONDS=audio-decoder=420,distill=100,export=30 bash bench/device/train_tiny.sh $OUT
# (a checkpoint whose record has an audio_decoder stage seeds it as done: CONTINUE=dit,audio-decoder re-opens it).
# Runs 8-9 (session 4) did that: audio decoder 0->4000 (162 s beside the pool), DiT 7413->10200->13443, distill 450 and
# 355 steps. Call 9 (warm machine, nothing beside): pool 74 s, DiT 229 s (3243 steps), distill 85 s, export 4 s with
#   WHEELS=.whl COMMIT=<sha> RESUME_FROM=h3/assets/tiny CONTINUE=dit PACK=0 STAGE_SECONDS=distill=85,export=25 \
#     BUDGET_S=470 bash bench/device/train_tiny.sh $OUT The content check's ceilings are the VAEs' (python
# bench/vae_roundtrip/vae_roundtrip.py h3/assets/tiny): shape 2/8 and sync 2/8 (clicks) at run 7, so sync >= 80% also needs a better
# audio VAE (CONTINUE=audio-vae restarts the DiT: its latents change) and shape a better video VAE.
#
# Multi-call training as planned before run 4 (kept for the record of runs 3 and 4):
# (each call one `run` on nvidia-h200-x2, ~580 s of lease with the machine start;
# carry .carry/tiny = `git archive HEAD h3 bench/device pyproject.toml` of this branch, .whl, and for a resume the
# previous call's state.pack.part-* copied into .carry/tiny/resume/: 0.5 + 22.7 + 25.6 MB = 49 MB < 64 MiB).
#
# Starting from run 3's state (bench/tiny_training/results/tiny_train_h200.md: video VAE 915 of 5000 steps, audio VAE done), repack
# it on the CPU first (its 47 MB state.tar cannot travel):
#   mkdir -p /tmp/r3/state && cat /work/notes/device_runs/train3/state.tar.part-* | tar -C /tmp/r3/state -xf -
#   PYTHONPATH=<worktree> python -m h3.train pack --out /tmp/r3 --to /tmp/r3/state.pack    # 25.6 MB
#   mkdir -p .carry/tiny/resume && split -b 15m /tmp/r3/state.pack .carry/tiny/resume/state.pack.part-
# Call 1 (the video VAE alone, re-opened to its planned 5000 steps, with the whole budget: ~2700 more steps at run 3's
# 5.2 steps/s):
#   cd .carry/tiny && WHEELS=../../.whl COMMIT=<sha> RESUME_FROM=resume CONTINUE=video-vae STAGE=video-vae \
#     STAGE_SECONDS=video-vae=520 bash bench/device/train_tiny.sh $OUT
#   returns train.log and state.pack.part-* (video + audio VAE, ~11 MB); no checkpoint.
# Call 2 (replace .carry/tiny/resume/ by call 1's state.pack.part-*): the rest of the video VAE, then pool, a fresh
# DiT on the new latents, distill, export:
#   cd .carry/tiny && WHEELS=../../.whl COMMIT=<sha> RESUME_FROM=resume CONTINUE=video-vae \
#     STAGE_SECONDS=video-vae=150,dit=260,distill=45,export=15 bash bench/device/train_tiny.sh $OUT
#   returns train.log, tiny.tgz.part-aa (probe it with bench/content_check/content_check.py) and state.pack.part-* (~26 MB).
# Call 3 (resume/ = call 2's parts): the DiT continued, the distillation redone from it, export:
#   cd .carry/tiny && WHEELS=../../.whl COMMIT=<sha> RESUME_FROM=resume CONTINUE=dit \
#     STAGE_SECONDS=dit=350,distill=100,export=15 bash bench/device/train_tiny.sh $OUT
#   returns train.log, tiny.tgz.part-aa and state.pack.part-*.
# Two calls instead: call 1 as above, then call 2 without CONTINUE (the video VAE ends at call 1's count) and
# STAGE_SECONDS=dit=380,distill=70,export=15. From scratch (no state): call 1 is the plain command at the top, and
# later calls add RESUME_FROM=resume and CONTINUE=<the stage to carry on>.
set -u
out=$1
BUDGET_S=${BUDGET_S:-570}
STAGE=${STAGE:-all}
PY=${PYTHON:-python3}
if [ -n "${WHEELS:-}" ]; then
  site=${SITE:-/tmp/site}  # SITE and RUN_DIR apart: two trainings side by side on one GPU
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=$site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
mkdir -p "$out"
run=${RUN_DIR:-/tmp/h3-train}
: >"$out/train.log"
if [ -n "${RESUME_FROM:-}" ] && [ -f "$RESUME_FROM/training_record.json" ]; then
  # an exported checkpoint (h3/assets/tiny): its weights and step counts seed the states (h3.train.travel)
  [ -z "${RUN_DIR:-}" ] && rm -rf "$run"
  $PY -m h3.train unpack --out "$run" --from "$RESUME_FROM" ${CONTINUE:+--continue "$CONTINUE"} \
    ${FRESH:+--fresh "$FRESH"} >>"$out/train.log" 2>&1
  rc=$?
  cat "$out/train.log"
  [ $rc -eq 0 ] || exit $rc
elif [ -n "${RESUME_FROM:-}" ]; then
  if ! ls "$RESUME_FROM"/state.pack.part-* >/dev/null 2>&1; then
    echo "RESUME_FROM=$RESUME_FROM: no state.pack.part-* there (an older state.tar? repack it on the CPU:" \
      "python -m h3.train pack)" >&2
    exit 3
  fi
  [ -z "${RUN_DIR:-}" ] && rm -rf "$run"
  cat "$RESUME_FROM"/state.pack.part-* >/tmp/h3-resume.pack || exit 1
  $PY -m h3.train unpack --out "$run" --from /tmp/h3-resume.pack ${CONTINUE:+--continue "$CONTINUE"} \
    >>"$out/train.log" 2>&1
  rc=$?
  cat "$out/train.log"
  [ $rc -eq 0 ] || exit $rc
elif [ -n "${CONTINUE:-}" ]; then
  echo "CONTINUE=$CONTINUE needs RESUME_FROM" >&2
  exit 3
fi
nvidia-smi -L 2>/dev/null || true
left=$((BUDGET_S - SECONDS))
timeout $((left - 15)) $PY -m h3.train "$STAGE" --out "$run" --device "${DEVICE:-cuda}" --finish-on-budget \
  --max-seconds $((left - 35)) --stage-seconds "${STAGE_SECONDS:-video-vae=175,audio-vae=175,dit=235,distill=60,export=15}" \
  --code-commit "${COMMIT:-}" ${EXTRA_ARGS:-} >>"$out/train.log" 2>&1
rc=$?
echo "train exit $rc at $SECONDS s"
grep -E "stage |step .*(00|/[0-9]+) |exported|Error|error" "$out/train.log" | tail -40
if [ -d "$run/tiny" ] && [ "${CHECKPOINT:-all}" = lora ]; then
  # a distillation call from the shipped checkpoint changes only the LoRA: its record, plot and LoRAs (~1 MB)
  tar -C "$run" -czf "$out/tiny-lora.tgz" tiny/lora tiny/training_record.json $(cd "$run" && ls tiny/*.png 2>/dev/null)
elif [ -d "$run/tiny" ]; then
  tar -C "$run" -czf - tiny | split -b 15m - "$out/tiny.tgz.part-"
fi
if [ -d "$run/state/distill/snapshots" ]; then  # distill_snapshot_every: the student at several steps
  tar -C "$run/state/distill" -czf "$out/snapshots.tgz" snapshots
fi
if [ -d "$run/state" ] && [ "${PACK:-1}" = 1 ]; then
  timeout 60 $PY -m h3.train pack --out "$run" --to "$run/state.pack" --moments "${PACK_MOMENTS:-bf16}" \
    && split -b 15m "$run/state.pack" "$out/state.pack.part-"
  pack_rc=$?
  echo "pack exit $pack_rc at $SECONDS s"
  [ $rc -eq 0 ] && rc=$pack_rc
fi
ls -la "$out"
exit $rc
