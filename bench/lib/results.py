"""Benchmark records: JSON + Markdown in the running study's ``results/`` folder (``bench/<study>/results/``), with
date, machine, versions and the command."""

from __future__ import annotations

import json
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]

RESULTS: Path | None = None
"""Where :func:`write` puts records; None: the ``results/`` folder beside the running script, which is
``bench/<study>/results/`` for ``python bench/<study>/SCRIPT.py``."""


def results_dir() -> Path:
    """The folder :func:`write` puts records in (:data:`RESULTS`, else the running study's ``results/``)."""
    if RESULTS is not None:
        return RESULTS
    script = Path(sys.argv[0]).resolve()
    if script.parent.parent != BENCH or script.parent.name == "lib":
        raise RuntimeError(f"{sys.argv[0]} is not a study script (bench/<study>/SCRIPT.py): its records have no "
                           "results/ folder to go to")
    return script.parent / "results"


def context() -> dict[str, Any]:
    from h3 import provenance

    return {
        "date": provenance.utc_now(),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "machine": {"platform": platform.platform(), **provenance.hardware()},
        "versions": provenance.versions(),
        "git": provenance.git_state(Path(__file__).parent),
    }


def write(name: str, payload: dict[str, Any], table_md: str) -> tuple[Path, Path]:
    from h3.atomic import atomic_write_json, atomic_write_text

    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    data = {**context(), **payload}
    json_path, md_path = results / f"{name}.json", results / f"{name}.md"
    atomic_write_json(json_path, data)
    numerics = data["machine"].get("numerics") or {}
    cpu = ", ".join(str(numerics[k]) for k in ("cpu_model", "aten_cpu_capability") if numerics.get(k))
    header = (f"# {name}\n\n- date: {data['date']}\n- command: `{data['command']}`\n"
              f"- machine: {data['machine']['platform']}, {data['machine']['cpu_count']} cpus"
              + (f" ({cpu})" if cpu else "") + "\n"
              f"- versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()) + "\n\n")
    atomic_write_text(md_path, header + table_md.rstrip() + "\n")
    return json_path, md_path
