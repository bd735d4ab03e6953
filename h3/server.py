"""``h3 serve``: the OpenAI-style videos API subset SGLang serves, over one loaded H3 runtime.

Endpoints (SGLang's field names and status values): ``POST /v1/videos`` (``prompt``, ``seed``, ``size`` "WxH",
``num_frames``, ``seconds``, ``fps``, ``num_inference_steps``), ``GET /v1/videos``, ``GET /v1/videos/{id}``,
``GET /v1/videos/{id}/content``, ``GET /v1/models``, ``GET /health``. Job status: ``queued``, ``in_progress``,
``completed``, ``failed``.

- One generation at a time on the device (a single worker thread); ``max_queue`` jobs may wait behind it, and a
  submission beyond that is answered 429.
- Validation errors are 422 with FastAPI's ``detail`` list, whose ``loc`` names the field.
- With an API key, every endpoint except ``/health`` needs ``Authorization: Bearer KEY`` (401 otherwise).
- Content is served only from the server's own output folder, looked up by a job id of a fixed form.
- Jobs are written to ``<output>/jobs/<id>.json`` (atomically) on every change: a restart keeps completed jobs; a
  job that was queued or running when the server stopped is marked failed (resubmit it), never left hanging.
- Besides SGLang's fields, a completed job carries ``h3_record`` (the clip's record: raw frame/PCM hashes, stage
  anatomy, what executed), and a request may carry ``h3_levers_sha256`` (:func:`levers_sha256`: the recipe
  without its name and description): the server refuses (422) a request whose levers differ from the ones it runs,
  so a client never gets a clip from another configuration.
"""

from __future__ import annotations

import collections
import hmac
import json
import logging
import re
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Optional

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from h3.atomic import atomic_write_json, sha256_file
from h3.runtime import FPS, TINY_MODELS, GenerateRequest, RequestError, resolve_request

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")
SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
STATUSES = ("queued", "in_progress", "completed", "failed")


class VideoCreate(BaseModel):
    """Body of ``POST /v1/videos``. Unknown fields are refused (422 naming the field), never silently ignored."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    seed: int = Field(default=0, ge=0, lt=2**63)
    size: Optional[str] = None
    """"WxH" (OpenAI's order: width first)."""
    num_frames: Optional[int] = Field(default=None, ge=1)
    seconds: Optional[float] = Field(default=None, gt=0)
    fps: Optional[int] = None
    num_inference_steps: Optional[int] = Field(default=None, ge=1)
    """DiT forward passes; must equal the served recipe's ``steps`` when given."""
    model: Optional[str] = None
    h3_levers_sha256: Optional[str] = None


def levers_sha256(recipe: Any) -> str:
    """Hash of what a recipe configures (every lever), leaving out its name and description."""
    import hashlib

    levers = {k: v for k, v in recipe.resolved().items() if k not in ("name", "description")}
    return hashlib.sha256(json.dumps(levers, sort_keys=True).encode()).hexdigest()


def _unprocessable(field: str, message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": ["body", field], "msg": message, "type": "value_error"}])


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
            except (OSError, json.JSONDecodeError) as exc:
                logger.warning("ignoring unreadable job file %s: %s", path, exc)
                continue
            if not JOB_ID.match(str(job.get("id", ""))) or path.stem != job["id"]:
                continue
            if job.get("status") == "completed":
                content = self.content_path(job["id"])
                if not content.is_file() or sha256_file(content) != job.get("mp4_sha256"):
                    job.update(status="failed", error={"message": "the clip file is missing or changed on disk"})
                    atomic_write_json(path, job)
            elif job.get("status") in ("queued", "in_progress"):
                job.update(status="failed", error={"message": "the server stopped before this job finished; "
                                                              "resubmit it"}, completed_at=int(time.time()))
                atomic_write_json(path, job)
            self.jobs[job["id"]] = job
        logger.info("recovered %d job(s) from %s", len(self.jobs), self.jobs_dir)

    def content_path(self, job_id: str) -> Path:
        if not JOB_ID.match(job_id):
            raise KeyError(job_id)
        path = (self.videos_dir / f"{job_id}.mp4").resolve()
        if not path.is_relative_to(self.videos_dir.resolve()):  # belt and braces: the id pattern already forbids it
            raise KeyError(job_id)
        return path

    def save(self, job: dict[str, Any]) -> None:
        atomic_write_json(self.jobs_dir / f"{job['id']}.json", job)

    def submit(self, job: dict[str, Any], request: GenerateRequest) -> bool:
        with self.lock:
            # max_queue counts jobs waiting behind the one on the device; an idle server always takes one job.
            if len(self.queue) >= self.max_queue and (self.busy or self.queue):
                return False
            self.jobs[job["id"]] = job
            self.requests[job["id"]] = request
            self.save(job)
            self.queue.append(job["id"])
            self.lock.notify()
            return True

    def next(self) -> str | None:
        with self.lock:
            while not self.queue and not self.stopping:
                self.lock.wait(timeout=0.5)
            if self.stopping:
                return None
            self.busy = True
            return self.queue.popleft()

    def done(self) -> None:
        with self.lock:
            self.busy = False

    def update(self, job_id: str, **fields: Any) -> dict[str, Any]:
        with self.lock:
            job = self.jobs[job_id]
            job.update(fields)
            self.save(job)
            return dict(job)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()


def _worker(store: JobStore, runtime: Any) -> None:
    while True:
        job_id = store.next()
        if job_id is None:
            return
        try:
            _run_job(store, runtime, job_id)
        finally:
            store.done()


def _run_job(store: JobStore, runtime: Any, job_id: str) -> None:
    """Generate one job's clip and record the outcome on the job."""
    request = store.requests.pop(job_id)
    store.update(job_id, status="in_progress", progress=0)
    out = store.content_path(job_id)
    try:
        record = runtime.generate(request, out, extra={"server_job_id": job_id})
    except Exception as exc:  # any failure of one job is reported on that job; the server keeps serving
        logger.exception("job %s failed", job_id)
        out.unlink(missing_ok=True)
        store.update(job_id, status="failed", completed_at=int(time.time()),
                     error={"message": f"{type(exc).__name__}: {exc}"})
        return
    peak = record.peak_memory_bytes
    store.update(
        job_id, status="completed", progress=100, completed_at=int(time.time()),
        inference_time_s=record.timings.generation_side_latency_s,
        peak_memory_mb=peak / 2**20 if peak is not None else None,
        mp4_sha256=record.mp4_sha256, h3_record=record.model_dump(mode="json"),
    )


def create_app(runtime: Any, output_dir: str | Path, api_key: str | None = None, max_queue: int = 8,
               model_name: str | None = None) -> FastAPI:
    """The FastAPI app over ``runtime`` (an :class:`h3.runtime.H3Runtime` or anything with its ``generate``)."""
    if max_queue < 0:
        raise ValueError(f"max_queue must be >= 0, got {max_queue}")
    store = JobStore(Path(output_dir), max_queue)
    recipe = runtime.recipe
    model_id = model_name or f"h3-{runtime.model if runtime.model in TINY_MODELS else Path(runtime.model).name}"

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        thread = threading.Thread(target=_worker, args=(store, runtime), name="h3-serve-worker", daemon=True)
        thread.start()
        yield
        store.stop()
        thread.join(timeout=5)

    app = FastAPI(title="h3 serve", lifespan=lifespan)
    app.state.store = store

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
        return {k: v for k, v in job.items() if k != "mp4_sha256"}

    @app.get("/health")
    def health() -> dict[str, Any]:
        with store.lock:
            running = sum(1 for j in store.jobs.values() if j.get("status") == "in_progress")
            return {"status": "ok", "queued": len(store.queue), "in_progress": running, "max_queue": max_queue}

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model_id, "object": "model", "owned_by": "h3", "model_path": runtime.model,
            "h3_recipe": recipe.resolved(), "h3_recipe_sha256": recipe.sha256(),
            "h3_levers_sha256": levers_sha256(recipe),
        }]}

    @app.post("/v1/videos", dependencies=[Depends(authorize)])
    def create_video(body: VideoCreate) -> JSONResponse:
        width = height = None
        if body.size is not None:
            match = SIZE.match(body.size)
            if not match:
                raise _unprocessable("size", f"size must be 'WIDTHxHEIGHT' like '1344x768', got {body.size!r}")
            width, height = int(match.group(1)), int(match.group(2))
        if body.fps is not None and body.fps != FPS:
            raise _unprocessable("fps", f"MiniMax-H3 generates at {FPS} fps, got {body.fps}")
        if body.num_inference_steps is not None and body.num_inference_steps != recipe.steps:
            raise _unprocessable("num_inference_steps", f"this server runs recipe {recipe.name!r} with "
                                 f"{recipe.steps} steps, got {body.num_inference_steps}")
        if body.h3_levers_sha256 is not None and body.h3_levers_sha256 != levers_sha256(recipe):
            raise _unprocessable("h3_levers_sha256", f"this server runs recipe {recipe.name!r} (levers "
                                 f"{levers_sha256(recipe)[:12]}), not the levers asked for "
                                 f"({body.h3_levers_sha256[:12]})")
        if body.model is not None and body.model != model_id:
            raise _unprocessable("model", f"this server serves {model_id!r}, got {body.model!r}")
        request = GenerateRequest(prompt=body.prompt, seed=body.seed, num_frames=body.num_frames,
                                  seconds=body.seconds, height=height, width=width)
        try:
            num_frames, res_h, res_w = runtime.resolve(request)
        except RequestError as exc:
            text = str(exc)
            if any(word in text for word in ("height", "width", "aspect")):
                field = "size"
            elif "prompt" in text or "seed" in text:
                field = "prompt" if "prompt" in text else "seed"
            else:  # a duration the model cannot generate: name the field the client used
                field = "seconds" if body.seconds is not None else "num_frames"
            raise _unprocessable(field, text) from None
        now = int(time.time())
        job = {"id": f"video_{uuid.uuid4().hex}", "object": "video", "model": model_id, "status": "queued",
               "progress": 0, "created_at": now, "completed_at": None, "prompt": body.prompt, "seed": body.seed,
               "size": f"{res_w}x{res_h}", "num_frames": num_frames, "seconds": f"{num_frames / FPS:.3f}",
               "fps": FPS, "num_inference_steps": recipe.steps, "error": None}
        if not store.submit(job, request):
            return JSONResponse(status_code=429, content={"detail": f"queue full ({max_queue} job(s) waiting); "
                                                                    "retry later"}, headers={"Retry-After": "1"})
        return JSONResponse(status_code=200, content=public(job))

    @app.get("/v1/videos", dependencies=[Depends(authorize)])
    def list_videos() -> dict[str, Any]:
        with store.lock:
            return {"object": "list", "data": [public(j) for j in store.jobs.values()]}

    @app.get("/v1/videos/{video_id}", dependencies=[Depends(authorize)])
    def retrieve_video(video_id: str) -> dict[str, Any]:
        return public(get_job(video_id))

    @app.get("/v1/videos/{video_id}/content", dependencies=[Depends(authorize)])
    def video_content(video_id: str) -> FileResponse:
        job = get_job(video_id)
        if job.get("status") != "completed":
            raise HTTPException(status_code=409, detail=f"video {video_id} is {job.get('status')}, not completed")
        path = store.content_path(video_id)
        if not path.is_file():
            raise HTTPException(status_code=404, detail=f"the clip of {video_id} is gone from the output folder")
        return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")

    return app


def serve(model: str, recipe: str, host: str = "127.0.0.1", port: int = 30000, api_key: str | None = None,
          max_queue: int = 8, output_dir: str | Path = "h3-serve", device: str | None = None) -> None:
    """Load the runtime and serve it until interrupted."""
    import uvicorn

    from h3.recipe import load_recipe
    from h3.runtime import H3Runtime

    runtime = H3Runtime.load(model, load_recipe(recipe), device)
    app = create_app(runtime, output_dir, api_key=api_key, max_queue=max_queue)
    uvicorn.run(app, host=host, port=port, log_level="warning")
