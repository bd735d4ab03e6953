#!/usr/bin/env bash
# One device call that trains the tiny preset from scratch on one or two GPUs and returns what ships:
#
#   WHEELS=../../.whl COMMIT=<sha> bash bench/device/train_tiny.sh OUTDIR
#
# runs `python -m h3.train all` with per-stage wall-clock budgets (--finish-on-budget: a stage ends when its budget
# is spent, its record says after how many of its planned steps) inside BUDGET_S seconds of the script's start (on two
# GPUs: the video VAE on the first beside the audio VAE on the second, the pool encoded on both, the DiT and the
# distillation data-parallel over both through torchrun), then packs for the lending
# tool's limits (8 files, 16 MiB each): the exported checkpoint (h3/assets/tiny) as tiny.tgz.part-*, the DiT and
# distill states for a resume as state.tar.part-*, and the log. On a machine of your own, the one command is
# `python -m h3.train all --out DIR` (the record's "reproduce" line fixes the step counts).
#
# Training that needs more than one call: RESUME_FROM=<folder holding an earlier call's state.tar.part-*> (carried
# with the call) unpacks those states first; `all` then skips the finished stages, rebuilds the latent pool from the
# seed and continues the unfinished one. CONTINUE=dit re-opens a DiT stage an earlier call ended on its budget (and
# drops its distillation, which the continued DiT's teacher must redo).
set -u
out=$1
BUDGET_S=${BUDGET_S:-570}
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
mkdir -p "$out"
run=${RUN_DIR:-/tmp/h3-train}
if [ -n "${RESUME_FROM:-}" ]; then
  mkdir -p "$run/state" && cat "$RESUME_FROM"/state.tar.part-* | tar -C "$run/state" -xf - || exit 1
  if [ -n "${CONTINUE:-}" ]; then
    ${PYTHON:-python3} - "$run/state" "$CONTINUE" <<'PY' || exit 1
import shutil, sys, torch
from pathlib import Path
root = Path(sys.argv[1])
for stage in sys.argv[2].split(","):
    path = root / stage / "state.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["total_steps"] = state.get("planned_steps", state["total_steps"])
    torch.save(state, path)
    if stage == "dit":
        shutil.rmtree(root / "distill", ignore_errors=True)
PY
  fi
fi
nvidia-smi -L 2>/dev/null || true
left=$((BUDGET_S - SECONDS))
timeout $((left - 15)) ${PYTHON:-python3} -m h3.train all --out "$run" --device "${DEVICE:-cuda}" --finish-on-budget \
  --max-seconds $((left - 35)) --stage-seconds "${STAGE_SECONDS:-video-vae=175,audio-vae=175,dit=235,distill=60,export=15}" \
  --code-commit "${COMMIT:-}" ${EXTRA_ARGS:-} >"$out/train.log" 2>&1
rc=$?
echo "train exit $rc at $SECONDS s"
grep -E "stage |step .*(00|/[0-9]+) |exported|Error|error" "$out/train.log" | tail -40
if [ -d "$run/tiny" ]; then
  tar -C "$run" -czf - tiny | split -b 15m - "$out/tiny.tgz.part-"
fi
if [ -d "$run/state" ]; then
  ( cd "$run/state" && tar -cf - $(ls -d */state.pt 2>/dev/null) ) | split -b 15m - "$out/state.tar.part-"
fi
ls -la "$out"
exit $rc
