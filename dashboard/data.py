"""Loading and aggregation for the review dashboard: pure functions over run directories, no Streamlit. The run as
loaded (:class:`RunData`), the speed and the quality tables; the verdict's reading is :mod:`dashboard.verdicts`, the
clip viewer's pieces :mod:`dashboard.pairview`.

Everything the pages show is computed here so that it can be tested directly. The dashboard reads what the run
store, the gates and the verdict wrote; it builds nothing of its own. A piece a run does not have yet (no gates,
no verdict, an unreadable file) comes back as an explicit "missing" entry, never as an exception or a zero.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from dashboard.verdicts import candidate_verdict
from h3eval import stats as S
from h3eval.store import (GateResultError, RecordError, RunManifest, RunStore, read_clip_record,
                          read_gate_result)

logger = logging.getLogger(__name__)

#: Stages of a request in the order they run (h3.record.StageAnatomy; "other" is unattributed glue).
STAGES: tuple[str, ...] = (
    "text_encode",
    "denoise",
    "video_decode",
    "audio_decode",
    "frame_prep_d2h",
    "mux_save",
    "other",
)

TRAJECTORY_GATE = "trajectory"

_CLIP_NAME = re.compile(r"^(?P<prompt>.+)-s(?P<seed>\d+)\.json$")


# ---------------------------------------------------------------------------------------------------------------
# Statistics (the numbers themselves are h3eval.stats': the dashboard, speed.json and the verdict share them)
# ---------------------------------------------------------------------------------------------------------------
def pareto_front(points: pd.DataFrame, x: str, y: str, higher_y_is_better: bool) -> pd.Series:
    """Boolean mask of the rows not dominated by another row: higher ``x`` is better, ``y`` as declared.

    A row is dominated when another is at least as good on both axes and strictly better on one. Rows with a
    missing coordinate are never on the front.
    """
    xs = points[x].to_numpy(dtype=np.float64)
    ys = points[y].to_numpy(dtype=np.float64)
    if not higher_y_is_better:
        ys = -ys
    valid = np.isfinite(xs) & np.isfinite(ys)
    mask = np.zeros(len(points), dtype=bool)
    for i in range(len(points)):
        if not valid[i]:
            continue
        others = valid & (xs >= xs[i]) & (ys >= ys[i]) & ((xs > xs[i]) | (ys > ys[i]))
        mask[i] = not others.any()
    return pd.Series(mask, index=points.index)


# ---------------------------------------------------------------------------------------------------------------
# Loading one run
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class RunData:
    """Everything the dashboard shows about one run directory, loaded once and cached."""

    root: str
    label: str
    manifest: dict[str, Any] | None
    """run.json as a dict, or None when it is missing or unreadable (see ``problems``)."""
    clips: pd.DataFrame
    """One row per clip record (warm-up requests included, flagged in ``warmup``)."""
    gates: pd.DataFrame
    """One row per gate result file: gate, candidate, prompt_id, seed, status, flagged, flags, error, metrics."""
    gate_results: dict[tuple[str, str, str, int], dict[str, Any]]
    """(gate, candidate, prompt_id, seed) -> the GateResult as a dict (series, artifacts, info)."""
    metric_directions: dict[str, dict[str, bool]]
    """gate -> metric -> higher_is_better, as the gates declared it."""
    verdict: dict[str, Any] | None
    """verdict.json, or None when the run has no verdict yet."""
    problems: list[str] = field(default_factory=list)
    """Files that exist but could not be read, with the reason (shown on the pages, never raised)."""
    notices: list[str] = field(default_factory=list)
    """What every page must say about the run's weights (``RunStore.weights_notices``: random weights)."""

    @property
    def baseline(self) -> str | None:
        return (self.manifest or {}).get("baseline")

    @property
    def candidates(self) -> list[str]:
        listed = list((self.manifest or {}).get("candidates") or [])
        if listed:
            return listed
        return sorted(r for r in self.clips["recipe"].unique() if r != self.baseline) if len(self.clips) else []

    @property
    def hourly_rate(self) -> float | None:
        """``gpu_hourly_rate`` from the run's arguments (the machine's $/hour), or None when not recorded."""
        value = ((self.manifest or {}).get("args") or {}).get("gpu_hourly_rate")
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None


CLIP_COLUMNS = [
    "run",
    "recipe",
    "prompt_id",
    "seed",
    "warmup",
    "generation_side_latency_s",
    "request_to_file_latency_s",
    "duration_s",
    "num_frames",
    "fps",
    "height",
    "width",
    "num_denoise_steps",
    *STAGES,
    "mp4",
    "workflow",
    "conditioning",
    "timed",
    "r2f_timed",
    "anatomy_timed",
]
"""``timed``, ``r2f_timed``, ``anatomy_timed``: the record's generation-side latency, request-to-file latency and
stage anatomy are reported and positive. Clips imported without timings hold zeros there (listed in the record's
``extra.unreported``), which no table may read as a latency."""


def _timed(value: float, field: str, unreported: set[str]) -> bool:
    return field not in unreported and math.isfinite(value) and value > 0


def fingerprint(root: str | Path) -> tuple:
    """A cheap key that changes whenever a file of the run is added, removed or rewritten (names and mtimes).

    Used as the cache key so that a warm page does not re-parse the run, while a gate finishing in the background
    shows up on the next rerun. Stats only the JSON and manifest files (the MP4s are keyed by their own mtime); the
    run store knows which (:meth:`h3eval.store.RunStore.fingerprint`).
    """
    return RunStore(root).fingerprint()


def _read_json(path: Path, problems: list[str]) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path}: unreadable JSON ({exc})")
        return None


def load_run(root: str | Path, label: str | None = None) -> RunData:
    """Read one run directory: manifest, clip records, gate results and verdict. Never raises on a bad file."""
    root = Path(root)
    store = RunStore(root)
    problems: list[str] = []
    manifest: dict[str, Any] | None = None
    manifest_path = store.manifest_path
    if not manifest_path.exists():
        problems.append(f"{manifest_path}: missing (not a run directory?)")
    else:
        raw = _read_json(manifest_path, problems)
        if raw is not None:
            try:
                manifest = RunManifest.model_validate(raw).model_dump(mode="json")
            except ValidationError as exc:
                problems.append(f"{manifest_path}: not a valid run manifest ({exc.error_count()} errors)")
    label = label or root.name
    clips = _load_clips(store, label, problems)
    gates, results, directions = _load_gates(store, problems)
    verdict = None
    verdict_path = store.verdict_path
    if verdict_path.exists():
        raw = _read_json(verdict_path, problems)
        if isinstance(raw, dict):
            verdict = raw
        elif raw is not None:
            problems.append(f"{verdict_path}: expected a JSON object, got {type(raw).__name__}")
    return RunData(
        root=str(root),
        label=label,
        manifest=manifest,
        clips=clips,
        gates=gates,
        gate_results=results,
        metric_directions=directions,
        verdict=verdict,
        problems=problems,
        notices=store.weights_notices(),
    )


def _load_clips(store: RunStore, label: str, problems: list[str]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for recipe in store.clip_recipes():
        for path in store.clip_record_paths(recipe):
            if not _CLIP_NAME.match(path.name):
                continue
            try:
                rec = read_clip_record(path)
            except RecordError as exc:
                problems.append(str(exc))
                continue
            anatomy = rec.timings.stage_anatomy
            unreported = set((rec.extra or {}).get("unreported") or [])
            row = {
                "run": label,
                "recipe": recipe,
                "prompt_id": rec.request.prompt_id or _CLIP_NAME.match(path.name)["prompt"],
                "seed": rec.request.seed,
                "warmup": bool(rec.extra.get("warmup", False)),
                "generation_side_latency_s": rec.timings.generation_side_latency_s,
                "request_to_file_latency_s": rec.timings.request_to_file_latency_s,
                "duration_s": rec.shape.duration_s,
                "num_frames": rec.shape.num_frames,
                "fps": rec.shape.fps,
                "height": rec.shape.height,
                "width": rec.shape.width,
                "num_denoise_steps": len(anatomy.denoise_steps),
                **{stage: float(getattr(anatomy, stage)) for stage in STAGES},
                "mp4": str(path.with_suffix(".mp4")),
                "workflow": rec.request.workflow,
                "conditioning": [(c.role, c.sha256) for c in rec.request.conditioning],
                "timed": _timed(rec.timings.generation_side_latency_s, "timings.generation_side_latency_s",
                                unreported),
                "r2f_timed": _timed(rec.timings.request_to_file_latency_s, "timings.request_to_file_latency_s",
                                    unreported),
                "anatomy_timed": "stage_anatomy" not in unreported
                and _timed(sum(float(getattr(anatomy, stage)) for stage in STAGES), "", unreported),
            }
            rows.append(row)
    return pd.DataFrame(rows, columns=CLIP_COLUMNS)


GATE_COLUMNS = ["gate", "candidate", "baseline", "prompt_id", "seed", "status", "flagged", "flags", "error",
                "identical", "path"]


def _load_gates(
    store: RunStore, problems: list[str]
) -> tuple[pd.DataFrame, dict[tuple[str, str, str, int], dict[str, Any]], dict[str, dict[str, bool]]]:
    rows: list[dict[str, Any]] = []
    results: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    directions: dict[str, dict[str, bool]] = {}
    gates = store.gates_present()
    if not gates:
        return pd.DataFrame(columns=GATE_COLUMNS), results, directions
    for gate in gates:
        for candidate in store.gate_candidates(gate):
            for path in store.gate_result_files(gate, candidate):
                m = _CLIP_NAME.match(path.name)
                if not m:
                    continue  # not a per-pair result (e.g. a gate's summary file)
                base_row = {
                    "gate": gate,
                    "candidate": candidate,
                    "baseline": None,
                    "prompt_id": m["prompt"],
                    "seed": int(m["seed"]),
                    "flagged": False,
                    "flags": "",
                    "identical": False,
                    "path": str(path),
                }
                try:
                    result = read_gate_result(path)
                except GateResultError as exc:
                    problems.append(f"{path}: unreadable JSON ({exc.detail})" if exc.unreadable else str(exc))
                    result = None
                if result is None:
                    rows.append({**base_row, "status": "unreadable", "error": f"{path.name} could not be read"})
                    continue
                row = {
                    **base_row,
                    "baseline": result.pair.baseline,
                    "prompt_id": result.pair.prompt_id,
                    "seed": result.pair.seed,
                    "status": result.status,
                    "flagged": result.flagged,
                    "flags": "; ".join(result.flags),
                    "error": result.error,
                    "identical": result.identical,
                }
                for name, metric in result.metrics.items():
                    row[f"metric:{name}"] = metric.value
                    directions.setdefault(gate, {})[name] = metric.higher_is_better
                rows.append(row)
                results[(gate, candidate, result.pair.prompt_id, result.pair.seed)] = result.model_dump(
                    mode="json"
                )
    frame = pd.DataFrame(rows)
    for col in GATE_COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    return frame, results, directions


# ---------------------------------------------------------------------------------------------------------------
# Speed
# ---------------------------------------------------------------------------------------------------------------
def warm_clips(run: RunData) -> pd.DataFrame:
    """Clips of the run with warm-up requests removed (their compile and load time is not serving speed)."""
    return run.clips[~run.clips["warmup"].astype(bool)]


def timed_clips(run: RunData, flag: str = "timed") -> pd.DataFrame:
    """Warm clips whose timing (``flag``: ``timed``, ``r2f_timed`` or ``anatomy_timed``) was reported."""
    clips = warm_clips(run)
    return clips[clips[flag].astype(bool)]


def has_timing(run: RunData) -> bool:
    """Whether any warm clip of the run has a reported generation-side latency (an imported run may have none)."""
    return bool(len(timed_clips(run)))


NO_TIMING = ("no timing data for this run: its clip records report no latency (clips imported without a manifest "
             "or timing file carry none)")


def paired_latencies(run: RunData, candidate: str, column: str = "generation_side_latency_s") -> pd.DataFrame:
    """Baseline and candidate latency of every (prompt, seed) both sides finished with that latency reported,
    warm-up excluded."""
    clips = timed_clips(run, "timed" if column == "generation_side_latency_s" else "r2f_timed")
    base = clips[clips["recipe"] == run.baseline][["prompt_id", "seed", column]]
    cand = clips[clips["recipe"] == candidate][["prompt_id", "seed", column]]
    merged = base.merge(cand, on=["prompt_id", "seed"], suffixes=("_baseline", "_candidate"))
    return merged.rename(columns={f"{column}_baseline": "baseline", f"{column}_candidate": "candidate"})


SPEED_COLUMNS = [
    "run",
    "recipe",
    "role",
    "n",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "p50_latency_s",
    "p50_request_to_file_s",
    "real_time_factor",
    "dollars_per_clip",
    "verdict",
]


def speed_table(run: RunData, hourly_rate: float | None = None, *,
                n_resamples: int = S.DEFAULT_RESAMPLES) -> pd.DataFrame:
    """One row per recipe of the run: speedup with its paired bootstrap CI, p50 latencies, RTF, $/clip, verdict.

    - ``role``: baseline, candidate, or recipe (a run without a baseline: no speedup).
    - ``n``: warm clips (baseline, recipe) or warm pairs (candidate) the row is computed from.
    - ``speedup``: :func:`h3eval.stats.speedup` over the pairs (ratio of mean generation-side latencies, paired BCa
      CI; no CI from fewer than two pairs); the baseline is 1 by definition.
    - ``p50_latency_s``: median generation-side latency (seed 000's definition) of the recipe's warm clips.
    - ``real_time_factor``: median of generation-side latency / clip duration (below 1 is faster than real time).
    - ``dollars_per_clip``: :func:`h3eval.stats.usd_per_clip` (p50 request-to-file × rate); None without a rate.
    """
    rate = hourly_rate if hourly_rate is not None else run.hourly_rate
    clips, r2f_clips = timed_clips(run), timed_clips(run, "r2f_timed")
    recipes: list[tuple[str, str]] = []
    if run.baseline is not None:
        recipes.append((run.baseline, "baseline"))
        recipes += [(c, "candidate") for c in run.candidates if c != run.baseline]
    else:  # a single-recipe run (`h3eval generate`): latencies, no pairs and so no speedup
        recipes += [(r, "recipe") for r in sorted(run.clips["recipe"].unique())]
    rows = []
    for recipe, role in recipes:
        mine = clips[clips["recipe"] == recipe]
        r2f = r2f_clips[r2f_clips["recipe"] == recipe]["request_to_file_latency_s"].to_numpy(dtype=np.float64)
        lat = mine["generation_side_latency_s"].to_numpy(dtype=np.float64)
        row: dict[str, Any] = {
            "run": run.label,
            "recipe": recipe,
            "role": role,
            "n": int(len(mine)),
            "speedup": None,
            "speedup_ci_low": None,
            "speedup_ci_high": None,
            "p50_latency_s": float(np.median(lat)) if len(lat) else None,
            "p50_request_to_file_s": float(np.median(r2f)) if len(r2f) else None,
            "real_time_factor": float(np.median(lat / mine["duration_s"].to_numpy(dtype=np.float64)))
            if len(lat)
            else None,
            "dollars_per_clip": S.usd_per_clip(r2f.tolist(), rate),
            "verdict": candidate_verdict(run.verdict, recipe) if role == "candidate" else None,
        }
        if role == "baseline":
            row["speedup"] = 1.0 if len(lat) else None
        elif role == "candidate":
            pairs = paired_latencies(run, recipe)
            row["n"] = int(len(pairs))
            if len(pairs):
                b = pairs["baseline"].to_numpy(dtype=np.float64)
                c = pairs["candidate"].to_numpy(dtype=np.float64)
                row["speedup"] = float(b.mean() / c.mean())
                if len(pairs) >= 2:
                    ci = S.speedup(b, c, n_resamples=n_resamples).ci
                    row["speedup_ci_low"], row["speedup_ci_high"] = ci.low, ci.high
        rows.append(row)
    return pd.DataFrame(rows, columns=SPEED_COLUMNS)


def stage_anatomy(runs: list[RunData]) -> pd.DataFrame:
    """Mean seconds of each stage per (run, recipe) over warm requests, long format (run, recipe, stage, seconds)."""
    rows = []
    for run in runs:
        clips = timed_clips(run, "anatomy_timed")
        for recipe, group in clips.groupby("recipe", sort=True):
            for stage in STAGES:
                rows.append(
                    {"run": run.label, "recipe": recipe, "stage": stage, "seconds": float(group[stage].mean()),
                     "n": int(len(group))}
                )
    return pd.DataFrame(rows, columns=["run", "recipe", "stage", "seconds", "n"])


# ---------------------------------------------------------------------------------------------------------------
# Quality
# ---------------------------------------------------------------------------------------------------------------
def quality_metrics(runs: list[RunData]) -> list[tuple[str, str]]:
    """(gate, metric) pairs any of the runs has results for, sorted."""
    found = {(g, m) for run in runs for g, ms in run.metric_directions.items() for m in ms}
    return sorted(found)


def metric_direction(runs: list[RunData], gate: str, metric: str) -> bool | None:
    for run in runs:
        if metric in run.metric_directions.get(gate, {}):
            return run.metric_directions[gate][metric]
    return None


def quality_table(run: RunData, gate: str, metric: str, *, n_resamples: int = S.DEFAULT_RESAMPLES) -> pd.DataFrame:
    """Per candidate: mean of ``gate``'s ``metric`` over scored pairs with :func:`h3eval.stats.mean_ci` (no CI from
    fewer than two values), and how many are missing.

    Missing values (gate error, not applicable, None) are counted in ``n_missing`` and left out of the mean.
    """
    rows = []
    col = f"metric:{metric}"
    frame = run.gates[run.gates["gate"] == gate] if len(run.gates) else run.gates
    for cand in run.candidates:
        mine = frame[frame["candidate"] == cand] if len(frame) else frame
        values = (
            pd.to_numeric(mine[col], errors="coerce").to_numpy(dtype=np.float64) if col in mine.columns
            else np.array([])
        )
        good = values[np.isfinite(values)]
        ci = S.mean_ci(good, n_resamples=n_resamples) if len(good) >= 2 else None
        rows.append(
            {
                "run": run.label,
                "recipe": cand,
                "n_scored": int(len(good)),
                "n_missing": int(len(mine) - len(good)),
                "quality": float(np.mean(good)) if len(good) else None,
                "quality_ci_low": ci.low if ci else None,
                "quality_ci_high": ci.high if ci else None,
            }
        )
    return pd.DataFrame(rows, columns=["run", "recipe", "n_scored", "n_missing", "quality", "quality_ci_low",
                                       "quality_ci_high"])


def speed_quality(speed: pd.DataFrame, quality: pd.DataFrame, higher_is_better: bool) -> pd.DataFrame:
    """Candidates with speedup and quality side by side (from :func:`speed_table` and :func:`quality_table` rows of
    any number of runs), and whether each is on the Pareto front of the whole set (faster and better)."""
    table = speed[speed["role"] == "candidate"].merge(quality, on=["run", "recipe"], how="left")
    numeric = ["speedup", "speedup_ci_low", "speedup_ci_high", "quality", "quality_ci_low", "quality_ci_high"]
    table = table.astype({c: float for c in numeric}).reset_index(drop=True)
    table["pareto"] = pareto_front(table, "speedup", "quality", higher_is_better) if len(table) else pd.Series(
        dtype=bool)
    table["label"] = table["run"] + " / " + table["recipe"]
    return table


def worst_first(frame: pd.DataFrame, metric: str, higher_is_better: bool | None) -> pd.DataFrame:
    """Rows sorted worst first on ``metric`` (lowest first when higher is better); missing values go first too,
    since a pair that could not be scored needs a look before any scored one."""
    col = f"metric:{metric}"
    if col not in frame.columns:
        return frame
    values = pd.to_numeric(frame[col], errors="coerce")
    key = values if higher_is_better else -values
    order = np.lexsort((key.fillna(0).to_numpy(), ~values.isna().to_numpy()))
    return frame.iloc[order]


def viewer_link(run_index: int, candidate: str, prompt_id: str, seed: int) -> str:
    """Relative URL that opens the clip viewer on one pair (read back by the app from the query string)."""
    from urllib.parse import urlencode

    return "?" + urlencode({"page": "viewer", "run": run_index, "candidate": candidate, "prompt": prompt_id,
                            "seed": seed})
