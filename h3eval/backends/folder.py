"""The ``folder`` backend: clips made by another stack (LightX2V, ComfyUI, SGLang...) brought into a run.

Clips are paired by name, ``<prompt_id>-s<seed>.mp4`` in the baseline and each candidate folder, or by a manifest
(JSONL, one object per clip: ``side`` ("baseline" or the candidate's name), ``file`` (relative to the manifest),
``prompt_id``, ``seed``, optional ``prompt``, ``generation_side_latency_s``, ``request_to_file_latency_s``,
``peak_memory_mb``; strict: a seed is an integer and never a boolean, a number is finite and positive, an unknown
key is an error, each named with its line). Each clip is decoded (frames and PCM hashed,
``extra["hash_source"] = "decoded"``) and copied atomically into ``clips/<recipe>/``. A candidate clip with no
baseline partner, or whose shape, fps or duration differs from its partner's, is not imported: it becomes a clear
error in the run record and the rest continues. One process imports into a run at a time (the store's lock).

With a prompt suite (``--prompts``), each clip's request is its suite line: the prompt text, and for fl2va / ref2va
suites the workflow and the sha256 of each keyframe or reference image, which the run keeps under ``inputs/`` (so
the keyframe gate can score imported clips against the images they were made from). A clip whose prompt id is not
in the suite is not imported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from h3.atomic import tmp_path_for
from h3.media import MediaError
from h3.names import is_safe_name
from h3.record import ClipRecord, ConditioningImage, RequestSpec
from h3.schema import FINITE_NUMBERS, validation_problems
from h3eval.backends import foreign_record, write_record
from h3eval.prompts import MAX_SEED
from h3eval.runner import RunError, run_differences
from h3eval.store import (
    ClipError, PromptSuiteRef, RunManifest, RunStore, Seed, check_safe_name, read_finished_record, utc_now)

logger = logging.getLogger(__name__)

CLIP_NAME = re.compile(r"^(?P<pid>[A-Za-z0-9][A-Za-z0-9._-]*)-s(?P<seed>[0-9]+)\.mp4$")  # ASCII digits only


@dataclass
class FolderClip:
    side: str
    path: Path
    prompt_id: str
    seed: int
    prompt: str | None = None
    timings: dict[str, Any] = field(default_factory=dict)


def side_name(spec: str, default: str) -> tuple[str, Path]:
    """``NAME=DIR`` or ``DIR`` (named after the folder)."""
    name, sep, directory = spec.partition("=")
    if not sep:
        directory, name = spec, Path(spec).name or default
    return check_safe_name("recipe name", name), Path(directory)


def scan_folder(side: str, directory: Path) -> list[FolderClip]:
    if not directory.is_dir():
        raise RunError(f"{side}: folder {directory} does not exist")
    clips, ignored = [], []
    for path in sorted(directory.iterdir()):
        match = CLIP_NAME.match(path.name)
        if match:
            if int(match["seed"]) > MAX_SEED:  # a file name has at most 255 characters: int() takes it
                raise RunError(f"{path}: seed {match['seed'][:30]} is too large (seeds go from 0 to 2**63-1)")
            clips.append(FolderClip(side, path, match["pid"], int(match["seed"])))
        elif path.suffix.lower() == ".mp4":
            ignored.append(path.name)
    if ignored:
        raise RunError(f"{directory}: clip names must be <prompt_id>-s<seed>.mp4 (or give --manifest); "
                       f"cannot pair {', '.join(ignored[:5])}")
    return clips


MAX_LATENCY_S = 1e6
"""Latencies above this (11.6 days for one clip) are typos; seed 000's slowest baseline request took 1545 s."""
MAX_PEAK_MEMORY_MB = 1e9
"""A petabyte: above it a peak memory is a typo (and would overflow the record's byte count)."""


class ManifestLine(BaseModel):
    """One line of an import manifest. Strict: a seed is an integer, never a boolean or a float (``true`` would be
    seed 1); numbers are finite and in range (a NaN or negative latency would poison the speed verdict); an unknown
    key is an error (a typo such as ``generation_latency_s`` would otherwise drop the latency silently)."""

    model_config = ConfigDict(extra="forbid", strict=True, **FINITE_NUMBERS)

    side: str
    """``baseline`` or a candidate's name (as given with ``NAME=DIR``)."""
    file: str = Field(min_length=1)
    """The clip, relative to the manifest."""
    prompt_id: str
    seed: Seed
    prompt: str | None = None
    generation_side_latency_s: float | None = Field(default=None, gt=0, le=MAX_LATENCY_S)
    request_to_file_latency_s: float | None = Field(default=None, gt=0, le=MAX_LATENCY_S)
    peak_memory_mb: float | None = Field(default=None, gt=0, le=MAX_PEAK_MEMORY_MB)

    @field_validator("file")
    @classmethod
    def _a_path(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("a file name cannot hold a NUL character")
        return value

    @field_validator("prompt_id")
    @classmethod
    def _safe_prompt_id(cls, value: str) -> str:
        if not is_safe_name(value):
            raise ValueError("must be letters, digits, '.', '_' or '-', starting with a letter or digit (it becomes "
                             "a file name)")
        return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        raise ValueError(f"key {duplicated[0]!r} appears twice")
    return dict(pairs)


def read_manifest(path: Path, sides: set[str]) -> list[FolderClip]:
    """Every clip of an import manifest; RunError naming the file, the line and each bad key."""
    clips = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except IsADirectoryError:
        raise RunError(f"manifest {path} is a directory, not a JSONL file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"cannot read manifest {path}: {getattr(exc, 'strerror', None) or exc}") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_unique_keys)
        except ValueError as exc:  # JSONDecodeError or a duplicated key
            raise RunError(f"{path}:{lineno}: not a JSON object ({exc})") from None
        try:
            entry = ManifestLine.model_validate(obj)
        except ValidationError as exc:
            raise RunError(f"{path}:{lineno}: " + "; ".join(validation_problems(exc, obj))) from None
        if entry.side not in sides:
            raise RunError(f"{path}:{lineno}: key 'side': {entry.side!r} is none of {sorted(sides)}")
        timings = {k: getattr(entry, k) for k in ("generation_side_latency_s", "request_to_file_latency_s",
                                                  "peak_memory_mb") if getattr(entry, k) is not None}
        clips.append(FolderClip(entry.side, (path.parent / entry.file).resolve(), entry.prompt_id, entry.seed,
                                entry.prompt, timings))
    return clips


def _import_clip(store: RunStore, clip: FolderClip, source: str, line: Any = None) -> ClipRecord:
    """``line``: the clip's prompt-suite line (h3eval.prompts.Prompt), whose text and images the record takes."""
    out = store.clip_path(clip.side, clip.prompt_id, clip.seed)
    tmp = tmp_path_for(out)
    try:
        shutil.copyfile(clip.path, tmp)
        peak = clip.timings.get("peak_memory_mb")
        record = foreign_record(
            tmp, recipe_name=clip.side, recipe={"name": clip.side, "imported_from": str(source)},
            request=RequestSpec(prompt=clip.prompt or "", prompt_id=clip.prompt_id, seed=clip.seed, height=0, width=0),
            model="imported", generation_side_latency_s=clip.timings.get("generation_side_latency_s"),
            request_to_file_latency_s=clip.timings.get("request_to_file_latency_s"),
            peak_memory_bytes=int(peak * 2**20) if peak is not None else None, device="imported",
            extra={"imported_from": str(clip.path), "warmup": False},
        )
        if line is not None:
            record.request.prompt = clip.prompt or line.prompt
            record.request.workflow = line.workflow
            record.request.conditioning = [ConditioningImage(role=role, sha256=image.sha256, width=image.width,
                                                             height=image.height, media_type=image.media_type)
                                           for role, image in line.images.items()]
        elif not clip.prompt:
            record.extra["unreported"].append("request.prompt")
        record.request.height, record.request.width = record.shape.height, record.shape.width
        tmp.replace(out)
    except MediaError as exc:
        tmp.unlink(missing_ok=True)
        # The decoder names the file it read, a temporary copy: the user knows the clip by its source.
        raise MediaError(str(exc).replace(str(tmp), str(clip.path)).replace(tmp.name, clip.path.name)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    write_record(out, record)
    return record


def _same_form(a: ClipRecord, b: ClipRecord) -> list[str]:
    diffs = []
    for key in ("width", "height", "fps", "num_frames"):
        if getattr(a.shape, key) != getattr(b.shape, key):
            diffs.append(f"{key} {getattr(a.shape, key)} vs {getattr(b.shape, key)}")
    if abs(a.shape.duration_s - b.shape.duration_s) > 1.0 / max(a.shape.fps, 1) and not diffs:
        diffs.append(f"duration {a.shape.duration_s:.3f} s vs {b.shape.duration_s:.3f} s")
    return diffs


def import_folders(baseline_dir: str, candidate_dirs: list[str], out: Path, manifest: Path | None = None,
                   prompts: Any = None) -> RunManifest:
    """Import folders of clips as an ``import`` run; resumable (finished clips are kept). ``prompts``: the
    h3eval.prompts.PromptSuite the clips were made from (their text, workflow and images), or None."""
    base_name, base_dir = side_name(baseline_dir, "baseline")
    candidates = [side_name(c, f"candidate{i}") for i, c in enumerate(candidate_dirs)]
    names = [base_name] + [c[0] for c in candidates]
    if len(set(names)) != len(names):
        raise RunError(f"baseline and candidate names must differ, got {names} (use NAME=DIR)")
    if manifest is not None:
        clips = read_manifest(Path(manifest), set(names) | {"baseline"})
        for c in clips:
            c.side = base_name if c.side == "baseline" else c.side
    else:
        clips = scan_folder(base_name, base_dir)
        for name, directory in candidates:
            clips += scan_folder(name, directory)
    by_side: dict[str, dict[tuple[str, int], FolderClip]] = {n: {} for n in names}
    for c in clips:
        if (c.prompt_id, c.seed) in by_side[c.side]:
            raise RunError(f"{c.side}: two clips for {c.prompt_id}-s{c.seed}")
        by_side[c.side][(c.prompt_id, c.seed)] = c
    keys = sorted({k for side in by_side.values() for k in side})
    ids = sorted({k[0] for k in keys})
    seeds = sorted({k[1] for k in keys})
    store = RunStore(out)
    recipes = {n: {"name": n, "imported_from": str(base_dir if n == base_name else dict(candidates)[n])} for n in names}
    recipe_sha = {n: hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest() for n, r in recipes.items()}
    listing = hashlib.sha256(json.dumps([[c.side, c.prompt_id, c.seed, str(c.path)] for c in clips]).encode())
    if prompts is not None:
        listing.update(prompts.sha256.encode())
    now = utc_now()
    fresh = RunManifest(kind="import", created_at=now, updated_at=now, model="imported", backend="folder",
                        baseline=base_name, candidates=names[1:], recipes=recipes, recipe_sha256=recipe_sha,
                        prompts=PromptSuiteRef(path=str(manifest or base_dir), sha256=listing.hexdigest(), ids=ids),
                        seeds=seeds, args={"command": "import", "baseline_dir": baseline_dir,
                                           "candidate_dirs": candidate_dirs, "manifest": str(manifest),
                                           "prompts": str(prompts.path) if prompts is not None else None})
    with store.lock("h3eval import"):  # one process writes into a run at a time
        if store.exists():
            existing = store.read_manifest()
            diffs = run_differences(existing, fresh)
            if diffs:
                raise RunError(f"{out} already holds a different run (differs in: {'; '.join(diffs)}); choose a new "
                               "--out (nothing was changed)")
            run = existing
        else:
            run = fresh
        run.status = "running"
        store.write_manifest(run)
        if prompts is not None:
            from h3eval.runner import save_inputs

            save_inputs(store, prompts)
        errors: list[ClipError] = []

        def error(side: str, key: tuple[str, int], message: str) -> None:
            logger.error("%s/%s-s%d: %s", side, key[0], key[1], message)
            errors.append(store.write_clip_error(side, key[0], key[1], message))

        def load(side: str, key: tuple[str, int]) -> ClipRecord | None:
            clip = by_side[side].get(key)
            if clip is None:
                return None
            done = read_finished_record(store.clip_path(side, *key))
            if done is not None:
                return done
            line = None
            if prompts is not None:
                try:
                    line = prompts.by_id(key[0])
                except KeyError:
                    error(side, key, f"{clip.path}: prompt id {key[0]!r} is not in the prompt suite {prompts.path}")
                    return None
            try:
                record = _import_clip(store, clip, base_dir if side == base_name else dict(candidates)[side], line)
            except (MediaError, OSError) as exc:
                error(side, key, f"cannot import {clip.path}: {exc}")
                return None
            store.clear_clip_error(side, *key)
            return record

        for key in keys:
            base = load(base_name, key)
            if base is None and key in by_side[base_name]:
                continue  # its error is recorded; the candidates' clips of this key have no usable partner
            for name in names[1:]:
                if key not in by_side[name]:
                    if base is not None:
                        error(name, key, f"no {name} clip partners baseline {by_side[base_name][key].path}")
                    continue
                if base is None:
                    error(name, key, f"{by_side[name][key].path} has no baseline partner ({key[0]}-s{key[1]}.mp4 is "
                                     f"missing from {base_dir})")
                    continue
                existing = store.clip_path(name, *key)
                cand = load(name, key)
                if cand is None:
                    continue
                diffs = _same_form(base, cand)
                if diffs:
                    existing.unlink(missing_ok=True)
                    existing.with_suffix(".json").unlink(missing_ok=True)
                    error(name, key, f"{by_side[name][key].path} differs from its baseline partner in "
                                     f"{', '.join(diffs)}: not imported")
        run.errors = errors
        run.status = "complete" if not errors else "partial"
        store.write_manifest(run)
        return run
