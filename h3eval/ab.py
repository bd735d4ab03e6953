"""``h3eval ab``: baseline versus candidates, clip for clip, with a speed summary that production would believe.

One run holds, for every recipe (baseline first):

- ``warmup/<recipe>/<session>-w<i>.mp4``: warm-up requests, run and recorded (``extra["warmup"] = True``) but
  excluded from every number. They run once per process that still has work for the recipe (a resumed run is a
  fresh process and pays its own warm-up). Warm-up sends the suite's first prompt, as offline benchmarks do.
- ``speed/<protocol>/<recipe>/r<i>-<prompt>-s<seed>.mp4``: timing requests of the speed protocol, in addition to the
  quality clips and never used by gates. ``mixed`` cycles the suite's prompts (``prompts/mixed-length.jsonl`` has
  prompts of very different token lengths), ``repeated`` sends the first prompt every time (what hides per-shape
  recompiles, seed 001); ``both`` runs repeated then mixed and reports their ratio. ``rounds`` cycles of the
  suite per protocol (2 by default, so every shape has a first request and a steady one).
- ``clips/<recipe>/<prompt>-s<seed>.mp4``: the quality clips (prompts × seeds) the gates compare.

Timing requests all use the first seed (speed does not depend on the seed; the prompt's length does).
A killed run reruns to completion: finished requests (record parses, MP4 hash matches) are kept, half-written
temporary files are swept, the rest is generated once. One process runs at a time (the store's lock); a rerun with
other parameters is refused (h3eval.runner.run_differences).

Sessions: every process that works on the run is recorded in ``run.json``'s ``extra.ab.sessions`` when it starts
(id, pid, host, start) and marked when it ends (``complete``, ``partial``, ``failed``, ``interrupted``); a session
still marked ``running`` when the next one starts was killed, and is marked ``killed`` with the requests it
finished. Warm-up clips of an ended session that finished no timed request (killed during its warm-up) are
orphans, excluded from every number and kept by nothing: the next session removes them and says how many.

Requests are interleaved across recipes (request i of every recipe before request i + 1) so machine drift hits
both sides alike. After every request the configured-versus-executed check runs (:func:`check_executed`); a
mismatch removes that clip, stops that recipe and fails the run: it produces no speed number. An off-identity
candidate (every lever as the baseline's) must reproduce the baseline's frames and PCM byte for byte.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from h3.atomic import atomic_write_json, atomic_write_text
from h3.media import MediaError
from h3.recipe import Recipe
from h3.runtime import GenerateRequest, RequestError
from h3eval import speed as speedmod
from h3eval.ab_sessions import begin_session
from h3eval.ab_speed import build_speed
from h3eval.backends import Backend, BackendError, remove_clip
from h3eval.executed import check_executed, is_unverified
from h3eval.ladder import ladder_recipes
from h3eval.offidentity import identity_recipe, levers_of, off_identity
from h3eval.runner import RunPlan, open_run, validate_plan
from h3eval.store import ClipError, RunManifest, RunStore, StoreError, read_finished_record, utc_now

# Parts of an ab run with modules of their own, importable from here as before: the off-identity check
# (h3eval.offidentity), the ladder (h3eval.ladder), speed.json (h3eval.ab_speed), the sessions (h3eval.ab_sessions).
__all__ = ["AbPlan", "AbResult", "Job", "begin_session", "build_speed", "check_executed", "identity_recipe",
           "ladder_recipes", "levers_of", "off_identity", "quality_jobs", "run_ab", "run_ab_from_args", "speed_jobs",
           "sweep_partial_files"]

logger = logging.getLogger(__name__)
_clock = time.monotonic  # the time box's clock (a test plants its own)

Protocol = Literal["mixed", "repeated", "both"]



# -- the plan -------------------------------------------------------------------------------------------------------
@dataclass
class AbPlan:
    run: RunPlan
    """Recipes (baseline first), prompts, seeds, shape, output directory; ``run.kind`` is ``ab``."""
    warmup: int = 1
    warmup_recipes: list[str] | None = None
    """Recipes that get the warm-up requests (None: every recipe). A full-size baseline's warm-up costs minutes
    and warms nothing a compiled candidate needs: ``--warmup-recipe`` names the ones whose first request pays a
    one-time cost (torch.compile, kernel autotuning)."""
    baseline_last: bool = False
    """Within each (prompt, seed) the candidates' requests first, the baseline's last: under a time box, a cheap
    candidate then never waits behind a baseline request of minutes (a full-size 29-step baseline at 768x1344 is
    ~3.5 min), and the pairs still complete in the order of the suite."""
    by_recipe: bool = False
    """Every request of one recipe before the next recipe's (baseline first), the last recipe applied for good on the
    shared model, instead of interleaving: what lets an FP8 candidate follow the bf16 baseline of the 33 B model on
    an 80 GB card, where a reversible FP8 would hold both copies of every layer (it ran out of memory at the first
    switch on the 2026-12-06 H100 call). Machine drift then falls between the recipes instead of on both alike."""
    speed_protocol: Protocol = "mixed"
    speed_rounds: int = 2
    gpu_hourly_rate: float | None = None
    recompile_ratio: float = speedmod.RECOMPILE_RATIO
    recompile_margin_s: float = speedmod.RECOMPILE_MARGIN_S
    identity: list[str] = field(default_factory=list)
    """Candidates that must reproduce the baseline byte for byte (besides those detected by equal levers)."""
    time_box_s: float | None = None
    """Seconds from the session's start after which no request starts, nor one the recipe's previous request says
    would end past it: the rest are recorded as not run (the run is partial) and a rerun resumes them. A driver with a
    hard time limit (a lent GPU) keeps speed.json, the records and the manifest of what did run."""
    progress: bool = True
    """A line per finished request on stderr (on a terminal one updating line with the ETA): h3eval.progress."""

    @property
    def protocols(self) -> list[str]:
        """The speed protocols that run: none with ``speed_rounds`` 0 (speed.json then has the quality clips only)."""
        if not self.speed_rounds:
            return []
        return ["repeated", "mixed"] if self.speed_protocol == "both" else [self.speed_protocol]

    def validate(self) -> None:
        from h3eval.runner import RunError

        if self.speed_protocol not in ("mixed", "repeated", "both"):
            raise RunError(f"--speed-protocol must be mixed, repeated or both, got {self.speed_protocol!r}")
        if self.warmup < 0 or self.speed_rounds < 0:
            raise RunError("--warmup and --speed-rounds must be >= 0")
        unknown = sorted(set(self.warmup_recipes or ()) - {r.name for r in self.run.recipes})
        if unknown:
            raise RunError(f"--warmup-recipe names no recipe of the run: {', '.join(unknown)} (recipes: "
                           f"{', '.join(r.name for r in self.run.recipes)})")
        if self.time_box_s is not None and not (math.isfinite(self.time_box_s) and self.time_box_s > 0):
            raise RunError(f"--time-box must be a positive number of seconds, got {self.time_box_s}")
        if self.gpu_hourly_rate is not None and not (math.isfinite(self.gpu_hourly_rate) and self.gpu_hourly_rate > 0):
            raise RunError(f"--gpu-hourly-rate must be positive and finite, got {self.gpu_hourly_rate}")
        if self.run.baseline is None or self.run.recipes[0].name != self.run.baseline:
            raise RunError("the baseline must be the first recipe of an ab run")
        if self.run.trajectory and self.run.backend != "inprocess":
            raise RunError("latent trajectories (--trajectory) are recorded by the inprocess backend only")
        if len(self.run.recipes) < 2:
            raise RunError("an ab run needs a baseline and at least one --candidate")
        if self.by_recipe and self.baseline_last:
            raise RunError("--by-recipe runs each recipe's requests together; --baseline-last orders them within "
                           "each pair: choose one")


@dataclass
class Job:
    recipe: Recipe
    request: GenerateRequest
    out: Path
    kind: str  # "warmup" | "speed/<protocol>" | "quality"
    name: str

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.recipe.name}/{self.name}"


def sweep_partial_files(store: RunStore) -> list[Path]:
    """Remove the temporary files of atomic writes a killed process left behind (the store's
    :meth:`~h3eval.store.RunStore.sweep_partial_files`), and say so."""
    removed = store.sweep_partial_files()
    if removed:
        logger.warning("removed %d half-written file(s) of an interrupted run under %s", len(removed), store.root)
    return removed


def speed_jobs(plan: AbPlan, store: RunStore, protocol: str) -> list[Job]:
    prompts = plan.run.prompts.prompts
    seed = plan.run.seeds[0]
    jobs = []
    for i in range(plan.speed_rounds * len(prompts)):
        prompt = prompts[i % len(prompts)] if protocol == "mixed" else prompts[0]
        name = f"r{i:03d}-{prompt.id}-s{seed}"
        for recipe in plan.run.recipes:
            out = store.speed_path(protocol, recipe.name, name)
            jobs.append(Job(recipe, plan.run.shape.request(prompt.id, prompt.prompt, seed, prompt.images), out,
                            f"speed/{protocol}", name))
    return jobs


def quality_jobs(plan: AbPlan, store: RunStore) -> list[Job]:
    jobs = []
    order = list(plan.run.jobs())
    if plan.baseline_last:  # stable: the pairs keep their order, the baseline moves to the end of its pair
        order.sort(key=lambda job: (plan.run.prompts.ids.index(job[1]), plan.run.seeds.index(job[2]),
                                    job[0].name == plan.run.baseline))
    for recipe, pid, seed in order:
        prompt = plan.run.prompts.by_id(pid)
        request = plan.run.shape.request(pid, prompt.prompt, seed, prompt.images)
        jobs.append(Job(recipe, request, store.clip_path(recipe.name, pid, seed), "quality", f"{pid}-s{seed}"))
    return jobs


class _Session:
    """One process's pass over the run: ordering counters, failures, errors."""

    def __init__(self, plan: AbPlan, store: RunStore, backend: Backend):
        self.plan, self.store, self.backend = plan, store, backend
        self.id = utc_now().replace(":", "").replace("+0000", "Z") + "-" + uuid.uuid4().hex[:6]
        self.lock = threading.Lock()
        self.seq = 0
        self.failed: dict[str, list[str]] = {}
        self.errors: list[ClipError] = []
        self.stop_at = None if plan.time_box_s is None else _clock() + plan.time_box_s
        self.took: dict[str, float] = {}  # each recipe's longest request in this session (the time box's estimate)
        self.progress = None  # an h3eval.progress.Progress over the session's requests (set by _run_ab)

    def run(self, jobs: list[Job]) -> None:
        todo = [j for j in jobs if read_finished_record(j.out) is None]
        if self.backend.concurrency <= 1:
            for job in todo:
                self.reported(job)
        else:
            with ThreadPoolExecutor(max_workers=self.backend.concurrency) as pool:
                list(pool.map(self.reported, todo))

    def reported(self, job: Job) -> None:
        """:meth:`one`, then its line of progress (its own wall clock: the time box's ``_clock`` is left alone)."""
        if self.progress is None:
            return self.one(job)
        started = time.perf_counter()
        self.progress.now(job.label)
        self.one(job)
        made = read_finished_record(job.out) is not None
        self.progress.advance(job.label, f"{time.perf_counter() - started:.1f} s" if made else "not made")

    def one(self, job: Job) -> None:
        name = job.recipe.name
        with self.lock:
            if name in self.failed:
                return
            self.seq += 1
            seq = self.seq
        extra = {"session": self.id, "seq": seq, "request_name": job.name, "kind": job.kind,
                 "warmup": job.kind == "warmup"}
        if job.kind.startswith("speed/"):
            extra["protocol"] = job.kind.split("/", 1)[1]
        job.out.with_suffix(".error.json").unlink(missing_ok=True)
        if self.stop_at is not None and _clock() + self.took.get(name, 0.0) > self.stop_at:
            self.error(job, f"not run: the time box ({self.plan.time_box_s:g} s) ends before it would; a rerun "
                       "resumes it")
            return
        t0 = _clock()
        try:
            if job.kind == "quality" and self.plan.run.trajectory:
                record = self.backend.generate(job.recipe, job.request, job.out, extra, trajectory=True)
            else:
                record = self.backend.generate(job.recipe, job.request, job.out, extra)
        except (BackendError, RequestError, StoreError, MediaError, RuntimeError, ValueError, OSError) as exc:
            self.error(job, f"{type(exc).__name__}: {exc}")
            return
        # The time box's estimate of this recipe's next request: this one's wall time without a model load it paid
        # (the shared model loads inside the first request: 2 min at full size, never again).
        took = _clock() - t0 - float(getattr(self.backend, "last_load_s", 0.0) or 0.0)
        with self.lock:
            self.took[name] = max(self.took.get(name, 0.0), took)
        problems = check_executed(job.recipe, record)
        if is_unverified(problems):
            return  # kept, and the speed summary marks the recipe unverified
        if problems:
            remove_clip(job.out)
            with self.lock:
                self.failed.setdefault(name, problems)
            self.error(job, "configured-versus-executed mismatch (clip removed, recipe stopped): "
                       + "; ".join(problems))

    def error(self, job: Job, message: str) -> None:
        logger.error("%s failed: %s", job.label, message)
        err = ClipError(recipe=job.recipe.name, prompt_id=job.request.prompt_id or "", seed=job.request.seed,
                        error=f"{job.label}: {message}", at=utc_now())
        atomic_write_json(job.out.with_suffix(".error.json"), err.model_dump(mode="json"))
        with self.lock:
            self.errors.append(err)



@dataclass
class AbResult:
    manifest: RunManifest
    speed: dict[str, Any]
    executed_mismatches: dict[str, list[str]]
    off_identity: dict[str, dict[str, Any]]




def _run_by_recipe(plan: AbPlan, store: RunStore, backend: Backend, session: _Session, warmups_for) -> None:
    """``--by-recipe``: each recipe's warm-up, speed and quality requests together, recipe after recipe; the
    in-process backend applies the last recipe with work left for good (its ``final_recipe``)."""
    every = [j for protocol in plan.protocols for j in speed_jobs(plan, store, protocol)] + quality_jobs(plan, store)
    blocks = [[j for j in every if j.recipe.name == recipe.name] for recipe in plan.run.recipes]
    left = [block for block in blocks if any(read_finished_record(j.out) is None for j in block)]
    if left and hasattr(backend, "final_recipe"):
        backend.final_recipe = left[-1][0].recipe.name
    for block in left:
        session.run(warmups_for(block) + block)


def run_ab(plan: AbPlan, backend: Backend) -> AbResult:
    """Run (or resume) an A/B run; writes clips, records, ``speed.json``/``speed.md`` and the manifest. Holds the
    run's lock throughout: a second process on the same run is refused before it writes anything."""
    plan.validate()
    plan.run.kind = "ab"
    plan.run.facts = {"speed_protocol": plan.speed_protocol, "speed_rounds": plan.speed_rounds}
    if plan.by_recipe:  # (only then: runs recorded before the option resume as they were)
        plan.run.facts["order"] = "by_recipe"
    validate_plan(plan.run)  # before the lock creates the directory: bad input leaves nothing behind
    with RunStore(plan.run.out).lock("h3eval ab"):
        return _run_ab(plan, backend)


def _run_ab(plan: AbPlan, backend: Backend) -> AbResult:
    store, manifest = open_run(plan.run)
    sweep_partial_files(store)
    session = _Session(plan, store, backend)
    entry = begin_session(store, manifest, session.id)
    warm_done: set[str] = set()
    session.progress = _progress(plan, store)

    def warmups_for(jobs: list[Job]) -> list[Job]:
        need = {j.recipe.name for j in jobs if read_finished_record(j.out) is None} - warm_done
        if plan.warmup_recipes is not None:
            need &= set(plan.warmup_recipes)
        first = plan.run.prompts.prompts[0]
        out = []
        for i in range(plan.warmup):
            for recipe in plan.run.recipes:
                if recipe.name in need:
                    request = plan.run.shape.request(first.id, first.prompt, plan.run.seeds[0], first.images)
                    out.append(Job(recipe, request,
                                   store.warmup_path(recipe.name, session.id, i), "warmup", f"w{i}"))
        warm_done.update(need)
        return out

    interrupted: KeyboardInterrupt | None = None
    try:
        if plan.by_recipe:
            _run_by_recipe(plan, store, backend, session, warmups_for)
        else:
            for protocol in plan.protocols:
                jobs = speed_jobs(plan, store, protocol)
                session.run(warmups_for(jobs) + jobs)
            jobs = quality_jobs(plan, store)
            session.run(warmups_for(jobs) + jobs)
    except KeyboardInterrupt as exc:
        # Ctrl-C, or a driver's SIGINT at its time limit: what finished still gets its speed.json and a manifest
        # marked partial (the interrupted request left only .tmp files, swept on resume), the session is marked
        # "interrupted"; then the interrupt goes on.
        interrupted = exc
    except BaseException as exc:
        # A bug: say so in run.json (a kill -9 cannot; the next session marks it "killed").
        entry.update(outcome=f"error: {type(exc).__name__}", ended_at=utc_now(), requests=session.seq)
        try:
            store.write_manifest(manifest)
        except OSError:
            logger.warning("could not record the end of session %s in %s", session.id, store.manifest_path)
        raise
    finally:
        session.progress.close()
        backend.close()

    baseline = plan.run.baseline
    identity_names = [r.name for r in plan.run.recipes[1:]
                      if r.name in plan.identity or levers_of(r) == levers_of(plan.run.recipes[0])]
    identity = {name: off_identity(store, baseline, name, plan.run.prompts.ids, plan.run.seeds)
                for name in identity_names}
    speed = build_speed(plan, store, session.failed)
    atomic_write_json(store.speed_json_path, speed)
    atomic_write_text(store.speed_md_path, speedmod.render_markdown(speed))

    manifest.errors = session.errors
    if session.failed or any(not v["passed"] for v in identity.values()):
        manifest.status = "failed"
    elif session.errors or interrupted is not None:
        manifest.status = "partial"
    else:
        manifest.status = "complete"
    entry.update(outcome="interrupted" if interrupted is not None else manifest.status, ended_at=utc_now(),
                 requests=session.seq)
    manifest.extra["ab"] = {
        "speed": "speed.json", "protocols": plan.protocols, "executed_mismatches": session.failed,
        "off_identity": identity, "sessions": manifest.extra["ab"]["sessions"],
        "interrupted": utc_now() if interrupted is not None else None,
    }
    store.write_manifest(manifest)
    if interrupted is not None:
        raise interrupted
    return AbResult(manifest, speed, session.failed, identity)


def _progress(plan: AbPlan, store: RunStore):
    """The session's progress over every request it will send: the speed protocols' and the quality clips' not yet on
    disk, and the warm-ups of the recipes that have any of them (as ``warmups_for`` sends them)."""
    from h3eval.progress import Progress

    jobs = [j for p in plan.protocols for j in speed_jobs(plan, store, p)] + quality_jobs(plan, store)
    todo = [j for j in jobs if read_finished_record(j.out) is None]
    warm = {j.recipe.name for j in todo} & set(plan.warmup_recipes if plan.warmup_recipes is not None
                                                 else [r.name for r in plan.run.recipes])
    total = len(todo) + plan.warmup * len(warm)
    return Progress("ab", total + len(jobs) - len(todo), done=len(jobs) - len(todo), enabled=plan.progress)


def run_ab_from_args(*, baseline, candidates, prompts, out, model="tiny", seeds="0", backend="inprocess", urls=(),
                     api_key=None, warmup=1, warmup_recipes=None, baseline_last=False, by_recipe=False,
                     speed_protocol="mixed",
                     speed_rounds=2, gpu_hourly_rate=None,
                     off_identity=False, trajectory=False, seconds=None, num_frames=None, height=None, width=None,
                     timeout_s=1800.0, device=None, runtime_factory=None, share_model=True,
                     text_encoder="resident", time_box_s=None, progress=True) -> AbResult:
    """``h3eval ab`` as a function of its options (recipe names or paths, a prompt suite name, seeds as text): builds
    the plan and the backend and runs (or resumes) the A/B run.

    ``share_model`` (inprocess): every recipe takes turns on one loaded model (the default; see
    :mod:`h3eval.backends.inprocess`); ``text_encoder``: ``resident`` or ``offload`` (streamed from host memory,
    :mod:`h3.residency`)."""
    from h3.recipe import load_recipe
    from h3.residency import TEXT_ENCODER_RESIDENCY
    from h3.runtime import SharedModelError, model_default_size
    from h3eval.prompts import load_prompts, parse_seeds
    from h3eval.runner import RequestShape, RunError, RunPlan

    base = load_recipe(baseline)
    recipes = [base] + ladder_recipes(base, [load_recipe(c) for c in candidates])  # a rung's parent joins the run
    if off_identity:
        recipes.append(identity_recipe(base))
    if backend not in ("inprocess", "http"):
        raise RunError(f"--backend must be inprocess or http, got {backend!r} (clips from elsewhere: h3eval import)")
    if backend == "http" and not urls:
        raise RunError("--backend http needs at least one --url")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise RunError(f"--timeout must be a positive finite number of seconds, got {timeout_s}")
    if backend == "inprocess" and urls:
        raise RunError("--url is for --backend http; the inprocess backend runs the h3 runtime in this process")
    if text_encoder not in TEXT_ENCODER_RESIDENCY:
        raise RunError(f"--text-encoder must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, got {text_encoder!r}")
    if backend == "http" and (text_encoder != "resident" or not share_model):
        raise RunError("--text-encoder and --no-share-model set up the inprocess backend; a server sets its own "
                       "(`h3 serve --text-encoder ...`)")
    plan = AbPlan(
        run=RunPlan(
            out=Path(out), model=model, recipes=recipes, prompts=load_prompts(prompts), seeds=parse_seeds(seeds),
            shape=RequestShape(seconds=seconds, num_frames=num_frames, height=height, width=width),
            baseline=base.name, kind="ab", backend=backend, device=device, trajectory=trajectory,
            args=dict(command="ab", baseline=baseline, candidates=list(candidates), prompts=str(prompts), model=model,
                      seeds=seeds, backend=backend, urls=list(urls), warmup=warmup,
                      warmup_recipes=list(warmup_recipes) if warmup_recipes else None, baseline_last=baseline_last,
                      by_recipe=by_recipe, speed_protocol=speed_protocol,
                      speed_rounds=speed_rounds, gpu_hourly_rate=gpu_hourly_rate, off_identity=off_identity,
                      trajectory=trajectory, seconds=seconds, num_frames=num_frames, height=height, width=width,
                      device=device, share_model=share_model, text_encoder=text_encoder, time_box_s=time_box_s),
        ),
        warmup=warmup, warmup_recipes=list(warmup_recipes) if warmup_recipes else None, baseline_last=baseline_last,
        by_recipe=by_recipe, speed_protocol=speed_protocol, speed_rounds=speed_rounds, gpu_hourly_rate=gpu_hourly_rate,
        time_box_s=time_box_s, progress=progress,
    )
    plan.validate()
    if backend == "http":
        from h3eval.backends.http import HttpBackend

        impl = HttpBackend(list(urls), model_default_size(model), api_key=api_key, timeout_s=timeout_s)
    else:
        from h3eval.backends.inprocess import InProcessBackend

        impl = InProcessBackend(model, device, runtime_factory, shared=share_model and runtime_factory is None,
                                text_encoder=text_encoder)
        try:
            impl.check_recipes(recipes, last_for_good=by_recipe)
        except SharedModelError as exc:
            raise RunError(str(exc)) from None
    return run_ab(plan, impl)
