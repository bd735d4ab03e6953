"""The ``http`` backend: a client of the OpenAI-style videos API with SGLang's field names.

``POST /v1/videos`` (``prompt``, ``seed``, ``size`` "WxH", ``num_frames``, ``fps``, ``num_inference_steps``, extra
fields passed through), poll ``GET /v1/videos/{id}`` until ``status`` is ``completed`` or ``failed``, download
``GET /v1/videos/{id}/content``.

Timings: ``request_to_file_latency_s`` is the client's wall time from submit to the file on disk (seed 002's
definition seen from the client, including queueing and transfer); the generation-side latency is the server's
``inference_time_s`` when it reports one. Our own server (``h3 serve``) also returns its clip record in the job JSON
(``h3_record``), so the client keeps the raw frame/PCM hashes and the executed telemetry; from a foreign server the
hashes are of the decoded MP4 (``extra["hash_source"] = "decoded"``).

Recompile detection through ``http`` groups requests by the *client's* session: a server keeps its compile caches
across client sessions, so a resumed client may see shapes already warm (a missed flag, never a false one).

Several URLs fan requests out: each server has at most one request of ours in flight (a free-server pool, handed
out first come, first served: :class:`ServerPool`), so ``concurrency`` is the number of servers. A URL given as
``RECIPE=URL`` serves only that recipe.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from h3.atomic import sha256_file, tmp_path_for
from h3.media import MediaError, probe
from h3.record import ClipRecord, RequestSpec
from h3.recipe import Recipe
from h3.runtime import FPS, GenerateRequest, resolve_request
from h3eval.backends import BackendError, foreign_record, write_record

logger = logging.getLogger(__name__)

TERMINAL = ("completed", "failed")


def parse_urls(urls: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``["http://a", "fast=http://b"]`` -> (URLs for any recipe, {recipe: URLs})."""
    shared, per_recipe = [], {}
    for item in urls:
        name, sep, url = item.partition("=")
        if sep and not name.startswith("http"):
            target = per_recipe.setdefault(name, [])
        else:
            url, target = item, shared
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url must be http(s)://HOST:PORT or RECIPE=http(s)://HOST:PORT, got {item!r}")
        target.append(url.rstrip("/"))
    if not urls:
        raise ValueError("the http backend needs at least one --url")
    return shared, per_recipe


class ServerPool:
    """The free servers of one set of URLs, handed to the waiting requests in the order they asked.

    Why not ``queue.Queue``: it wakes a waiter when a server comes back but lets a thread that asks just then take it
    first, so a recipe's next request could overtake another recipe's request that had waited for the same server
    (seen: on one multi-recipe server, ``int8 p0, int8 p1, sparse p1, sparse p0``), and the A/B run's interleaving
    across recipes (request i of every recipe before request i + 1) would not hold on a server they share.
    """

    def __init__(self, urls: tuple[str, ...]):
        self._cond = threading.Condition()
        self._free = deque(urls)
        self._waiting: deque[object] = deque()

    def get(self) -> str:
        with self._cond:
            ticket = object()
            self._waiting.append(ticket)
            while not (self._free and self._waiting[0] is ticket):
                self._cond.wait()
            self._waiting.popleft()
            url = self._free.popleft()
            self._cond.notify_all()  # the next in line may take another free server
            return url

    def put(self, url: str) -> None:
        with self._cond:
            self._free.append(url)
            self._cond.notify_all()


class HttpBackend:
    name = "http"

    def __init__(self, urls: list[str], default_size: tuple[int, int], api_key: str | None = None,
                 timeout_s: float = 1800.0, poll_interval_s: float = 0.2, extra_fields: dict[str, Any] | None = None,
                 connect_timeout_s: float = 10.0):
        self.shared, self.per_recipe = parse_urls(urls)
        self.default_size = default_size
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.extra_fields = dict(extra_fields or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(60.0, connect=connect_timeout_s))
        self._free: dict[tuple[str, ...], ServerPool] = {}
        self._free_lock = threading.Lock()
        self._is_h3: dict[str, bool] = {}

    @property
    def concurrency(self) -> int:
        return max(1, len(self.shared) + sum(len(v) for v in self.per_recipe.values()))

    def servers_for(self, recipe: str) -> tuple[str, ...]:
        servers = tuple(self.per_recipe.get(recipe) or self.shared)
        if not servers:
            raise BackendError(f"no --url serves recipe {recipe!r} (give --url URL or --url {recipe}=URL)")
        return servers

    def _pool(self, servers: tuple[str, ...]) -> ServerPool:
        with self._free_lock:  # one pool per set of servers, also when two recipes' first requests ask at once
            if servers not in self._free:
                self._free[servers] = ServerPool(servers)
            return self._free[servers]

    def close(self) -> None:
        self.client.close()

    # -- one request -------------------------------------------------------------------------------------------
    def generate(self, recipe: Recipe, request: GenerateRequest, out: Path, extra: dict | None = None) -> ClipRecord:
        pool = self._pool(self.servers_for(recipe.name))
        url = pool.get()
        try:
            return self._generate(url, recipe, request, Path(out), dict(extra or {}))
        finally:
            pool.put(url)

    def _get(self, url: str, path: str, **kw) -> httpx.Response:
        try:
            return self.client.get(url + path, **kw)
        except httpx.HTTPError as exc:
            raise BackendError(f"{url}{path}: {type(exc).__name__}: {exc or 'no response'}") from None

    def is_h3_server(self, url: str) -> bool:
        """Our own server advertises its recipe in ``/v1/models``; then the client verifies the recipe hash."""
        if url not in self._is_h3:
            response = self._get(url, "/v1/models")
            if response.status_code == 401:
                raise BackendError(f"{url}/v1/models: 401 unauthorized (give --api-key)")
            data = response.json().get("data", []) if response.status_code == 200 else []
            self._is_h3[url] = bool(data) and "h3_levers_sha256" in data[0]
        return self._is_h3[url]

    def payload(self, url: str, recipe: Recipe, request: GenerateRequest) -> dict[str, Any]:
        num_frames, height, width = resolve_request(request, self.default_size)
        body: dict[str, Any] = {
            "prompt": request.prompt, "seed": request.seed, "size": f"{width}x{height}", "num_frames": num_frames,
            "fps": FPS, "num_inference_steps": recipe.steps, **self.extra_fields,
        }
        if self.is_h3_server(url):
            from h3.server import levers_sha256

            body["h3_levers_sha256"] = levers_sha256(recipe)
        return body

    def _generate(self, url: str, recipe: Recipe, request: GenerateRequest, out: Path, extra: dict) -> ClipRecord:
        body = self.payload(url, recipe, request)
        t_submit = time.perf_counter()
        deadline = t_submit + self.timeout_s
        # The first keyframe goes as input_reference, the field OpenAI's and SGLang's image-to-video servers read.
        images = {{"first_frame": "input_reference", "last_frame": "last_frame", "reference": "reference_image"}[role]:
                  image for role, image in request.images().items()}
        job = self._submit(url, body, deadline, images)
        job_id = job.get("id")
        if not isinstance(job_id, str) or not job_id:
            raise BackendError(f"{url}/v1/videos answered without a job id: {job!r}")
        job = self._poll(url, job_id, job, deadline)
        tmp = tmp_path_for(out)
        try:
            self._download(url, job_id, tmp, deadline)
            try:
                probe(tmp)
            except MediaError as exc:
                raise BackendError(f"{url} job {job_id}: the downloaded clip does not decode ({exc})") from None
            t_file = time.perf_counter()
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        try:
            record = self._record(url, job, recipe, request, out, t_file - t_submit, extra)
            write_record(out, record)
        except BaseException:
            out.unlink(missing_ok=True)
            raise
        return record

    def _submit(self, url: str, body: dict, deadline: float, images: dict | None = None) -> dict:
        """POST the job; a 429 (queue full) is back-pressure: wait and retry until the deadline.

        With ``images`` (field -> ImageInput) the job goes as multipart/form-data with each image a file upload, as
        the openai SDK sends ``input_reference``."""
        wait = self.poll_interval_s
        while True:
            try:
                if images:
                    form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in body.items()}
                    files = {name: (f"{name}.png", image.data, image.media_type) for name, image in images.items()}
                    response = self.client.post(url + "/v1/videos", data=form, files=files)
                else:
                    response = self.client.post(url + "/v1/videos", json=body)
            except httpx.HTTPError as exc:
                raise BackendError(f"{url}/v1/videos: server unreachable ({type(exc).__name__}: {exc})") from None
            if response.status_code == 429 and time.perf_counter() + wait < deadline:
                time.sleep(wait)
                wait = min(wait * 2, 5.0)
                continue
            if response.status_code >= 400:
                raise BackendError(f"{url}/v1/videos: HTTP {response.status_code}: {response.text[:500]}")
            return response.json()

    def _poll(self, url: str, job_id: str, job: dict, deadline: float) -> dict:
        while job.get("status") not in TERMINAL:
            if time.perf_counter() > deadline:
                raise BackendError(f"{url} job {job_id} did not complete within {self.timeout_s:g} s "
                                   f"(last status {job.get('status')!r})")
            time.sleep(self.poll_interval_s)
            response = self._get(url, f"/v1/videos/{job_id}")
            if response.status_code != 200:
                raise BackendError(f"{url}/v1/videos/{job_id}: HTTP {response.status_code}: {response.text[:300]}")
            job = response.json()
        if job["status"] == "failed":
            error = job.get("error") or {}
            message = error.get("message") if isinstance(error, dict) else error
            raise BackendError(f"{url} job {job_id} failed on the server: {message or 'no reason given'}")
        return job

    def _download(self, url: str, job_id: str, tmp: Path, deadline: float) -> None:
        try:
            with self.client.stream("GET", f"{url}/v1/videos/{job_id}/content") as response:
                if response.status_code != 200:
                    response.read()
                    raise BackendError(f"{url}/v1/videos/{job_id}/content: HTTP {response.status_code}: "
                                       f"{response.text[:300]}")
                expected = response.headers.get("content-length")
                received = 0
                with open(tmp, "wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        received += len(chunk)
                    handle.flush()
                    os.fsync(handle.fileno())
        except httpx.HTTPError as exc:
            raise BackendError(f"{url} job {job_id}: download cut short ({type(exc).__name__}: {exc})") from None
        if expected is not None and int(expected) != received:
            raise BackendError(f"{url} job {job_id}: download cut short ({received} of {expected} bytes)")

    def _record(self, url: str, job: dict, recipe: Recipe, request: GenerateRequest, out: Path, wall_s: float,
                extra: dict) -> ClipRecord:
        server = {"server_url": url, "server_job_id": job["id"], "client_wall_s": wall_s}
        for key in ("inference_time_s", "peak_memory_mb"):
            if job.get(key) is not None:
                server[key] = job[key]
        raw = job.get("h3_record")
        if isinstance(raw, dict):
            record = ClipRecord.model_validate(raw)
            if record.mp4_sha256 != sha256_file(out):
                raise BackendError(f"{url} job {job['id']}: the downloaded clip is not the one the server recorded "
                                   "(sha256 differs)")
            server["server_request_to_file_latency_s"] = record.timings.request_to_file_latency_s
            if record.recipe_name != recipe.name:
                # The server ran these levers (it checked h3_levers_sha256) under its own recipe's name.
                server["server_recipe_name"] = record.recipe_name
                record.recipe_name, record.recipe, record.recipe_sha256 = recipe.name, recipe.resolved(), recipe.sha256()
            record.timings.request_to_file_latency_s = wall_s
            record.extra = {**record.extra, **extra, **server, "hash_source": "raw"}
            return record
        num_frames, height, width = resolve_request(request, self.default_size)
        peak_mb = job.get("peak_memory_mb")
        return foreign_record(
            out, recipe_name=recipe.name, recipe=recipe.resolved(),
            request=RequestSpec(prompt=request.prompt, prompt_id=request.prompt_id, seed=request.seed,
                                num_frames=request.num_frames, seconds=request.seconds, height=height, width=width,
                                workflow=request.workflow, conditioning=request.conditioning_spec()),
            model=str(job.get("model") or url), generation_side_latency_s=job.get("inference_time_s"),
            request_to_file_latency_s=wall_s,
            peak_memory_bytes=int(peak_mb * 2**20) if isinstance(peak_mb, (int, float)) else None,
            device=url, extra={**extra, **server},
        )
