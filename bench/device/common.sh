# Sourced by the device drivers (after they set $out): make $out, install the carried wheels (.whl/) where the
# machine lacks them, set the environment, and give each step what is left of the call's budget (BUDGET_S seconds from now) as its timeout.
[ -n "${out:-}" ] && mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then  # the lending machine: wheels carried in .whl/
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
  export PYTHONPATH=/tmp/site:.
else  # a machine with the project's dependencies installed
  export PYTHONPATH=.
fi
export PYTHONUNBUFFERED=1 H3_CACHE_DIR=${H3_CACHE_DIR:-/tmp/h3cache}
deadline=$((SECONDS + ${BUDGET_S:-540}))
left() { local l=$((deadline - SECONDS)); [ $l -lt 5 ] && l=5; echo $l; }
# The commands the drivers run: the recipe speed bench, and the gpu-marked tests (JUnit XML into $out).
R="python3 bench/full_size_speed/h200_recipes_speed.py"
T="python3 -m pytest -m gpu -p no:cacheprovider -q -rs --junitxml=${out:-.}/gpu_tests.xml tests/test_levers.py tests/test_opcheck.py tests/test_gate_fidelity.py"
