"""Reusing a clip that another run already made, when it is provably the same request (issue 51).

``h3eval demo`` makes the baseline's clips at every seed for the new-seed floor, before the signoff run's first look;
the signoff run asked for the same 16 requests again (15 % of the demo's wall, bench/demo_time/results/
2026-12-06-GenuineIntel-s27-cuts.md). :func:`reuse_clips` puts the source run's clip into the target run instead:
the MP4 byte for byte (a hard link where the filesystem allows) and its record, with ``extra["reused_from"]`` naming
the source, so the target run resumes as if it had made it (h3eval.ab skips a finished clip).

"The same request" is everything the runner compares on resume (h3eval.runner.run_differences) that decides a clip's
bytes, and what decides the floats on a CPU (h3.determinism): the model and its weights, the backend, the recipe's
settings (its sha256), the prompt suite's content, the prompt, the seed, the resolved request shape, the package
versions and the hardware (CPU, thread count, numerics mode). Any difference refuses the reuse, and the clip is made as
usual. Latent trajectories are not copied: a run that records them (``plan.trajectory``) reuses nothing.

What a reused clip does not carry: a second making of the request (the two runs' byte identity was the demo's
determinism check), and a latency timed among the target run's other requests: its record's timings are the source
run's.
"""

from __future__ import annotations

import logging
from pathlib import Path

from h3.atomic import atomic_write_json
from h3eval.floor import _link_or_copy  # the floor run links the same clips (atomic: a hard link, else a copy)
from h3eval.prompts import PromptSuite
from h3eval.store import RunManifest, RunStore, read_finished_record

logger = logging.getLogger(__name__)

REUSE_FACTS = ("num_frames", "height", "width", "model_identity")
"""The run plan's facts (h3eval.runner.plan_facts) that decide a clip's bytes and must be equal for a reuse."""


def reuse_problems(source: RunManifest, target: RunManifest, recipe: str) -> list[str]:
    """Why ``recipe``'s clips of the ``source`` run are not requests of the ``target`` run (empty: they are)."""
    problems = []
    for key in ("model", "backend", "versions", "hardware"):
        if getattr(source, key) != getattr(target, key):
            problems.append(f"{key} differs")
    if target.backend != "inprocess":
        problems.append(f"backend {target.backend!r} (only the in-process runtime's clips are reused)")
    if recipe not in source.recipe_sha256 or source.recipe_sha256[recipe] != target.recipe_sha256.get(recipe):
        problems.append(f"recipe {recipe!r} differs (sha256) or is missing")
    if source.prompts is None or target.prompts is None or source.prompts.sha256 != target.prompts.sha256:
        problems.append("prompt suites differ")
    for key in REUSE_FACTS:
        if key not in target.plan or source.plan.get(key) != target.plan.get(key):
            problems.append(f"{key} {source.plan.get(key)!r} -> {target.plan.get(key)!r}")
    if target.plan.get("trajectory"):
        problems.append("the target run records latent trajectories (not reused)")
    return problems


def reuse_clips(source_dir: str | Path, target: RunStore, manifest: RunManifest, recipe: str, prompts: PromptSuite,
                seeds: list[int]) -> list[str]:
    """Put ``recipe``'s finished clips of the run at ``source_dir`` into ``target`` (whose manifest is ``manifest``)
    for every (prompt, seed) the target has no finished clip of, when :func:`reuse_problems` finds none and the
    source clip's record asks what the target would (recipe sha256, prompt id and text, seed). Returns the clip stems
    reused; a refusal is logged, and the target makes those clips itself."""
    source = RunStore(source_dir)
    problems = reuse_problems(source.read_manifest(), manifest, recipe) if source.exists() else ["no run there"]
    if problems:
        logger.warning("not reusing %s's clips of %s: %s", recipe, source_dir, "; ".join(problems))
        return []
    reused = []
    for prompt in prompts.prompts:
        for seed in seeds:
            dst = target.clip_path(recipe, prompt.id, seed)
            src = source.clip_path(recipe, prompt.id, seed)
            record = read_finished_record(src)
            if read_finished_record(dst) is not None or record is None:
                continue
            asked = record.request
            if (record.recipe_sha256 != manifest.recipe_sha256[recipe] or asked.prompt_id != prompt.id
                    or asked.prompt != prompt.prompt or asked.seed != seed):
                logger.warning("not reusing %s: its record asked for another request", src)
                continue
            _link_or_copy(src, dst)
            record.extra["reused_from"] = str(src.resolve())
            atomic_write_json(dst.with_suffix(".json"), record.model_dump(mode="json"))  # last: marks it finished
            reused.append(dst.stem)
    return reused


def reused_from(record) -> str | None:
    """The source clip a record was reused from (:func:`reuse_clips`), or None for a clip made in its own run."""
    return (record.extra or {}).get("reused_from")
