#!/usr/bin/env bash
# One H200 call prepared in session 8 (2026-12-02) for the next session, three measurements in one call:
#   1. issue 23: the 15 s 768x1344 turbo4-sparse request, in a box of its own (it needed more than the 200 s the
#      goals script estimated on 2026-12-02): bench/h200_goals.py --rows sparse768,request15.
#   2. issue 23: the dense 5 s 768x1344 forward with FlashAttention-3's FP8 attention (per-head scales,
#      h3.levers.fp8_attention) against Sage 2.2, both on the FP8 linears, compiled, 128-row buckets
#      (bench/h200_recipes_speed.py variants turbo4-fp8+fa3fp8+compile+bucket, turbo4-fp8-sage-compile);
#   3. issue 19: the per-pair gates of 5 s 768x1344 pairs in runs of 4 pairs (the next pair's clips decode while this
#      pair's gates run: h3eval.gaterun.decode_ahead), four gates and five, side by side (gates_speed --pairs 4);
#
#   WHEEL_DIRS=.whl_prod GOALS_BOX_S=330 FA3_BOX_S=150 bash bench/device/h200_session9.sh
#
# (GOALS_BOX_S=0 skips the first; CALL_S, default 585, is when the gates must end, counted from the script's start.
# Session 9 ran the second and third alone: GOALS_BOX_S=0 FA3_BOX_S=150 CALL_S=300.)
#
# from the repository root, carrying .whl_prod, .carry/sagewhl and .carry/fa3whl (the flash_attn_3 wheel session 8
# built, 1.7 MB), h3/assets/tiny out of the index. Returns results.tgz (the goals' raw JSON under g23/).
set -u
t0=$SECONDS
R=/tmp/res; rm -rf $R; mkdir -p $R/gates $R/g23 $R/fa3
wheels=""; for d in ${WHEEL_DIRS:-.whl_prod}; do wheels="$wheels $d/*.whl"; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
  .carry/sagewhl/*.whl .carry/fa3whl/*.whl >"$R/pip.log" 2>&1 || { echo pip failed; tail -5 "$R/pip.log"; }
echo "wheels installed at $((SECONDS - t0)) s"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
python3 -c 'import flash_attn_interface, sageattention; print("fa3 and sage import")' 2>&1 | tail -1
# 1. the 15 s request (the sparse row first: the request runs on its levers; about 300 s: at 15 s the dense first step
#    alone is ~45 s, the decode ~14 s and the mux of noise-like frames ~20 s, twice, plus the compile of the shape)
B=${GOALS_BOX_S:-330}
if [ "$B" -gt 0 ]; then
  echo "goals box $B s at $((SECONDS - t0)) s"
  (export GOALS_BOX_S=$((B - 5)) GOALS_ARGS="--rows sparse768,request15"
   timeout -k 10 $B bash bench/device/h200_goals.sh "$R/g23" >"$R/g23/driver.log" 2>&1; echo "goals rc $? at $((SECONDS - t0)) s")
  tail -c 1500 "$R/g23/h200_goals.log"
else
  echo "goals skipped (GOALS_BOX_S=0)"
fi
# 2. the dense forward with FA3 FP8 attention against Sage
timeout -k 10 ${FA3_BOX_S:-150} python3 bench/h200_recipes_speed.py --out $R/fa3/recipes_fa3fp8.json \
  --shapes 5s-768x1344 --repeats 2 --variants turbo4-fp8+fa3fp8+compile+bucket,turbo4-fp8-sage-compile \
  >"$R/fa3/recipes.log" 2>&1
echo "fa3fp8 rc $? at $((SECONDS - t0)) s"; grep -v "W1\|Warning" "$R/fa3/recipes.log" | tail -4
# 3. gates, runs of 4 pairs, with what the call has left
G=$((${CALL_S:-585} - (SECONDS - t0))); gend=$((SECONDS + G)); gleft() { local l=$((gend - SECONDS)); [ $l -lt 5 ] && l=5; echo $l; }
W=/tmp/gates-s9
for spec in "side4:integrity,fidelity,audio,ghosting:" "side5:integrity,fidelity,audio,ghosting,reference_free:--reuse-run"; do
  IFS=: read -r tag gates extra <<<"$spec"
  timeout -k 5 $(gleft) python3 bench/gates_speed.py --device cuda -o lpips_trunk=rand --gates "$gates" --repeat 2 \
    --pairs 4 --workdir $W $extra --tag "s9_${tag}_p4" --out "$R/gates" >"$R/gates/$tag.log" 2>&1
  echo "gates $tag rc $? at $((SECONDS - t0)) s"
done
grep -h "all gates on the pair\|at once" $R/gates/gates_speed_gpu_s9_*.md 2>/dev/null
tar -czf "$OUT/results.tgz" --exclude='*.mp4' -C $R .
ls -la "$OUT"
