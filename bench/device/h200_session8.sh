#!/usr/bin/env bash
# One H200 call of 2026-12-02 (session 8), two measurements in one call:
#   1. issue 19: the per-pair gates of one 5 s 768x1344 pair on the GPU host (16 cores), side by side (the default on
#      a host of 8+ cores) and one after another ($H3EVAL_GATE_THREADS=1), the four same-seed gates and with
#      reference_free (bench/gates_speed.py; results gates_speed_gpu_s8_*.{json,md});
#   2. issue 23: the goals as whole requests (bench/device/h200_goals.sh; h200_goals_raw.json), with the VAE's
#      float32 rule fixed (the 544x960 request and the 15 s decode rows failed on 2026-12-01).
#
#   WHEEL_DIRS=.whl_prod GATES_BOX_S=110 GOALS_BOX_S=400 bash bench/device/h200_session8.sh
# GATES_PAIRS=N: runs of N pairs (the figure per pair is the wall / N; the next pair decodes while this one is gated).
#
# from the repository root, carrying .whl_prod (diffusers 0.42.1, pydantic, PyAV 18.1.0, lpips, pyloudnorm) and
# .carry/sagewhl (the SageAttention 2.2 wheel an earlier call built), with h3/assets/tiny out of the index (the call
# does not read it; the tree plus those is under the 64 MiB a call carries). Returns results.tgz.
set -u
t0=$SECONDS
R=/tmp/res; rm -rf $R; mkdir -p $R/gates $R/g23
wheels=""; for d in ${WHEEL_DIRS:-.whl_prod}; do wheels="$wheels $d/*.whl"; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
  >"$R/pip.log" 2>&1 || { echo pip failed; tail -5 "$R/pip.log"; }
ls .carry/sagewhl/sageattention-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/site .carry/sagewhl/*.whl >>"$R/pip.log" 2>&1
echo "wheels installed at $((SECONDS - t0)) s"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
nvidia-smi -L
# 1. gates (a fresh synthetic pair, then the same pair reused): side by side four gates, side by side five, five one
#    after another. --repeat 3: the first run loads the models and warms every gate (its first pair runs one after
#    another), the best of the next three is the figure.
G=${GATES_BOX_S:-110}; gend=$((SECONDS + G)); gleft() { local l=$((gend - SECONDS)); [ $l -lt 5 ] && l=5; echo $l; }
W=/tmp/gates-s8
for spec in "side4:integrity,fidelity,audio,ghosting:" "side5:integrity,fidelity,audio,ghosting,reference_free:--reuse-run" \
            "serial5:integrity,fidelity,audio,ghosting,reference_free:--reuse-run" \
            "serial4:integrity,fidelity,audio,ghosting:--reuse-run"; do
  IFS=: read -r tag gates extra <<<"$spec"
  threads=""; [[ $tag == serial* ]] && threads=1
  # (the call of 2026-12-02 ran `export ${threads:+...}`, which with nothing to export printed the environment)
  (if [ -n "$threads" ]; then export H3EVAL_GATE_THREADS=$threads; fi; timeout -k 5 $(gleft) python3 bench/gates_speed.py --device cuda \
    -o lpips_trunk=rand --gates "$gates" --repeat 3 --workdir $W $extra --tag "s8_$tag${GATES_PAIRS:+_p$GATES_PAIRS}" \
    --pairs ${GATES_PAIRS:-1} --out "$R/gates" \
    >"$R/gates/$tag.log" 2>&1; echo "gates $tag rc $? at $((SECONDS - t0)) s")
done
grep -h "all gates on the pair\|alone, clips\|decode both" $R/gates/gates_speed_gpu_s8_*.md 2>/dev/null | head -30
# 2. issue 23's goals
B=${GOALS_BOX_S:-400}; left=$((590 - (SECONDS - t0))); [ $B -gt $left ] && B=$left
echo "goals box $B s at $((SECONDS - t0)) s"
(export GOALS_BOX_S=$((B - 5)); timeout -k 10 $B bash bench/device/h200_goals.sh "$R/g23" >"$R/g23/driver.log" 2>&1
 echo "goals rc $? at $((SECONDS - t0)) s")
tail -c 2500 "$R/g23/h200_goals.log"
tar -czf "$OUT/results.tgz" --exclude='*.mp4' -C $R .
ls -la "$OUT"
