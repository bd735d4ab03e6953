"""Fill a run: generate every (recipe, prompt, seed) clip through a backend, resumably.

Everything is validated before the run directory is touched. A rerun of the same command after a kill keeps every
finished clip whose MP4 hash matches its record and generates only the rest; a rerun with different inputs
(recipes, prompts, seeds, model, request shape, backend...: :func:`run_differences`) is refused naming each
difference, so one run directory never mixes two experiments. One process fills a run at a time (the store's lock).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from h3 import provenance
from h3.recipe import Recipe
from h3.runtime import (
    GenerateRequest, RequestError, canonical_model, check_model, model_default_size, resolve_request,
)
from h3eval.backends import Backend, BackendError, remove_clip
from h3eval.backends.inprocess import InProcessBackend, RuntimeFactory, default_runtime_factory
from h3eval.executed import check_executed, is_unverified
from h3eval.prompts import MAX_SEED, PromptSuite
from h3eval.store import PromptSuiteRef, RunManifest, RunStore, StoreError, utc_now

logger = logging.getLogger(__name__)


class RunError(ValueError):
    """A run cannot start (bad inputs, or the directory holds a different run)."""


@dataclass
class RequestShape:
    """The shape every request of a run asks for."""

    seconds: float | None = None
    num_frames: int | None = None
    height: int | None = None
    width: int | None = None

    def request(self, prompt_id: str, prompt: str, seed: int, images: dict | None = None) -> GenerateRequest:
        """``images``: the prompt's image inputs by role (fl2va keyframes, a ref2va reference)."""
        return GenerateRequest(prompt=prompt, seed=seed, prompt_id=prompt_id, seconds=self.seconds,
                               num_frames=self.num_frames, height=self.height, width=self.width, **(images or {}))


@dataclass
class RunPlan:
    out: Path
    model: str
    recipes: list[Recipe]
    prompts: PromptSuite
    seeds: list[int]
    shape: RequestShape = field(default_factory=RequestShape)
    baseline: str | None = None
    kind: str = "generate"
    backend: str = "inprocess"
    device: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    trajectory: bool = False
    """Record each request's latent trajectory next to its clip (for the trajectory gate)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What else decides the run's clips, compared on resume like the request shape (ab: speed protocol, rounds)."""

    def __post_init__(self) -> None:
        # The manifest names the model that runs (``tiny`` -> ``tiny-trained``); ``args`` keeps it as passed.
        self.model = canonical_model(self.model)

    @property
    def candidates(self) -> list[str]:
        return [r.name for r in self.recipes if r.name != self.baseline] if self.baseline else []

    def jobs(self) -> Iterable[tuple[Recipe, str, int]]:
        """Every (recipe, prompt id, seed), recipes interleaved per prompt so machine drift hits all sides alike."""
        for prompt in self.prompts.prompts:
            for seed in self.seeds:
                for recipe in self.recipes:
                    yield recipe, prompt.id, seed


def validate_plan(plan: RunPlan) -> tuple[int, int, int]:
    """Refuse a plan before anything is written; returns the resolved (num_frames, height, width) of its requests."""
    names = [r.name for r in plan.recipes]
    if len(set(names)) != len(names):
        raise RunError(f"recipe names must be distinct within a run, got {names}")
    if plan.baseline is not None and plan.baseline not in names:
        raise RunError(f"baseline {plan.baseline!r} is not among the run's recipes {names}")
    if not plan.seeds:
        raise RunError("a run needs at least one seed")
    for seed in plan.seeds:  # every seed, before anything runs (not only the first request's)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise RunError(f"seeds must be integers from 0 to 2**63-1, got {seed!r}")
    check_model(plan.model)
    default_size = model_default_size(plan.model)
    try:
        first = plan.prompts.prompts[0]
        return resolve_request(plan.shape.request(first.id, first.prompt, plan.seeds[0], first.images), default_size)
    except RequestError as exc:
        raise RunError(str(exc)) from None


def plan_facts(plan: RunPlan, resolved: tuple[int, int, int]) -> dict[str, Any]:
    """Every parameter besides recipes, prompts and seeds that decides what the run's clips are, as resolved: the
    request shape (``--seconds 5`` and ``--num-frames 120`` are the same clips), trajectories, the in-process model's
    weights (``model_identity``: a retrained checkpoint under the same name is another run), and the plan's own
    ``facts`` (the backend is the manifest's own field). Stored in ``run.json``'s ``plan``, compared on resume."""
    num_frames, height, width = resolved
    facts = {"num_frames": num_frames, "height": height, "width": width, "trajectory": plan.trajectory, **plan.facts}
    if plan.backend == "inprocess":  # a server's model is the server's (its records carry their model_sha256)
        from h3.runtime import model_identity

        identity = model_identity(plan.model)
        if identity is not None:
            facts["model_identity"] = identity
    return facts


def _new_manifest(plan: RunPlan, facts: dict[str, Any]) -> RunManifest:
    now = utc_now()
    return RunManifest(
        kind=plan.kind, created_at=now, updated_at=now, model=plan.model, backend=plan.backend,
        baseline=plan.baseline, candidates=plan.candidates,
        recipes={r.name: r.resolved() for r in plan.recipes},
        recipe_sha256={r.name: r.sha256() for r in plan.recipes},
        prompts=PromptSuiteRef(path=str(plan.prompts.path), sha256=plan.prompts.sha256, ids=plan.prompts.ids),
        seeds=list(plan.seeds), args=dict(plan.args), plan=facts, versions=provenance.versions(),
        hardware=provenance.hardware(plan.device or "cpu"), git=provenance.git_state(Path(__file__).parent),
    )


_SHAPE_ARGS = ("seconds", "num_frames", "height", "width")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def run_differences(existing: RunManifest, fresh: RunManifest) -> list[str]:
    """How ``fresh`` (this command's run) differs from the run on disk, one item per parameter: ``height 128 -> 256``.

    Recipes, prompts (by content), seeds, model, baseline and kind, and every fact of ``plan`` (a run written before
    ``plan`` existed is compared on the request shape as its command passed it)."""
    diffs = []
    for key in ("kind", "model", "baseline", "backend", "seeds"):
        if getattr(existing, key) != getattr(fresh, key):
            diffs.append(f"{key} {_show(getattr(existing, key))} -> {_show(getattr(fresh, key))}")
    old_recipes, new_recipes = existing.recipe_sha256, fresh.recipe_sha256
    if set(old_recipes) != set(new_recipes):
        diffs.append(f"recipes {sorted(old_recipes)} -> {sorted(new_recipes)}")
    else:
        diffs += [f"recipe {name} (its settings changed)" for name in sorted(old_recipes)
                  if old_recipes[name] != new_recipes[name]]
    if (existing.prompts and existing.prompts.sha256) != (fresh.prompts and fresh.prompts.sha256):
        diffs.append("prompts (the suite's content differs)")
    if existing.plan:
        for key in dict.fromkeys([*existing.plan, *fresh.plan]):
            old, new = existing.plan.get(key), fresh.plan.get(key)
            if old != new:
                diffs.append(f"{key} {_show(old)} -> {_show(new)}")
    else:
        for key in _SHAPE_ARGS:
            if key in existing.args and existing.args.get(key) != fresh.args.get(key):
                diffs.append(f"{key} {_show(existing.args.get(key))} -> {_show(fresh.args.get(key))}")
    return diffs


def _check_same_run(existing: RunManifest, fresh: RunManifest, root: Path) -> None:
    diffs = run_differences(existing, fresh)
    if diffs:
        raise RunError(
            f"{root} already holds a different run (differs in: {'; '.join(diffs)}); choose a new --out directory "
            "or rerun with the run's own parameters (nothing was changed)"
        )


def open_run(plan: RunPlan) -> tuple[RunStore, RunManifest]:
    """Create the run directory, or reopen it for resuming when it holds the same run. The caller holds the run's
    lock (:meth:`h3eval.store.RunStore.lock`)."""
    resolved = validate_plan(plan)
    store = RunStore(plan.out)
    fresh = _new_manifest(plan, plan_facts(plan, resolved))
    if store.exists():
        existing = store.read_manifest()
        _check_same_run(existing, fresh, plan.out)
        if not existing.plan:
            existing.plan = fresh.plan  # a run from before `plan` existed: compared on every fact from now on
        existing.status = "running"
        existing.errors = []
        store.write_manifest(existing)
        save_inputs(store, plan.prompts)
        return store, existing
    store.check_writable_root()
    store.write_manifest(fresh)
    save_inputs(store, plan.prompts)
    return store, fresh


def save_inputs(store: RunStore, prompts: PromptSuite) -> None:
    """Keep every image a prompt conditions on in the run (``inputs/<sha256>.png``), before any clip names it."""
    for prompt in prompts.prompts:
        for image in prompt.images.values():
            store.save_input(image)


def fill_run(
    plan: RunPlan,
    runtime_factory: RuntimeFactory | None = None,
    progress: bool = True,
    on_clip: Callable[[str, str, int, Any], None] | None = None,
    backend: Backend | None = None,
) -> RunManifest:
    """Generate every missing clip of the plan (see :func:`_fill_run`), holding the run's lock: a second process on
    the same run is refused before it writes anything."""
    validate_plan(plan)  # before the lock creates the directory: bad input leaves nothing behind
    with RunStore(plan.out).lock(f"h3eval {plan.kind}"):
        return _fill_run(plan, runtime_factory, progress, on_clip, backend)


def _fill_run(
    plan: RunPlan,
    runtime_factory: RuntimeFactory | None = None,
    progress: bool = True,
    on_clip: Callable[[str, str, int, Any], None] | None = None,
    backend: Backend | None = None,
) -> RunManifest:
    """Generate every missing clip of the plan; returns the final manifest (status complete, partial or failed).

    Clips come from ``backend`` (default: the in-process runtime, built by ``runtime_factory``) and each goes
    through the configured-versus-executed check (:func:`h3eval.executed.check_executed`): a clip that ran
    something other than its recipe is removed, its recipe stops, and the run is ``failed``.
    """
    store, manifest = open_run(plan)
    backend = backend or InProcessBackend(plan.model, plan.device, runtime_factory or default_runtime_factory)
    jobs = list(plan.jobs())
    todo = [(r, pid, seed) for r, pid, seed in jobs if store.read_record(r.name, pid, seed) is None]
    logger.info("%d of %d clips to generate in %s", len(todo), len(jobs), plan.out)
    bar = _progress(progress, len(jobs), len(jobs) - len(todo))
    errors = []
    stopped: set[str] = set()
    try:
        for recipe, pid, seed in todo:
            if recipe.name in stopped:
                bar.advance(f"{recipe.name}/{pid}-s{seed}")
                continue
            prompt = plan.prompts.by_id(pid)
            out = store.clip_path(recipe.name, pid, seed)
            try:
                request = plan.shape.request(pid, prompt.prompt, seed, prompt.images)
                if plan.trajectory:
                    record = backend.generate(recipe, request, out, trajectory=True)
                else:
                    record = backend.generate(recipe, request, out)
                problems = check_executed(recipe, record)
                if problems and not is_unverified(problems):
                    remove_clip(out)
                    stopped.add(recipe.name)
                    raise ExecutedMismatch("configured-versus-executed mismatch (clip removed, recipe stopped): "
                                           + "; ".join(problems))
                store.clear_clip_error(recipe.name, pid, seed)
                if on_clip is not None:
                    on_clip(recipe.name, pid, seed, record)
            except (BackendError, RequestError, StoreError, RuntimeError, ValueError, OSError) as exc:
                message = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ExecutedMismatch) else str(exc)
                logger.error("%s/%s-s%d failed: %s", recipe.name, pid, seed, message)
                errors.append(store.write_clip_error(recipe.name, pid, seed, message))
            bar.advance(f"{recipe.name}/{pid}-s{seed}")
    finally:
        bar.close()
        backend.close()
    manifest.errors = errors
    manifest.status = "failed" if stopped else ("complete" if not errors else "partial")
    store.write_manifest(manifest)
    return manifest


class ExecutedMismatch(RuntimeError):
    """A clip ran something other than its recipe (the configured-versus-executed check)."""


class _progress:
    """The clips' progress on stderr: one updating line with the ETA on a terminal, a line per clip otherwise."""

    def __init__(self, enabled: bool, total: int, done: int):
        from h3eval.progress import Progress

        self._progress = Progress("clips", total, unit="clip", done=done, enabled=enabled)
        self._started = time.perf_counter()

    def advance(self, what: str = "") -> None:
        self._progress.advance(what, f"{time.perf_counter() - self._started:.1f} s" if what else "")
        self._started = time.perf_counter()

    def close(self) -> None:
        self._progress.close()
