"""How long building the pinned VBench scoring environment takes (it decides whether CI can afford it).

    python bench/vbench_env_build/vbench_env_build.py [--dimensions temporal_flickering] [--out bench/vbench_env_build/results/vbench_env_build.json]

Builds a fresh environment in a temporary folder with pip's cache off (as on a new machine), times
``gates.vbench.env.setup_env``, measures its size, and appends one entry (date, machine, versions, command) to the
results file. The temporary environment is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3.atomic import atomic_write_json  # noqa: E402
from h3eval.store import utc_now  # noqa: E402
from gates.vbench.dimensions import requirement_groups, resolve_dimensions  # noqa: E402
from gates.vbench.env import LOCK_FILES, read_lock, setup_env  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dimensions", default="temporal_flickering")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "vbench_env_build.json"))
    args = parser.parse_args()
    dims = resolve_dimensions([args.dimensions])
    os.environ["PIP_NO_CACHE_DIR"] = "1"
    with tempfile.TemporaryDirectory(prefix="vbench-env-bench-") as tmp:
        env = Path(tmp) / "env"
        start = time.monotonic()
        setup_env(env, dims)
        seconds = time.monotonic() - start
        size = int(subprocess.run(["du", "-sb", str(env)], capture_output=True, text=True).stdout.split()[0])
        shutil.rmtree(env)
    groups = requirement_groups(dims)
    entry = {
        "date": utc_now(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "dimensions": dims,
        "groups": groups,
        "distributions": sum(len(read_lock(LOCK_FILES[g])) for g in groups),
        "build_seconds": round(seconds, 1),
        "env_bytes": size,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "note": "wheels of torch and the CUDA libraries come from the machine's local mirror; the rest from PyPI; "
                "other jobs may have shared the 2 CPUs",
    }
    out = Path(args.out)
    entries = json.loads(out.read_text()) if out.exists() else []
    entries.append(entry)
    atomic_write_json(out, entries)
    print(json.dumps(entry, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
