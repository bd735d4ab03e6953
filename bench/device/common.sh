# Sourced by the device drivers: install the carried wheels (.whl/) where the machine lacks them, set the
# environment, and give each step what is left of the call's budget (BUDGET_S seconds from now) as its timeout.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 H3_CACHE_DIR=/tmp/h3cache
deadline=$((SECONDS + ${BUDGET_S:-540}))
left() { local l=$((deadline - SECONDS)); [ $l -lt 5 ] && l=5; echo $l; }
