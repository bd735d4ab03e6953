#!/usr/bin/env bash
# Issue 54, "the gates on the GPU": every per-pair release gate (integrity, fidelity, audio, ghosting, reference_free,
# prompt_faithfulness; VBench runs in its own environment and is not timed here) over real decoded clips of a fast
# recipe at 5 s 768x1344, as a fraction of that recipe's generation, on ONE GPU, through the product:
#   1. `h3eval ab --model h3-random` (full size, seeded random weights, the text encoder streamed from host memory):
#      stock diffusers at 4 steps (bench/runtime_speed/recipes/stock4.toml) as the baseline and GF_CAND (turbo4-fp8)
#      on GF_PAIRS (2) prompts of bench/runtime_speed/prompts.jsonl, seed 0, one speed round (speed.json: the
#      generation-side time of each recipe's requests, warm), --by-recipe (the baseline's requests first, then the
#      candidate's, applied for good: interleaved, the FP8 candidate ran out of memory at its first switch on the
#      2026-12-06 H100 call, a reversible FP8 holding both copies of the DiT), warm-up for the candidate only (the
#      stock baseline at 768x1344 takes ~36 s a request on an H100; GF_GATE_S, 130 s, is left for the gates;
#      estimated for 2 pairs on an H100: baseline load ~50 s + 4 x 36 s, FP8 apply + warm-up ~40 s + 4 x ~20 s);
#   2. `h3eval gate RUN --gates ... --device cuda --force` GF_REPEAT times (the first loads LPIPS and warms the
#      kernels; the later ones are the warm figures), each timed whole.
#   run(command="bash bench/device/gate_fraction.sh", carry=[".whl_prod"], kind="nvidia-h200", needs_h200=true,
#       timeout_s=590)
# An H200: on an 80 GB H100 stock4 at 768x1344 peaks at 77.9 GiB and its second request runs out of memory
# (bench/gates_speed/results/gpu_fraction/2026-12-06-h100-s29-oom.md); there, GF_SHAPE="5 544 960" measures the
# fraction at the smaller shape only.
# then, here: python bench/gates_speed/gate_fraction.py --from FILES_AT --name NAME --command "..." [--commit SHA].
# CPU rehearsal: GF_UNPACK=0 GF_PY=.venv/bin/python GF_MODEL=h3-random-small GF_SHAPE="5 64 64" GF_DEVICE=cpu
#   GF_CAND=turbo4 GF_PAIRS=2 OUT=/tmp/gf_out bash bench/device/gate_fraction.sh
# LPIPS runs with its random AlexNet trunk (lpips_trunk=rand: the trunk's weights are not on the machine; the same
# architecture, so the same cost). Writes $OUT/gate_fraction.tgz (speed.json, run.json, the gates' per-pair JSON,
# the logs) and $OUT/gate_times.json on its own. GF_SERIAL=1 adds a last run, one gate after another, on a copy of the
# run (run_serial/gates: each gate's own seconds a pair; not part of the fraction).
set -u
t0=$SECONDS
call_s=${GF_CALL_S:-560}
PY=${GF_PY:-python3}
R=${GF_DIR:-/tmp/gf}; rm -rf $R; mkdir -p $R /tmp/site "$OUT"
source "$(dirname "$0")/site.sh"
if [ "${GF_UNPACK:-1}" = 1 ]; then unpack_site "$PY" || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export H3_CACHE_DIR=/tmp/h3cache TOKENIZERS_PARALLELISM=false
model=${GF_MODEL:-h3-random}; dev=${GF_DEVICE:-cuda}; cand=${GF_CAND:-turbo4-fp8}
gates=${GF_GATES:-integrity,fidelity,audio,ghosting,reference_free,prompt_faithfulness}
read -r secs height width <<<"${GF_SHAPE:-5 768 1344}"
head -n "${GF_PAIRS:-2}" bench/runtime_speed/prompts.jsonl >$R/prompts.jsonl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >$R/card.txt 2>&1
$PY -m h3.cli seeded-lora --model "$model" --out $R/lora 2>&1 | tail -1
export H3_LORA_DIR=$R/lora
left=$((call_s - (SECONDS - t0) - ${GF_GATE_S:-130}))
echo "ab starts at $((SECONDS - t0)) s with ${left} s for it"
timeout -k 5 $left $PY -m h3eval.cli ab --baseline bench/runtime_speed/recipes/stock4.toml --candidate "$cand" \
  --model "$model" --prompts $R/prompts.jsonl --seeds 0 --seconds "$secs" --height "$height" --width "$width" \
  --device "$dev" --text-encoder offload --speed-rounds 1 --by-recipe --warmup-recipe "$cand" --out $R/run 2>&1 \
  | grep -v "FutureWarning\|WeightNorm.apply" >$R/ab.log
echo "ab exit ${PIPESTATUS[0]} at $((SECONDS - t0)) s" | tee -a $R/ab.log
tail -5 $R/ab.log
echo '{"gates": "'"$gates"'", "device": "'"$dev"'", "candidate": "'"$cand"'", "shape": "'"$secs $height $width"'", "walls_s": [' >$R/gate_times.json
sep=""
for i in $(seq 1 "${GF_REPEAT:-3}"); do
  [ $((call_s - (SECONDS - t0))) -lt 40 ] && { echo "no time for gate run $i"; break; }
  s=$EPOCHREALTIME
  timeout -k 5 $((call_s - (SECONDS - t0) - 20)) $PY -m h3eval.cli gate $R/run --gates "$gates" --device "$dev" \
    -o lpips_trunk=rand --force >$R/gate_$i.log 2>&1
  rc=$?; e=$EPOCHREALTIME; w=$(awk "BEGIN{printf \"%.3f\", $e - $s}")
  echo "gate run $i exit $rc in $w s" | tee -a $R/gate_$i.log
  [ $rc -ne 0 ] && tail -5 $R/gate_$i.log
  printf '%s{"run": %d, "exit": %d, "wall_s": %s}' "$sep" "$i" "$rc" "$w" >>$R/gate_times.json
  sep=", "
done
echo ']}' >>$R/gate_times.json
# GF_SERIAL=1: once more on a copy of the run with the gates one after another (H3EVAL_GATE_THREADS=1, no decode
# ahead), so that each gate's info.gate_s is its own cost on a pair (the threaded runs' figures share the pair's wall).
if [ "${GF_SERIAL:-0}" = 1 ] && [ $((call_s - (SECONDS - t0))) -ge 40 ]; then
  rm -rf $R/run_serial && cp -r $R/run $R/run_serial
  H3EVAL_GATE_THREADS=1 timeout -k 5 $((call_s - (SECONDS - t0) - 15)) $PY -m h3eval.cli gate $R/run_serial \
    --gates "$gates" --device "$dev" -o lpips_trunk=rand --force >$R/gate_serial.log 2>&1
  echo "serial gate run exit $?" | tee -a $R/gate_serial.log
fi
cp $R/gate_times.json "$OUT/"
(cd $R && tar -czf "$OUT/gate_fraction.tgz" card.txt ab.log gate_*.log gate_times.json run/run.json run/speed.json \
  $(cd $R && find run/gates run_serial/gates -name '*.json' 2>/dev/null))
echo "gate_fraction.sh done at $((SECONDS - t0)) s"; ls -la "$OUT"
