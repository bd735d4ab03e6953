"""``h3 serve``: the OpenAI videos API (as the official ``openai`` SDK calls it, with SGLang's extra fields) over one
loaded H3 runtime.

Endpoints: ``POST /v1/videos`` (JSON, multipart/form-data or a urlencoded form), ``GET /v1/videos`` (``limit``,
``after``, ``order``), ``GET /v1/videos/{id}``, ``DELETE /v1/videos/{id}``, ``GET /v1/videos/{id}/content``
(``variant`` = ``video`` MP4, ``thumbnail`` WebP, ``spritesheet`` JPEG), ``GET /v1/models``, ``GET /health``. Job
status: ``queued``, ``in_progress``, ``completed``, ``failed``.

Request fields (:data:`FIELDS`), each honoured or refused by name, never ignored:

- OpenAI's: ``prompt``, ``model`` (the served model id or recipe name, both listed in ``/v1/models``), ``seconds``
  and ``size`` "WxH". Both are mapped onto the model's grid and the job reports what will be generated:
  ``seconds`` snaps to the nearest frame count ``17n+5`` the video VAE decodes (below MiniMax-H3's 5 s minimum,
  the shortest clip; above its 15 s maximum, a 422), ``size`` snaps each side to the nearest multiple of the
  canvas multiple (32). ``input_reference`` (an image to start from) is refused by name: the runtime generates
  text-to-video+audio only so far.
- SGLang's: ``seed``, ``num_frames``, ``fps`` (24 only), ``num_inference_steps`` (the recipe's own only),
  ``guidance_scale`` (1 only) and ``negative_prompt`` (empty only): MiniMax-H3 is guidance-distilled, one forward
  per step and no unconditional branch, so another scale or a negative prompt cannot be honoured. SGLang's
  ``extra_body`` object (or, in a form, JSON text) is merged into the top level.
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
import copy
import hmac
import json
import logging
import math
import re
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from h3.atomic import atomic_write_bytes, atomic_write_json, sha256_file
from h3.runtime import FPS, MAX_SECONDS, MIN_SECONDS, GenerateRequest, RequestError, resolve_request

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")
# ASCII only: Python's int() and \d would read Arabic-Indic and other Unicode digits ("١٢٨" as 128).
SIZE = re.compile(r"^([0-9]{1,6})[xX]([0-9]{1,6})$")
INTEGER = re.compile(r"^-?[0-9]{1,30}$")
DECIMAL = re.compile(r"^-?[0-9]{1,30}(\.[0-9]{1,30})?$")
STATUSES = ("queued", "in_progress", "completed", "failed")
# What MiniMax-H3 was released for (diffusers' resolve_canvas_size): area cap and aspect-ratio range.
RELEASED_CANVAS_PIXELS = 768 * 1344
MIN_ASPECT, MAX_ASPECT = 1 / 4, 4.0
POLL_AFTER_MS = 250
"""Sent as ``openai-poll-after-ms`` on a retrieve: the SDK's ``poll``/``create_and_poll`` wait that long."""

FIELDS = {
    "prompt": "text to generate from (required)",
    "model": "the served model id or recipe name (GET /v1/models)",
    "seconds": "duration; snapped to the nearest 17n+5 frame count at 24 fps, 5 to 15 s",
    "size": "WIDTHxHEIGHT; each side snapped to the nearest multiple of the canvas multiple",
    "num_frames": "frame count; snapped like seconds (give one of the two)",
    "seed": "integer, 0 to 2**63-1 (default 0)",
    "fps": "24 only (MiniMax-H3 generates at 24 fps)",
    "num_inference_steps": "the served recipe's steps only",
    "guidance_scale": "1 only (MiniMax-H3 is guidance-distilled)",
    "negative_prompt": "empty only (MiniMax-H3 is guidance-distilled)",
    "h3_levers_sha256": "the levers the client expects the server to run",
    "extra_body": "SGLang's wrapper: an object whose fields are merged into the top level",
    "input_reference": "refused: image inputs are not supported yet",
}
REFUSED = {
    "input_reference": "image inputs (first/last keyframe, reference image) are not supported by this server yet: "
                       "it generates from the prompt alone; resubmit without input_reference",
    "reference_url": "image inputs (first/last keyframe, reference image) are not supported by this server yet: "
                     "it generates from the prompt alone; resubmit without reference_url",
}
DISTILLED = ("MiniMax-H3 is guidance-distilled (one forward per step, no unconditional branch, no classifier-free "
             "guidance)")


def levers_sha256(recipe: Any) -> str:
    """Hash of what a recipe configures (every lever), leaving out its name and description."""
    import hashlib

    levers = {k: v for k, v in recipe.resolved().items() if k not in ("name", "description")}
    return hashlib.sha256(json.dumps(levers, sort_keys=True).encode()).hexdigest()


# -- limits ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask of this server. Each has a CLI flag and an environment variable (``h3 serve``)."""

    max_prompt_tokens: int
    """Prompt tokens (the runtime's own tokenizer, as the pipeline tokenizes it). ``--max-prompt-tokens``."""
    max_pixels: int
    """Canvas width x height after snapping. ``--max-pixels``."""
    job_timeout_s: float
    """Seconds one job may generate before it is ended as failed. ``--job-timeout``."""
    max_body_bytes: int = 64 * 1024
    """Request body of ``POST /v1/videos`` (413 beyond). ``--max-body-bytes``."""
    basis: dict[str, str] = field(default_factory=dict)
    """Where each default came from, reported with the limits."""

    def __post_init__(self):
        for name in ("max_prompt_tokens", "max_pixels", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        t = self.job_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"job_timeout_s must be a positive finite number of seconds, got {t!r}")

    def report(self) -> dict[str, Any]:
        return asdict(self)


# The longest prompt in prompts/ is 772 characters (mixed-length.jsonl), 772 tokens on the tiny preset's
# one-token-per-character tokenizer; an 8 KB prompt took 65 s on the tiny preset against about 1 s (issue 26).
DEFAULT_MAX_PROMPT_TOKENS = 1024
# Seed 000: the full-step 15 s 768x1344 baseline took 1545 s generation-side on one RTX 5090.
CHECKPOINT_JOB_TIMEOUT_S = 3600.0
TINY_JOB_TIMEOUT_S = 300.0
# On a CPU a canvas of 4x the default area takes several times the default clip's time (the tiny preset: 128x128 a
# few seconds, 512x512 about a minute on 2 cores, 1792x1024 minutes: issue 26); beyond that, raise --max-pixels.
CPU_CANVAS_FACTOR = 4


def default_limits(runtime: Any, **overrides: Any) -> ServerLimits:
    """Limits from what the loaded model and its device can do; ``overrides`` (not None) replace single values."""
    basis: dict[str, str] = {}
    pipe = getattr(runtime, "pipe", None)
    positions = None
    try:
        positions = int(pipe.text_encoder.config.text_config.max_position_embeddings)
    except (AttributeError, TypeError, ValueError):
        pass
    if positions is not None and positions < DEFAULT_MAX_PROMPT_TOKENS:
        tokens = positions
        basis["max_prompt_tokens"] = f"the text encoder's {positions} positions"
    else:
        tokens = DEFAULT_MAX_PROMPT_TOKENS
        basis["max_prompt_tokens"] = "default: room for the longest prompt suites (issue 26: long prompts stall)"
    try:
        budget = int(getattr(pipe.config, "canvas_max_pixels"))
    except (AttributeError, TypeError, ValueError):
        budget = RELEASED_CANVAS_PIXELS
    height, width = getattr(runtime, "default_size", (768, 1344))
    device = str(getattr(getattr(runtime, "device", None), "type", "cpu"))
    if device == "cpu":
        pixels = min(budget, CPU_CANVAS_FACTOR * height * width)
        basis["max_pixels"] = f"CPU: {CPU_CANVAS_FACTOR}x the default {width}x{height} canvas (model budget {budget})"
    else:
        pixels = budget
        basis["max_pixels"] = f"the model's canvas budget ({budget} pixels, MiniMax-H3's 768x1344)"
    pixels = max(pixels, height * width)
    if getattr(runtime, "model", None) == "tiny":
        timeout, basis["job_timeout_s"] = TINY_JOB_TIMEOUT_S, "tiny preset"
    else:
        timeout, basis["job_timeout_s"] = CHECKPOINT_JOB_TIMEOUT_S, "checkpoint: seed 000's 1545 s baseline x2.3"
    values = {"max_prompt_tokens": tokens, "max_pixels": pixels, "job_timeout_s": timeout}
    for name, value in overrides.items():
        if value is not None:
            values[name] = value
            basis[name] = "set by the operator"
    return ServerLimits(**values, basis=basis)


# -- errors ----------------------------------------------------------------------------------------------------------
def _error_body(status: int, message: str, detail: Any, param: str | None = None) -> dict[str, Any]:
    """FastAPI's ``detail`` beside OpenAI's ``error`` object (what the SDK reads into its exception message)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"detail": detail, "error": {"message": message, "type": kind, "param": param, "code": str(status)}}


class RequestProblem(Exception):
    """One or more fields of a request the server refuses: 422 (or ``status``) with every field named."""

    def __init__(self, errors: list[tuple[str, str]], status: int = 422, where: str = "body"):
        self.errors, self.status, self.where = errors, status, where
        super().__init__("; ".join(f"{f}: {m}" for f, m in errors))

    def response(self) -> JSONResponse:
        detail = [{"loc": [self.where] + ([f] if f else []), "msg": m, "type": "value_error"} for f, m in self.errors]
        field_name, message = self.errors[0]
        text = f"{field_name}: {message}" if field_name else message
        return JSONResponse(status_code=self.status, content=_error_body(self.status, text, detail, field_name or None))


def _show(value: Any, limit: int = 60) -> str:
    """A value for an error message: repr, cut short (a refused 1 MB value is not echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class _NonFinite:
    """A JSON number that is not finite (``NaN``, ``Infinity``, ``1e400``): kept as what was sent, refused by field."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _json_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RequestProblem([(key, "given twice")])
        out[key] = value
    return out


def parse_json_object(data: bytes | str, what: str = "the body") -> dict[str, Any]:
    """A JSON object with unique keys; non-finite numbers kept as :class:`_NonFinite` for the field to refuse."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, parse_float=_json_float, parse_constant=_NonFinite, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError:
        raise RequestProblem([("", f"{what} is not UTF-8 text")]) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; an integer over Python's 4300-digit limit
        raise RequestProblem([("", f"{what} is not valid JSON ({str(exc)[:120]})")]) from None
    if not isinstance(value, dict):
        raise RequestProblem([("", f"{what} must be a JSON object, got {type(value).__name__}")])
    return value


# -- field parsing: one rule for JSON values and form strings ------------------------------------------------------
def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, not a boolean ({_show(value)})")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and INTEGER.match(value.strip()):
        return int(value.strip())
    raise ValueError(f"{name} must be an integer written in ASCII digits, got {_show(value)}")


def _as_number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, not a boolean ({_show(value)})")
    if isinstance(value, _NonFinite):
        raise ValueError(f"{name} must be a finite number, got {value.text}")
    if isinstance(value, int):
        if abs(value) > 10**18:
            raise ValueError(f"{name} is out of range, got {_show(value)}")
        value = float(value)
    elif isinstance(value, str) and DECIMAL.match(value.strip()):
        value = float(value.strip())
    elif not isinstance(value, float):
        raise ValueError(f"{name} must be a number (like 8 or \"8\" or 8.5), got {_show(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
    return value


def _as_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800" in JSON
        raise ValueError(f"{name} is not valid Unicode text (it holds an unpaired surrogate)") from None
    return value


@dataclass
class Resolved:
    """A request the server accepted: what to generate, and what the job reports."""

    request: GenerateRequest
    num_frames: int
    height: int
    width: int
    requested: dict[str, Any]


class RequestSchema:
    """Validates and resolves ``POST /v1/videos`` bodies against one runtime, its recipe and the server's limits."""

    def __init__(self, runtime: Any, limits: ServerLimits, model_names: tuple[str, ...]):
        self.runtime = runtime
        self.recipe = runtime.recipe
        self.limits = limits
        self.model_names = model_names
        self.levers = levers_sha256(self.recipe)
        self.multiple = int(getattr(getattr(runtime, "pipe", None), "canvas_multiple", 32))
        self.default_size = tuple(getattr(runtime, "default_size", (768, 1344)))
        tokenizer = getattr(getattr(runtime, "pipe", None), "tokenizer", None)
        # A copy of its own: the worker thread tokenizes through the pipeline's tokenizer at the same time.
        self._tokenizer = copy.deepcopy(tokenizer) if tokenizer is not None else None
        self._tokenizer_lock = threading.Lock()

    def count_tokens(self, prompt: str) -> int:
        if self._tokenizer is None:
            return len(prompt)
        with self._tokenizer_lock:
            return len(self._tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def resolve(self, body: dict[str, Any]) -> Resolved:
        body = self._merge_extra_body(body)
        # JSON null for a field of this API means "not given" (SGLang's and OpenAI's optional fields).
        body = {k: v for k, v in body.items() if not (v is None and (k in FIELDS or k in REFUSED))}
        errors: list[tuple[str, str]] = []
        values: dict[str, Any] = {}

        def check(name: str, parse) -> None:
            if name in body:
                try:
                    values[name] = parse(name, body[name])
                except ValueError as exc:
                    errors.append((name, str(exc)))

        for name in sorted(set(body) - set(FIELDS) - set(REFUSED)):
            errors.append((name, f"unknown field {_show(name, 40)}; this server takes: {', '.join(FIELDS)}"))
        for name, why in REFUSED.items():
            if name in body:
                errors.append((name, why))
        if "prompt" not in body:
            errors.append(("prompt", "prompt is required"))
        check("prompt", self._prompt)
        check("model", self._model)
        check("seed", self._seed)
        check("seconds", self._seconds)
        check("num_frames", self._num_frames)
        check("size", self._size)
        check("fps", self._fps)
        check("num_inference_steps", self._steps)
        check("guidance_scale", self._guidance_scale)
        check("negative_prompt", self._negative_prompt)
        check("h3_levers_sha256", self._levers)
        if "seconds" in values and "num_frames" in values:
            errors.append(("num_frames", "give either seconds or num_frames, not both"))
        if errors:
            raise RequestProblem(errors)

        width, height = values.get("size", (None, None))
        request = GenerateRequest(prompt=values["prompt"], seed=values.get("seed", 0),
                                  num_frames=values.get("num_frames"), seconds=values.get("seconds"),
                                  height=height, width=width)
        try:
            num_frames, height, width = resolve_request(request, self.default_size, self.multiple)
        except RequestError as exc:
            text = str(exc)
            if any(word in text for word in ("height", "width", "aspect")):
                name = "size"
            else:
                name = "seconds" if "seconds" in values else "num_frames"
            raise RequestProblem([(name, text)]) from None
        if width * height > self.limits.max_pixels:  # the default canvas, when no size was given
            raise RequestProblem([("size", self._too_many_pixels(width, height))])
        requested = {k: body[k] for k in ("seconds", "size", "num_frames") if k in body}
        return Resolved(request, num_frames, height, width, jsonable_encoder(requested))

    # -- one parser per field --------------------------------------------------------------------------------------
    def _merge_extra_body(self, body: dict[str, Any]) -> dict[str, Any]:
        if "extra_body" not in body:
            return body
        extra = body["extra_body"]
        if isinstance(extra, str):  # a form sends it as JSON text (SGLang's multipart convention)
            extra = parse_json_object(extra, "extra_body")
        if not isinstance(extra, dict):
            raise RequestProblem([("extra_body", f"extra_body must be an object, got {type(extra).__name__}")])
        clash = sorted(set(extra) & set(body))
        if clash:
            raise RequestProblem([(name, "given both at the top level and in extra_body") for name in clash])
        merged = {k: v for k, v in body.items() if k != "extra_body"}
        merged.update(extra)
        return merged

    def _prompt(self, name: str, value: Any) -> str:
        prompt = _as_text(name, value)
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        tokens = self.count_tokens(prompt)
        if tokens > self.limits.max_prompt_tokens:
            raise ValueError(f"the prompt is {tokens} tokens; this server takes at most "
                             f"{self.limits.max_prompt_tokens} (--max-prompt-tokens, H3_MAX_PROMPT_TOKENS)")
        return prompt

    def _model(self, name: str, value: Any) -> str:
        model = _as_text(name, value)
        if model not in self.model_names:
            raise ValueError(f"this server serves {' or '.join(repr(m) for m in self.model_names)} "
                             f"(GET /v1/models), got {_show(model)}")
        return model

    def _seed(self, name: str, value: Any) -> int:
        seed = _as_int(name, value)
        if not 0 <= seed < 2**63:
            raise ValueError(f"seed must be between 0 and 2**63-1, got {seed}")
        return seed

    def _seconds(self, name: str, value: Any) -> float:
        seconds = _as_number(name, value)
        if seconds <= 0:
            raise ValueError(f"seconds must be positive, got {seconds:g}")
        if seconds > MAX_SECONDS:
            raise ValueError(f"MiniMax-H3 generates {MIN_SECONDS:g} to {MAX_SECONDS:g} s, got {seconds:g}")
        # Below the model's minimum: its shortest clip (OpenAI's default 4 s becomes 5.167 s, reported in the job).
        return max(seconds, MIN_SECONDS)

    def _num_frames(self, name: str, value: Any) -> int:
        frames = _as_int(name, value)
        if frames < 1:
            raise ValueError(f"num_frames must be positive, got {frames}")
        if frames > 100_000:
            raise ValueError(f"MiniMax-H3 generates {MIN_SECONDS:g} to {MAX_SECONDS:g} s at {FPS} fps, "
                             f"got {frames} frames")
        return frames

    def _size(self, name: str, value: Any) -> tuple[int, int]:
        text = _as_text(name, value)
        match = SIZE.match(text.strip())
        if not match:
            raise ValueError(f"size must be 'WIDTHxHEIGHT' in ASCII digits, like '1280x720', got {_show(text)}")
        width, height = int(match.group(1)), int(match.group(2))
        if width < 1 or height < 1:
            raise ValueError(f"size must be positive, got {text.strip()}")
        m = self.multiple
        snapped_w, snapped_h = (max(m, (v + m // 2) // m * m) for v in (width, height))
        if not MIN_ASPECT <= snapped_w / snapped_h <= MAX_ASPECT:
            raise ValueError(f"aspect ratio {snapped_w}x{snapped_h} (from {width}x{height}) is outside "
                             f"MiniMax-H3's 1:4 to 4:1")
        if snapped_w * snapped_h > self.limits.max_pixels:
            raise ValueError(self._too_many_pixels(snapped_w, snapped_h, f"{width}x{height}"))
        return snapped_w, snapped_h

    def _too_many_pixels(self, width: int, height: int, asked: str | None = None) -> str:
        source = f" (snapped from {asked})" if asked and asked != f"{width}x{height}" else ""
        return (f"{width}x{height}{source} is {width * height} pixels; this server generates at most "
                f"{self.limits.max_pixels} (--max-pixels, H3_MAX_PIXELS)")

    def _fps(self, name: str, value: Any) -> int:
        fps = _as_number(name, value)
        if fps != FPS:
            raise ValueError(f"MiniMax-H3 generates at {FPS} fps, got {fps:g}")
        return FPS

    def _steps(self, name: str, value: Any) -> int:
        steps = _as_int(name, value)
        if steps != self.recipe.steps:
            raise ValueError(f"this server runs recipe {self.recipe.name!r} with {self.recipe.steps} steps, "
                             f"got {steps}")
        return steps

    def _guidance_scale(self, name: str, value: Any) -> float:
        scale = _as_number(name, value)
        if scale != 1.0:
            raise ValueError(f"{DISTILLED}: only guidance_scale 1 (the conditional prediction alone) is what it "
                             f"computes, got {scale:g}")
        return scale

    def _negative_prompt(self, name: str, value: Any) -> str:
        text = _as_text(name, value)
        if text.strip():
            raise ValueError(f"{DISTILLED}: a negative prompt has nothing to act on; send none")
        return text

    def _levers(self, name: str, value: Any) -> str:
        text = _as_text(name, value)
        if text != self.levers:
            raise ValueError(f"this server runs recipe {self.recipe.name!r} (levers {self.levers[:12]}), not the "
                             f"levers asked for ({_show(text[:12])})")
        return text


async def read_request_body(request: Request, schema: RequestSchema) -> dict[str, Any]:
    """The body of ``POST /v1/videos`` as a dict of field values: JSON, multipart or urlencoded; 413 past the limit."""
    limit = schema.limits.max_body_bytes
    too_large = RequestProblem([("", f"the request body is over {limit} bytes (--max-body-bytes, H3_MAX_BODY_BYTES)"
                                     "; image uploads (input_reference) are not supported yet")], status=413)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    body = b"".join(chunks)
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type in ("application/json", "") or content_type.endswith("+json"):
        return parse_json_object(body)
    if content_type not in ("multipart/form-data", "application/x-www-form-urlencoded"):
        raise RequestProblem([("", f"unsupported content type {content_type!r}: send application/json, "
                                   "multipart/form-data or application/x-www-form-urlencoded")], status=415)

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(request.scope, replay).form(max_files=4, max_fields=64, max_part_size=limit)
    try:
        values: dict[str, Any] = {}
        errors: list[tuple[str, str]] = []
        for key, value in form.multi_items():
            if key in values:
                errors.append((key, "given twice"))
            elif not isinstance(value, str):  # an uploaded file
                errors.append((key, REFUSED.get(key, f"{key} must be a form field, not a file upload")))
                values[key] = None
            else:
                values[key] = value
        if errors:
            raise RequestProblem(errors)
        return values
    finally:
        await form.close()


# -- jobs ------------------------------------------------------------------------------------------------------------
class JobTimeout(RuntimeError):
    """Raised in the worker thread, at a module call of the pipeline, when its job is past its deadline."""


class JobInterrupts:
    """Per-job deadline and progress, checked as the pipeline calls its modules.

    Forward pre-hooks (prepended, so they run before any lever's hook) on the text encoder, the transformer (once per
    denoising step) and the decoders of both VAEs and their blocks (per tile and chunk): never inside a compiled
    block. They act only on the worker thread, so an in-process caller of the same runtime is unaffected.
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
        import torch

        @torch.compiler.disable
        def check(*_):
            if self.thread == threading.get_ident() and self.deadline is not None and time.monotonic() > self.deadline:
                self.fired = self.reason
                raise JobTimeout(self.reason)

        @torch.compiler.disable
        def step(*_):
            check()
            if self.thread == threading.get_ident():
                self.steps += 1
                if self.on_step is not None:
                    self.on_step(self.steps)

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
                raise RequestProblem([("after", f"no video job {_show(after, 80)}")], where="query")
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
    out = store.content_path(job_id)
    total = max(1, int(getattr(runtime.recipe, "steps", 1)))
    job = store.jobs[job_id]

    def on_step(steps: int) -> None:  # progress in memory; the file is written at the end
        job["progress"] = min(95, int(95 * steps / total))

    started = time.monotonic()
    try:
        interrupts.start(limits.job_timeout_s, on_step)
        try:
            record = runtime.generate(request, out, extra={"server_job_id": job_id})
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


# -- previews --------------------------------------------------------------------------------------------------------
THUMBNAIL = ("thumbnail", ".thumbnail.webp", "image/webp")
SPRITESHEET = ("spritesheet", ".spritesheet.jpg", "image/jpeg")
SPRITE_FRAMES, SPRITE_COLUMNS, SPRITE_TILE_WIDTH = 16, 4, 256


def sprite_layout(num_frames: int, width: int, height: int) -> dict[str, Any]:
    """Which frames a spritesheet holds (evenly spaced, first and last included) and how they are laid out."""
    import numpy as np

    count = min(SPRITE_FRAMES, num_frames)
    frames = sorted({int(i) for i in np.linspace(0, num_frames - 1, count).round()})
    tile_w = min(width, SPRITE_TILE_WIDTH)
    tile_h = max(1, round(height * tile_w / width))
    columns = min(SPRITE_COLUMNS, len(frames))
    return {"frames": frames, "columns": columns, "rows": -(-len(frames) // columns), "tile": (tile_w, tile_h)}


def _decode_frames(path: Path, wanted: set[int]) -> dict[int, Any]:
    import av

    found: dict[int, Any] = {}
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for index, frame in enumerate(container.decode(stream)):
            if index in wanted:
                found[index] = frame.to_ndarray(format="rgb24")
            if len(found) == len(wanted):
                break
    return found


def make_preview(variant: str, mp4: Path, layout: dict[str, Any]) -> bytes:
    """The thumbnail (first frame, lossless WebP) or the spritesheet (JPEG grid of ``layout``: :func:`sprite_layout`)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    if variant == "thumbnail":
        Image.fromarray(_decode_frames(mp4, {0})[0]).save(buffer, format="WEBP", lossless=True)
        return buffer.getvalue()
    frames = _decode_frames(mp4, set(layout["frames"]))
    tile_w, tile_h = layout["tile"]
    sheet = Image.new("RGB", (tile_w * layout["columns"], tile_h * layout["rows"]))
    for slot, index in enumerate(layout["frames"]):
        tile = Image.fromarray(frames[index])
        if tile.size != (tile_w, tile_h):
            tile = tile.resize((tile_w, tile_h), Image.Resampling.BILINEAR)
        sheet.paste(tile, ((slot % layout["columns"]) * tile_w, (slot // layout["columns"]) * tile_h))
    sheet.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


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
    model_id = model_name or f"h3-{runtime.model if runtime.model == 'tiny' else Path(runtime.model).name}"
    names = tuple(dict.fromkeys([model_id, recipe.name]))
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
        return JSONResponse(status_code=422, content=_error_body(422, message, errors, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(jsonable_encoder(exc.detail))
        return JSONResponse(status_code=exc.status_code, content=_error_body(exc.status_code, message, exc.detail),
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:  # a bug: say so in JSON, keep serving
        logger.exception("internal error")
        return JSONResponse(status_code=500, content=_error_body(500, f"internal server error ({type(exc).__name__})",
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
        return {k: v for k, v in job.items() if k != "mp4_sha256" and not k.startswith("_")}

    def model_entry(name: str) -> dict[str, Any]:
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
               "num_frames": num_frames, "fps": FPS, "num_inference_steps": recipe.steps, "h3_recipe": recipe.name,
               "h3_requested": resolved.requested, "_created_ns": now}
        if not store.submit(job, request):
            return JSONResponse(status_code=429, content=_error_body(
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


def serve(model: str, recipe: str, host: str = "127.0.0.1", port: int = 30000, api_key: str | None = None,
          max_queue: int = 8, output_dir: str | Path = "h3-serve", device: str | None = None,
          **limit_overrides: Any) -> None:
    """Load the runtime and serve it until interrupted (``limit_overrides``: :func:`default_limits`' keywords)."""
    import uvicorn

    from h3.recipe import load_recipe
    from h3.runtime import H3Runtime

    runtime = H3Runtime.load(model, load_recipe(recipe), device)
    limits = default_limits(runtime, **limit_overrides)
    logger.warning("h3 serve limits: %s", json.dumps(limits.report()))
    app = create_app(runtime, output_dir, api_key=api_key, max_queue=max_queue, limits=limits)
    uvicorn.run(app, host=host, port=port, log_level="warning")
