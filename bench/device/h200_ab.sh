#!/usr/bin/env bash
# Issue 20's part of a combined call: the whole signoff chain at full size on ONE H200 (CUDA_VISIBLE_DEVICES names
# it) inside a time box (BUDGET_S, default 280 s, model init included):
#   h3-random (released configs, seeded weights drawn on the device; the real-size Qwen3-VL conditioner streamed from
#   host memory), 5 s 544x960, 1 prompt x seeds 0,1, no warm-up: `h3eval ab` baseline vs turbo4-fp8-sage-compile
#   (or, without sageattention on the image, bench/full_size_ab/recipes/turbo4-fp8-compile.toml) and turbo4-sparse, every gate
#   bench/full_size_ab/h200_ab.py GATES names (on the GPU where a gate has a GPU path), verdict, report, rendered results. ab stops
#   starting requests in time (--time-box); what ran is kept. fidelity, audio and reference_free need lpips,
#   pyloudnorm and scikit-video, which the image lacks (2026-12-01): carry their wheels, or those gates error (named
#   in the rendered results; chain.log lists the gate modules found).
#   bash bench/device/h200_ab.sh OUTDIR
# OUTDIR gets: chain.log (progress, and the tail of a failed step's log), h200_ab.json + h200_ab_<shape>.{json,md}
# (rendered), state.tgz[.part-NN] (the work folder without clips, trajectories and LoRA: restore it at home with
# `python bench/full_size_ab/h200_ab.py restore --state OUTDIR --work W`, then `render` / `screenshot`), clips.tgz when < 15 MB.
# H200_AB_SHAPE=5s-768x1344 H200_AB_SEEDS=0 for the larger shape: its baseline alone is 29 x 6.63 s = 192 s of DiT
# (bench/full_size_speed/results/h200_speed_stock.md), so one seed is what fits a 10-minute call.
# H200_AB_GATES_RESERVE_S: what ab leaves the later steps (bench/full_size_ab/h200_ab.py --gates-reserve-s; default 50 s).
# H200_AB_WARMUP=1 H200_AB_WARMUP_FAST=1: one warm-up request for the compiled candidates only, the FP8 one and
# turbo4-sparse (compiled since session 20) where it runs (their torch.compile paid outside the timed request; the
# baseline's warm-up would cost a request of minutes and warm nothing).
# H200_AB_OFF_IDENTITY=1: the off-identity candidate (the baseline's levers again, byte for byte) runs too.
# H200_AB_BASELINE_LAST=1: each pair's candidates before its baseline (768x1344: the baseline is ~3.5 min).
# H200_AB_QUICK=1: no version and module checks before the chain (~10 s).
# H200_AB_CANDIDATES=fast,turbo4-sparse (the default): the candidates, `fast` standing for the FP8 one above; e.g.
# H200_AB_CANDIDATES=fast with H200_AB_OFF_IDENTITY=1 spends a call's time on the off-identity check instead.
# H200_AB_BASELINE=fast (or a recipe name / .toml): the run's baseline in place of the stock `baseline`, e.g. to
# measure one lever added to the fast recipe side by side (its candidate bench/full_size_ab/recipes/turbo4-fp8-sage-compile-vaec.toml)
# without the stock baseline's 81 s a 544x960 request; judged against that baseline as the candidate's kind says.
# A CPU rehearsal: H200_AB_MODEL=h3-random-small H200_AB_DEVICE=cpu H200_AB_SHAPE=5s-128x128 bash ... OUTDIR
set -u
out=$(mkdir -p "$1" && cd "$1" && pwd)
BUDGET_S=${BUDGET_S:-280}
PY=${PYTHON:-python3}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 H3_CACHE_DIR=${H3_CACHE_DIR:-/tmp/h3cache}
work=${H200_AB_WORK:-/tmp/h200_ab_work}
model=${H200_AB_MODEL:-h3-random} device=${H200_AB_DEVICE:-cuda} shape=${H200_AB_SHAPE:-5s-544x960}
seeds=${H200_AB_SEEDS:-0,1}
end=$((SECONDS + BUDGET_S))
{
  echo "start $(date -u +%FT%TZ) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset} budget=${BUDGET_S}s work=$work"
  if [ -z "${H200_AB_QUICK:-}" ]; then
    timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
    timeout 30 "$PY" -c "import av, torch; print('av', av.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
    timeout 10 "$PY" -c "import importlib.util as u; print('gate modules:', ', '.join(m + (' ok' if u.find_spec(m)
      else ' MISSING') for m in ('cv2', 'scipy', 'lpips', 'pyloudnorm', 'skvideo')))" 2>&1 | tail -1
  fi
} >>"$out/chain.log" 2>&1
if [ -n "${H200_AB_QUICK:-}" ] && [ -d /tmp/site/sageattention ]; then fast=turbo4-fp8-sage-compile
elif timeout 30 "$PY" -c "import sageattention" 2>/dev/null; then fast=turbo4-fp8-sage-compile
else fast=bench/full_size_ab/recipes/turbo4-fp8-compile.toml
  echo "sageattention is not importable here: the FP8 candidate is turbo4-fp8-compile (native attention)" \
    >>"$out/chain.log"
fi
candidates=$(echo "${H200_AB_CANDIDATES:-fast,turbo4-sparse}" | sed "s#\bfast\b#$fast#")
baseline=$(echo "${H200_AB_BASELINE:-baseline}" | sed "s#^fast\$#$fast#")
warm=$(basename "$fast" .toml); case ",$candidates," in *,turbo4-sparse,*) warm="$warm,turbo4-sparse";; esac
echo "baseline $baseline; candidates $candidates; warm-up ${H200_AB_WARMUP:-0} (${H200_AB_WARMUP_FAST:+$warm})" \
  >>"$out/chain.log"
# The chain leaves 20 s of the box for packing the results below.
chain_s=$((end - SECONDS - 20))
# The chain runs in the background so that a SIGTERM from an outer `timeout` shorter than BUDGET_S is trapped: the
# chain is stopped (it kills its running step) and what it made is still packed (fast: no render, no clips).
timeout -k 7 $((chain_s + 5)) "$PY" bench/full_size_ab/h200_ab.py chain --work "$work" --model "$model" --device "$device" \
  --shapes "$shape" --prompts '*=1' --seeds "$seeds" --warmup "${H200_AB_WARMUP:-0}" \
  ${H200_AB_WARMUP_FAST:+--warmup-recipes "$warm"} ${H200_AB_BASELINE_LAST:+--baseline-last} \
  --off-identity "$([ -n "${H200_AB_OFF_IDENTITY:-}" ] && echo "$shape")" \
  --candidates "$candidates" --baseline "$baseline" --budget-s "$chain_s" ${H200_AB_GATES_RESERVE_S:+--gates-reserve-s \
  "$H200_AB_GATES_RESERVE_S"} >>"$out/chain.log" 2>&1 &
cpid=$!
cut=0
trap 'cut=1; echo "SIGTERM at ${SECONDS}s: stopping the chain, packing what it made" >>"$out/chain.log"
      kill -TERM $cpid' TERM
wait $cpid; rc=$?
[ $cut = 1 ] && { wait $cpid; rc=$?; }
echo "chain exit $rc at ${SECONDS}s" >>"$out/chain.log"
if [ $cut = 1 ]; then
  cp "$work"/results/h200_ab*.json "$work"/results/h200_ab*.md "$out/" 2>/dev/null
  timeout 4 "$PY" bench/full_size_ab/h200_ab.py snapshot --work "$work" --out "$out" --max-mib 15 --max-parts 2 \
    >>"$out/chain.log" 2>&1
  echo "packed at ${SECONDS}s (cut short)" >>"$out/chain.log"; exit 124
fi
for f in "$work"/steps/*.json; do
  grep -q '"done"' "$f" || { s=$(basename "$f" .json); echo "== tail of logs/$s.log"; tail -25 "$work/logs/$s.log"; }
done >>"$out/chain.log" 2>&1
# The rendered results (again if the chain was cut before its render step), then the state and, if small, the clips.
grep -qs '"done"' "$work/steps/render.json" || \
  timeout 15 "$PY" bench/full_size_ab/h200_ab.py render --work "$work" --out-dir "$work/results" >>"$out/chain.log" 2>&1
cp "$work"/results/h200_ab*.json "$work"/results/h200_ab*.md "$out/" 2>>"$out/chain.log"
timeout 8 "$PY" bench/full_size_ab/h200_ab.py snapshot --work "$work" --out "$out" --max-mib 15 --max-parts 2 >>"$out/chain.log" 2>&1
if ( cd "$work" && timeout 5 tar -czf /tmp/h200_ab_clips.tgz runs/*/clips/*/*.mp4 ) 2>/dev/null \
   && [ "$(stat -c %s /tmp/h200_ab_clips.tgz)" -lt 15000000 ]; then mv /tmp/h200_ab_clips.tgz "$out/clips.tgz"
else echo "clips not returned (over 15 MB or not packed in time)" >>"$out/chain.log"; rm -f /tmp/h200_ab_clips.tgz; fi
echo "done at ${SECONDS}s $(date -u +%FT%TZ)" >>"$out/chain.log"
tail -40 "$out/chain.log"
