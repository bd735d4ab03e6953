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
temporary files are swept, the rest is generated once.

Requests are interleaved across recipes (request i of every recipe before request i + 1) so machine drift hits
both sides alike. After every request the configured-versus-executed check runs (:func:`check_executed`); a
mismatch removes that clip, stops that recipe and fails the run: it produces no speed number. An off-identity
candidate (every lever as the baseline's) must reproduce the baseline's frames and PCM byte for byte.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from h3.atomic import atomic_write_json, atomic_write_text
from h3.media import MediaError
from h3.record import ClipRecord
from h3.recipe import Recipe, recipe_from_dict
from h3.runtime import GenerateRequest, RequestError
from h3eval import speed as speedmod
from h3eval.backends import Backend, BackendError, remove_clip
from h3eval.executed import check_executed, is_unverified
from h3eval.runner import RunPlan, open_run
from h3eval.store import ClipError, RunManifest, RunStore, StoreError, read_finished_record, utc_now

logger = logging.getLogger(__name__)

Protocol = Literal["mixed", "repeated", "both"]


# -- off-identity ---------------------------------------------------------------------------------------------------
def levers_of(recipe: Recipe) -> dict[str, Any]:
    return {k: v for k, v in recipe.resolved().items() if k not in ("name", "description")}


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


# -- the plan -------------------------------------------------------------------------------------------------------
@dataclass
class AbPlan:
    run: RunPlan
    """Recipes (baseline first), prompts, seeds, shape, output directory; ``run.kind`` is ``ab``."""
    warmup: int = 1
    speed_protocol: Protocol = "mixed"
    speed_rounds: int = 2
    gpu_hourly_rate: float | None = None
    recompile_ratio: float = speedmod.RECOMPILE_RATIO
    recompile_margin_s: float = speedmod.RECOMPILE_MARGIN_S
    identity: list[str] = field(default_factory=list)
    """Candidates that must reproduce the baseline byte for byte (besides those detected by equal levers)."""

    @property
    def protocols(self) -> list[str]:
        return ["repeated", "mixed"] if self.speed_protocol == "both" else [self.speed_protocol]

    def validate(self) -> None:
        from h3eval.runner import RunError

        if self.speed_protocol not in ("mixed", "repeated", "both"):
            raise RunError(f"--speed-protocol must be mixed, repeated or both, got {self.speed_protocol!r}")
        if self.warmup < 0 or self.speed_rounds < 0:
            raise RunError("--warmup and --speed-rounds must be >= 0")
        if self.gpu_hourly_rate is not None and not self.gpu_hourly_rate > 0:
            raise RunError(f"--gpu-hourly-rate must be positive, got {self.gpu_hourly_rate}")
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
    for recipe, pid, seed in plan.run.jobs():
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

    def run(self, jobs: list[Job]) -> None:
        todo = [j for j in jobs if read_finished_record(j.out) is None]
        if self.backend.concurrency <= 1:
            for job in todo:
                self.one(job)
        else:
            with ThreadPoolExecutor(max_workers=self.backend.concurrency) as pool:
                list(pool.map(self.one, todo))

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
        try:
            if job.kind == "quality" and self.plan.run.trajectory:
                record = self.backend.generate(job.recipe, job.request, job.out, extra, trajectory=True)
            else:
                record = self.backend.generate(job.recipe, job.request, job.out, extra)
        except (BackendError, RequestError, StoreError, MediaError, RuntimeError, ValueError, OSError) as exc:
            self.error(job, f"{type(exc).__name__}: {exc}")
            return
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
        "run": str(store.root), "baseline": baseline, "protocols": sections, "recompiles": recompiles,
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
    if plan.speed_protocol == "both":
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


def run_ab(plan: AbPlan, backend: Backend) -> AbResult:
    """Run (or resume) an A/B run; writes clips, records, ``speed.json``/``speed.md`` and the manifest."""
    plan.validate()
    plan.run.kind = "ab"
    store, manifest = open_run(plan.run)
    sweep_partial_files(store)
    session = _Session(plan, store, backend)
    warm_done: set[str] = set()

    def warmups_for(jobs: list[Job]) -> list[Job]:
        need = {j.recipe.name for j in jobs if read_finished_record(j.out) is None} - warm_done
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

    try:
        for protocol in plan.protocols:
            jobs = speed_jobs(plan, store, protocol)
            session.run(warmups_for(jobs) + jobs)
        jobs = quality_jobs(plan, store)
        session.run(warmups_for(jobs) + jobs)
    finally:
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
    elif session.errors:
        manifest.status = "partial"
    else:
        manifest.status = "complete"
    manifest.extra["ab"] = {
        "speed": "speed.json", "protocols": plan.protocols, "executed_mismatches": session.failed,
        "off_identity": identity, "sessions": [*manifest.extra.get("ab", {}).get("sessions", []), session.id],
    }
    store.write_manifest(manifest)
    return AbResult(manifest, speed, session.failed, identity)


def run_ab_from_args(*, baseline, candidates, prompts, out, model="tiny", seeds="0", backend="inprocess", urls=(),
                     api_key=None, warmup=1, speed_protocol="mixed", speed_rounds=2, gpu_hourly_rate=None,
                     off_identity=False, trajectory=False, seconds=None, num_frames=None, height=None, width=None,
                     timeout_s=1800.0, device=None, runtime_factory=None) -> AbResult:
    """``h3eval ab`` as a function of its options (recipe names or paths, a prompt suite name, seeds as text): builds
    the plan and the backend and runs (or resumes) the A/B run."""
    from h3.recipe import load_recipe
    from h3.runtime import FULL_DEFAULT_SIZE, TINY_DEFAULT_SIZE, TINY_MODELS
    from h3eval.prompts import load_prompts, parse_seeds
    from h3eval.runner import RequestShape, RunError, RunPlan

    base = load_recipe(baseline)
    recipes = [base] + [load_recipe(c) for c in candidates]
    if off_identity:
        recipes.append(identity_recipe(base))
    if backend not in ("inprocess", "http"):
        raise RunError(f"--backend must be inprocess or http, got {backend!r} (clips from elsewhere: h3eval import)")
    if backend == "http" and not urls:
        raise RunError("--backend http needs at least one --url")
    if backend == "inprocess" and urls:
        raise RunError("--url is for --backend http; the inprocess backend runs the h3 runtime in this process")
    plan = AbPlan(
        run=RunPlan(
            out=Path(out), model=model, recipes=recipes, prompts=load_prompts(prompts), seeds=parse_seeds(seeds),
            shape=RequestShape(seconds=seconds, num_frames=num_frames, height=height, width=width),
            baseline=base.name, kind="ab", backend=backend, device=device, trajectory=trajectory,
            args=dict(command="ab", baseline=baseline, candidates=list(candidates), prompts=str(prompts), model=model,
                      seeds=seeds, backend=backend, urls=list(urls), warmup=warmup, speed_protocol=speed_protocol,
                      speed_rounds=speed_rounds, gpu_hourly_rate=gpu_hourly_rate, off_identity=off_identity,
                      trajectory=trajectory, seconds=seconds, num_frames=num_frames, height=height, width=width,
                      device=device),
        ),
        warmup=warmup, speed_protocol=speed_protocol, speed_rounds=speed_rounds, gpu_hourly_rate=gpu_hourly_rate,
    )
    plan.validate()
    if backend == "http":
        from h3eval.backends.http import HttpBackend

        impl = HttpBackend(list(urls), TINY_DEFAULT_SIZE if model in TINY_MODELS else FULL_DEFAULT_SIZE, api_key=api_key,
                           timeout_s=timeout_s)
    else:
        from h3eval.backends.inprocess import InProcessBackend

        impl = InProcessBackend(model, device, runtime_factory)
    return run_ab(plan, impl)
