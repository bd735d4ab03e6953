"""The jobs of ``h3 serve`` (:mod:`h3.server`): each job a JSON file under ``<output>/jobs/`` (:class:`JobStore`),
one worker thread generating them one at a time (:func:`worker`), and the per-job deadline checked as the pipeline
calls its modules (:class:`JobInterrupts`).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import HTTPException

from h3.atomic import atomic_write_json, sha256_file
from h3.runtime import GenerateRequest
from h3.server_request import RequestProblem, ServerLimits, show

__all__ = ["JOB_ID", "STATUSES", "JobTimeout", "JobInterrupts", "JobStore", "worker"]

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")
STATUSES = ("queued", "in_progress", "completed", "failed")


class JobTimeout(RuntimeError):
    """Raised in the worker thread, at a module call of the pipeline, when its job is past its deadline."""


class JobInterrupts:
    """Per-job deadline and progress, checked as the pipeline calls its modules.

    Forward pre-hooks (prepended, so they run before any lever's hook) on the text encoder, the transformer (once per
    denoising step) and the decoders of both VAEs and their blocks (per tile and chunk): never inside a compiled
    block. They act only on the worker thread, so an in-process caller of the same runtime is unaffected.

    A runtime of several ranks (``h3 serve --nproc N``) places the checks itself (``runtime.install_interrupts``,
    h3/parallel/serving.py): a job may stop only where every rank stops with it.
    """

    def __init__(self, runtime: Any):
        self.thread: int | None = None
        self.deadline: float | None = None
        self.reason: str | None = None
        self.fired: str | None = None
        self.steps = 0
        self.on_step = None
        self._handles: list[Any] = []
        pipe = getattr(runtime, "pipe", None)
        if pipe is None:
            return
        install = getattr(runtime, "install_interrupts", None)
        if install is not None:
            self._handles = list(install(self))
            return
        import torch

        @torch.compiler.disable
        def check(*_):
            reason = self.due()
            if reason is not None:
                self.stop(reason)

        @torch.compiler.disable
        def step(*_):
            check()
            self.count_step()

        hooked = []
        text = getattr(pipe, "text_encoder", None)
        hooked += [(getattr(text, "model", text), check)]
        hooked += [(getattr(pipe, "transformer", None), step)]
        for vae in (getattr(pipe, "vae", None), getattr(pipe, "audio_vae", None)):
            decoder = getattr(vae, "decoder", None)
            if decoder is not None:
                hooked += [(decoder, check)] + [(child, check) for child in decoder.children()]
        for module, hook in hooked:
            if module is not None and hasattr(module, "register_forward_pre_hook"):
                self._handles.append(module.register_forward_pre_hook(hook, prepend=True))

    def due(self) -> str | None:
        """Why the job on this thread must stop now (past its deadline, or the server stopping); None: it goes on."""
        if self.thread == threading.get_ident() and self.deadline is not None and time.monotonic() > self.deadline:
            return self.reason
        return None

    def stop(self, reason: str) -> None:
        """End the job on this thread here."""
        self.fired = reason
        raise JobTimeout(reason)

    def count_step(self) -> None:
        """A denoising step of the job on this thread begins (its progress)."""
        if self.thread == threading.get_ident():
            self.steps += 1
            if self.on_step is not None:
                self.on_step(self.steps)

    def start(self, timeout_s: float, on_step=None) -> None:
        self.steps, self.on_step, self.fired = 0, on_step, None
        self.reason = f"the job ran past the server's per-job timeout of {timeout_s:g} s (--job-timeout)"
        self.deadline = time.monotonic() + timeout_s
        self.thread = threading.get_ident()

    def finish(self) -> None:
        self.thread = self.deadline = self.on_step = None

    def stop_now(self, reason: str) -> None:
        """End the running job at its next module call (the server is shutting down)."""
        self.reason = reason
        self.deadline = -math.inf

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class JobStore:
    """Jobs on disk, one JSON file each, plus the bounded queue of the single worker."""

    def __init__(self, root: Path, max_queue: int):
        self.root = Path(root)
        self.jobs_dir = self.root / "jobs"
        self.videos_dir = self.root / "videos"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.videos_dir.mkdir(parents=True, exist_ok=True)
        self.max_queue = max_queue
        self.lock = threading.Condition()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.queue: collections.deque[str] = collections.deque()
        self.requests: dict[str, GenerateRequest] = {}
        self.recipes: dict[str, Any] = {}
        """The recipe of each queued job (a multi-recipe server switches its shared model to it)."""
        self.stopping = False
        self.busy = False
        """Whether the worker holds a job (popped from the queue, not yet finished)."""
        self._recover()

    def _recover(self) -> None:
        for partial in [*self.videos_dir.glob(".*.tmp"), *self.jobs_dir.glob(".*.tmp")]:
            partial.unlink(missing_ok=True)  # an atomic write a killed server did not finish
        for path in sorted(self.jobs_dir.glob("video_*.json")):
            try:
                job = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                logger.warning("ignoring unreadable job file %s: %s", path, exc)
                continue
            if not isinstance(job, dict) or not JOB_ID.match(str(job.get("id", ""))) or path.stem != job["id"]:
                continue
            if job.get("status") == "completed":
                content = self.content_path(job["id"])
                if not content.is_file() or sha256_file(content) != job.get("mp4_sha256"):
                    job.update(status="failed", error={"code": "clip_missing",
                                                       "message": "the clip file is missing or changed on disk"})
                    atomic_write_json(path, job)
            elif job.get("status") in ("queued", "in_progress"):
                job.update(status="failed", error={"code": "server_stopped", "message": "the server stopped before "
                                                   "this job finished; resubmit it"}, completed_at=int(time.time()))
                atomic_write_json(path, job)
            self.jobs[job["id"]] = job
        logger.info("recovered %d job(s) from %s", len(self.jobs), self.jobs_dir)

    def content_path(self, job_id: str, suffix: str = ".mp4") -> Path:
        if not JOB_ID.match(job_id):
            raise KeyError(job_id)
        path = (self.videos_dir / f"{job_id}{suffix}").resolve()
        if not path.is_relative_to(self.videos_dir.resolve()):  # belt and braces: the id pattern already forbids it
            raise KeyError(job_id)
        return path

    def save(self, job: dict[str, Any]) -> None:
        atomic_write_json(self.jobs_dir / f"{job['id']}.json", job)

    def submit(self, job: dict[str, Any], request: GenerateRequest, recipe: Any = None) -> bool:
        with self.lock:
            # max_queue counts jobs waiting behind the one on the device; an idle server always takes one job.
            if len(self.queue) >= self.max_queue and (self.busy or self.queue):
                return False
            self.jobs[job["id"]] = job
            self.requests[job["id"]] = request
            if recipe is not None:
                self.recipes[job["id"]] = recipe
            self.save(job)
            self.queue.append(job["id"])
            self.lock.notify()
            return True

    def next(self) -> str | None:
        """The next job, already marked in progress (so a delete cannot race the worker for it)."""
        with self.lock:
            while not self.queue and not self.stopping:
                self.lock.wait(timeout=0.5)
            if self.stopping:
                return None
            self.busy = True
            job_id = self.queue.popleft()
            job = self.jobs[job_id]
            job.update(status="in_progress", progress=0)
            self.save(job)
            return job_id

    def done(self) -> None:
        with self.lock:
            self.busy = False

    def update(self, job_id: str, **fields: Any) -> dict[str, Any]:
        with self.lock:
            job = self.jobs[job_id]
            job.update(fields)
            self.save(job)
            return dict(job)

    def listing(self, order: str = "desc", after: str | None = None, limit: int | None = None
                ) -> tuple[list[dict[str, Any]], bool]:
        """Jobs by creation time (``order``), those after job ``after``, at most ``limit``; and whether more remain."""
        with self.lock:
            jobs = sorted(self.jobs.values(), key=lambda j: (j.get("created_at") or 0, j.get("_created_ns") or 0,
                                                             j["id"]), reverse=order == "desc")
            jobs = [dict(j) for j in jobs]
        if after is not None:
            ids = [j["id"] for j in jobs]
            if after not in ids:
                raise RequestProblem([("after", f"no video job {show(after, 80)}")], where="query")
            jobs = jobs[ids.index(after) + 1:]
        if limit is None:
            return jobs, False
        return jobs[:limit], len(jobs) > limit

    def delete(self, job_id: str) -> dict[str, Any]:
        """Remove a queued, completed or failed job, its clip and its previews; 409 for the job on the device."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise KeyError(job_id)
            if job.get("status") == "in_progress":
                raise HTTPException(status_code=409, detail=f"video {job_id} is being generated; delete it once it "
                                                            "has completed or failed")
            if job_id in self.queue:
                self.queue.remove(job_id)
                self.requests.pop(job_id, None)
                self.recipes.pop(job_id, None)
            del self.jobs[job_id]
            (self.jobs_dir / f"{job_id}.json").unlink(missing_ok=True)
            for path in self.videos_dir.glob(f"{job_id}.*"):
                path.unlink(missing_ok=True)
            return job

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()


def worker(store: JobStore, runtime: Any, interrupts: JobInterrupts, limits: ServerLimits) -> None:
    """The single worker thread: take the next job, generate it, until the store stops."""
    while True:
        job_id = store.next()
        if job_id is None:
            return
        try:
            _run_job(store, runtime, job_id, interrupts, limits)
        finally:
            store.done()


def _run_job(store: JobStore, runtime: Any, job_id: str, interrupts: JobInterrupts, limits: ServerLimits) -> None:
    """Generate one job's clip and record the outcome on the job."""
    request = store.requests.pop(job_id)
    recipe = store.recipes.pop(job_id, None)
    out = store.content_path(job_id)
    total = max(1, int(getattr(recipe or runtime.recipe, "steps", 1)))
    job = store.jobs[job_id]

    def on_step(steps: int) -> None:  # progress in memory; the file is written at the end
        job["progress"] = min(95, int(95 * steps / total))

    started = time.monotonic()
    try:
        extra: dict[str, Any] = {"server_job_id": job_id}
        if recipe is not None and (runtime.recipe is not recipe or not getattr(runtime, "levers_applied", True)):
            # A multi-recipe server: the job's recipe takes its turn on the shared model (outside the request's
            # timings, reported beside them).
            extra["server_switch_s"] = runtime.switch_recipe(recipe)["seconds"]
        interrupts.start(limits.job_timeout_s, on_step)
        try:
            record = runtime.generate(request, out, extra=extra)
        finally:
            interrupts.finish()
    except Exception as exc:  # any failure of one job is reported on that job; the server keeps serving
        for path in store.videos_dir.glob(f"{job_id}.*"):
            path.unlink(missing_ok=True)
        for path in store.videos_dir.glob(f".{job_id}.*.tmp"):
            path.unlink(missing_ok=True)
        if interrupts.fired is not None:
            logger.warning("job %s ended after %.1f s: %s", job_id, time.monotonic() - started, interrupts.fired)
            code, message = ("timeout" if "timeout" in interrupts.fired else "server_stopped"), interrupts.fired
        else:
            logger.exception("job %s failed", job_id)
            code, message = "generation_failed", f"{type(exc).__name__}: {exc}"
        store.update(job_id, status="failed", completed_at=int(time.time()), error={"code": code, "message": message})
        return
    peak = record.peak_memory_bytes
    store.update(
        job_id, status="completed", progress=100, completed_at=int(time.time()),
        inference_time_s=record.timings.generation_side_latency_s,
        peak_memory_mb=peak / 2**20 if peak is not None else None,
        mp4_sha256=record.mp4_sha256, h3_record=record.model_dump(mode="json"),
    )
