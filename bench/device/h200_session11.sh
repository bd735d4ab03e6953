#!/usr/bin/env bash
# One H200 call prepared in session 10 (2026-12-02) for the next session, three measurements, each side by side:
#   1. issue 23, kernel level: FA3 FP8 with q, k and v quantized in eager ops against one compiled graph (c04d643), Sage
#      2.2 and cuDNN at H3's shape (bench/attention_kernels.py);
#   2. issue 23, the dense 5 s 768x1344 forward: FA3 FP8 with compiled quantization, the same with eager quantization
#      (session 9-10's path: 4.20-4.29 s) and Sage 2.2, all on the FP8 linears, compiled, 128-row buckets
#      (h200_kernel_profile_s10.md: the eager quantization cost ~470 ms of a 4.2 s forward);
#   3. issue 19: decoding a 5 s 768x1344 clip with the RGB conversion in one thread against a pool beside the decoder
#      (1ac9166, h3.media.decode_video(convert_threads=)), then the per-pair gates in runs of 4 pairs (gates_speed
#      --pairs 4, four gates; session 9: 1.2 s a pair, decode alone 0.9-1.0 s).
#
#   WHEEL_DIRS=.whl_prod bash bench/device/h200_session11.sh
#
# from the repository root, carrying .whl_prod, .carry/sagewhl and .carry/fa3whl, h3/assets/tiny out of the index
# (about 480 s in all; CALL_S, default 560, is when the gates must end). The 15 s request (h200_goals.py --rows
# sparse768,request15) still needs a call of its own: `WHEEL_DIRS=.whl_prod GOALS_BOX_S=330 PROFILE_BOX_S=0 bash
# bench/device/h200_session10.sh`. Returns results.tgz.
set -u
t0=$SECONDS
R=/tmp/res; rm -rf $R; mkdir -p $R/ak $R/fwd $R/gates
wheels=""; for d in ${WHEEL_DIRS:-.whl_prod}; do wheels="$wheels $d/*.whl"; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
  .carry/sagewhl/*.whl .carry/fa3whl/*.whl >"$R/pip.log" 2>&1 || { echo pip failed; tail -5 "$R/pip.log"; }
echo "wheels installed at $((SECONDS - t0)) s"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
# 1. kernels
timeout -k 5 90 python3 bench/attention_kernels.py --out $R/ak >"$R/ak/ak.log" 2>&1
echo "attention kernels rc $? at $((SECONDS - t0)) s"; grep "^fa3_fp8_per_head\|^sage" "$R/ak/ak.log" | cut -c1-160
# 2. forwards
timeout -k 10 ${FWD_BOX_S:-230} python3 bench/h200_recipes_speed.py --out $R/fwd/recipes_fa3quant.json \
  --shapes 5s-768x1344 --repeats 2 --variants \
  turbo4-fp8+fa3fp8+compile+bucket,turbo4-fp8+fa3fp8eager+compile+bucket,turbo4-fp8-sage-compile >"$R/fwd/recipes.log" 2>&1
echo "forwards rc $? at $((SECONDS - t0)) s"; grep -v "W1\|Warning" "$R/fwd/recipes.log" | grep forward_s | cut -c1-200
# 3. gates: a pair's clips first (gates_speed makes them), then the decode side by side on them
G=$((${CALL_S:-560} - (SECONDS - t0))); [ $G -lt 30 ] && G=30
W=/tmp/gates-s11
timeout -k 5 $G python3 bench/gates_speed.py --device cuda -o lpips_trunk=rand --gates integrity,fidelity,audio,ghosting \
  --repeat 2 --pairs 4 --workdir $W --tag s11_side4_p4 --out "$R/gates" >"$R/gates/side4.log" 2>&1
echo "gates rc $? at $((SECONDS - t0)) s"
grep -h "all gates on the pair\|at once" $R/gates/gates_speed_gpu_s11_*.md 2>/dev/null
timeout -k 5 60 python3 - "$W" >"$R/gates/decode.json" 2>"$R/gates/decode.log" <<'PY'
import json, statistics, sys, time
from pathlib import Path
from h3.media import decode_video
clips = sorted(Path(sys.argv[1]).rglob("*.mp4"))[:2]
out = {"clips": [str(c) for c in clips], "seconds": {}}
for convert in (1, 2, 4, 8, 1, 2, 4, 8):
    for clip in clips:
        t = time.perf_counter(); decode_video(clip, threads=0, convert_threads=convert)
        out["seconds"].setdefault(str(convert), []).append(time.perf_counter() - t)
out["median_s"] = {k: statistics.median(v) for k, v in out["seconds"].items()}
print(json.dumps(out, indent=1))
PY
echo "decode rc $? at $((SECONDS - t0)) s"; grep -A5 median_s "$R/gates/decode.json"
tar -czf "$OUT/results.tgz" --exclude='*.mp4' -C $R .
ls -la "$OUT"
