#!/usr/bin/env bash
# Issue 54: whole requests, warm, through the product, on ONE GPU (an H100 or an H200; the card is recorded):
# `h3 generate --prompts-file` on `--model h3-random` (full size, seeded random weights), the text encoder streamed
# from host memory (built there: the 62 GiB never pass through the card), the recipes of RS_RECIPES taking turns on
# one model in this one process (stock first, the last recipe applied for good so that FP8 fits an 80 GB card), every
# prompt of bench/runtime_speed/prompts.jsonl under each: a recipe's first request apart, the rest warm.
#
#   bash bench/device/runtime_speed.sh            (from the repository root, on the device; results under $OUT)
#
# Settings: RS_RECIPES (default "bench/runtime_speed/recipes/stock4.toml turbo4-fp8"), RS_SHAPE ("5 544 960":
# seconds height width), RS_CALL_S (545: when the run must end, from this script's start), RS_DEVICE (cuda),
# RS_PROMPTS (bench/runtime_speed/prompts.jsonl: 9 prompts, 8 warm requests a recipe; prompts_repeat.jsonl adds the
# first prompt again last, whose clip must be the first request's to the bit), RS_TE (offload: the text encoder's
# residency, `h3 generate --text-encoder`; fit keeps the layers that fit beside each request's peak); the CPU
# rehearsal here: RS_UNPACK=0 RS_PY=.venv/bin/python RS_MODEL=h3-random-small RS_SHAPE="5 128 128" RS_DEVICE=cpu
# OUT=/tmp/rs_out bash bench/device/runtime_speed.sh
# Needs .whl_prod/site.tar.xz (diffusers 0.42.1, pydantic 2.14.4 with its three, PyAV 18.1.0 trimmed: libx265 and
# libSvtAv1Enc replaced by stubs, every .so stripped; built as bench/runtime_speed/README.md says) carried with the
# call. Writes $OUT/runtime_speed.tgz (requests.json, every clip's record, the log, versions, card), and
# $OUT/requests.json and $OUT/call_env.json on their own (they come back even when the tarball is cut).
# Then, here: python bench/runtime_speed/record.py --from <files_at> --name <label> --command "<the run's command>".
set -u
t0=$SECONDS
call_s=${RS_CALL_S:-545}
PY=${RS_PY:-python3}
R=/tmp/rs; rm -rf $R; mkdir -p $R/run /tmp/site
source "$(dirname "$0")/site.sh"
if [ "${RS_UNPACK:-1}" = 1 ]; then unpack_site "$PY" || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export H3_CACHE_DIR=/tmp/h3cache TOKENIZERS_PARALLELISM=false
echo "site unpacked at $((SECONDS - t0)) s"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >$R/card.txt 2>&1
$PY - >$R/call_env.json <<'EOF'
import json, platform, torch, diffusers, transformers, av, pydantic
print(json.dumps({"card": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30
                  if torch.cuda.is_available() else None,
                  "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "diffusers": diffusers.__version__, "transformers": transformers.__version__,
                  "av": av.__version__, "pydantic": pydantic.__version__}))
EOF
cat $R/call_env.json; cp $R/call_env.json "$OUT/"
$PY -m h3.cli seeded-lora --model ${RS_MODEL:-h3-random} --out /tmp/lora 2>&1 | tail -1
export H3_LORA_DIR=/tmp/lora
read -r secs height width <<<"${RS_SHAPE:-5 544 960}"
args=()
for r in ${RS_RECIPES:-bench/runtime_speed/recipes/stock4.toml turbo4-fp8}; do args+=(--recipe "$r"); done
left=$((call_s - (SECONDS - t0) - 12))
echo "generate starts at $((SECONDS - t0)) s with ${left} s left: ${args[*]}"
prompts=${RS_PROMPTS:-bench/runtime_speed/prompts.jsonl}
timeout -k 5 $left $PY -m h3.cli generate --prompts-file "$prompts" --out $R/run \
  --model ${RS_MODEL:-h3-random} "${args[@]}" --text-encoder "${RS_TE:-offload}" --seconds "$secs" --height "$height" --width "$width" \
  --device "${RS_DEVICE:-cuda}" 2>&1 | grep -v "FutureWarning\|WeightNorm.apply" >$R/generate.log
echo "generate exit ${PIPESTATUS[0]} at $((SECONDS - t0)) s" | tee -a $R/generate.log
tail -25 $R/generate.log
nvidia-smi --query-gpu=memory.used --format=csv,noheader >>$R/card.txt 2>&1
cp $R/run/requests.json "$OUT/" 2>/dev/null
(cd $R && tar -czf "$OUT/runtime_speed.tgz" card.txt call_env.json generate.log run/*.json)
ls -la "$OUT"
