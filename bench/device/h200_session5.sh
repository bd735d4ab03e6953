#!/usr/bin/env bash
# What the 2026-12-01 session ran on one H200 (calls 2, 4 and 5 of its closing note), kept as the record of the commands.
# Run from a tree that carries snapshots of the branches (`git archive HEAD h3 gates h3eval bench/*.py bench/device prompts
# pyproject.toml` into .carry/prod, .carry/g23) and the py3.12 wheels (.whl: diffusers 0.42.1, transformers 5.24.0, pydantic;
# .whl_av: PyAV 18.1.0). Call 5: `BOX_P=442 BOX_T=0 BOX_G23=0 bash bench/device/h200_session5.sh`.
# Lesson: the lending tool returns at most 8 files per call (16 MiB each); the drivers write more, so everything is
# packed into results.tgz here. The first call of the session lost its results to that limit.
set -u
t0=$SECONDS
rm -rf /tmp/h200_ab_work /tmp/res; R=/tmp/res; mkdir -p $R/prod $R/g23
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl_av/*.whl >"$R/pip.log" 2>&1 || { echo pip failed; tail -5 "$R/pip.log"; }
# The gates' own packages, which the image lacks (fidelity, audio and reference_free errored without them on the
# 2026-12-01 calls): carry .whl_gates = lpips 0.1.4, pyloudnorm 0.2.0, scikit-video 1.1.11, threadpoolctl 3.6.0
# (py3 wheels, 2.3 MB; `pip download --no-deps --only-binary=:all: --python-version 3.12 ...` with pyproject's pins).
if ls .whl_gates/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_gates/*.whl \
    >>"$R/pip.log" 2>&1 || { echo pip gates failed; tail -5 "$R/pip.log"; }
fi
export PYTHONPATH=/tmp/site
nvidia-smi -L; python3 -c 'import torch, diffusers, transformers, av; print(torch.__version__, diffusers.__version__, transformers.__version__, av.__version__)'
echo "install done at $((SECONDS - t0)) s"
P=${BOX_P:-230}; G23=${BOX_G23:-0}
(cd .carry/prod && export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES=0 BUDGET_S=$((P - 12)) && timeout -k 10 $P bash bench/device/h200_ab.sh "$R/prod" >"$R/prod/driver.log" 2>&1; echo "prod rc $? at $((SECONDS - t0)) s")
[ "${BOX_T:-60}" -gt 0 ] && (cd .carry/prod && export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES=0 && timeout -k 5 ${BOX_T:-60} python3 -m pytest -p no:cacheprovider -q -rs -m gpu tests/test_random_model.py -k streamed > "$R/prod/gpu_test.log" 2>&1; echo "gpu test rc $? at $((SECONDS - t0)) s"; tail -3 "$R/prod/gpu_test.log")
if [ "$G23" -gt 30 ] && [ -d .carry/g23 ]; then
  (cd .carry/g23 && export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES=0 GOALS_BOX_S=$((G23 - 5)) && timeout -k 10 $G23 bash bench/device/h200_goals.sh "$R/g23" >"$R/g23/driver.log" 2>&1; echo "g23 rc $? at $((SECONDS - t0)) s")
fi
[ -f "$R/prod/clips.tgz" ] && mv "$R/prod/clips.tgz" "$OUT/clips.tgz"
tar -czf "$OUT/results.tgz" --exclude='*.mp4' -C $R .
[ -d /tmp/h200_ab_work ] && tar -czf "$OUT/prod_work.tgz" --exclude='*.mp4' --exclude='*.safetensors' --exclude='*.pt' -C /tmp h200_ab_work
for d in prod g23; do echo "== $d"; tail -8 "$R/$d/driver.log" 2>/dev/null; done
ls -la "$OUT"
