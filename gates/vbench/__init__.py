"""The ``vbench`` gate: pinned VBench scores per clip, in VBench's own environment, paired clip by clip.

Before anything is scored, :func:`gates.vbench.pins.verify` checks the scoring environment against its locks, every
pinned VBench scorer file and every checkpoint the requested dimensions load; any problem stops the gate with all
problems named (nothing is scored, nothing is written). Scoring runs ``gates/vbench/runner.py`` in a subprocess of
the scoring environment, in VBench's custom-input mode with each clip's prompt passed explicitly.

Two ways in:

- **Per pair** (the standard :class:`gates.base.Gate` contract, what ``h3eval gate RUNDIR --gates vbench`` runs):
  :meth:`VBenchGate.evaluate` scores the pair's two clips in one subprocess and returns the :class:`GateResult`;
  options ``dimensions``, ``env``, ``cache_dir``, ``device``.
- **Whole run**: :func:`evaluate_run` (``VBenchGate.evaluate_run``) takes the :class:`gates.base.RunContext` the suite
  builds (``h3eval.gaterun.run_context(run_dir, "vbench")``), scores every clip of the run (baseline and
  candidates) in ONE subprocess (each VBench model is loaded once) and writes every file below itself; it returns
  the summary. The gate runner does not call it yet (it scores pair by pair, resumably); scripts and tests do.

Files (``<run>/gates/vbench/``):

- ``<candidate>/<prompt_id>-s<seed>.json``: :class:`GateResult` per pair. ``metrics[<dimension>]`` is the
  candidate's raw VBench score, ``metrics[<dimension>_delta]`` candidate minus baseline (raw); both
  higher-is-better. ``info`` holds baseline and candidate raw and normalized scores per dimension. A score that
  could not be computed is ``None`` with the reason in ``error`` (never zero-filled), and ``status`` is ``error``.
- ``clips/<recipe>/<prompt_id>-s<seed>.json``: raw and normalized score per dimension of every clip, baseline too.
- ``summary.json``: per dimension the eligible / scored / missing / error denominators (clips and pairs), the VBench
  mode, how long videos are treated, provenance (pins file hashes, the scoring environment's package versions,
  device) and ``partial`` (true whenever any eligible clip lacks a score).

Long videos: VBench calls clips of 5 s and longer long videos; the product scores them whole in standard VBench
(not VBench-Long's split-into-clips), flags ``long_video`` per clip and records ``long_video_handling``. See
:data:`gates.vbench.dimensions.LONG_VIDEO_SECONDS`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import field_validator

from gates.base import (ClipSide, Gate, GateOptions, GateResult, Metric, MetricSpec, PairContext, PairRef, RunContext,
                        register_gate)
from h3.atomic import atomic_write_json, sha256_file
from h3.names import clip_stem
from h3.provenance import utc_now
from gates.vbench.dimensions import (
    DIMENSIONS,
    UnknownDimensionError,
    LONG_VIDEO_HANDLING,
    LONG_VIDEO_SECONDS,
    VBENCH_MODE,
    VBENCH_VERSION,
    resolve_dimensions,
)
from gates.vbench.env import default_env_path
from gates.vbench.pins import (
    CHECKPOINT_PINS_PATH,
    SOURCE_PINS_PATH,
    VerifyReport,
    load_json_file,
    require_verified,
    verify,
)

logger = logging.getLogger(__name__)

GATE_NAME = "vbench"
RUNNER = Path(__file__).resolve().parent / "runner.py"
SUMMARY_VERSION = 1
CLIP_SCORES_VERSION = 1


class VBenchRunnerError(RuntimeError):
    """The scoring subprocess failed as a whole (crashed, or wrote no result)."""


@dataclass
class ClipInput:
    """One clip to score: where it is and the prompt it was made from."""

    recipe: str
    prompt_id: str
    seed: int
    mp4: Path
    prompt: str
    mp4_sha256: str
    duration_s: float | None

    @property
    def key(self) -> str:
        return f"{self.recipe}/{clip_stem(self.prompt_id, self.seed)}"


def run_scorer(clips: list[ClipInput], dimensions: list[str], report: VerifyReport, work_dir: Path,
               device: str = "auto", log_path: Path | None = None) -> dict[str, Any]:
    """Score ``clips`` in one subprocess of the verified environment; the runner's result dict."""
    assert report.ok and report.env is not None, "run_scorer needs a verified environment"
    work_dir.mkdir(parents=True, exist_ok=True)
    pinned = load_json_file(SOURCE_PINS_PATH, "source pins")["files"]
    request = {
        "dimensions": dimensions,
        "clips": [{"key": c.key, "path": str(Path(c.mp4).resolve()), "prompt": c.prompt} for c in clips],
        "cache_dir": report.cache_dir,
        "device": device,
        "work_dir": str(work_dir),
        "pinned_files": pinned,
    }
    request_path = work_dir / "request.json"
    result_path = work_dir / "result.json"
    result_path.unlink(missing_ok=True)
    atomic_write_json(request_path, request)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["VBENCH_CACHE_DIR"] = report.cache_dir
    cmd = [report.env.python, "-I", str(RUNNER), str(request_path), str(result_path)]
    logger.info("scoring %d clip(s) on %s: %s", len(clips), ", ".join(dimensions), " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(work_dir))
    if log_path is not None:
        from h3.atomic import atomic_write_text

        atomic_write_text(log_path, f"$ {' '.join(cmd)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    if proc.returncode != 0 or not result_path.exists():
        raise VBenchRunnerError(
            f"the VBench scoring subprocess failed (exit {proc.returncode}); nothing was scored. "
            f"Last output:\n{proc.stderr[-3000:]}"
        )
    return json.loads(result_path.read_text())


def _score_entry(dimension: str, raw: float | None, error: str | None) -> dict[str, Any]:
    return {
        "raw": raw,
        "normalized": DIMENSIONS[dimension].normalize(raw) if raw is not None else None,
        "error": error,
    }


def clip_scores(result: dict[str, Any], key: str, dimensions: list[str]) -> dict[str, dict[str, Any]]:
    """Per dimension ``{raw, normalized, error}`` of one clip from the runner's result; a clip the runner did not
    report on gets an error, never a value."""
    scores = {}
    for dim in dimensions:
        per_clip = result.get("dimensions", {}).get(dim, {}).get("clips", {})
        entry = per_clip.get(key)
        if entry is None:
            scores[dim] = _score_entry(dim, None, "the VBench runner reported nothing for this clip")
        else:
            scores[dim] = _score_entry(dim, entry.get("value"), entry.get("error"))
            if entry.get("value") is None and not entry.get("error"):
                scores[dim]["error"] = "no score and no reason from the VBench runner"
    return scores


def pair_result(pair: PairRef, baseline: dict[str, dict[str, Any]], candidate: dict[str, dict[str, Any]],
                dimensions: list[str], info: dict[str, Any]) -> GateResult:
    """The pair's GateResult from both clips' scores. Missing on either side -> None with the reason."""
    metrics: dict[str, Metric] = {}
    errors = []
    per_dim: dict[str, Any] = {}
    for dim in dimensions:
        hib = DIMENSIONS[dim].higher_is_better
        b, c = baseline[dim], candidate[dim]
        metrics[dim] = Metric(value=c["raw"], higher_is_better=hib)
        delta = c["raw"] - b["raw"] if c["raw"] is not None and b["raw"] is not None else None
        metrics[f"{dim}_delta"] = Metric(value=delta, higher_is_better=hib)
        if c["raw"] is None:
            errors.append(f"{dim}: candidate not scored ({c['error']})")
        if b["raw"] is None:
            errors.append(f"{dim}: baseline not scored ({b['error']})")
        per_dim[dim] = {"baseline": b, "candidate": c}
    return GateResult(
        gate=GATE_NAME,
        pair=pair,
        metrics=metrics,
        error="; ".join(errors) or None,
        status="error" if errors else "ok",
        flags=["partial: some VBench scores are missing"] if errors else [],
        info={**info, "scores": per_dim, "partial": bool(errors)},
    )


def _clip_inputs(run: RunContext) -> tuple[list[tuple[str, str, int]], list[ClipInput], list[tuple[str, str, int, str]],
                                            list[str]]:
    """(every eligible clip, the finished ones, the missing ones with why, recipes) of a run."""
    recipes = list(dict.fromkeys(c.recipe for c in run.clips))
    eligible, found, missing = [], [], []
    for clip in run.clips:
        eligible.append((clip.recipe, clip.prompt_id, clip.seed))
        if clip.side is None:
            missing.append((clip.recipe, clip.prompt_id, clip.seed, clip.missing or "clip missing"))
            continue
        record = clip.side.record
        found.append(ClipInput(clip.recipe, clip.prompt_id, clip.seed, clip.side.mp4, record["request"]["prompt"],
                               record["mp4_sha256"], record["shape"]["duration_s"]))
    return eligible, found, missing, recipes


def evaluate_run(run: RunContext, dimensions: list[str] | None = None, env: str | Path | None = None,
                 cache_dir: str | Path | None = None, device: str = "auto",
                 source_pins_path: Path = SOURCE_PINS_PATH, checkpoint_pins_path: Path = CHECKPOINT_PINS_PATH,
                 ) -> dict[str, Any]:
    """Score every clip of the run on ``dimensions``, write per-clip, per-pair and summary files; the summary.

    ``run`` is what the suite hands a whole-run gate (``h3eval.gaterun.run_context(run_dir, "vbench")``).
    Refuses to start (VBenchPinError / VBenchEnvError message, nothing written) when verification finds a problem.
    Resumable: a clip whose scores file already holds every requested dimension for the same MP4 sha256 and the same
    pins is not scored again.

    The steps: :func:`_score_run` (reuse or score each clip), :func:`_write_clip_files`, :func:`_write_pair_results`
    and :func:`_run_summary`.
    """
    started = time.monotonic()
    dims = resolve_dimensions(dimensions)
    eligible, found, missing, recipes = _clip_inputs(run)
    report = require_verified(verify(Path(env) if env else default_env_path(), dims, cache_dir,
                                     source_pins_path=source_pins_path, checkpoint_pins_path=checkpoint_pins_path))
    gate_dir = run.gate_dir
    provenance = report.provenance()
    scores, rescored, runner_info = _score_run(gate_dir, found, missing, dims, report, device, provenance)
    _write_clip_files(gate_dir, eligible, found, scores, provenance)
    info = {"vbench_version": VBENCH_VERSION, "mode": VBENCH_MODE, "long_video_handling": LONG_VIDEO_HANDLING,
            "source_pins_sha256": provenance["source_pins_sha256"],
            "checkpoint_pins_sha256": provenance["checkpoint_pins_sha256"], "device": runner_info.get("device")}
    pair_counts = _write_pair_results(run, scores, dims, info, missing)
    summary = _run_summary(dims, eligible, found, missing, recipes, scores, pair_counts)
    summary.update({
        "rescored_clips": rescored,
        "reused_clips": len(found) - rescored,
        "runner": runner_info,
        "provenance": provenance,
        "seconds": round(time.monotonic() - started, 2),
    })
    atomic_write_json(gate_dir / "summary.json", summary)
    if summary["partial"]:
        logger.warning("VBench scores are PARTIAL: %s", {d: c["clips"] for d, c in summary["denominators"].items()
                                                         if c["clips"]["scored"] < c["clips"]["eligible"]})
    return summary


def _key(recipe: str, prompt_id: str, seed: int) -> str:
    """A clip's key in the scores (:attr:`ClipInput.key`)."""
    return f"{recipe}/{clip_stem(prompt_id, seed)}"


def _score_run(gate_dir: Path, found: list[ClipInput], missing: list[tuple[str, str, int, str]], dims: list[str],
               report: VerifyReport, device: str, provenance: dict[str, Any]
               ) -> tuple[dict[str, dict[str, dict[str, Any]]], int, dict[str, Any]]:
    """(scores per clip key and dimension, how many clips were scored now, what scored them).

    A clip whose earlier scores still hold (:func:`_read_previous`) is reused; the rest are scored in ONE subprocess;
    a missing clip gets its reason as the error of every dimension.
    """
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    to_score: list[ClipInput] = []
    for clip in found:
        previous = _read_previous(gate_dir, clip, dims, provenance)
        if previous is not None:
            scores[clip.key] = previous
        else:
            to_score.append(clip)
    runner_info: dict[str, Any] = {}
    if not to_score and (gate_dir / "summary.json").exists():  # everything reused: keep what scored it
        try:
            runner_info = json.loads((gate_dir / "summary.json").read_text()).get("runner", {})
        except (json.JSONDecodeError, UnicodeDecodeError):
            runner_info = {}
    if to_score:
        with tempfile.TemporaryDirectory(prefix=".work-", dir=_mkdir(gate_dir)) as work:
            result = run_scorer(to_score, dims, report, Path(work), device, log_path=gate_dir / "runner.log")
        runner_info = {k: result.get(k) for k in ("vbench_version", "mode", "device", "device_name", "torch_version")}
        runner_info["seconds_per_dimension"] = {d: result["dimensions"][d].get("seconds") for d in dims}
        for clip in to_score:
            scores[clip.key] = clip_scores(result, clip.key, dims)
    for recipe, pid, seed, why in missing:
        scores[_key(recipe, pid, seed)] = {d: _score_entry(d, None, why) for d in dims}
    return scores, len(to_score), runner_info


def _is_long(clip: ClipInput | None) -> bool:
    return clip is not None and clip.duration_s is not None and clip.duration_s >= LONG_VIDEO_SECONDS


def _write_clip_files(gate_dir: Path, eligible: list[tuple[str, str, int]], found: list[ClipInput],
                      scores: dict[str, dict[str, dict[str, Any]]], provenance: dict[str, Any]) -> None:
    """``clips/<recipe>/<prompt_id>-s<seed>.json`` for every eligible clip, baseline too (a missing one: no hash)."""
    by_key = {c.key: c for c in found}
    for recipe, pid, seed in eligible:
        key = _key(recipe, pid, seed)
        clip = by_key.get(key)
        atomic_write_json(gate_dir / "clips" / recipe / f"{clip_stem(pid, seed)}.json", {
            "version": CLIP_SCORES_VERSION,
            "recipe": recipe, "prompt_id": pid, "seed": seed,
            "prompt": clip.prompt if clip else None,
            "mp4_sha256": clip.mp4_sha256 if clip else None,
            "duration_s": clip.duration_s if clip else None,
            "long_video": _is_long(clip),
            "source_pins_sha256": provenance["source_pins_sha256"],
            "checkpoint_pins_sha256": provenance["checkpoint_pins_sha256"],
            "scores": scores[key],
        })


def _write_pair_results(run: RunContext, scores: dict[str, dict[str, dict[str, Any]]], dims: list[str],
                        info: dict[str, Any], missing: list[tuple[str, str, int, str]]) -> dict[str, dict[str, int]]:
    """Each pair's :class:`GateResult` under ``<candidate>/``; per dimension the pairs eligible, scored, missing (a
    clip of the pair was never made) and in error."""
    pair_counts = {d: {"eligible": 0, "scored": 0, "missing": 0, "error": 0} for d in dims}
    missing_keys = {_key(r, p, s) for r, p, s, _ in missing}
    for pair in run.pairs:
        bkey = _key(pair.baseline, pair.prompt_id, pair.seed)
        ckey = _key(pair.candidate, pair.prompt_id, pair.seed)
        result = pair_result(pair, scores[bkey], scores[ckey], dims, info)
        atomic_write_json(run.gate_dir / pair.candidate / f"{clip_stem(pair.prompt_id, pair.seed)}.json",
                          result.model_dump(mode="json"))
        for d in dims:
            counts = pair_counts[d]
            counts["eligible"] += 1
            if scores[bkey][d]["raw"] is not None and scores[ckey][d]["raw"] is not None:
                counts["scored"] += 1
            elif bkey in missing_keys or ckey in missing_keys:
                counts["missing"] += 1
            else:
                counts["error"] += 1
    return pair_counts


def _run_summary(dims: list[str], eligible: list[tuple[str, str, int]], found: list[ClipInput],
                 missing: list[tuple[str, str, int, str]], recipes: list[str],
                 scores: dict[str, dict[str, dict[str, Any]]], pair_counts: dict[str, dict[str, int]]
                 ) -> dict[str, Any]:
    """The summary's scores part: clip denominators, per-recipe means, ``partial``, the normalization used."""
    clip_counts = {}
    per_recipe: dict[str, Any] = {}
    for d in dims:
        counts = {"eligible": len(eligible), "scored": 0, "missing": len(missing), "error": 0}
        for clip in found:
            counts["scored" if scores[clip.key][d]["raw"] is not None else "error"] += 1
        clip_counts[d] = counts
        per_recipe[d] = {}
        for recipe in recipes:
            values = [scores[_key(recipe, p, s)][d]["raw"] for r, p, s in eligible if r == recipe]
            got = [v for v in values if v is not None]
            per_recipe[d][recipe] = {
                "n_scored": len(got), "n_eligible": len(values),
                "mean_raw": sum(got) / len(got) if got else None,
                "mean_normalized": DIMENSIONS[d].normalize(sum(got) / len(got)) if got else None,
            }
    partial = any(c["scored"] < c["eligible"] for c in clip_counts.values())
    return {
        "version": SUMMARY_VERSION,
        "gate": GATE_NAME,
        "created_at": utc_now(),
        "dimensions": dims,
        "mode": VBENCH_MODE,
        "long_video_seconds": LONG_VIDEO_SECONDS,
        "long_video_handling": LONG_VIDEO_HANDLING,
        "long_videos": sorted(c.key for c in found if _is_long(c)),
        "partial": partial,
        "complete": not partial,
        "denominators": {d: {"clips": clip_counts[d], "pairs": pair_counts[d]} for d in dims},
        "per_recipe": per_recipe,
        "normalization": {d: {"min": DIMENSIONS[d].leaderboard_min, "max": DIMENSIONS[d].leaderboard_max,
                              "source": "VBench scripts/constant.py NORMALIZE_DIC"} for d in dims},
        "higher_is_better": {d: DIMENSIONS[d].higher_is_better for d in dims},
    }


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _read_previous(gate_dir: Path, clip: ClipInput, dims: list[str], provenance: dict[str, Any]):
    path = gate_dir / "clips" / clip.recipe / f"{clip_stem(clip.prompt_id, clip.seed)}.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if (data.get("mp4_sha256") != clip.mp4_sha256
            or data.get("source_pins_sha256") != provenance["source_pins_sha256"]
            or data.get("checkpoint_pins_sha256") != provenance["checkpoint_pins_sha256"]):
        return None
    scores = data.get("scores", {})
    if not all(d in scores and scores[d].get("raw") is not None for d in dims):
        return None
    return {d: scores[d] for d in dims}


class VBenchOptions(GateOptions):
    dimensions: str | list[str] | None = None
    """Dimensions to score (comma-separated); default: every supported one."""

    @field_validator("dimensions")
    @classmethod
    def _known_dimensions(cls, value: str | list[str] | None) -> list[str] | None:
        """Checked when the options are (before the run starts): an unknown name is refused with the known ones."""
        if value is None:
            return None
        try:
            return resolve_dimensions(value)
        except UnknownDimensionError as exc:
            raise ValueError(str(exc)) from None
    env: str | None = None
    """The scoring environment (default ``$H3EVAL_VBENCH_ENV``, else ``~/.cache/h3eval/vbench-env``)."""
    cache_dir: str | None = None
    """VBench's checkpoint folder (default ``$VBENCH_CACHE_DIR``, else ``~/.cache/vbench``)."""
    device: str | None = None
    """Where VBench scores (default: the gate run's device)."""


@register_gate
class VBenchGate(Gate):
    """Pinned VBench scores of both clips of a pair (see the module docstring)."""

    name: ClassVar[str] = GATE_NAME
    needs = ("video",)
    description: ClassVar[str] = "pinned VBench (custom-input mode) in its own environment, hash-verified, per clip"
    Options = VBenchOptions
    # The candidate's raw score and candidate minus baseline, per dimension, both in the dimension's direction.
    metrics = {name: MetricSpec(higher_is_better=dim.higher_is_better) for key, dim in DIMENSIONS.items()
               for name in (key, f"{key}_delta")}

    evaluate_run = staticmethod(evaluate_run)

    def evaluate(self, ctx: PairContext) -> GateResult:
        options = self.parse_options(ctx.options)
        dims = resolve_dimensions(options.dimensions)  # a string from the command line is one comma-separated list
        report = require_verified(verify(Path(options.env) if options.env else default_env_path(), dims,
                                         options.cache_dir))
        clips = [self._clip_input(side, ctx) for side in (ctx.baseline, ctx.candidate)]
        with tempfile.TemporaryDirectory(prefix="vbench-pair-") as work:
            result = run_scorer(clips, dims, report, Path(work), options.device or ctx.device)
        provenance = report.provenance()
        info = {"vbench_version": VBENCH_VERSION, "mode": VBENCH_MODE, "long_video_handling": LONG_VIDEO_HANDLING,
                "source_pins_sha256": provenance["source_pins_sha256"],
                "checkpoint_pins_sha256": provenance["checkpoint_pins_sha256"], "device": result.get("device")}
        return pair_result(ctx.pair, clip_scores(result, clips[0].key, dims), clip_scores(result, clips[1].key, dims),
                           dims, info)

    @staticmethod
    def _clip_input(side: ClipSide, ctx: PairContext) -> ClipInput:
        request = side.record.get("request", {})
        return ClipInput(side.recipe, ctx.pair.prompt_id, ctx.pair.seed, side.mp4, request.get("prompt", ""),
                         side.record.get("mp4_sha256") or sha256_file(side.mp4),
                         side.record.get("shape", {}).get("duration_s"))
