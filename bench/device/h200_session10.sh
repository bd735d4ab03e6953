#!/usr/bin/env bash
# One H200 call prepared in session 9 (2026-12-02) for the next session, two measurements of issue 23:
#   1. the 15 s 768x1344 turbo4-sparse request, in a box of its own (never measured: it needs ~300 s with its compile;
#      session 8's box cut it): bench/h200_goals.py --rows sparse768,request15;
#   2. the dense 5 s 768x1344 forward, FA3 FP8 attention against Sage 2.2 (both on the FP8 linears, compiled, 128-row
#      buckets), each profiled once by kernel family (--profile, bench/kernel_profile.py): where the 4.29 s (FA3 FP8,
#      session 9) and 4.25 s (Sage, session 8) go against the 3.3 s goal, and why FA3 FP8's faster kernel did not pay.
#
#   WHEEL_DIRS=.whl_prod GOALS_BOX_S=330 PROFILE_BOX_S=230 bash bench/device/h200_session10.sh
#
# from the repository root, carrying .whl_prod, .carry/sagewhl and .carry/fa3whl, h3/assets/tiny out of the index.
# GOALS_BOX_S=0 skips the first. Returns results.tgz (the goals' raw JSON under g23/, the profiles under prof/).
set -u
t0=$SECONDS
R=/tmp/res; rm -rf $R; mkdir -p $R/g23 $R/prof
wheels=""; for d in ${WHEEL_DIRS:-.whl_prod}; do wheels="$wheels $d/*.whl"; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
  .carry/sagewhl/*.whl .carry/fa3whl/*.whl >"$R/pip.log" 2>&1 || { echo pip failed; tail -5 "$R/pip.log"; }
echo "wheels installed at $((SECONDS - t0)) s"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
python3 -c 'import flash_attn_interface, sageattention; print("fa3 and sage import")' 2>&1 | tail -1
# 2 first: it is shorter and its result is the one the next lever work needs
timeout -k 10 ${PROFILE_BOX_S:-230} python3 bench/h200_recipes_speed.py --out $R/prof/recipes_profiled.json \
  --shapes 5s-768x1344 --repeats 2 --profile \
  --variants turbo4-fp8-sage-compile,turbo4-fp8+fa3fp8+compile+bucket >"$R/prof/recipes.log" 2>&1
echo "profiled forwards rc $? at $((SECONDS - t0)) s"; grep -v "W1\|Warning" "$R/prof/recipes.log" | tail -3
B=${GOALS_BOX_S:-330}
if [ "$B" -gt 0 ]; then
  echo "goals box $B s at $((SECONDS - t0)) s"
  (export GOALS_BOX_S=$((B - 5)) GOALS_ARGS="--rows sparse768,request15"
   timeout -k 10 $B bash bench/device/h200_goals.sh "$R/g23" >"$R/g23/driver.log" 2>&1; echo "goals rc $? at $((SECONDS - t0)) s")
  tail -c 1500 "$R/g23/h200_goals.log"
fi
tar -czf "$OUT/results.tgz" --exclude='*.mp4' -C $R .
ls -la "$OUT"
