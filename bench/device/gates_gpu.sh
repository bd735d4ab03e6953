#!/usr/bin/env bash
# Issue 19 on one H200 (time box 100 s, it stops itself): the per-pair gates' speed on a 5 s 768x1344 pair
# (bench/gates_speed/gates_speed.py --device cuda: frames decoded once, uploaded once per clip), the ghosting gate alone
# (bench/ghosting/ghosting_speed.py --device cuda), then the gpu-marked ghosting tests if time is left (JUnit XML).
#   bash bench/device/gates_gpu.sh OUTDIR        (from the snapshot's root; GPU through CUDA_VISIBLE_DEVICES)
# Needs av (the coordinator's /tmp/site), opencv, scipy, torch on the image; lpips, pyloudnorm and threadpoolctl are
# installed from the snapshot's .whl19/ into /tmp/site19 only where the image lacks them.
set -u
out=$(mkdir -p "$1" && cd "$1" && pwd)
deadline=$((SECONDS + ${BUDGET_S:-95}))
left() { local l=$((deadline - SECONDS)); [ $l -lt 5 ] && l=5; echo $l; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
log="$out/run.log"
[ -f COMMIT ] && echo "[snapshot] commit $(cat COMMIT)" >>"$log"  # the snapshot has no .git: its maker writes COMMIT
for m in lpips pyloudnorm threadpoolctl; do
  if ! $PY -c "import $m" 2>/dev/null && ls .whl19/$m-*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site19 .whl19/$m-*.whl >>"$log" 2>&1
    export PYTHONPATH=/tmp/site19:$PYTHONPATH
  fi
done
$PY - >"$out/deps.json" 2>>"$log" <<'PY'
import importlib, json
out = {}
for m in ("torch", "av", "cv2", "scipy", "lpips", "pyloudnorm", "threadpoolctl", "pydantic", "pytest"):
    try:
        mod = importlib.import_module(m)
        out[m] = getattr(mod, "__version__", "present")
    except Exception as exc:  # recorded, not fatal: the step that needs it fails and says so
        out[m] = f"MISSING: {exc!r}"
import torch
out["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(json.dumps(out, indent=1))
PY
echo "[deps] $(tr -d '\n' <"$out/deps.json")" >>"$log"
# 1. all per-pair gates (repeat 2: the best warm run is the figure); result files gates_speed_gpu.{json,md}
timeout $(( $(left) > ${GATES_S:-60} ? ${GATES_S:-60} : $(left) )) $PY bench/gates_speed/gates_speed.py --device ${DEVICE:-cuda} -o lpips_trunk=rand --out "$out" \
  --repeat 2 ${GATES_ARGS:-} 2>&1 | tail -30 | sed 's/^/[gates] /' >>"$log"
# 2. the ghosting gate alone; ghosting_speed_cuda.{json,md}
timeout $(( $(left) > 25 ? 25 : $(left) )) $PY bench/ghosting/ghosting_speed.py --device ${DEVICE:-cuda} --out "$out" ${GHOST_ARGS:-} \
  2>&1 | tail -20 | sed 's/^/[ghost] /' >>"$log"
# 3. the gpu-marked ghosting tests, with what is left
if [ -d tests ] && [ $(left) -gt 10 ]; then
  timeout $(left) $PY -m pytest -m gpu -p no:cacheprovider -q -rs --junitxml="$out/gpu_tests.xml" \
    tests/test_gate_ghosting.py 2>&1 | tail -15 | sed 's/^/[pytest] /' >>"$log"
fi
echo "done at ${SECONDS}s" >>"$log"
tail -60 "$log"
