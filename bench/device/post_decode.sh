#!/usr/bin/env bash
# Issue 54: the request's path from the video decode to the file on ONE GPU (an H100 or an H200; the card is recorded):
# bench/post_decode/post_decode.py on `--model h3-random` (full size, seeded random weights), the text encoder streamed
# from host memory, one recipe, the same requests with the MP4 encode streamed into the decode (h3.post_decode) and
# not, alternating, after one warm-up request. Records come back under $OUT.
#
#   run(command="bash bench/device/post_decode.sh", carry=[".whl_prod"], timeout_s=560)
#   run(command="PD_SHAPE=15x768x1344 PD_PAIRS=1 bash bench/device/post_decode.sh", carry=[".whl_prod"], timeout_s=600)
#
# Settings: PD_RECIPE (turbo4-fp8), PD_SHAPE (5x544x960: SECONDSxHEIGHTxWIDTH), PD_PAIRS (3), PD_CALL_S (545: when the
# run must end, from this script's start), PD_MODEL (h3-random), PD_DEVICE (cuda), PD_UNPACK (1: unpack
# .whl_prod/site.tar.xz, built by bench/runtime_speed/pack_site.sh), PD_STEPS (the recipe's). The CPU rehearsal here:
# PD_UNPACK=0 PD_PY=.venv/bin/python PD_MODEL=h3-random-small PD_RECIPE=baseline PD_STEPS=2 PD_SHAPE=5x128x128
# PD_PAIRS=1 PD_DEVICE=cpu OUT=/tmp/pd_out bash bench/device/post_decode.sh
set -u
t0=$SECONDS
PY=${PD_PY:-python3}
shape=${PD_SHAPE:-5x544x960}
model=${PD_MODEL:-h3-random}
device=${PD_DEVICE:-cuda}
name="post_decode_${device%%:*}_${shape}_$(date -u +%Y%m%d-%H%M)"
mkdir -p /tmp/site "$OUT"
if [ "${PD_UNPACK:-1}" = 1 ]; then tar -xJf .whl_prod/site.tar.xz -C /tmp/site || { echo "no site.tar.xz"; exit 1; }; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export H3_CACHE_DIR=/tmp/h3cache TOKENIZERS_PARALLELISM=false
echo "site unpacked at $((SECONDS - t0)) s; $(nproc) cpus; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1)"
$PY -m h3.cli seeded-lora --model "$model" --out /tmp/lora 2>&1 | tail -1
export H3_LORA_DIR=/tmp/lora
left=$(( ${PD_CALL_S:-545} - (SECONDS - t0) - 10 ))
echo "post_decode starts at $((SECONDS - t0)) s with ${left} s left"
timeout -k 5 $left $PY bench/post_decode/post_decode.py --model "$model" --recipe "${PD_RECIPE:-turbo4-fp8}" \
  --shape "$shape" --pairs "${PD_PAIRS:-3}" --device "$device" --text-encoder offload --name "$name" \
  ${PD_STEPS:+--steps "$PD_STEPS"} 2>&1 \
  | grep -v "FutureWarning\|WeightNorm.apply\|Loading weights" | tee "$OUT/post_decode.log" | tail -30
echo "post_decode exit ${PIPESTATUS[0]} at $((SECONDS - t0)) s"
cp bench/post_decode/results/"$name".* "$OUT"/ 2>/dev/null
ls -la "$OUT"
