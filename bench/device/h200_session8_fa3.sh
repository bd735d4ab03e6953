#!/usr/bin/env bash
# One H200 call of 2026-12-02 (session 8) for issue 23's FlashAttention-3 lever:
#   1. FA3 built on the device (bench/device/build_fa3.sh: hdim 128, bf16 + FP8, forward only); the wheel returns;
#   2. the attention kernels at H3's shape, one call each (bench/attention_kernels.py: SDPA cuDNN / flash, FA3 bf16,
#      FA3 FP8 plain and per-head scaled, Sage 2.2), time and error against float32;
#   3. if the box allows, the dense DiT forward at 5 s 768x1344 with FA3 against Sage, both on the FP8 linears, compiled
#      (bench/h200_recipes_speed.py variants turbo4-fp8+compile+fa3 and turbo4-fp8-sage-compile).
#
#   WHEEL_DIRS=.whl_prod BOX_S=480 bash bench/device/h200_session8_fa3.sh
#
# from the repository root, carrying .whl_prod, .carry/sagewhl and .carry/fa3 (fa3-src.tgz, 2.7 MB), h3/assets/tiny out
# of the index. Returns results.tgz and the flash_attn_3 wheel (split in 15 MiB parts when larger).
set -u
t0=$SECONDS; box=${BOX_S:-480}
R=/tmp/res; rm -rf $R; mkdir -p $R/fa3whl
wheels=""; for d in ${WHEEL_DIRS:-.whl_prod}; do wheels="$wheels $d/*.whl"; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
  .carry/sagewhl/*.whl >"$R/pip.log" 2>&1 || { echo pip failed; tail -5 "$R/pip.log"; }
echo "wheels installed at $((SECONDS - t0)) s"
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
timeout -k 5 ${BUILD_S:-300} bash bench/device/build_fa3.sh .carry/fa3/fa3-src.tgz $R/fa3whl >"$R/fa3_build.log" 2>&1
echo "fa3 build rc $? at $((SECONDS - t0)) s"; tail -6 "$R/fa3_build.log"
ls $R/fa3whl/flash_attn_3-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/site $R/fa3whl/*.whl >>"$R/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -c 'import flash_attn_interface, flash_attn_3; print("fa3 import ok")' 2>&1 | tail -1
left() { local l=$((box - (SECONDS - t0))); [ $l -lt 5 ] && l=5; echo $l; }
timeout -k 5 $(( $(left) < 120 ? $(left) : 120 )) python3 bench/attention_kernels.py --out $R >"$R/attention.log" 2>&1
echo "attention rc $? at $((SECONDS - t0)) s"; grep -v Warning "$R/attention.log" | tail -8
if [ $(left) -gt 150 ]; then
  timeout -k 10 $(( $(left) - 10 )) python3 bench/h200_recipes_speed.py --out $R/recipes_fa3.json --shapes 5s-768x1344 \
    --repeats 2 --variants turbo4-fp8+compile+fa3,turbo4-fp8-sage-compile >"$R/recipes.log" 2>&1
  echo "recipes rc $? at $((SECONDS - t0)) s"; grep -v "W1\|Warning" "$R/recipes.log" | tail -8
fi
for w in $R/fa3whl/*.whl; do
  [ -f "$w" ] || continue
  if [ "$(stat -c %s "$w")" -lt 16000000 ]; then cp "$w" "$OUT/"; else split -b 15m "$w" "$OUT/$(basename "$w").part-"; fi
done
tar -czf "$OUT/results.tgz" --exclude='*.whl' -C $R .
ls -la "$OUT"
