"""The request schema of ``h3 serve``: what ``POST /v1/videos`` accepts, how it maps onto the model's grid, and the
server's limits (see :mod:`h3.server` for the API as a whole).

One rule for JSON values and form strings (the openai SDK sends multipart forms, so every value arrives as text):
integers are ASCII digits and never booleans, numbers are finite, text is valid Unicode; every field is honoured or
refused by name (422, the field in FastAPI's ``detail[].loc`` and OpenAI's ``error.param``).
"""

from __future__ import annotations

import copy
import json
import math
import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from h3.conditioning import ConditioningError, ImageInput, image_from_bytes, workflow_of
from h3.runtime import FPS, MAX_SECONDS, MIN_SECONDS, SMALL_MODELS, GenerateRequest, RequestError, resolve_request

# ASCII only: Python's int() and \d would read Arabic-Indic and other Unicode digits ("١٢٨" as 128).
SIZE = re.compile(r"^([0-9]{1,6})[xX]([0-9]{1,6})$")
INTEGER = re.compile(r"^-?[0-9]{1,30}$")
DECIMAL = re.compile(r"^-?[0-9]{1,30}(\.[0-9]{1,30})?$")
# What MiniMax-H3 was released for (diffusers' resolve_canvas_size): area cap and aspect-ratio range.
RELEASED_CANVAS_PIXELS = 768 * 1344
MIN_ASPECT, MAX_ASPECT = 1 / 4, 4.0
FIELDS = {
    "prompt": "text to generate from (required)",
    "model": "the served model id or recipe name (GET /v1/models)",
    "seconds": "duration, 5 to 15 s; snapped up to the next 17n+5 frames at 24 fps (15 s: 14.375 s)",
    "size": "WIDTHxHEIGHT; each side snapped to the nearest multiple of the canvas multiple",
    "num_frames": "frame count; snapped like seconds (give one of the two)",
    "seed": "integer, 0 to 2**63-1 (default 0)",
    "fps": "24 only (MiniMax-H3 generates at 24 fps)",
    "num_inference_steps": "the served recipe's steps only",
    "guidance_scale": "1 only (MiniMax-H3 is guidance-distilled)",
    "negative_prompt": "empty only (MiniMax-H3 is guidance-distilled)",
    "h3_levers_sha256": "the levers the client expects the server to run",
    "extra_body": "SGLang's wrapper: an object whose fields are merged into the top level",
    "input_reference": "the image the clip starts from (OpenAI's and SGLang's image-to-video field; the fl2va first "
                       "keyframe): a file upload, a data: URL, or {\"image_url\": \"data:...\"}",
    "first_frame": "the fl2va first keyframe (an upload or data: URL; the same as input_reference)",
    "last_frame": "the fl2va last keyframe (an upload or data: URL)",
    "reference_image": "a ref2va reference image whose subject the clip keeps (an upload or data: URL)",
}
IMAGE_FIELDS = {"input_reference": "first_frame", "first_frame": "first_frame", "last_frame": "last_frame",
                "reference_image": "reference"}
"""Image fields of a request and the role (h3.conditioning.ROLES) each fills."""
REFUSED = {
    "reference_url": "this server does not fetch URLs (it runs offline): upload the image as input_reference, "
                     "first_frame, last_frame or reference_image, or send it as a data: URL",
}
DISTILLED = ("MiniMax-H3 is guidance-distilled (one forward per step, no unconditional branch, no classifier-free "
             "guidance)")


def levers_sha256(recipe: Any) -> str:
    """Hash of what a recipe configures (every lever), leaving out its name and description."""
    import hashlib

    levers = {k: v for k, v in recipe.resolved().items() if k not in ("name", "description", "signoff")}
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
# On a CPU a canvas of 4x the default area takes a few times the default clip's time (the tiny preset on a shared
# 2-core machine: 128x128 3-10 s, 256x256 15 s, 512x512 54 s; 1792x1024 minutes, issue 26). Raise --max-pixels.
CPU_CANVAS_FACTOR = 4
DEFAULT_MAX_BODY_BYTES = 16 * 2**20


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
        basis["max_prompt_tokens"] = "default: room for the longest prompt suite (issue 26: long prompts stall)"
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
        basis["max_pixels"] = f"the model's canvas budget (canvas_max_pixels {budget}; MiniMax-H3: 768x1344)"
    pixels = max(pixels, height * width)
    if getattr(runtime, "model", None) in SMALL_MODELS:
        timeout, basis["job_timeout_s"] = TINY_JOB_TIMEOUT_S, "tiny preset"
    else:
        timeout, basis["job_timeout_s"] = CHECKPOINT_JOB_TIMEOUT_S, "checkpoint: seed 000's 1545 s baseline x2.3"
    basis["max_body_bytes"] = "default: room for three image uploads (keyframes or a reference) of up to 5 MiB each"
    values = {"max_prompt_tokens": tokens, "max_pixels": pixels, "job_timeout_s": timeout,
              "max_body_bytes": DEFAULT_MAX_BODY_BYTES}
    for name, value in overrides.items():
        if value is not None:
            values[name] = value
            basis[name] = "set by the operator"
    return ServerLimits(**values, basis=basis)


# -- errors ----------------------------------------------------------------------------------------------------------
def error_body(status: int, message: str, detail: Any, param: str | None = None) -> dict[str, Any]:
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
        text = f"{field_name}: {message}" if field_name and not message.startswith(field_name) else message
        return JSONResponse(status_code=self.status, content=error_body(self.status, text, detail, field_name or None))


def show(value: Any, limit: int = 60) -> str:
    """A value for an error message: repr, cut short (a refused 1 MB value is not echoed back)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4300-digit conversion limit
        return "<a number too long to show>"
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
        raise ValueError(f"{name} must be an integer, not a boolean ({show(value)})")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and INTEGER.match(value.strip()):
        return int(value.strip())
    raise ValueError(f"{name} must be an integer written in ASCII digits, got {show(value)}")


def _as_number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, not a boolean ({show(value)})")
    if isinstance(value, _NonFinite):
        raise ValueError(f"{name} must be a finite number, got {value.text}")
    if isinstance(value, int):
        if abs(value) > 10**18:
            raise ValueError(f"{name} is out of range, got {show(value)}")
        value = float(value)
    elif isinstance(value, str) and DECIMAL.match(value.strip()):
        value = float(value.strip())
    elif not isinstance(value, float):
        raise ValueError(f"{name} must be a number (like 8 or \"8\" or 8.5), got {show(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {show(value)}")
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
    recipe: Any = None
    """The served recipe the job runs (one of several on a multi-recipe server)."""


class RequestSchema:
    """Validates and resolves ``POST /v1/videos`` bodies against one runtime, its recipe and the server's limits."""

    def __init__(self, runtime: Any, limits: ServerLimits, model_names: tuple[str, ...]):
        self.runtime = runtime
        self.recipe = runtime.recipe
        self.limits = limits
        self.model_names = model_names
        self.levers = levers_sha256(self.recipe)
        # A multi-recipe server (``h3 serve --recipe A --recipe B``: a shared model) serves each of its recipes; a job
        # names one by its levers or its name.
        self.recipes = list(getattr(runtime, "served_recipes", None) or [self.recipe])
        self.by_levers = {levers_sha256(r): r for r in self.recipes}
        self.by_name = {r.name: r for r in self.recipes}
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
            takes = ", ".join(n for n in FIELDS if n not in REFUSED)
            errors.append((name, f"unknown field {show(name, 40)}; this server takes: {takes}"))
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
        for name in IMAGE_FIELDS:
            check(name, self._image)
        if "seconds" in values and "num_frames" in values:
            errors.append(("num_frames", "give either seconds or num_frames, not both"))
        recipe = self._choose_recipe(values, errors)
        if recipe is not None and "num_inference_steps" in values and values["num_inference_steps"] != recipe.steps:
            errors.append(("num_inference_steps", f"this server runs recipe {recipe.name!r} with {recipe.steps} "
                                                  f"steps, got {values['num_inference_steps']}"))
        if "input_reference" in values and "first_frame" in values:
            errors.append(("first_frame", "input_reference is the first frame: give it once"))
        images = {IMAGE_FIELDS[name]: values[name] for name in IMAGE_FIELDS if name in values}
        if not errors and images:
            try:
                workflow = workflow_of(**images)
            except ConditioningError as exc:
                workflow = None
                errors.append(("reference_image", str(exc).removeprefix("reference: ")))
            if workflow == "ref2va" and getattr(self.runtime, "ref_partition", None) is None:
                errors.append(("reference_image", "this server's checkpoint has no ref2va partition that its recipe "
                                                  "runs on (transformer_ref is not the loaded DiT); send keyframes "
                                                  "or text only"))
        if errors:
            raise RequestProblem(errors)

        width, height = values.get("size", (None, None))
        request = GenerateRequest(prompt=values["prompt"], seed=values.get("seed", 0),
                                  num_frames=values.get("num_frames"), seconds=values.get("seconds"),
                                  height=height, width=width, **images)
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
        return Resolved(request, num_frames, height, width, jsonable_encoder(requested), recipe)

    def _choose_recipe(self, values: dict[str, Any], errors: list[tuple[str, str]]) -> Any:
        """The served recipe a job runs: the one whose levers it names, else the one its ``model`` names, else the
        only one."""
        by_levers = self.by_levers.get(values.get("h3_levers_sha256", ""))
        by_name = self.by_name.get(values.get("model", ""))
        if by_levers is not None and by_name is not None and by_levers is not by_name:
            errors.append(("model", f"model names recipe {by_name.name!r}, h3_levers_sha256 recipe "
                                    f"{by_levers.name!r}"))
            return None
        recipe = by_levers or by_name or (self.recipes[0] if len(self.recipes) == 1 else None)
        if recipe is None and not any(name in ("model", "h3_levers_sha256") for name, _ in errors):
            errors.append(("model", f"this server serves recipes {', '.join(repr(n) for n in self.by_name)}: name "
                                    "one with model (a recipe name) or h3_levers_sha256"))
        return recipe

    # -- one parser per field --------------------------------------------------------------------------------------
    def _merge_extra_body(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("extra_body") is None:  # absent, or JSON null
            return {k: v for k, v in body.items() if k != "extra_body"}
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
        # No tokenizer packs 32 characters into one token: a longer prompt is refused without tokenizing it.
        if len(prompt) > 32 * self.limits.max_prompt_tokens:
            raise ValueError(f"the prompt is {len(prompt)} characters; this server takes at most "
                             f"{self.limits.max_prompt_tokens} tokens (--max-prompt-tokens, H3_MAX_PROMPT_TOKENS)")
        tokens = self.count_tokens(prompt)
        if tokens > self.limits.max_prompt_tokens:
            raise ValueError(f"the prompt is {tokens} tokens; this server takes at most "
                             f"{self.limits.max_prompt_tokens} (--max-prompt-tokens, H3_MAX_PROMPT_TOKENS)")
        return prompt

    def _model(self, name: str, value: Any) -> str:
        model = _as_text(name, value)
        if model not in self.model_names:
            raise ValueError(f"this server serves {' or '.join(repr(m) for m in self.model_names)} "
                             f"(GET /v1/models), got {show(model)}")
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
            raise ValueError(f"size must be 'WIDTHxHEIGHT' in ASCII digits, like '1280x720', got {show(text)}")
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
        return _as_int(name, value)  # checked against the job's recipe once that is known

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

    def _image(self, name: str, value: Any) -> ImageInput:
        """An uploaded file (bytes), a ``data:`` URL, or OpenAI's ``{"image_url": ...}`` object."""
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"image_url"})
            if "file_id" in value:
                raise ValueError("file_id references OpenAI's file store, which this server does not have; upload "
                                 "the image or send image_url as a data: URL")
            if unknown or "image_url" not in value:
                raise ValueError(f"{name} as an object takes image_url only, got {show(sorted(value), 60)}")
            value = value["image_url"]
        if isinstance(value, (bytes, bytearray)):
            data = bytes(value)
        elif isinstance(value, str):
            data = _data_url_bytes(name, value)
        else:
            raise ValueError(f"{name} must be an image upload or a data: URL, got {type(value).__name__}")
        try:
            return image_from_bytes(data, name)
        except ConditioningError as exc:
            raise ValueError(str(exc).removeprefix(f"{name}: ")) from None

    def _levers(self, name: str, value: Any) -> str:
        text = _as_text(name, value)
        if text not in self.by_levers:
            served = ", ".join(f"{r.name!r} (levers {h[:12]})" for h, r in self.by_levers.items())
            raise ValueError(f"this server runs recipe {served}, not the levers asked for ({show(text[:12])})"
                             if len(self.by_levers) == 1 else
                             f"this server runs recipes {served}, not the levers asked for ({show(text[:12])})")
        return text


def _data_url_bytes(name: str, text: str) -> bytes:
    """The bytes of a base64 ``data:image/...`` URL; an http(s) URL is refused (the server runs offline)."""
    import base64
    import binascii

    if text.startswith(("http://", "https://")):
        raise ValueError("this server does not fetch URLs (it runs offline): upload the image or send a data: URL")
    if not text.startswith("data:") or ";base64," not in text[:200]:
        raise ValueError(f"{name} must be an image upload or a base64 data: URL (data:image/png;base64,...), "
                         f"got {show(text, 40)}")
    try:
        return base64.b64decode(text.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{name}: the data: URL is not valid base64") from None


async def read_request_body(request: Request, schema: RequestSchema) -> dict[str, Any]:
    """The body of ``POST /v1/videos`` as a dict of field values: JSON, multipart or urlencoded; 413 past the limit."""
    limit = schema.limits.max_body_bytes
    too_large = RequestProblem([("", f"the request body is over {limit} bytes (--max-body-bytes, H3_MAX_BODY_BYTES)"
                                     )], status=413)
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
                if key in IMAGE_FIELDS:
                    values[key] = await value.read()
                else:
                    errors.append((key, REFUSED.get(key, f"{key} must be a form field, not a file upload")))
                    values[key] = None
            elif key.startswith("input_reference[") and key.endswith("]"):
                # The openai SDK sends an {"image_url": ...} / {"file_id": ...} object as bracketed form fields.
                values.setdefault("input_reference", {})
                if not isinstance(values["input_reference"], dict):
                    errors.append(("input_reference", "given twice"))
                else:
                    values["input_reference"][key[len("input_reference["):-1]] = value
            else:
                values[key] = value
        if errors:
            raise RequestProblem(errors)
        return values
    finally:
        await form.close()
