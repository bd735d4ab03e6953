#!/usr/bin/env bash
# Times `h3eval demo` from a git worktree of a given commit (before/after comparisons on a shared, loaded machine: run
# two of these side by side, in the same conditions) with /usr/bin/time -v: wall, user and system CPU seconds of the
# process tree, peak RSS; the load average before and after; the outcome per candidate read back from verdict.json.
#
#   bench/demo_time/time_demo_at.sh WORKTREE OUT LOG        (the thread count as the environment sets it)
#
# The demo runs as `python -m h3eval.cli demo --out OUT` with PYTHONPATH=WORKTREE (h3eval, h3 and gates resolve inside
# the worktree; the virtualenv is this checkout's). Writes LOG (the demo's output) and LOG.time (time -v's report).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
WT=$(cd "$1" && pwd); OUT=$2; LOG=$3
rm -rf "$OUT"
cd "$WT"
echo "commit $(git -C "$WT" rev-parse --short HEAD); OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}; load before $(cut -d' ' -f1-3 /proc/loadavg); start $(date -u +%H:%M:%SZ)" > "$LOG.time"
set +e
PYTHONPATH="$WT" /usr/bin/time -v -a -o "$LOG.time" "$PY" -m h3eval.cli demo --out "$OUT" > "$LOG" 2>&1
RC=$?
set -e
echo "exit $RC; load after $(cut -d' ' -f1-3 /proc/loadavg); end $(date -u +%H:%M:%SZ)" >> "$LOG.time"
"$PY" - "$OUT/run/verdict.json" >> "$LOG.time" <<'PYEOF'
import json, sys
v = json.load(open(sys.argv[1]))
print("verdict: " + ", ".join(f"{c['candidate']} {c['outcome']}" for c in v["candidates"]))
PYEOF
