"""The suite's own parallel-versus-single check (issue 21): is a recipe's output at degree N the output it gives on one
process, up to rounding?

A correct sequence-parallel run computes the same mathematics as the single process in another order: its rows go
through GEMMs of another height, its heads through attention kernels in other groups. It differs from the single
process by rounding, which the denoising loop then carries to the end; a bug (seed 001: "a parallel bug can look
like ghosting") differs by much more. So the check puts the parallel clip beside the single-process clip of the same
request and seed, and reads their difference against the **single-process same-seed noise floor**: how far the
single process's own output moves when only its rounding changes. Two twins of the degree-1 run measure it, each an
exact recomputation of the same request with other rounding:

- ``<recipe>.floor-hp``: the transformer in higher precision (float64 for a float32 recipe, float32 for bf16/fp16);
  backends that only take half precision (Sage, flash, cuDNN) run native SDPA there;
- ``<recipe>.floor-math``: the dense attention through PyTorch's math SDPA (``_native_math``) instead of the recipe's
  backend.

Measured on the tiny preset (CPU, float32): the latent trajectories of a correct SP2 run differ from SP1 by 4e-8
relative; the twins by 5e-8 to 1.2e-7; the planted bugs by 3e-3 to 1.6e-2. On the decoded MP4 the codec turns any
rounding difference into a few flipped macroblocks (RMSE 0.30-0.38 of 255 for SP2 and the twins alike), the bugs into
RMSE ~5.

Per pair, the judged distances ``d`` (:data:`JUDGED`: the trajectory gate's final-x0 relative L2 of video and
audio, the fidelity gate's PSNR as the RMSE it states) pass when ``d(single, parallel) <= FACTOR * max(d(single,
twin))``. ``FACTOR = 2`` is the triangle inequality: the parallel run and the single run are each one rounding of the
same exact result, each about a twin's distance from it, so at most about twice that from each other (measured:
0.40-0.58x the floor on the latents, 0.95-1.02x on PSNR; the planted bugs 1e5x and 19-20x). The ghosting gate judges
with its own calibrated decision: the parallel clip may be flagged only where a twin is. SSIM, LPIPS and the ghost
scores are reported beside their floors but not judged (:data:`REPORTED` says why). The run passes when every pair
passes and both sides ran as configured (h3eval.ab.check_executed: the parallel side at its degree, one device per
rank, its tiles on every rank); a metric missing on either side fails the pair (never read as a pass).

Layout: an ordinary run directory (``h3eval`` store) with the four recipes above plus ``<recipe>.sp<N>``, gated with
fidelity, ghosting and trajectory; the verdict goes to ``<run>/parallel_check.json``. The parallel clips come from one
launch of N ranks (h3/parallel/batch.py); ``plant`` sets ``H3_PARALLEL_PLANT`` there (a planted bug the check must
fail, h3/parallel/plants.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from h3.atomic import atomic_write_json
from h3.levers.parallel import at_degree
from h3.recipe import Recipe
from h3eval.prompts import PromptSuite
from h3eval.runner import RequestShape, RunError, RunPlan, fill_run, open_run
from h3eval.store import RunStore

logger = logging.getLogger(__name__)

FACTOR = 2.0
GATES = ("fidelity", "ghosting", "trajectory")
# Backends that only take half precision: the higher-precision twin runs native SDPA instead.
HALF_ONLY_BACKENDS = ("sage", "flash", "_flash_3", "_native_flash", "_native_cudnn")


def _same(value: float) -> float:
    return value


def _psnr_to_rmse(value: float) -> float:
    return 255.0 * 10.0 ** (-value / 20.0)


def _one_minus(value: float) -> float:
    return 1.0 - value


JUDGED: dict[str, Callable[[float], float]] = {
    "trajectory.video_x0_rel_l2_final": _same,
    "trajectory.audio_x0_rel_l2_final": _same,
    "fidelity.psnr_mean": _psnr_to_rmse,
}
"""Judged metrics -> their reading as a distance (0 for identical clips, larger for further apart)."""
REPORTED: dict[str, Callable[[float], float]] = {
    "fidelity.ssim_mean": _one_minus,
    "fidelity.lpips_mean": _same,
    "ghosting.ghost_strength": _same,
    "ghosting.ghost_score_max": _same,
}
"""Reported beside the floor, not judged: at the scale of rounding they measure which of the codec's macroblocks
flipped, not how far the clips are apart (tiny preset, 9 correct SP2 pairs: SSIM and LPIPS up to 2.7x the larger
twin, the ghost score's maximum up to 19x and infinite over a zero floor; PSNR within 0.95-1.02x)."""
def higher_dtype(dtype: str) -> str:
    return "float64" if dtype == "float32" else "float32"


def variants(recipe: Recipe, degree: int) -> dict[str, Recipe]:
    """The check's recipes by role: ``single`` (the baseline), ``parallel``, ``floor-hp``, ``floor-math``."""
    if degree < 2:
        raise RunError(f"the parallel check needs a degree of 2 or more, got {degree}")
    single = at_degree(recipe, 1)
    name = single.name

    def renamed(r: Recipe, suffix: str, description: str) -> Recipe:
        return r.model_copy(update={"name": f"{name}.{suffix}", "description": description})

    hp = higher_dtype(single.dtype)
    hp_recipe = single
    if single.attention.backend in HALF_ONLY_BACKENDS:
        hp_recipe = single.model_copy(update={"attention": single.attention.model_copy(update={"backend": "native"})})
    math_recipe = single.model_copy(
        update={"attention": single.attention.model_copy(update={"backend": "_native_math"})})
    return {
        "single": single,
        "parallel": renamed(at_degree(recipe, degree), f"sp{degree}", f"{name} at parallel degree {degree}"),
        "floor-hp": renamed(hp_recipe, "floor-hp", f"floor twin of {name}: the transformer in {hp}"),
        "floor-math": renamed(math_recipe, "floor-math", f"floor twin of {name}: dense attention through math SDPA"),
    }


@dataclass
class ParallelCheckPlan:
    model: str
    recipe: Recipe
    degree: int
    prompts: PromptSuite
    seeds: list[int]
    out: Path
    shape: RequestShape = field(default_factory=RequestShape)
    device: str | None = None
    gate_options: dict[str, Any] = field(default_factory=dict)
    plant: str | None = None
    factor: float = FACTOR
    timeout_s: float | None = None
    """Limit on the parallel launch (None: none)."""


def _generate_parallel(plan: ParallelCheckPlan, store: RunStore, recipe: Recipe) -> dict[str, Any]:
    """The parallel side's missing clips in one launch of ``degree`` ranks."""
    from h3.parallel.launch import launch

    requests = []
    for prompt in plan.prompts.prompts:
        for seed in plan.seeds:
            if store.read_record(recipe.name, prompt.id, seed) is not None:
                continue
            request = plan.shape.request(prompt.id, prompt.prompt, seed)
            requests.append({"prompt": request.prompt, "seed": seed, "prompt_id": prompt.id,
                             "num_frames": request.num_frames, "seconds": request.seconds,
                             "height": request.height, "width": request.width, "trajectory": True,
                             "out": str(store.clip_path(recipe.name, prompt.id, seed))})
    if not requests:
        return {"launched": False, "done": [], "errors": []}
    with tempfile.TemporaryDirectory(prefix="h3-parallel-check-") as tmp:
        job = {"model": plan.model, "recipe": recipe.resolved(), "device": plan.device, "requests": requests,
               "result": str(Path(tmp) / "result.json")}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        env = dict(os.environ)
        env.pop("H3_PARALLEL_PLANT", None)
        if plan.plant:
            env["H3_PARALLEL_PLANT"] = plan.plant
        code = launch(plan.degree, "h3.parallel.batch", [str(Path(tmp) / "job.json")], env=env,
                      timeout=plan.timeout_s)
        result_path = Path(tmp) / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else {"done": [], "errors": []}
    result.update(launched=True, exit_code=code)
    for error in result["errors"]:
        logger.error("parallel clip %s: %s", error["out"], error["error"])
    if code != 0 and not result["errors"]:
        result["errors"].append({"out": None, "error": f"the {plan.degree} ranks exited with status {code}"})
    return result


def _runtime_factory(roles: dict[str, Recipe]):
    from h3.runtime import H3Runtime

    hp_name = roles["floor-hp"].name
    hp_dtype = higher_dtype(roles["single"].dtype)

    def factory(model: str, recipe: Recipe, device: str | None):
        if recipe.name == hp_name:
            return H3Runtime.load(model, recipe, device, transformer_dtype=hp_dtype)
        return H3Runtime.load(model, recipe, device)

    return factory


def _result(store: RunStore, gate: str, candidate: str, prompt_id: str, seed: int):
    from gates.base import GateResult
    from h3eval.gaterun import result_path

    path = result_path(store, gate, candidate, prompt_id, seed)
    if not path.is_file():
        return None
    try:
        result = GateResult.model_validate_json(path.read_text())
    except ValueError:
        return None
    return result if result.status == "ok" else None


def _metric(store: RunStore, gate: str, candidate: str, prompt_id: str, seed: int, name: str) -> float | None:
    result = _result(store, gate, candidate, prompt_id, seed)
    if result is None or name not in result.metrics:
        return None
    value = result.metrics[name].value
    return float(value) if value is not None and math.isfinite(value) else None


def judge(store: RunStore, roles: dict[str, Recipe], prompts: PromptSuite, seeds: list[int],
          factor: float = FACTOR) -> dict[str, Any]:
    """Per pair: each judged metric's parallel distance against the floor (the larger twin distance), and the
    ghosting gate's flag (calibrated on real footage, bench/ghosting/results/ghosting_calibration.md): the parallel pair may
    be flagged only where a twin is too."""
    parallel, twins = roles["parallel"].name, [roles["floor-hp"].name, roles["floor-math"].name]
    pairs, worst = [], {}
    for prompt in prompts.prompts:
        for seed in seeds:
            metrics, reported, reasons = {}, {}, []
            for table, rules in ((metrics, JUDGED), (reported, REPORTED)):
                for key, as_distance in rules.items():
                    gate, name = key.split(".", 1)
                    raw = _metric(store, gate, parallel, prompt.id, seed, name)
                    floors = [_metric(store, gate, twin, prompt.id, seed, name) for twin in twins]
                    if raw is None or any(f is None for f in floors):
                        table[key] = {"parallel": None, "floor": None, "pass": False}
                        if table is metrics:
                            reasons.append(f"{key}: not scored on every side")
                        continue
                    d = as_distance(raw)
                    floor = max(as_distance(f) for f in floors)
                    ok = d <= factor * floor
                    ratio = d / floor if floor > 0 else (0.0 if d == 0 else math.inf)
                    table[key] = {"parallel": d, "floor": floor, "twins": [as_distance(f) for f in floors],
                                  "ratio": ratio, "pass": ok}
                    if table is metrics:
                        worst[key] = max(worst.get(key, 0.0), ratio)
                        if not ok:
                            reasons.append(f"{key}: {d:.4g} > {factor:g} x floor {floor:.4g}")
            ghost = _result(store, "ghosting", parallel, prompt.id, seed)
            ghost_twins = [_result(store, "ghosting", twin, prompt.id, seed) for twin in twins]
            if ghost is None or any(t is None for t in ghost_twins):
                metrics["ghosting.flagged"] = {"parallel": None, "twins": None, "pass": False}
                reasons.append("ghosting.flagged: not scored on every side")
            else:
                ok = not ghost.flagged or any(t.flagged for t in ghost_twins)
                metrics["ghosting.flagged"] = {"parallel": ghost.flagged, "twins": [t.flagged for t in ghost_twins],
                                               "pass": ok}
                if not ok:
                    reasons.append("ghosting.flagged: the ghosting gate flags the parallel clip and no twin: "
                                   + "; ".join(ghost.flags[:2]))
            pairs.append({"prompt_id": prompt.id, "seed": seed, "pass": not reasons, "reasons": reasons,
                          "metrics": metrics, "reported": reported})
    return {"verdict": "PASS" if pairs and all(p["pass"] for p in pairs) else "FAIL", "factor": factor,
            "pairs": pairs, "worst_ratio": worst}


def run_parallel_check(plan: ParallelCheckPlan, progress: bool = False) -> dict[str, Any]:
    """Generate (resumably), gate and judge; writes and returns ``<out>/parallel_check.json``."""
    from h3eval.gaterun import run_gates

    roles = variants(plan.recipe, plan.degree)
    order = [roles[r] for r in ("single", "parallel", "floor-hp", "floor-math")]
    run_plan = RunPlan(out=Path(plan.out), model=plan.model, recipes=order, prompts=plan.prompts,
                       seeds=list(plan.seeds), shape=plan.shape, baseline=roles["single"].name, kind="parallel-check",
                       device=plan.device, trajectory=True,
                       args={"command": "parallel-check", "degree": plan.degree, "plant": plan.plant})
    store, _ = open_run(run_plan)
    from h3.parallel.world import prepare_model

    prepare_model(plan.model)  # once here, not by the ranks at once
    launched = _generate_parallel(plan, store, roles["parallel"])
    manifest = fill_run(run_plan, runtime_factory=_runtime_factory(roles), progress=progress)
    summary = run_gates(plan.out, list(GATES), device=plan.device or "cpu", options=plan.gate_options,
                        progress=progress)
    verdict = judge(store, roles, plan.prompts, list(plan.seeds), plan.factor)
    from h3eval.ab import check_executed

    planted, not_as_configured = set(), {}
    for prompt in plan.prompts.prompts:
        for seed in plan.seeds:
            for role in ("single", "parallel"):
                record = store.read_record(roles[role].name, prompt.id, seed)
                if record is None:
                    continue
                if role == "parallel":
                    planted.add((record.executed.levers.get("parallel") or {}).get("planted_bug"))
                # Configured versus executed: the degree (ranks, one device each), the kind, the tiles, every lever.
                problems = [p for p in check_executed(roles[role], record)
                            if not (plan.plant and "a planted bug ran" in p)]
                if problems:
                    not_as_configured.setdefault(role, {})[f"{prompt.id}-s{seed}"] = problems
    if not_as_configured:
        verdict["verdict"] = "FAIL"
    out = {
        **verdict,
        "recipe": roles["single"].name, "degree": plan.degree, "kind": roles["parallel"].parallel.kind,
        "roles": {role: r.name for role, r in roles.items()},
        "planted_bug": sorted(p for p in planted if p) or None,
        "not_as_configured": not_as_configured,
        "run_status": manifest.status, "clip_errors": manifest.errors, "parallel_launch": launched,
        "gate_errors": summary.errors,
        "definition": ("pass iff d(single, parallel) <= factor x max(d(single, floor-hp), d(single, floor-math)) for "
                       "every judged metric of every pair, and the ghosting gate flags the parallel clip only where it "
                       "flags a twin (h3eval/parallel_check.py)"),
    }
    if manifest.errors or launched.get("errors"):
        out["verdict"] = "FAIL"
    atomic_write_json(Path(plan.out) / "parallel_check.json", out)
    return out
