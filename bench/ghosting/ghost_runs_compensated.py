"""Seed 001's stale ghost (alpha 0.05) per 16-pair run, as bench/artifact_detectors/ghost_runs.py measures it, with
the ghosting gate's displacement compensation on (gates.metrics.ghost_motion, issue 50): that study calls the
estimator (gates.metrics.ghost.ghost_scores) directly, so it reads the raw pair; here each pair's baseline is first
compensated as gates/ghosting.py does. Same sources, plants, fit / publish split and report; rows and report go to
``--out`` (default bench/ghosting/results/ghost_runs_compensated*), the study's own records are left as they are.

    PYTHONPATH=. python bench/ghosting/ghost_runs_compensated.py [--family footage] [--workers 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "artifact_detectors"))

import ghost_runs  # noqa: E402

from gates.metrics.ghost import downsample_factor, ghost_scores  # noqa: E402
from gates.metrics.ghost_motion import compensate  # noqa: E402

OUT = ROOT / "bench" / "ghosting" / "results"


def compensated_ghost_scores(base, cand, config, **kwargs):
    """gates/ghosting.py's order: the baseline moved onto the candidate's displaced content, then the fit."""
    factor = downsample_factor(base.shape[1], base.shape[2], config.work_long_side)
    return ghost_scores(compensate(base, cand, factor).frames, cand, config, **kwargs)


def shipped_threshold_table() -> str:
    """The publish pairs' 16-pair run FAIL rate at the shipped threshold (gates.metrics.ghost_run.THRESHOLD, which
    release.toml's near judge applies), compensated and, from the study's own rows, uncompensated: the report above
    refits the threshold on this script's fit pairs instead."""
    import json

    import numpy as np

    from gates.metrics import ghost_run

    lines = ["", f"## Publish, at the shipped threshold {ghost_run.THRESHOLD} (release.toml's near judge)", "",
             "| camera | kind | sources | FAILed, compensated | FAILed, uncompensated (the study's rows) | "
             "median pair stale evidence, compensated / uncompensated |", "|---|---|---:|---:|---:|---:|"]
    for family in ("footage", "tiny"):
        mine = OUT / f"ghost_runs_compensated_rows_{family}.json"
        theirs = ghost_runs.RESULTS_STUDY / f"ghost_runs_rows_{family}.json"
        if not (mine.is_file() and theirs.is_file()):
            continue
        rows, old = json.loads(mine.read_text()), json.loads(theirs.read_text())
        for camera in sorted({r["camera"] for r in rows}):
            for kind in ghost_runs.KINDS:
                def values(table):
                    return np.array([r["stale_evidence"] for r in table if r["split"] == "publish"
                                     and r["camera"] == camera and r["kind"] == kind])
                a, b = values(rows), values(old)
                if a.size == 0:
                    continue
                rates = [float((ghost_runs.run_means(v, np.random.default_rng(0)) > ghost_run.THRESHOLD).mean())
                         if v.size else float("nan") for v in (a, b)]
                lines.append(f"| {camera} | {kind} | {a.size} | {rates[0]:.1%} | {rates[1]:.1%} | "
                             f"{np.median(a):.4f} / {np.median(b) if b.size else float('nan'):.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ghost_runs.ghost_scores = compensated_ghost_scores
    ghost_runs.RESULTS_STUDY = ghost_runs.RESULTS
    ghost_runs.RESULTS = OUT
    ghost_runs.rows_path = lambda family: OUT / f"ghost_runs_compensated_rows_{family}.json"
    write = ghost_runs.atomic_write_text

    def to_own_name(path, text):
        path = Path(path)
        if path.name != "ghost_runs.md":
            return write(path, text)
        command = "PYTHONPATH=. python " + " ".join(["bench/ghosting/ghost_runs_compensated.py", *sys.argv[1:]])
        text = text.replace("PYTHONPATH=. python bench/artifact_detectors/ghost_runs.py --report", command, 1)
        text = text.replace("\n\n", "\n- the ghosting gate's displacement compensation ON (gates.metrics.ghost_motion, "
                            "as gates/ghosting.py runs it); the study's own record without it: "
                            "bench/artifact_detectors/results/ghost_runs.md\n\n", 1)
        return write(OUT / "ghost_runs_compensated.md", text + shipped_threshold_table())

    ghost_runs.atomic_write_text = to_own_name
    ghost_runs.main()


if __name__ == "__main__":
    main()
