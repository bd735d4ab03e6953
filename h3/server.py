"""``h3 serve``: the OpenAI videos API (as the official ``openai`` SDK calls it, with SGLang's extra fields) over one
loaded H3 runtime.

Endpoints: ``POST /v1/videos`` (JSON, multipart/form-data or a urlencoded form), ``GET /v1/videos`` (``limit``,
``after``, ``order``), ``GET /v1/videos/{id}``, ``DELETE /v1/videos/{id}``, ``GET /v1/videos/{id}/content``
(``variant`` = ``video`` MP4, ``thumbnail`` WebP, ``spritesheet`` JPEG), ``GET /v1/models``, ``GET /health``. Job
status: ``queued``, ``in_progress``, ``completed``, ``failed``.

Request fields (:data:`h3.server_request.FIELDS`), each honoured or refused by name, never ignored:

- OpenAI's: ``prompt``, ``model`` (the served model id or recipe name, both listed in ``/v1/models``), ``seconds``
  and ``size`` "WxH". Both are mapped onto the model's grid and the job reports what will be generated:
  ``seconds`` snaps up to the next frame count ``17n+5`` the video VAE decodes (below MiniMax-H3's 5 s minimum,
  the shortest clip; 15 s gives 14.375 s; above 15 s, a 422), ``size`` snaps each side to the nearest multiple of
  the canvas multiple (32). ``input_reference`` (OpenAI's and SGLang's
  image-to-video field: a file upload, a ``data:`` URL or ``{"image_url": "data:..."}``) is the keyframe the clip
  starts from (MiniMax-H3's fl2va workflow).
- SGLang's: ``seed``, ``num_frames``, ``fps`` (24 only), ``num_inference_steps`` (the recipe's own only),
  ``guidance_scale`` (1 only) and ``negative_prompt`` (empty only): MiniMax-H3 is guidance-distilled, one forward
  per step and no unconditional branch, so another scale or a negative prompt cannot be honoured. SGLang's
  ``extra_body`` object (or, in a form, JSON text) is merged into the top level.
- Images (issue 25): ``first_frame`` (the same as ``input_reference``), ``last_frame`` (fl2va) and
  ``reference_image`` (ref2va), each an upload or a ``data:`` URL; the job reports the workflow and each image's
  sha256 (``h3_workflow``, ``h3_conditioning``). URLs are refused: the server does not fetch (it runs offline).
- Ours: ``h3_levers_sha256`` (:func:`levers_sha256`: the recipe without its name and description): a request whose
  levers differ from the ones the server runs is refused, so a client never gets a clip from another configuration.

Anything else is a 422 naming the field. Numbers must be finite (``NaN``, ``Infinity``, ``1e400`` are refused by
field), integers are integers (``true`` is not 1), digits are ASCII digits.

Limits (:class:`ServerLimits`, reported in ``/v1/models``, set from the loaded model and device unless given):
the request body (413), the prompt's tokens, the canvas's pixels (422 naming the field), and a per-job timeout
(the job ends ``failed`` with that reason, and the worker takes the next job).

- One generation at a time on the device (a single worker thread); ``max_queue`` jobs may wait behind it, and a
  submission beyond that is answered 429.
- Errors carry FastAPI's ``detail`` (for validation: a list whose ``loc`` names the field) and OpenAI's ``error``
  object (``message``, ``type``, ``param``, ``code``), which the SDK shows.
- With an API key, every endpoint except ``/health`` needs ``Authorization: Bearer KEY`` (401 otherwise); the SDK
  sends its ``api_key`` that way.
- Content is served only from the server's own output folder, looked up by a job id of a fixed form.
- Jobs are written to ``<output>/jobs/<id>.json`` (atomically) on every change: a restart keeps completed jobs; a
  job that was queued or running when the server stopped is marked failed (resubmit it), never left hanging.
- A completed job carries ``h3_record`` (the clip's record: raw frame/PCM hashes, stage anatomy, what executed).
"""

from __future__ import annotations

import collections
import hmac
import json
import logging
import math
import re
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Optional

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from h3.atomic import atomic_write_bytes, atomic_write_json, sha256_file
from h3.runtime import FPS, MAX_SECONDS, MIN_SECONDS, TINY_MODELS, GenerateRequest
from h3.server_previews import SPRITESHEET, THUMBNAIL, make_preview, sprite_layout
from h3.server_request import (FIELDS, RequestProblem, RequestSchema, ServerLimits, default_limits, error_body,
                               levers_sha256, read_request_body, show)

__all__ = ["create_app", "serve", "serve_runtime", "levers_sha256", "ServerLimits", "default_limits", "JobStore"]

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")
STATUSES = ("queued", "in_progress", "completed", "failed")
POLL_AFTER_MS = 250
"""Sent as ``openai-poll-after-ms`` on a retrieve: the SDK's ``poll``/``create_and_poll`` wait that long."""


# -- jobs ------------------------------------------------------------------------------------------------------------
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


def _worker(store: JobStore, runtime: Any, interrupts: JobInterrupts, limits: ServerLimits) -> None:
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


# -- the app ---------------------------------------------------------------------------------------------------------
def create_app(runtime: Any, output_dir: str | Path, api_key: str | None = None, max_queue: int = 8,
               model_name: str | None = None, limits: ServerLimits | None = None, *,
               max_prompt_tokens: int | None = None, max_pixels: int | None = None,
               job_timeout_s: float | None = None, max_body_bytes: int | None = None) -> FastAPI:
    """The FastAPI app over ``runtime`` (an :class:`h3.runtime.H3Runtime`).

    ``limits`` defaults to :func:`default_limits` of the runtime; the keyword limits override single values.
    """
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
        raise ValueError(f"max_queue must be >= 0, got {max_queue}")
    limits = limits or default_limits(runtime, max_prompt_tokens=max_prompt_tokens, max_pixels=max_pixels,
                                      job_timeout_s=job_timeout_s, max_body_bytes=max_body_bytes)
    store = JobStore(Path(output_dir), max_queue)
    recipe = runtime.recipe
    from h3.random_model import is_random_preset

    preset = runtime.model in TINY_MODELS or is_random_preset(runtime.model)
    served = runtime.model if preset else Path(runtime.model).name
    model_id = model_name or (served if served.startswith("h3-") else f"h3-{served}")
    served_recipes = list(getattr(runtime, "served_recipes", None) or [recipe])
    names = tuple(dict.fromkeys([model_id, *(r.name for r in served_recipes)]))
    schema = RequestSchema(runtime, limits, names)
    loaded_at = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        interrupts = JobInterrupts(runtime)
        thread = threading.Thread(target=_worker, args=(store, runtime, interrupts, limits), name="h3-serve-worker",
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            store.stop()
            interrupts.stop_now("the server stopped before this job finished; resubmit it")
            thread.join(timeout=30)
            interrupts.remove()

    app = FastAPI(title="h3 serve", lifespan=lifespan)
    app.state.store = store
    app.state.limits = limits

    @app.exception_handler(RequestProblem)
    async def _problem(_request: Request, exc: RequestProblem) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = jsonable_encoder(exc.errors(), custom_encoder={bytes: lambda b: b.decode("utf-8", "replace")})
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", [])]
        param = loc[-1] if len(loc) > 1 else None
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        return JSONResponse(status_code=422, content=error_body(422, message, errors, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(jsonable_encoder(exc.detail))
        return JSONResponse(status_code=exc.status_code, content=error_body(exc.status_code, message, exc.detail),
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:  # a bug: say so in JSON, keep serving
        logger.exception("internal error")
        return JSONResponse(status_code=500, content=error_body(500, f"internal server error ({type(exc).__name__})",
                                                                 "internal server error"))

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), api_key.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer API key",
                                headers={"WWW-Authenticate": "Bearer"})

    def get_job(video_id: str) -> dict[str, Any]:
        job = store.jobs.get(video_id) if JOB_ID.match(video_id) else None
        if job is None:
            raise HTTPException(status_code=404, detail=f"no video job {video_id[:80]!r}")
        return job

    def public(job: dict[str, Any]) -> dict[str, Any]:
        with store.lock:  # the worker adds keys to a job as it completes it
            return {k: v for k, v in job.items() if k != "mp4_sha256" and not k.startswith("_")}

    def model_entry(name: str) -> dict[str, Any]:
        # The model id stands for the first recipe; each recipe name for itself (a multi-recipe server).
        recipe = next((r for r in served_recipes if r.name == name), served_recipes[0])
        return {"id": name, "object": "model", "created": loaded_at, "owned_by": "h3", "model_path": runtime.model,
                "h3_model": model_id, "h3_recipe_name": recipe.name, "h3_recipe": recipe.resolved(),
                "h3_recipe_sha256": recipe.sha256(), "h3_levers_sha256": levers_sha256(recipe),
                "h3_limits": {**limits.report(), "max_queue": max_queue, "canvas_multiple": schema.multiple,
                              "default_size": f"{schema.default_size[1]}x{schema.default_size[0]}",
                              "seconds": [MIN_SECONDS, MAX_SECONDS], "fps": FPS,
                              "num_inference_steps": recipe.steps},
                "h3_fields": FIELDS}

    @app.get("/health")
    def health() -> dict[str, Any]:
        with store.lock:
            running = sum(1 for j in store.jobs.values() if j.get("status") == "in_progress")
            return {"status": "ok", "queued": len(store.queue), "in_progress": running, "max_queue": max_queue}

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry(name) for name in names]}

    def accept(body: dict[str, Any]) -> JSONResponse:
        resolved = schema.resolve(body)
        now = time.time_ns()
        num_frames = resolved.num_frames
        request = resolved.request
        job = {"id": f"video_{uuid.uuid4().hex}", "object": "video", "model": model_id, "status": "queued",
               "progress": 0, "created_at": now // 10**9, "completed_at": None, "expires_at": None, "error": None,
               "prompt": request.prompt, "seconds": f"{num_frames / FPS:.3f}",
               "size": f"{resolved.width}x{resolved.height}", "remixed_from_video_id": None, "seed": request.seed,
               "num_frames": num_frames, "fps": FPS, "num_inference_steps": resolved.recipe.steps,
               "h3_recipe": resolved.recipe.name, "h3_requested": resolved.requested, "h3_workflow": request.workflow,
               "h3_conditioning": [c.model_dump() for c in request.conditioning_spec()], "_created_ns": now}
        if not store.submit(job, request, resolved.recipe if len(served_recipes) > 1 else None):
            return JSONResponse(status_code=429, content=error_body(
                429, f"queue full ({max_queue} job(s) waiting); retry later",
                f"queue full ({max_queue} job(s) waiting); retry later"), headers={"Retry-After": "1"})
        return JSONResponse(status_code=200, content=public(job))

    @app.post("/v1/videos", dependencies=[Depends(authorize)])
    async def create_video(request: Request) -> JSONResponse:
        body = await read_request_body(request, schema)
        return await run_in_threadpool(accept, body)

    @app.get("/v1/videos", dependencies=[Depends(authorize)])
    def list_videos(after: Optional[str] = Query(None, max_length=200),
                    limit: Optional[int] = Query(None, ge=1, le=100),
                    order: Literal["asc", "desc"] = Query("desc")) -> dict[str, Any]:
        jobs, has_more = store.listing(order, after, limit)
        data = [public(j) for j in jobs]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": has_more}

    @app.get("/v1/videos/{video_id}", dependencies=[Depends(authorize)])
    def retrieve_video(video_id: str) -> JSONResponse:
        return JSONResponse(public(get_job(video_id)), headers={"openai-poll-after-ms": str(POLL_AFTER_MS)})

    @app.delete("/v1/videos/{video_id}", dependencies=[Depends(authorize)])
    def delete_video(video_id: str) -> dict[str, Any]:
        get_job(video_id)
        try:
            store.delete(video_id)
        except KeyError:
            raise HTTPException(status_code=404, detail=f"no video job {video_id[:80]!r}") from None
        return {"id": video_id, "object": "video.deleted", "deleted": True}

    @app.get("/v1/videos/{video_id}/content", dependencies=[Depends(authorize)])
    def video_content(video_id: str,
                      variant: Literal["video", "thumbnail", "spritesheet"] = Query("video")) -> Any:
        job = get_job(video_id)
        if job.get("status") != "completed":
            raise HTTPException(status_code=409, detail=f"video {video_id} is {job.get('status')}, not completed")
        path = store.content_path(video_id)
        if not path.is_file():
            raise HTTPException(status_code=404, detail=f"the clip of {video_id} is gone from the output folder")
        if variant == "video":
            return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")
        name, suffix, media_type = THUMBNAIL if variant == "thumbnail" else SPRITESHEET
        width, height = (int(v) for v in str(job["size"]).split("x"))
        layout = sprite_layout(int(job["num_frames"]), width, height)
        if name == "thumbnail":
            headers = {"x-h3-frames": "0"}
        else:
            headers = {"x-h3-frames": ",".join(map(str, layout["frames"])),
                       "x-h3-grid": f"{layout['columns']}x{layout['rows']}",
                       "x-h3-tile": f"{layout['tile'][0]}x{layout['tile'][1]}"}
        cached = store.content_path(video_id, suffix)  # kept beside the clip, deleted with the job
        if cached.is_file():
            return FileResponse(cached, media_type=media_type, headers=headers)
        data = make_preview(name, path, layout)
        atomic_write_bytes(cached, data)
        return Response(data, media_type=media_type, headers=headers)

    return app


def load_served_runtime(model: str, recipes: str | list[str], device: str | None = None,
                        text_encoder: str = "resident") -> Any:
    """The runtime a server serves: one recipe, or several taking turns on one shared model (each checked before any
    weight loads)."""
    from h3.recipe import load_recipe
    from h3.runtime import H3Runtime, SharedModelError

    names = [recipes] if isinstance(recipes, str) else list(recipes)
    loaded = [load_recipe(name) for name in names]
    if len({r.name for r in loaded}) != len(loaded):
        raise ValueError(f"--recipe names must be distinct, got {[r.name for r in loaded]}")
    if len(loaded) == 1:
        return H3Runtime.load(model, loaded[0], device, text_encoder=text_encoder)
    from h3.runtime import shared_recipes_problems

    problems = shared_recipes_problems(loaded)
    if problems:
        raise SharedModelError("these recipes cannot share one served model: " + "; ".join(problems)
                               + ". Serve each on its own (`h3 serve --recipe NAME --port P`).")
    runtime = H3Runtime.load(model, loaded[0], device, shared=True, text_encoder=text_encoder)
    runtime.served_recipes = loaded
    return runtime


def serve(model: str, recipe: str | list[str], host: str = "127.0.0.1", port: int = 30000,
          api_key: str | None = None, max_queue: int = 8, output_dir: str | Path = "h3-serve",
          device: str | None = None, text_encoder: str = "resident", **limit_overrides: Any) -> None:
    """Load the runtime and serve it until interrupted (``limit_overrides``: :func:`default_limits`' keywords;
    ``recipe``: one recipe, or several sharing one model; ``text_encoder``: ``resident`` or ``offload``,
    :mod:`h3.residency`)."""
    runtime = load_served_runtime(model, recipe, device, text_encoder)
    serve_runtime(runtime, host=host, port=port, api_key=api_key, max_queue=max_queue, output_dir=output_dir,
                  **limit_overrides)


def serve_runtime(runtime: Any, host: str = "127.0.0.1", port: int = 30000, api_key: str | None = None,
                  max_queue: int = 8, output_dir: str | Path = "h3-serve", **limit_overrides: Any) -> None:
    """Serve a loaded runtime until interrupted (the runtime of ``h3 serve``, or rank 0's of ``--nproc N``)."""
    import uvicorn

    limits = default_limits(runtime, **limit_overrides)
    logger.warning("h3 serve limits: %s", json.dumps(limits.report()))
    app = create_app(runtime, output_dir, api_key=api_key, max_queue=max_queue, limits=limits)
    uvicorn.run(app, host=host, port=port, log_level="warning")
