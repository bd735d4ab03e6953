"""Several requests in one process (``h3 generate --prompts-file``): the model loads once, each recipe's levers apply
once, and every request after a recipe's first is *warm* (no build, no LoRA fuse, no first compile in it).

The prompts file is JSON Lines (``{"prompt": ..., "id": ..., "seed": ...}``, ``id`` and ``seed`` optional, the
format of ``prompts/*.jsonl``) or plain text (one prompt a line; blank lines and lines starting with ``#`` skipped).
With several recipes the model is shared (:meth:`h3.runtime.H3Runtime.switch_recipe`): every prompt runs under the
first recipe, then under the next, and the last one applies for good (an FP8 recipe drops the float weights it
replaces, which is what lets it follow bf16 ones on an 80 GB card). Each request writes its clip and record as a
single request does (``<out>/<recipe>-<NN>.mp4`` and ``.json``; the record says ``extra.batch``: its index, whether it
was warm); ``<out>/requests.json`` gathers every request's anatomy and each recipe's warm figures.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from h3.atomic import atomic_write_json
from h3.runtime import RequestError

SUMMARY = "requests.json"


@dataclass(frozen=True)
class PromptLine:
    prompt: str
    prompt_id: str | None = None
    seed: int | None = None


def read_prompts_file(path: str | Path) -> list[PromptLine]:
    """The prompts of ``path`` (JSON Lines or plain text), or a RequestError naming the line at fault."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RequestError(f"--prompts-file {path}: not UTF-8 text") from None
    except OSError as exc:
        raise RequestError(f"--prompts-file {path}: {exc.strerror or exc}") from None
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line and not line.startswith("#")]
    if not lines:
        raise RequestError(f"--prompts-file {path}: no prompt in it")
    as_json = path.suffix.lower() in (".jsonl", ".json") or lines[0][1].startswith("{")
    prompts = []
    for number, line in lines:
        where = f"--prompts-file {path} line {number}"
        if not as_json:
            prompts.append(PromptLine(line))
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise RequestError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise RequestError(f"{where}: needs a non-empty string \"prompt\"")
        seed = item.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise RequestError(f"{where}: \"seed\" must be an integer 0 to 2**63-1, got {seed!r}")
        prompt_id = item.get("id", item.get("prompt_id"))
        prompts.append(PromptLine(item["prompt"], None if prompt_id is None else str(prompt_id), seed))
    return prompts


def _stem(recipe: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", recipe) or "recipe"


def _quantiles(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return None
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return {"n": len(values), "p50": statistics.median(values), "p90": p90, "mean": statistics.fmean(values),
            "min": ordered[0], "max": ordered[-1]}


def summarize(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Per recipe: the warm requests' generation-side and request-to-file latencies and stages (n, p50, p90, mean,
    min, max), and the first request's apart."""
    out: dict[str, Any] = {}
    for recipe in dict.fromkeys(r["recipe"] for r in requests):
        mine = [r for r in requests if r["recipe"] == recipe]
        warm = [r for r in mine if r["warm"]]
        first = [r for r in mine if not r["warm"]]
        stages = sorted({k for r in warm for k, v in r["stage_anatomy"].items() if isinstance(v, (int, float))})
        out[recipe] = {
            "requests": len(mine), "warm_requests": len(warm),
            "first_request": {k: first[0][k] for k in ("generation_side_latency_s", "request_to_file_latency_s")}
            if first else None,
            "warm": {
                "generation_side_latency_s": _quantiles([r["generation_side_latency_s"] for r in warm]),
                "request_to_file_latency_s": _quantiles([r["request_to_file_latency_s"] for r in warm]),
                "stages_s": {k: _quantiles([r["stage_anatomy"][k] for r in warm]) for k in stages},
            },
        }
    return out


def run_requests(runtime: Any, recipes: list[Any], prompts: list[PromptLine], out_dir: str | Path, *,
                 seed: int = 0, shape: dict[str, Any] | None = None, repeat: int = 1,
                 on_clip: Callable[[Path, Any, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every prompt (``repeat`` times over) under each of ``recipes`` in turn on ``runtime`` (loaded with the first
    recipe; shared when there are several), writing clips, records and ``requests.json`` into ``out_dir``. A prompt
    without its own seed gets ``seed`` plus its index. ``shape``: num_frames / seconds / height / width for every
    request. Returns the summary (also written after every request, so a run cut short keeps what it measured)."""
    from h3.runtime import GenerateRequest

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    requests: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"recipes": [r.name for r in recipes], "prompts": len(prompts), "repeat": repeat,
                               "requests": requests, "switches": []}
    items = [p for _ in range(repeat) for p in prompts]
    for r_index, recipe in enumerate(recipes):
        if r_index > 0:
            summary["switches"].append(runtime.switch_recipe(recipe, final=r_index == len(recipes) - 1))
        for index, item in enumerate(items):
            request = GenerateRequest(prompt=item.prompt, prompt_id=item.prompt_id,
                                      seed=item.seed if item.seed is not None else seed + index % len(prompts),
                                      **(shape or {}))
            clip = out_dir / f"{_stem(recipe.name)}-{index:02d}.mp4"
            info = {"index": index, "warm": index > 0, "recipe": recipe.name}
            record = runtime.generate(request, clip, extra={"batch": info})
            if record is None:
                continue  # a follower rank
            row = {"recipe": recipe.name, "index": index, "warm": index > 0, "prompt_id": item.prompt_id,
                   "seed": request.seed, "num_text_tokens": record.shape.num_text_tokens, "clip": clip.name,
                   "generation_side_latency_s": record.timings.generation_side_latency_s,
                   "request_to_file_latency_s": record.timings.request_to_file_latency_s,
                   "stage_anatomy": record.timings.stage_anatomy.model_dump(mode="json"),
                   "peak_memory_bytes": record.peak_memory_bytes}
            requests.append(row)
            summary["by_recipe"] = summarize(requests)
            summary["model_load_s"] = (record.extra or {}).get("model_load_s")
            atomic_write_json(out_dir / SUMMARY, summary)
            if on_clip is not None:
                on_clip(clip, record, row)
    return summary
