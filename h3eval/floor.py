"""Noise floors: the suite's own noise, so a candidate's delta is read against a known scale.

``h3eval floor`` generates one recipe twice under two names (``R`` and ``R-repeat``) over a prompt suite and
seeds, then gates two kinds of pair against ``R``:

* ``R-repeat`` at the same seed — the **determinism** check: the same recipe, request and seed must give identical
  raw frames and PCM (and so exactly zero in every gate). If not, determinism is broken and the floor says so.
* ``R-newseed`` — ``R``'s clip of the *next* seed filed under this seed, i.e. the same prompt at a different seed:
  the scale of "a different video". Its mean per gate metric is the **new-seed floor** that policies may state
  thresholds against (``{fraction_of_floor = 0.1}``).

The floor is written to ``<run>/floor.json`` in the shape h3eval.policy reads
(``{"version", "metrics": {"<gate>.<metric>": value}, ...provenance}``).
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import Any

from h3.atomic import atomic_write_json
from h3.recipe import Recipe
from h3eval.prompts import PromptSuite
from h3eval.runner import RequestShape, RunError, RunPlan, fill_run
from h3eval.store import RunStore, read_gate_result

logger = logging.getLogger(__name__)

DEFAULT_FLOOR_GATES = ("fidelity", "audio", "ghosting")


def _name(recipe: Recipe | str) -> str:
    """A recipe's name (a floor from a run knows only the name: an imported recipe is no h3 Recipe)."""
    return recipe if isinstance(recipe, str) else recipe.name


def _newseed_name(recipe: Recipe | str) -> str:
    return f"{_name(recipe)}-newseed"


def _link_or_copy(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` atomically: a hard link where the filesystem allows, a copy otherwise."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.linktmp")
    tmp.unlink(missing_ok=True)
    try:
        tmp.hardlink_to(src)
    except OSError:
        shutil.copyfile(src, tmp)
    tmp.replace(dst)


def _file_newseed_view(store: RunStore, recipe: Recipe | str, prompts: PromptSuite, seeds: list[int]) -> int:
    """File R's clip of seed s[i+1] under seed s[i] as recipe R-newseed (hard link, or copy across devices)."""
    made = 0
    target = _newseed_name(recipe)
    for prompt in prompts.prompts:
        for i, seed in enumerate(seeds):
            source_seed = seeds[(i + 1) % len(seeds)]
            src_mp4 = store.clip_path(_name(recipe), prompt.id, source_seed)
            record = store.read_record(_name(recipe), prompt.id, source_seed)
            if record is None:
                continue
            dst_mp4 = store.clip_path(target, prompt.id, seed)
            existing = store.read_record(target, prompt.id, seed)
            if existing is not None and existing.mp4_sha256 == record.mp4_sha256:
                made += 1
                continue
            _link_or_copy(src_mp4, dst_mp4)
            # The trajectory gate reads <clip>.traj.npz of both sides.
            if src_mp4.with_suffix(".traj.npz").exists():
                _link_or_copy(src_mp4.with_suffix(".traj.npz"), dst_mp4.with_suffix(".traj.npz"))
            copied = record.model_copy(deep=True)
            copied.extra = {**copied.extra, "floor_source_seed": source_seed, "floor_view": "newseed"}
            atomic_write_json(store.record_path(target, prompt.id, seed), copied.model_dump(mode="json"))
            made += 1
    return made


def determinism_check(store: RunStore, recipe: Recipe, prompts: PromptSuite, seeds: list[int]) -> dict[str, Any]:
    """``R`` against ``R-repeat``: the same recipe, request and seed must give identical raw frames and PCM."""
    from h3eval.ab import off_identity

    result = off_identity(store, recipe.name, f"{recipe.name}-repeat", prompts.ids, seeds)
    # None: no pair could be compared byte for byte (every repeat made on another platform), so nothing is claimed.
    checked = result["identical"] > 0 or bool(result["differing"])
    return {"pairs": result["identical"] + len(result["differing"]),
            "identical": (result["identical"] > 0 and not result["differing"]) if checked else None,
            "mismatches": [d["pair"] for d in result["differing"]],
            "not_comparable": result["not_comparable"], "compared": result["compared"],
            "platform": result["platforms"].get(recipe.name)}


def floor_from_results(store: RunStore, recipe: Recipe | str,
                       gates: list[str]) -> tuple[dict[str, float], dict[str, int]]:
    """Mean of every gate metric over the new-seed pairs (missing values skipped and counted, never zero-filled):
    of the absolute value of a pair metric, and of ``|score - score.baseline|`` for a per-clip score that a gate
    writes for both sides (the reference-free dimensions, prompt faithfulness).

    Raises :class:`h3eval.store.GateResultError` on a result file that does not parse: the gate runner writes them
    atomically, so one that does not parse was damaged, and a floor must not quietly leave it out."""
    sums: dict[str, list[float]] = {}
    for gate in gates:
        for path in store.gate_result_files(gate, _newseed_name(recipe)):
            result = read_gate_result(path)  # a corrupt result stops the floor with the file named (exit 3)
            for name, metric in result.metrics.items():
                if name.endswith(".baseline"):
                    continue  # the baseline side of a per-clip score: folded into its metric's difference below
                value = metric.value
                side = result.metrics.get(f"{name}.baseline")
                if side is not None:
                    # A per-clip score (compare = "sides"): its floor is how much the score moves between seeds.
                    value = None if value is None or side.value is None else float(value) - float(side.value)
                if value is not None and math.isfinite(value):
                    sums.setdefault(f"{gate}.{name}", []).append(abs(float(value)))
    return ({k: sum(v) / len(v) for k, v in sums.items()}, {k: len(v) for k, v in sums.items()})


def measure_floor(
    *, model: str, recipe: Recipe, prompts: PromptSuite, seeds: list[int], out: str | Path,
    gates: list[str] | tuple[str, ...] = DEFAULT_FLOOR_GATES, shape: RequestShape | None = None,
    device: str | None = None, gate_options: dict[str, Any] | None = None, progress: bool = True,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Generate, gate and summarize a floor run; returns the floor file's content."""
    from h3eval.gaterun import run_gates
    from h3eval.policy import write_floor

    if len(seeds) < 2:
        raise RunError("a noise floor needs at least two seeds (the new-seed floor compares different seeds)")
    with RunStore(out).lock("h3eval floor"):  # generate, gate and write the floor as one holder
        repeat = recipe.model_copy(update={"name": f"{recipe.name}-repeat"})
        plan = RunPlan(out=Path(out), model=model, recipes=[recipe, repeat], prompts=prompts, seeds=list(seeds),
                       shape=shape or RequestShape(), baseline=recipe.name, kind="floor", device=device,
                       args=dict(args or {}, command="floor"))
        manifest = fill_run(plan, progress=progress)
        store = RunStore(out)
        _file_newseed_view(store, recipe, prompts, list(seeds))
        manifest = store.read_manifest()
        newseed = _newseed_name(recipe)
        if newseed not in manifest.candidates:
            manifest.candidates.append(newseed)
            manifest.recipes[newseed] = {**recipe.resolved(), "name": newseed,
                                         "floor_view": "clip of the next seed filed under this seed"}
            store.write_manifest(manifest)
        summary = run_gates(out, list(gates), device=device or "cpu", options=gate_options or {}, progress=progress)
        determinism = determinism_check(store, recipe, prompts, list(seeds))
        metrics, counts = floor_from_results(store, recipe, list(gates))
        floor = write_floor(
            store.floor_path, metrics, recipe=recipe.name, recipe_sha256=recipe.sha256(), model=model,
            prompts_sha256=prompts.sha256, seeds=list(seeds), pairs_per_metric=counts, determinism=determinism,
            gates=list(gates), gate_errors=len(summary.errors), run_status=manifest.status,
        )
        logger.info("floor: %d metrics, determinism %s", len(metrics), determinism)
        return {"metrics": metrics, "counts": counts, "determinism": determinism, "floor": floor,
                "gate_errors": summary.errors}


def newseed_floor_from_run(
    source_run: str | Path, recipe_name: str, out: str | Path, gates: list[str] | tuple[str, ...] = DEFAULT_FLOOR_GATES,
    device: str = "cpu", gate_options: dict[str, Any] | None = None, progress: bool = True,
    determinism: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The new-seed floor of ``recipe_name`` from clips an existing run already has (no generation).

    Builds a floor run at ``out`` whose baseline is the source run's ``recipe_name`` clips (hard links) and whose
    candidate is the new-seed view, gates it, and writes ``out/floor.json``.
    """
    from h3eval.gaterun import run_gates
    from h3eval.policy import write_floor
    from h3eval.prompts import Prompt, PromptSuite
    from h3eval.store import PromptSuiteRef, RunManifest, utc_now

    source = RunStore(source_run)
    manifest = source.read_manifest()
    if recipe_name not in manifest.recipes:
        raise RunError(f"{source_run} has no recipe {recipe_name!r}")
    if len(manifest.seeds) < 2:
        raise RunError("a new-seed floor needs at least two seeds in the source run")
    with RunStore(out).lock("h3eval floor"):
        store = RunStore(out)
        recipe = recipe_name  # the run's resolved recipe may be an imported one (no steps...): only its name is used
        prompts = PromptSuite(path=Path(manifest.prompts.path), sha256=manifest.prompts.sha256,
                              prompts=[Prompt(id=i, prompt="") for i in manifest.prompts.ids])
        for pid in manifest.prompts.ids:
            for seed in manifest.seeds:
                src = source.clip_path(recipe_name, pid, seed)
                if source.read_record(recipe_name, pid, seed) is None:
                    continue
                dst = store.clip_path(recipe_name, pid, seed)
                for suffix in (".mp4", ".traj.npz", ".json"):  # the record last: it marks the clip finished
                    if src.with_suffix(suffix).exists() and not dst.with_suffix(suffix).exists():
                        _link_or_copy(src.with_suffix(suffix), dst.with_suffix(suffix))
        _file_newseed_view(store, recipe, prompts, list(manifest.seeds))
        now = utc_now()
        newseed = _newseed_name(recipe)
        store.write_manifest(RunManifest(
            kind="floor", created_at=now, updated_at=now, model=manifest.model, backend="folder", baseline=recipe_name,
            candidates=[newseed], recipes={recipe_name: manifest.recipes[recipe_name],
                                           newseed: {**manifest.recipes[recipe_name], "name": newseed}},
            recipe_sha256={recipe_name: manifest.recipe_sha256.get(recipe_name, "")},
            prompts=PromptSuiteRef(path=manifest.prompts.path, sha256=manifest.prompts.sha256,
                                   ids=manifest.prompts.ids),
            seeds=list(manifest.seeds), status="complete", extra={"source_run": str(Path(source_run).resolve())},
        ))
        summary = run_gates(out, list(gates), device=device, options=gate_options or {}, progress=progress)
        metrics, counts = floor_from_results(store, recipe, list(gates))
        write_floor(store.floor_path, metrics, recipe=recipe_name, source_run=str(source_run),
                    seeds=list(manifest.seeds), pairs_per_metric=counts, determinism=determinism or {},
                    gates=list(gates), gate_errors=len(summary.errors))
        return {"metrics": metrics, "counts": counts, "gate_errors": summary.errors}


def parent_floors_from_run(
    run: str | Path, policy, device: str = "cpu", gate_options: dict[str, Any] | None = None, progress: bool = True,
    skip_gates: tuple[str, ...] = (),
) -> dict[str, dict[str, Any]]:
    """The new-seed floor of every recipe a rung of ``run`` is judged against as its parent under ``policy`` (other
    than the baseline), from the run's own clips of it (each against the same prompt's next seed, no generation):
    written to ``<run>/floors/<parent>/floor.json`` (:func:`h3eval.verdict.lineage.recipe_floor_path`), where the
    verdict reads the floor-relative thresholds of every comparison against that parent. The gates measured are the
    floor gates of the kinds its children are judged by, less ``skip_gates``. Returns parent -> its floor's content."""
    from h3eval.verdict.lineage import parents_judged, recipe_floor_path

    store = RunStore(run)
    manifest = store.read_manifest()
    out = {}
    for parent, kinds in sorted(parents_judged(policy, manifest).items()):
        gates = [g for g in policy.floor_gates(sorted(k for k in kinds if k)) if g not in skip_gates]
        if not gates:
            continue
        out[parent] = newseed_floor_from_run(run, parent, recipe_floor_path(store, parent).parent, gates=gates,
                                             device=device, gate_options=gate_options, progress=progress)
    return out
