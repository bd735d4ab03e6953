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

Where the parts live: the jobs, their worker and the per-job deadline in :mod:`h3.server_jobs`; request fields and
limits in :mod:`h3.server_request`; previews in :mod:`h3.server_previews`; what each endpoint answers in
:class:`VideoService` here.
"""

from __future__ import annotations

import hmac
import json
import logging
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

from h3.atomic import atomic_write_bytes
from h3.runtime import FPS, MAX_SECONDS, MIN_SECONDS, TINY_MODELS
from h3.server_jobs import JOB_ID, STATUSES, JobInterrupts, JobStore, JobTimeout, worker
from h3.server_previews import SPRITESHEET, THUMBNAIL, make_preview, sprite_layout
from h3.server_request import (FIELDS, RequestProblem, RequestSchema, ServerLimits, default_limits, error_body,
                               levers_sha256, read_request_body)

__all__ = ["create_app", "serve", "serve_runtime", "levers_sha256", "ServerLimits", "default_limits", "JobStore",
           "JobInterrupts", "JobTimeout", "JOB_ID", "STATUSES", "VideoService"]

logger = logging.getLogger(__name__)

POLL_AFTER_MS = 250
"""Sent as ``openai-poll-after-ms`` on a retrieve: the SDK's ``poll``/``create_and_poll`` wait that long."""


# -- the app ---------------------------------------------------------------------------------------------------------
def create_app(runtime: Any, output_dir: str | Path, api_key: str | None = None, max_queue: int = 8,
               model_name: str | None = None, limits: ServerLimits | None = None, *,
               max_prompt_tokens: int | None = None, max_pixels: int | None = None,
               job_timeout_s: float | None = None, max_body_bytes: int | None = None) -> FastAPI:
    """The FastAPI app over ``runtime`` (an :class:`h3.runtime.H3Runtime`).

    ``limits`` defaults to :func:`default_limits` of the runtime; the keyword limits override single values.
    The app is its parts: the jobs and their worker (:mod:`h3.server_jobs`), what each endpoint answers
    (:class:`VideoService`), the error bodies (:func:`_add_error_handlers`) and the routes (:func:`_add_routes`).
    """
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
        raise ValueError(f"max_queue must be >= 0, got {max_queue}")
    limits = limits or default_limits(runtime, max_prompt_tokens=max_prompt_tokens, max_pixels=max_pixels,
                                      job_timeout_s=job_timeout_s, max_body_bytes=max_body_bytes)
    store = JobStore(Path(output_dir), max_queue)
    service = VideoService(runtime, store, limits, api_key, model_name)
    app = FastAPI(title="h3 serve", lifespan=_lifespan(service))
    app.state.store = store
    app.state.limits = limits
    _add_error_handlers(app)
    _add_routes(app, service)
    return app


def served_model_id(runtime: Any, model_name: str | None = None) -> str:
    """The model id the server answers to: ``model_name``, else the preset or checkpoint folder's name with ``h3-``."""
    from h3.random_model import is_random_preset

    preset = runtime.model in TINY_MODELS or is_random_preset(runtime.model)
    served = runtime.model if preset else Path(runtime.model).name
    return model_name or (served if served.startswith("h3-") else f"h3-{served}")


class VideoService:
    """What each endpoint answers, over one runtime and its job store (the routes are thin over these methods)."""

    def __init__(self, runtime: Any, store: JobStore, limits: ServerLimits, api_key: str | None = None,
                 model_name: str | None = None):
        self.runtime, self.store, self.limits, self.api_key = runtime, store, limits, api_key
        self.max_queue = store.max_queue
        self.model_id = served_model_id(runtime, model_name)
        self.served_recipes = list(getattr(runtime, "served_recipes", None) or [runtime.recipe])
        self.names = tuple(dict.fromkeys([self.model_id, *(r.name for r in self.served_recipes)]))
        """Every name a request's ``model`` may give: the model id, then each served recipe's name."""
        self.schema = RequestSchema(runtime, limits, self.names)
        self.loaded_at = int(time.time())

    def authorize(self, request: Request) -> None:
        """401 unless the request carries the server's API key as a bearer token (no key: everyone may call)."""
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer API key",
                                headers={"WWW-Authenticate": "Bearer"})

    def get_job(self, video_id: str) -> dict[str, Any]:
        job = self.store.jobs.get(video_id) if JOB_ID.match(video_id) else None
        if job is None:
            raise HTTPException(status_code=404, detail=f"no video job {video_id[:80]!r}")
        return job

    def public(self, job: dict[str, Any]) -> dict[str, Any]:
        """The job as a client sees it (no clip hash, no private keys)."""
        with self.store.lock:  # the worker adds keys to a job as it completes it
            return {k: v for k, v in job.items() if k != "mp4_sha256" and not k.startswith("_")}

    def health(self) -> dict[str, Any]:
        store = self.store
        with store.lock:
            running = sum(1 for j in store.jobs.values() if j.get("status") == "in_progress")
            return {"status": "ok", "queued": len(store.queue), "in_progress": running, "max_queue": self.max_queue}

    def model_entry(self, name: str) -> dict[str, Any]:
        """One ``/v1/models`` entry: the model id stands for the first recipe, each recipe name for itself."""
        recipe = next((r for r in self.served_recipes if r.name == name), self.served_recipes[0])
        schema, limits = self.schema, self.limits
        return {"id": name, "object": "model", "created": self.loaded_at, "owned_by": "h3",
                "model_path": self.runtime.model, "h3_model": self.model_id, "h3_recipe_name": recipe.name,
                "h3_recipe": recipe.resolved(), "h3_recipe_sha256": recipe.sha256(),
                "h3_levers_sha256": levers_sha256(recipe),
                "h3_limits": {**limits.report(), "max_queue": self.max_queue, "canvas_multiple": schema.multiple,
                              "default_size": f"{schema.default_size[1]}x{schema.default_size[0]}",
                              "seconds": [MIN_SECONDS, MAX_SECONDS], "fps": FPS,
                              "num_inference_steps": recipe.steps},
                "h3_fields": FIELDS}

    def accept(self, body: dict[str, Any]) -> JSONResponse:
        """Check a creation request and queue its job (200 with the job), or answer 429 when the queue is full."""
        resolved = self.schema.resolve(body)
        now = time.time_ns()
        num_frames = resolved.num_frames
        request = resolved.request
        job = {"id": f"video_{uuid.uuid4().hex}", "object": "video", "model": self.model_id, "status": "queued",
               "progress": 0, "created_at": now // 10**9, "completed_at": None, "expires_at": None, "error": None,
               "prompt": request.prompt, "seconds": f"{num_frames / FPS:.3f}",
               "size": f"{resolved.width}x{resolved.height}", "remixed_from_video_id": None, "seed": request.seed,
               "num_frames": num_frames, "fps": FPS, "num_inference_steps": resolved.recipe.steps,
               "h3_recipe": resolved.recipe.name, "h3_requested": resolved.requested, "h3_workflow": request.workflow,
               "h3_conditioning": [c.model_dump() for c in request.conditioning_spec()], "_created_ns": now}
        if not self.store.submit(job, request, resolved.recipe if len(self.served_recipes) > 1 else None):
            full = f"queue full ({self.max_queue} job(s) waiting); retry later"
            return JSONResponse(status_code=429, content=error_body(429, full, full), headers={"Retry-After": "1"})
        return JSONResponse(status_code=200, content=self.public(job))

    def listing(self, after: str | None, limit: int | None, order: str) -> dict[str, Any]:
        jobs, has_more = self.store.listing(order, after, limit)
        data = [self.public(j) for j in jobs]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": has_more}

    def delete(self, video_id: str) -> dict[str, Any]:
        self.get_job(video_id)
        try:
            self.store.delete(video_id)
        except KeyError:
            raise HTTPException(status_code=404, detail=f"no video job {video_id[:80]!r}") from None
        return {"id": video_id, "object": "video.deleted", "deleted": True}

    def content(self, video_id: str, variant: str) -> Any:
        """A completed job's clip (MP4), or its thumbnail or sprite sheet, made once and kept beside the clip."""
        job = self.get_job(video_id)
        if job.get("status") != "completed":
            raise HTTPException(status_code=409, detail=f"video {video_id} is {job.get('status')}, not completed")
        path = self.store.content_path(video_id)
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
        cached = self.store.content_path(video_id, suffix)  # kept beside the clip, deleted with the job
        if cached.is_file():
            return FileResponse(cached, media_type=media_type, headers=headers)
        data = make_preview(name, path, layout)
        atomic_write_bytes(cached, data)
        return Response(data, media_type=media_type, headers=headers)


def _lifespan(service: VideoService):
    """The app's lifespan: the worker thread runs while the app does; on shutdown the running job stops at its next
    module call and is marked failed."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        interrupts = JobInterrupts(service.runtime)
        thread = threading.Thread(target=worker, args=(service.store, service.runtime, interrupts, service.limits),
                                  name="h3-serve-worker", daemon=True)
        thread.start()
        try:
            yield
        finally:
            service.store.stop()
            interrupts.stop_now("the server stopped before this job finished; resubmit it")
            thread.join(timeout=30)
            interrupts.remove()

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as FastAPI's ``detail`` plus OpenAI's ``error`` object (:func:`h3.server_request.error_body`)."""

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


def _add_routes(app: FastAPI, service: VideoService) -> None:
    """The endpoints (see the module docstring), each thin over a :class:`VideoService` method."""
    auth = [Depends(service.authorize)]

    @app.get("/health")
    def health() -> dict[str, Any]:
        return service.health()

    @app.get("/v1/models", dependencies=auth)
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [service.model_entry(name) for name in service.names]}

    @app.post("/v1/videos", dependencies=auth)
    async def create_video(request: Request) -> JSONResponse:
        body = await read_request_body(request, service.schema)
        return await run_in_threadpool(service.accept, body)

    @app.get("/v1/videos", dependencies=auth)
    def list_videos(after: Optional[str] = Query(None, max_length=200),
                    limit: Optional[int] = Query(None, ge=1, le=100),
                    order: Literal["asc", "desc"] = Query("desc")) -> dict[str, Any]:
        return service.listing(after, limit, order)

    @app.get("/v1/videos/{video_id}", dependencies=auth)
    def retrieve_video(video_id: str) -> JSONResponse:
        return JSONResponse(service.public(service.get_job(video_id)),
                            headers={"openai-poll-after-ms": str(POLL_AFTER_MS)})

    @app.delete("/v1/videos/{video_id}", dependencies=auth)
    def delete_video(video_id: str) -> dict[str, Any]:
        return service.delete(video_id)

    @app.get("/v1/videos/{video_id}/content", dependencies=auth)
    def video_content(video_id: str,
                      variant: Literal["video", "thumbnail", "spritesheet"] = Query("video")) -> Any:
        return service.content(video_id, variant)


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
    from h3.memory import card_load_problem
    from h3.runtime import check_device

    problem = card_load_problem(model, loaded, check_device(device), text_encoder=text_encoder)
    if problem:  # before minutes of loading
        raise SharedModelError(problem)
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
