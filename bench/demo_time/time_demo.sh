#!/usr/bin/env bash
# Times `h3eval demo` as a new user runs it (the CLI, into a fresh folder) and records it in bench/demo_time/results/:
# date, CPU (lscpu's vendor and model name, cores), versions, the exact command, the load before and after, the wall
# and CPU seconds, the exit code, and the outcome per candidate read back from the run's verdict.json.
#
#   bench/demo_time/time_demo.sh [OUT] [NAME]      (default OUT /tmp/h3eval-demo-time, NAME <date>-<vendor>)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
OUT=${1:-/tmp/h3eval-demo-time}
VENDOR=$(lscpu | sed -n 's/^Vendor ID: *//p' | head -1)
MODEL=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
NAME=${2:-$(date -u +%Y-%m-%d)-${VENDOR}}
RESULTS=$ROOT/bench/demo_time/results
mkdir -p "$RESULTS"
rm -rf "$OUT"
CMD="$ROOT/.venv/bin/h3eval demo --out $OUT"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
TIMEFORMAT="%R %U %S"
set +e
{ time $CMD > "$RESULTS/$NAME.log" 2>&1; } 2> "$RESULTS/$NAME.time"
RC=$?
set -e
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
read -r WALL USER SYS < <(tail -n 1 "$RESULTS/$NAME.time")  # bash's `time` line comes last (after "Terminated")
rm -f "$RESULTS/$NAME.time"
OUTCOMES=$("$PY" - "$OUT/run/verdict.json" <<'PYEOF'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"no verdict: {exc}")
else:
    print(f"policy {v['policy_name']!r}: " + ", ".join(f"{c['candidate']} {c['outcome']}" for c in v["candidates"]))
PYEOF
)
VERSIONS=$("$PY" -c "import platform, torch, diffusers
print(f'python {platform.python_version()}, torch {torch.__version__}, diffusers {diffusers.__version__}')")
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
git -C "$ROOT" diff --quiet HEAD -- h3 h3eval gates 2>/dev/null || COMMIT="$COMMIT+uncommitted"
cat > "$RESULTS/$NAME.md" <<MDEOF
# $NAME

- date: $START
- CPU: $VENDOR, $MODEL, $(nproc) cores
- versions: $VERSIONS, h3eval at $COMMIT
- command: \`time $CMD\` (exit code $RC)
- load average (1, 5, 15 min) before / after: $LOAD_BEFORE / $LOAD_AFTER
- wall: **${WALL} s** (target <= 180 s), CPU user ${USER} s + system ${SYS} s
- verdict.json: $OUTCOMES
- the command's closing lines:

\`\`\`
$(grep -E '^(outcome|report|next|requests saved):|^  [a-z0-9-]+ -> |^    ladder top ' "$RESULTS/$NAME.log" || true)
\`\`\`
MDEOF
cat "$RESULTS/$NAME.md"
