#!/usr/bin/env bash
# The one runner for device calls (issue 52): run a study's command and write call.json beside its results.
#
#   bash bench/device/call.sh STUDY COMMAND [ARGS...]
#
# From the repository root. STUDY is a folder bench/STUDY/. The results folder is $CALL_OUT, else $OUT/STUDY (the
# lending tool's return folder), else bench/STUDY/results/call-<UTC stamp>; the word {out} in COMMAND or ARGS stands
# for it, and $CALL_OUT is set to it for the command. Any existing device script runs under it unchanged, e.g.
#
#   bash bench/device/call.sh gates_speed bash bench/device/gates_gpu.sh {out}
#   COMMIT=$(git rev-parse --short HEAD) DIRTY=$(git status --porcelain | grep -q . && echo true || echo false) \
#     bash bench/device/call.sh full_size_speed bash bench/device/h200_goals.sh {out}     # a tree without .git
#
# {out}/call.json: study, date (UTC, at the start), finished (UTC), wall_s, card (nvidia-smi's names, else the CPU
# model), command (as run, shell-quoted), commit and dirty (from git when the tree has it, else $COMMIT and $DIRTY,
# else null), exit (the command's status, which is also call.sh's). A bad STUDY or no COMMAND: one error, exit 2.
set -u
if [ $# -lt 2 ]; then
  echo "usage: bash bench/device/call.sh STUDY COMMAND [ARGS...]" >&2
  exit 2
fi
study=${1%/}
shift
if [ ! -d "bench/$study" ] || [ "$study" = lib ] || [ "$study" = device ] || [[ "$study" == */* ]]; then
  echo "call.sh: no study bench/$study/ (run from the repository root; STUDY is a folder of bench/)" >&2
  exit 2
fi
PY=${PYTHON:-python3}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [ -n "${CALL_OUT:-}" ]; then
  out=$CALL_OUT
elif [ -n "${OUT:-}" ]; then
  out=$OUT/$study
else
  out=bench/$study/results/call-$(date -u +%Y%m%dT%H%M%SZ)
fi
mkdir -p "$out" || { echo "call.sh: cannot make $out" >&2; exit 2; }
export CALL_OUT=$out
args=()
for a in "$@"; do args+=("${a//\{out\}/$out}"); done

if git rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git rev-parse --short HEAD)
  if git status --porcelain | grep -q .; then dirty=true; else dirty=false; fi
else
  commit=${COMMIT:-}
  dirty=${DIRTY:-}
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ *\([0-9]*\) /\1x /' | paste -sd, -)
else
  card=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  card="${card:-unknown CPU}, $(nproc) cpus"
fi

t0=$SECONDS
"${args[@]}"
status=$?
finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)

STUDY=$study STARTED=$started FINISHED=$finished WALL=$((SECONDS - t0)) CARD=$card C_COMMIT=$commit C_DIRTY=$dirty \
  STATUS=$status OUTDIR=$out "$PY" - "${args[@]}" <<'EOF' || { echo "call.sh: could not write call.json" >&2; exit 2; }
import json, os, shlex, sys
e = os.environ
dirty = {"true": True, "false": False}.get(e["C_DIRTY"].strip().lower())
record = {"study": f"bench/{e['STUDY']}", "date": e["STARTED"], "finished": e["FINISHED"], "wall_s": int(e["WALL"]),
          "card": e["CARD"], "command": shlex.join(sys.argv[1:]), "commit": e["C_COMMIT"] or None, "dirty": dirty,
          "exit": int(e["STATUS"])}
path = os.path.join(e["OUTDIR"], "call.json")
with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
os.replace(path + ".tmp", path)
print(f"call.sh: {path} (exit {record['exit']}, {record['wall_s']} s, {record['card']})", file=sys.stderr)
EOF
exit $status
