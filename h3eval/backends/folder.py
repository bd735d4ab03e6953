"""The ``folder`` backend: clips made by another stack (LightX2V, ComfyUI, SGLang...) brought into a run.

Clips are paired by name, ``<prompt_id>-s<seed>.mp4`` in the baseline and each candidate folder, or by a manifest
(JSONL). A manifest holds two kinds of line:

- a **clip line**, one per clip: ``side`` ("baseline" or the candidate's name), ``file``, ``prompt_id``, ``seed``,
  optional ``prompt``, ``generation_side_latency_s``, ``request_to_file_latency_s``, ``peak_memory_mb`` and
  ``sglang_perf_dump`` (the JSON that SGLang's ``--perf-dump-path`` wrote for that request: its
  ``total_duration_ms``, the pipeline's wall time without saving the file, is the clip's generation-side latency);
- a **side line** (no ``file``): ``side`` and any of ``kind`` (the candidate's signoff kind: exact, near or
  resample), ``parent`` (the recipe it is judged against by lineage: the baseline or another candidate) and
  ``timings`` (a timing file for that side, below).

Every path in a manifest (``file``, ``timings``, ``sglang_perf_dump``) is relative to the manifest and stays inside
its folder: an absolute path or one with a ``..`` part is refused (a manifest names its own clips, not files
elsewhere on the machine). The manifest is strict: a seed is an integer and never a boolean, a number is finite and
positive, an unknown key is an error, each named with its line; a manifest that names no clip is an error.

Declarations on the command line do the same for folders paired by name: ``--kind NAME=KIND``, ``--parent
NAME=PARENT`` and ``--timings NAME=FILE`` (NAME as in ``--candidate-dir NAME=DIR``; ``--timings`` also takes the
baseline's name). A **timing file** is a JSON object from clip (``<prompt_id>-s<seed>``, with or without ``.mp4``) to
its generation-side latency in seconds, or to an object with ``generation_side_latency_s`` and/or
``request_to_file_latency_s``; every number finite, above 0 and at most :data:`MAX_LATENCY_S`. The kind goes into
the run's resolved recipe as ``[signoff] kind`` and the parent as its top-level ``parent``, where the verdict reads
them for recipes made here. Declarations given to a rerun replace those on disk (the clips are kept); those not given
are kept. Without any timing, the speed check says so and judges nothing.

Each clip is decoded (frames and PCM hashed, ``extra["hash_source"] = "decoded"``) and copied atomically into
``clips/<recipe>/``. A candidate clip with no baseline partner, or whose shape, fps or duration differs from its
partner's, is not imported: it becomes a clear error in the run record and the rest continues. One process imports
into a run at a time (the store's lock).

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
from h3eval.policy import SIGNOFF_KINDS, SignoffKind
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


def inside(base: Path, rel: str, what: str) -> Path:
    """``rel`` (from a manifest) under ``base``: a relative path without ``..`` parts, else RunError. A manifest names
    its own clips and timing files, never a file elsewhere on the machine."""
    path = Path(rel)
    if path.is_absolute() or rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
        raise RunError(f"{what} {rel!r} is an absolute path: paths in a manifest are relative to its folder {base}")
    if ".." in path.parts or ".." in rel.replace("\\", "/").split("/"):
        raise RunError(f"{what} {rel!r} leaves the manifest's folder {base} ('..'): a manifest names files inside "
                       "its own folder")
    return (base / path).resolve()


class ManifestLine(BaseModel):
    """One clip line of an import manifest. Strict: a seed is an integer, never a boolean or a float (``true`` would
    be seed 1); numbers are finite and in range (a NaN or negative latency would poison the speed verdict); an unknown
    key is an error (a typo such as ``generation_latency_s`` would otherwise drop the latency silently)."""

    model_config = ConfigDict(extra="forbid", strict=True, **FINITE_NUMBERS)

    side: str
    """``baseline`` or a candidate's name (as given with ``NAME=DIR``)."""
    file: str = Field(min_length=1)
    """The clip, relative to the manifest, inside its folder."""
    prompt_id: str
    seed: Seed
    prompt: str | None = None
    generation_side_latency_s: float | None = Field(default=None, gt=0, le=MAX_LATENCY_S)
    request_to_file_latency_s: float | None = Field(default=None, gt=0, le=MAX_LATENCY_S)
    peak_memory_mb: float | None = Field(default=None, gt=0, le=MAX_PEAK_MEMORY_MB)
    sglang_perf_dump: str | None = Field(default=None, min_length=1)
    """SGLang's ``--perf-dump-path`` JSON of this clip's request, relative to the manifest: its ``total_duration_ms``
    is the generation-side latency."""

    @field_validator("file", "sglang_perf_dump")
    @classmethod
    def _a_path(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("a file name cannot hold a NUL character")
        return value

    @field_validator("prompt_id")
    @classmethod
    def _safe_prompt_id(cls, value: str) -> str:
        if not is_safe_name(value):
            raise ValueError("must be letters, digits, '.', '_' or '-', starting with a letter or digit (it becomes "
                             "a file name)")
        return value


class SideLine(BaseModel):
    """A side line of an import manifest (no ``file``): what is declared about one side."""

    model_config = ConfigDict(extra="forbid", strict=True)

    side: str
    kind: SignoffKind | None = None
    """The candidate's signoff kind (the verdict's judge)."""
    parent: str | None = None
    """The recipe the candidate is judged against by lineage: the baseline or another candidate."""
    timings: str | None = Field(default=None, min_length=1)
    """A timing file for this side, relative to the manifest (see the module docstring)."""


SIDE_KEYS = ("kind", "parent", "timings")


@dataclass
class Declarations:
    """What the command line and the manifest declare about the sides: candidate -> signoff kind, candidate ->
    parent, side -> timing file."""

    kinds: dict[str, str] = field(default_factory=dict)
    parents: dict[str, str] = field(default_factory=dict)
    timings: dict[str, Path] = field(default_factory=dict)

    def merge(self, other: "Declarations", where: str) -> None:
        """Add ``other``'s declarations; the same side declared two different ways is an error naming both."""
        for mine, theirs, what in ((self.kinds, other.kinds, "kind"), (self.parents, other.parents, "parent"),
                                   (self.timings, other.timings, "timings")):
            for name, value in theirs.items():
                if name in mine and mine[name] != value:
                    raise RunError(f"{name}: {what} declared twice, {mine[name]} and {value} ({where})")
                mine[name] = value


def parse_declarations(items: list[str] | None, option: str) -> dict[str, str]:
    """``NAME=VALUE`` items of a repeatable option; RunError on a malformed or repeated one."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise RunError(f"{option} {item!r}: use {option} NAME=VALUE (NAME as in --candidate-dir NAME=DIR)")
        if name in out and out[name] != value:
            raise RunError(f"{option}: {name} given twice ({out[name]} and {value})")
        out[name] = value
    return out


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        raise ValueError(f"key {duplicated[0]!r} appears twice")
    return dict(pairs)


def _finite_latency(value: Any, where: str) -> float:
    """A latency read from a file: a finite number of seconds in (0, MAX_LATENCY_S], else RunError naming it."""
    # The range test is false for NaN and for an integer too large for a float (math.isfinite would raise on it).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_LATENCY_S:
        raise RunError(f"{where}: {value!r} is not a latency (a finite number of seconds above 0 and at most "
                       f"{MAX_LATENCY_S:g})")
    return float(value)


def _read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise RunError(f"{what} {path} is a directory, not a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except ValueError as exc:
        raise RunError(f"{what} {path} is not valid JSON ({exc})") from None


def read_sglang_perf_dump(path: Path) -> float:
    """The generation-side latency (seconds) of one request from the JSON SGLang's ``--perf-dump-path`` writes
    (``{"total_duration_ms": ..., "steps": [{"name": "DenoisingStage", "duration_ms": ...}, ...], ...}``)."""
    data = _read_json(path, "SGLang perf dump")
    if not isinstance(data, dict) or "total_duration_ms" not in data:
        raise RunError(f"SGLang perf dump {path} has no total_duration_ms (written by `--perf-dump-path`?)")
    return _finite_latency(data["total_duration_ms"], f"{path}: total_duration_ms") / 1000.0


TIMING_KEY = re.compile(r"^(?P<pid>[A-Za-z0-9][A-Za-z0-9._-]*)-s(?P<seed>[0-9]+)(\.mp4)?$")
LATENCY_KEYS = ("generation_side_latency_s", "request_to_file_latency_s")


def read_timing_file(path: Path) -> dict[tuple[str, int], dict[str, float]]:
    """A timing file: ``{"<prompt_id>-s<seed>": seconds}`` (the generation-side latency) or ``{"<prompt_id>-s<seed>":
    {"generation_side_latency_s": s, "request_to_file_latency_s": s}}``; every number finite and > 0 (RunError)."""
    data = _read_json(path, "timing file")
    if not isinstance(data, dict) or not data:
        raise RunError(f"timing file {path} must be a non-empty JSON object from clip (<prompt_id>-s<seed>) to "
                       "seconds")
    out: dict[tuple[str, int], dict[str, float]] = {}
    for key, value in data.items():
        match = TIMING_KEY.match(key)
        if not match or int(match["seed"]) > MAX_SEED:
            raise RunError(f"timing file {path}: key {key!r} is not a clip name <prompt_id>-s<seed>")
        clip = (match["pid"], int(match["seed"]))
        if clip in out:
            raise RunError(f"timing file {path}: clip {key!r} appears twice")
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(LATENCY_KEYS))
            if unknown or not value:
                raise RunError(f"timing file {path}: {key}: use {' and/or '.join(LATENCY_KEYS)}"
                               + (f" (unknown key {unknown[0]!r})" if unknown else ""))
            out[clip] = {k: _finite_latency(v, f"timing file {path}: {key}.{k}") for k, v in value.items()}
        else:
            out[clip] = {"generation_side_latency_s": _finite_latency(value, f"timing file {path}: {key}")}
    return out


def read_manifest(path: Path, sides: set[str]) -> tuple[list[FolderClip], Declarations]:
    """Every clip of an import manifest and its side lines' declarations; RunError naming the file, the line and
    each bad key."""
    clips = []
    declared = Declarations()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except IsADirectoryError:
        raise RunError(f"manifest {path} is a directory, not a JSONL file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"cannot read manifest {path}: {getattr(exc, 'strerror', None) or exc}") from None
    base = path.parent
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line, object_pairs_hook=_unique_keys)
        except ValueError as exc:  # JSONDecodeError or a duplicated key
            raise RunError(f"{where}: not a JSON object ({exc})") from None
        side_line = isinstance(obj, dict) and "file" not in obj and any(k in obj for k in SIDE_KEYS)
        try:
            entry = (SideLine if side_line else ManifestLine).model_validate(obj)
        except ValidationError as exc:
            raise RunError(f"{where}: " + "; ".join(validation_problems(exc, obj))) from None
        if entry.side not in sides:
            raise RunError(f"{where}: key 'side': {entry.side!r} is none of {sorted(sides)}")
        try:
            if isinstance(entry, SideLine):
                one = Declarations()
                if entry.kind is not None:
                    one.kinds[entry.side] = entry.kind
                if entry.parent is not None:
                    one.parents[entry.side] = entry.parent
                if entry.timings is not None:
                    one.timings[entry.side] = inside(base, entry.timings, "key 'timings':")
                declared.merge(one, where)
                continue
            timings = {k: getattr(entry, k) for k in ("generation_side_latency_s", "request_to_file_latency_s",
                                                      "peak_memory_mb") if getattr(entry, k) is not None}
            if entry.sglang_perf_dump is not None:
                if "generation_side_latency_s" in timings:
                    raise RunError("give generation_side_latency_s or sglang_perf_dump, not both")
                timings["generation_side_latency_s"] = read_sglang_perf_dump(
                    inside(base, entry.sglang_perf_dump, "key 'sglang_perf_dump':"))
            clip_path = inside(base, entry.file, "key 'file':")
        except RunError as exc:
            raise RunError(f"{where}: {exc}") from None
        clips.append(FolderClip(entry.side, clip_path, entry.prompt_id, entry.seed, entry.prompt, timings))
    if not clips:
        raise RunError(f"manifest {path} names no clip (one JSON object per line: side, file, prompt_id, seed); "
                       "nothing was imported")
    return clips, declared


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


def check_declarations(declared: Declarations, baseline: str, names: list[str]) -> None:
    """Kinds and parents name candidates, parents name recipes of the run without a cycle, timings name sides."""
    candidates = names[1:]
    for option, table in (("--kind", declared.kinds), ("--parent", declared.parents)):
        for name in table:
            if name not in candidates:
                what = "the baseline, which is what candidates are judged against" if name == baseline else \
                    "not a candidate of this import"
                raise RunError(f"{option} {name}=...: {name!r} is {what}; candidates: {', '.join(candidates)}")
    for name, kind in declared.kinds.items():
        if kind not in SIGNOFF_KINDS:
            raise RunError(f"--kind {name}={kind}: the signoff kind is one of {', '.join(SIGNOFF_KINDS)}")
    for name, parent in declared.parents.items():
        if parent not in names:
            raise RunError(f"--parent {name}={parent}: {parent!r} is not a recipe of this import "
                           f"({', '.join(names)})")
        if parent == name:
            raise RunError(f"--parent {name}={parent}: a recipe cannot be its own parent")
        seen, at = [name], parent
        while at in declared.parents:
            if at in seen:
                raise RunError(f"--parent: a cycle {' -> '.join(seen + [at])}: a parent chain ends at the baseline "
                               "or a candidate without a parent")
            seen.append(at)
            at = declared.parents[at]
    for name in declared.timings:
        if name not in names:
            raise RunError(f"--timings {name}=...: {name!r} is none of {', '.join(names)}")


def _apply_timing_files(declared: Declarations, by_side: dict[str, dict[tuple[str, int], FolderClip]]) -> None:
    for side, path in declared.timings.items():
        for key, values in read_timing_file(path).items():
            clip = by_side[side].get(key)
            if clip is None:
                raise RunError(f"timing file {path} times {key[0]}-s{key[1]}, which {side} has no clip for")
            for name, value in values.items():
                if name in clip.timings and clip.timings[name] != value:
                    raise RunError(f"{side}/{key[0]}-s{key[1]}: {name} is {clip.timings[name]} in the manifest and "
                                   f"{value} in timing file {path}")
                clip.timings[name] = value


def _apply_timings(record: ClipRecord, timings: dict[str, float]) -> bool:
    """Put the declared ``timings`` into a finished clip's record (a rerun that brings timings); True if it changed."""
    changed = False
    unreported = record.extra.setdefault("unreported", [])
    for key in LATENCY_KEYS:
        if key in timings and (getattr(record.timings, key) != timings[key] or f"timings.{key}" in unreported):
            setattr(record.timings, key, timings[key])
            if f"timings.{key}" in unreported:
                unreported.remove(f"timings.{key}")
            changed = True
    if "peak_memory_mb" in timings and record.peak_memory_bytes != int(timings["peak_memory_mb"] * 2**20):
        record.peak_memory_bytes, changed = int(timings["peak_memory_mb"] * 2**20), True
    return changed


IDENTITY_KEYS = ("name", "imported_from")
"""The keys of an imported recipe that say which clips it is; its declarations (signoff kind, parent) may change."""


def _sha(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def resolved_recipe(identity: dict[str, Any], kind: str | None, parent: str | None, how: str) -> dict[str, Any]:
    """An imported side's resolved recipe: where its clips came from, ``[signoff] kind`` and top-level ``parent``
    where declared (the keys the verdict reads for recipes made here)."""
    recipe = dict(identity)
    if kind is not None:
        recipe["signoff"] = {"kind": kind, "reason": f"declared on import ({how})"}
    if parent is not None:
        recipe["parent"] = parent
    return recipe


def import_folders(baseline_dir: str, candidate_dirs: list[str], out: Path, manifest: Path | None = None,
                   prompts: Any = None, kinds: list[str] | None = None, parents: list[str] | None = None,
                   timings: list[str] | None = None) -> RunManifest:
    """Import folders of clips as an ``import`` run; resumable (finished clips are kept). ``prompts``: the
    h3eval.prompts.PromptSuite the clips were made from (their text, workflow and images), or None. ``kinds``,
    ``parents``, ``timings``: ``NAME=VALUE`` declarations (``--kind``, ``--parent``, ``--timings``)."""
    base_name, base_dir = side_name(baseline_dir, "baseline")
    candidates = [side_name(c, f"candidate{i}") for i, c in enumerate(candidate_dirs)]
    names = [base_name] + [c[0] for c in candidates]
    if len(set(names)) != len(names):
        raise RunError(f"baseline and candidate names must differ, got {names} (use NAME=DIR)")
    declared = Declarations(kinds=parse_declarations(kinds, "--kind"), parents=parse_declarations(parents, "--parent"),
                            timings={n: Path(v) for n, v in parse_declarations(timings, "--timings").items()})
    declared.timings = {base_name if n == "baseline" else n: v for n, v in declared.timings.items()}
    if manifest is not None:
        clips, from_manifest = read_manifest(Path(manifest), set(names) | {"baseline"})
        for c in clips:
            c.side = base_name if c.side == "baseline" else c.side
        from_manifest.timings = {base_name if n == "baseline" else n: v for n, v in from_manifest.timings.items()}
        from_manifest.kinds = {base_name if n == "baseline" else n: v for n, v in from_manifest.kinds.items()}
        from_manifest.parents = {base_name if n == "baseline" else n: v for n, v in from_manifest.parents.items()}
        declared.merge(from_manifest, f"on the command line and in {manifest}")
    else:
        clips = scan_folder(base_name, base_dir)
        for name, directory in candidates:
            clips += scan_folder(name, directory)
        if not clips:
            raise RunError(f"no clip named <prompt_id>-s<seed>.mp4 in {base_dir} or the candidate folders; nothing "
                           "was imported")
    check_declarations(declared, base_name, names)
    by_side: dict[str, dict[tuple[str, int], FolderClip]] = {n: {} for n in names}
    for c in clips:
        if (c.prompt_id, c.seed) in by_side[c.side]:
            raise RunError(f"{c.side}: two clips for {c.prompt_id}-s{c.seed}")
        by_side[c.side][(c.prompt_id, c.seed)] = c
    _apply_timing_files(declared, by_side)
    keys = sorted({k for side in by_side.values() for k in side})
    ids = sorted({k[0] for k in keys})
    seeds = sorted({k[1] for k in keys})
    store = RunStore(out)
    identity = {n: {"name": n, "imported_from": str(base_dir if n == base_name else dict(candidates)[n])}
                for n in names}
    how = "the manifest" if manifest is not None else "--kind / --parent"
    recipes = {n: resolved_recipe(identity[n], declared.kinds.get(n), declared.parents.get(n), how) for n in names}
    listing = hashlib.sha256(json.dumps([[c.side, c.prompt_id, c.seed, str(c.path)] for c in clips]).encode())
    if prompts is not None:
        listing.update(prompts.sha256.encode())
    now = utc_now()
    fresh = RunManifest(kind="import", created_at=now, updated_at=now, model="imported", backend="folder",
                        baseline=base_name, candidates=names[1:], recipes=recipes,
                        recipe_sha256={n: _sha(r) for n, r in recipes.items()},
                        prompts=PromptSuiteRef(path=str(manifest or base_dir), sha256=listing.hexdigest(), ids=ids),
                        seeds=seeds, args={"command": "import", "baseline_dir": baseline_dir,
                                           "candidate_dirs": candidate_dirs, "manifest": str(manifest),
                                           "prompts": str(prompts.path) if prompts is not None else None,
                                           "kinds": list(kinds or []), "parents": list(parents or []),
                                           "timings": list(timings or [])})
    with store.lock("h3eval import"):  # one process writes into a run at a time
        if store.exists():
            existing = store.read_manifest()
            # The clips decide whether this is the same run; declarations (kind, parent) given now replace those on
            # disk, and those not given are kept.
            diffs = run_differences(
                existing.model_copy(update={"recipe_sha256": {n: _sha({k: r[k] for k in IDENTITY_KEYS if k in r})
                                                              for n, r in existing.recipes.items()}}),
                fresh.model_copy(update={"recipe_sha256": {n: _sha(identity[n]) for n in names}}))
            if diffs:
                raise RunError(f"{out} already holds a different run (differs in: {'; '.join(diffs)}); choose a new "
                               "--out (nothing was changed)")
            run = existing
            for n in names:
                old = existing.recipes.get(n) or {}
                kind = declared.kinds.get(n) or (old.get("signoff") or {}).get("kind")
                parent = declared.parents.get(n) or old.get("parent")
                run.recipes[n] = (resolved_recipe(identity[n], kind, parent, how) if n in declared.kinds or
                                  n in declared.parents else {**identity[n], **{k: v for k, v in old.items()
                                                                               if k in ("signoff", "parent")}})
            run.recipe_sha256 = {n: _sha(r) for n, r in run.recipes.items()}
            run.args = fresh.args
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
                if _apply_timings(done, clip.timings):  # a rerun that brings the clip's timings
                    write_record(store.clip_path(side, *key), done)
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
