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
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from h3.atomic import atomic_write_json, atomic_write_text
from h3.media import MediaError
from h3.record import ClipRecord
from h3.recipe import NOT_COMPUTATION, Recipe, recipe_from_dict
from h3.runtime import GenerateRequest, RequestError
from h3eval import speed as speedmod
from h3eval.backends import Backend, BackendError, remove_clip
from h3eval.executed import check_executed, is_unverified
from h3eval.runner import RunPlan, open_run, validate_plan
from h3eval.store import ClipError, RunManifest, RunStore, StoreError, read_finished_record, utc_now

logger = logging.getLogger(__name__)
_clock = time.monotonic  # the time box's clock (a test plants its own)

Protocol = Literal["mixed", "repeated", "both"]


# -- off-identity ---------------------------------------------------------------------------------------------------
def levers_of(recipe: Recipe) -> dict[str, Any]:
    """What the recipe computes: everything but its name, description and how it is signed off
    (:data:`h3.recipe.NOT_COMPUTATION`), so that a candidate with the baseline's computation gets the off-identity
    check whatever signoff kind it declares."""
    return {k: v for k, v in recipe.resolved().items() if k not in ("name", "description", *NOT_COMPUTATION)}


def identity_recipe(baseline: Recipe) -> Recipe:
    """The baseline with every lever as it is (none added): must reproduce the baseline byte for byte."""
    data = baseline.resolved()
    data.update(name=f"{baseline.name}-identity", description=f"off-identity check of {baseline.name}")
    return recipe_from_dict(data, source="off-identity")


def off_identity(store: RunStore, baseline: str, candidate: str, prompt_ids: list[str],
                 seeds: list[int]) -> dict[str, Any]:
    """Compare frames and PCM hashes of every quality pair; pass only when every pair exists and matches.

    Byte identity is promised on one platform (h3/determinism.py): a pair whose two clips were made on different
    platforms (CPU model, vector capability, MKL reproducibility mode, threads, torch or GPU), or on a CPU whose MKL
    ran without reproducibility, cannot fail the check by differing; it is listed under ``not_comparable`` with the
    platform keys that differ, and counted in neither ``identical`` nor ``differing``.
    """
    from h3.determinism import byte_identity_promised, platform_difference

    identical, differing, missing, not_comparable = 0, [], [], []
    platforms: dict[str, Any] = {}
    for pid in prompt_ids:
        for seed in seeds:
            a, b = store.read_record(baseline, pid, seed), store.read_record(candidate, pid, seed)
            if a is None or b is None:
                missing.append(f"{pid}-s{seed}")
                continue
            na, nb = (a.hardware or {}).get("numerics"), (b.hardware or {}).get("numerics")
            platforms.setdefault(baseline, na)
            platforms.setdefault(candidate, nb)
            same_bytes = a.frames_sha256 == b.frames_sha256 and a.pcm_sha256 == b.pcm_sha256
            if (a.extra or {}).get("hash_source", "raw") != (b.extra or {}).get("hash_source", "raw"):
                differing.append({"pair": f"{pid}-s{seed}", "why": "hashes of different sources (raw vs decoded)"})
            elif same_bytes:
                identical += 1
            elif platform_difference(na, nb) or not (byte_identity_promised(na) and byte_identity_promised(nb)):
                keys = platform_difference(na, nb)
                not_comparable.append({
                    "pair": f"{pid}-s{seed}",
                    "why": (f"made on different platforms (differ in {', '.join(keys)})" if keys
                            else "made on a CPU whose MKL ran without reproducibility (MKL_CBWR)"),
                })
            else:
                differing.append({"pair": f"{pid}-s{seed}", "frames_equal": a.frames_sha256 == b.frames_sha256,
                                  "pcm_equal": a.pcm_sha256 == b.pcm_sha256})
    return {"candidate": candidate, "pairs": len(prompt_ids) * len(seeds), "identical": identical,
            "differing": differing, "missing": missing, "not_comparable": not_comparable,
            "compared": "sha256 of the raw frames (uint8) and PCM (int16) of every quality pair",
            "platforms": platforms, "passed": not differing and not missing}


# -- the ladder -----------------------------------------------------------------------------------------------------
def ladder_recipes(baseline: Recipe, candidates: list[Recipe], load=None) -> list[Recipe]:
    """The candidates with the parents they name (``parent = "turbo4-tiny"``) that are not in the run added before
    them, so that every rung is generated in the same run with the same prompts and seeds as the rung below it and
    judged against it (:mod:`h3eval.verdict.lineage`). A parent named like the baseline is the baseline. ``load``: how
    a parent's name is read (default :func:`h3.recipe.load_recipe`: a shipped name or a path)."""
    from h3.recipe import RecipeError, load_recipe
    from h3eval.runner import RunError

    load = load or load_recipe
    out: list[Recipe] = []
    names = {baseline.name}

    listed: set[int] = set()  # candidates already placed (as a parent of an earlier one)

    def add(recipe: Recipe, chain: tuple[str, ...]) -> None:
        if id(recipe) in listed or (chain and recipe.name in names):
            return  # a name given twice on the command line goes through, for the plan's own check to refuse
        parent = recipe.parent
        if parent is not None and parent not in names and parent in (*chain, recipe.name):
            raise RunError(f"recipe {recipe.name!r}: its parents form a loop "
                           f"({' -> '.join((*chain, recipe.name, parent))})")
        if parent is not None and parent not in names and parent not in {c.name for c in candidates}:
            try:
                above = load(parent)
            except RecipeError as exc:
                raise RunError(f"recipe {recipe.name!r} names parent {parent!r}, which cannot be read: {exc}") from None
            logger.info("ladder: %s is judged against its parent %s, which joins the run", recipe.name, parent)
            add(above, (*chain, recipe.name))
        elif parent is not None and parent not in names:
            add(next(c for c in candidates if c.name == parent), (*chain, recipe.name))
        names.add(recipe.name)
        listed.add(id(recipe))
        out.append(recipe)

    for candidate in candidates:
        add(candidate, ())
    return out


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


def build_speed(plan: AbPlan, store: RunStore, refused: dict[str, list[str]]) -> dict[str, Any]:
    """speed.json's content, from the records on disk (so a resumed run counts every finished request)."""
    baseline = plan.run.baseline
    names = [r.name for r in plan.run.recipes]
    per_recipe_all: dict[str, list[ClipRecord]] = {}
    for name in names:
        recs = store.finished_records(store.warmup_dir(name))
        for protocol in plan.protocols:
            recs += store.finished_records(store.speed_dir(protocol, name))
        recs += store.finished_records(store.clip_dir(name))
        per_recipe_all[name] = recs
    recompiles = {name: speedmod.detect_recompiles(per_recipe_all[name], plan.recompile_ratio,
                                                   plan.recompile_margin_s) for name in names}
    sections: dict[str, dict[str, Any]] = {}
    for section in [*plan.protocols, "quality_clips"]:
        directory = (lambda n: store.clip_dir(n)) if section == "quality_clips" else (
            lambda n, s=section: store.speed_dir(s, n))
        records = {n: store.finished_records(directory(n)) for n in names}
        base_by_name = {(r.extra or {}).get("request_name") or f"{r.request.prompt_id}-s{r.request.seed}": r
                        for r in records[baseline]}
        out: dict[str, Any] = {}
        for name in names:
            if name in refused:
                out[name] = {"status": "refused", "reason": "configured-versus-executed mismatch: "
                             + "; ".join(refused[name])}
                continue
            recs = records[name]
            if not recs:
                out[name] = {"status": "empty", "reason": "no finished request"}
                continue
            summary = {"status": "ok", **speedmod.summarize(recs, plan.gpu_hourly_rate)}
            summary["executed_verified"] = not any("executed" in (r.extra or {}).get("unreported", []) for r in recs)
            if name != baseline and baseline not in refused:
                pairs = []
                for r in recs:
                    key = (r.extra or {}).get("request_name") or f"{r.request.prompt_id}-s{r.request.seed}"
                    if key in base_by_name:
                        pairs.append((base_by_name[key].timings.generation_side_latency_s,
                                      r.timings.generation_side_latency_s))
                summary["speedup"] = speedmod.speedup([p[0] for p in pairs], [p[1] for p in pairs])
            rc = recompiles[name]
            if rc.get("available"):
                mine = {(r.extra or {}).get("request_name") for r in recs}
                shapes = [s for s in rc["shapes"] if s["request"] in mine]
                summary["recompiles"] = {**{k: v for k, v in rc.items() if k != "shapes"}, "shapes": shapes,
                                         "flagged": bool(shapes)}
            else:
                summary["recompiles"] = dict(rc)  # not available: neither flagged nor cleared
            out[name] = summary
        sections[section] = out
    speed: dict[str, Any] = {
        "run": str(store.root), "baseline": baseline, "notices": store.weights_notices(), "protocols": sections,
        "recompiles": recompiles,
        "definitions": {
            "quantile": "numpy quantile method='linear' (Hyndman & Fan type 7)",
            "generation_side_latency": "seed 000: text encode + DiT + decodes + frame prep/D2H; no mux, no network",
            "request_to_file_latency": "seed 002: request in to file on disk (http: client submit to file)",
            "real_time_factor": "generation-side latency / clip duration (seed 000), p50",
            "usd_per_clip": "p50 request-to-file s x gpu_hourly_rate / 3600",
            "speedup": (f"mean(baseline)/mean(candidate) generation-side latency over paired requests; "
                        f"{int(speedmod.CI_LEVEL * 100)}% paired BCa bootstrap (h3eval.stats), "
                        f"B={speedmod.BOOTSTRAP_B}, "
                        f"seed {speedmod.BOOTSTRAP_SEED}"),
            "recompile": f"first request at a sequence shape > max({plan.recompile_ratio}x, "
                         f"+{plan.recompile_margin_s} s) of the recipe's steady-state median",
            "warmup": "warm-up requests are recorded under warmup/ and excluded from every number",
        },
        "gpu_hourly_rate": plan.gpu_hourly_rate,
    }
    if plan.protocols == ["repeated", "mixed"]:
        ratios = {}
        for name in names:
            m, r = sections["mixed"].get(name, {}), sections["repeated"].get(name, {})
            if m.get("status") == "ok" and r.get("status") == "ok" and m.get("generation_side_latency_s") and \
                    r.get("generation_side_latency_s"):
                mp, rp = m["generation_side_latency_s"]["p50"], r["generation_side_latency_s"]["p50"]
                ratios[name] = {"mixed_p50_s": mp, "repeated_p50_s": rp, "ratio": mp / rp}
        speed["repeated_vs_mixed"] = ratios
    return speed


@dataclass
class AbResult:
    manifest: RunManifest
    speed: dict[str, Any]
    executed_mismatches: dict[str, list[str]]
    off_identity: dict[str, dict[str, Any]]


def _sessions(manifest: RunManifest) -> list[dict[str, Any]]:
    """``extra.ab.sessions`` as a list of entries (runs written before entries existed listed bare ids)."""
    ab = manifest.extra.get("ab")
    raw = ab.get("sessions") if isinstance(ab, dict) else None
    return [entry if isinstance(entry, dict) and "id" in entry else {"id": str(entry), "outcome": "unknown"}
            for entry in (raw if isinstance(raw, list) else [])]


def _session_requests(store: RunStore, recipes: list[str]) -> dict[str, int]:
    """Finished timed requests (speed and quality clips) per session, from the records on disk."""
    counts: dict[str, int] = {}
    for name in recipes:
        for directory in [store.clip_dir(name), *(store.speed_dir(p, name) for p in ("repeated", "mixed"))]:
            for record in store.finished_records(directory):
                session = str((record.extra or {}).get("session", ""))
                counts[session] = counts.get(session, 0) + 1
    return counts


def begin_session(store: RunStore, manifest: RunManifest, session_id: str) -> dict[str, Any]:
    """Record a session in ``run.json`` before it generates anything; mark the sessions a kill left ``running`` as
    ``killed``, and remove the warm-up clips of ended sessions that finished no timed request. Returns the entry."""
    sessions = _sessions(manifest)
    recipes = list(manifest.recipes)
    finished = _session_requests(store, recipes)
    for entry in sessions:
        if entry.get("outcome") == "running":  # the lock is ours: that process is gone without saying so
            entry.update(outcome="killed", noticed_by=session_id, finished_requests=finished.get(entry["id"], 0))
    swept: dict[str, int] = {}
    for name in recipes:
        for session, files in store.warmup_files(name).items():
            if session != session_id and not finished.get(session):
                for path in files:
                    path.unlink(missing_ok=True)
                swept[session] = swept.get(session, 0) + sum(1 for p in files if p.suffix == ".mp4")
    for entry in sessions:
        if swept.get(entry["id"]):
            entry["warmups_removed"] = entry.get("warmups_removed", 0) + swept[entry["id"]]
    if swept:
        logger.warning("removed %d orphaned warm-up clip(s) of %d ended session(s) that finished no timed request",
                       sum(swept.values()), len(swept))
    entry = {"id": session_id, "pid": os.getpid(), "host": socket.gethostname(), "started_at": utc_now(),
             "outcome": "running"}
    sessions.append(entry)
    if not isinstance(manifest.extra.get("ab"), dict):
        manifest.extra["ab"] = {}
    manifest.extra["ab"]["sessions"] = sessions
    store.write_manifest(manifest)
    return entry


def run_ab(plan: AbPlan, backend: Backend) -> AbResult:
    """Run (or resume) an A/B run; writes clips, records, ``speed.json``/``speed.md`` and the manifest. Holds the
    run's lock throughout: a second process on the same run is refused before it writes anything."""
    plan.validate()
    plan.run.kind = "ab"
    plan.run.facts = {"speed_protocol": plan.speed_protocol, "speed_rounds": plan.speed_rounds}
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
                     api_key=None, warmup=1, warmup_recipes=None, baseline_last=False, speed_protocol="mixed",
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
                      speed_protocol=speed_protocol,
                      speed_rounds=speed_rounds, gpu_hourly_rate=gpu_hourly_rate, off_identity=off_identity,
                      trajectory=trajectory, seconds=seconds, num_frames=num_frames, height=height, width=width,
                      device=device, share_model=share_model, text_encoder=text_encoder, time_box_s=time_box_s),
        ),
        warmup=warmup, warmup_recipes=list(warmup_recipes) if warmup_recipes else None, baseline_last=baseline_last,
        speed_protocol=speed_protocol, speed_rounds=speed_rounds, gpu_hourly_rate=gpu_hourly_rate,
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
            impl.check_recipes(recipes)
        except SharedModelError as exc:
            raise RunError(str(exc)) from None
    return run_ab(plan, impl)
