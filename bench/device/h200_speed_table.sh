#!/usr/bin/env bash
# The speed table of the speed issue on a 2-GPU H200 machine, one command (about 9 minutes):
#
#   bash bench/device/h200_speed_table.sh OUTDIR
#
# GPU 0: every recipe variant at 5 s 768x1344; GPU 1: at 5 s 544x960, then a subset at 15 s 768x1344 (one repeat).
# Meanwhile the CPU builds SageAttention 2 for sm_90 (bench/device/build_sageattention.sh, source in .sage-src/) and
# GPU 0 then times the Sage recipes at both 5 s shapes. Each GPU runs its own process with its own full-size model, so
# every ratio in a file is measured side by side in one process. Wheels the machine lacks travel in .whl/.
set -u
out=$1
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 H3_CACHE_DIR=/tmp/h3cache
deadline=$((SECONDS + ${BUDGET_S:-560}))
left() { echo $((deadline - SECONDS)); }

rm -f /tmp/sage.done
( if timeout $(left) bash bench/device/build_sageattention.sh .sage-src /tmp/sagewhl >"$out/sage_build.log" 2>&1 \
     && python3 -m pip install -q --no-index --no-deps --target /tmp/sagesite /tmp/sagewhl/*.whl >>"$out/sage_build.log" 2>&1; then
    cp /tmp/sagewhl/*.whl "$out/"; echo ok >/tmp/sage.done
  else echo failed >/tmp/sage.done; fi ) &

MAIN=stock,turbo4+compile,turbo4-int8+compile,turbo4-fp8,turbo4-fp8+compile,turbo4-fp8+cudnn+compile,turbo4-sparse+compile,turbo4-sparse+sparse85+fp8+compile
(
  CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 bench/h200_recipes_speed.py --out "$out/recipes_768.json" \
    --shapes 5s-768x1344 --variants $MAIN 2>&1 | sed 's/^/[gpu0] /'
  while [ ! -f /tmp/sage.done ] && [ "$(left)" -gt 60 ]; do sleep 5; done
  if [ "$(cat /tmp/sage.done 2>/dev/null)" = ok ]; then
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/sagesite:$PYTHONPATH timeout $(left) python3 bench/h200_recipes_speed.py \
      --out "$out/recipes_sage.json" --shapes 5s-768x1344,5s-544x960 \
      --variants turbo4-fp8+compile,turbo4-fp8-sage+compile,turbo4-fp8-sage 2>&1 | sed 's/^/[gpu0-sage] /'
  else echo "[gpu0] sageattention not built in time or failed: see sage_build.log"; fi
) >>"$out/run.log" &
(
  CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 bench/h200_recipes_speed.py --out "$out/recipes_544_15s.json" \
    --shapes 5s-544x960,15s-768x1344 --variants $MAIN,turbo4-int8,turbo4-sparse \
    --shape-variants 15s-768x1344=stock,turbo4-fp8+compile,turbo4-sparse+sparse85+fp8+compile \
    --shape-repeats 15s-768x1344=1 2>&1 | sed 's/^/[gpu1] /'
) >>"$out/run.log" &
wait
tail -5 "$out/sage_build.log" >>"$out/run.log" 2>/dev/null
echo "done at ${SECONDS}s" >>"$out/run.log"
cat "$out/run.log"
