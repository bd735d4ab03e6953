#!/usr/bin/env bash
# Issue 54's mux goal on the card's host: bench/mux_speed/mux_speed.py (libx264 presets and thread counts, and
# h264_nvenc where PyAV's build opens it) at 15 s 768x1344 and 5 s 544x960; the JSON comes back under $OUT.
#   run(command="bash bench/device/mux_speed.sh", carry=[".whl_prod"], timeout_s=260)
set -u
t0=$SECONDS
mkdir -p /tmp/site && tar -xJf .whl_prod/site.tar.xz -C /tmp/site || { echo "no .whl_prod/site.tar.xz"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
echo "site unpacked at $((SECONDS - t0)) s; $(nproc) cpus; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
python3 bench/mux_speed/mux_speed.py --deadline-s "${MS_DEADLINE_S:-170}" --out "$OUT/mux_speed.json" 2>&1 | tail -30
echo "done at $((SECONDS - t0)) s"
