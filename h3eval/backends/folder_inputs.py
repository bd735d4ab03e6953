"""What an import is told (:mod:`h3eval.backends.folder`, whose docstring states the formats): the clips of folders
paired by name (:func:`scan_folder`) or of a JSONL manifest (:func:`read_manifest`: clip lines and side lines, every
path inside the manifest's folder), the declarations of the command line and the manifest (signoff kind, parent,
timing file: :class:`Declarations`, :func:`check_declarations`), and timing files (:func:`read_timing_file`, SGLang's
perf dump: :func:`read_sglang_perf_dump`). Every problem is one :class:`~h3eval.runner.RunError` naming the file, the
line and the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from h3.names import is_safe_name
from h3.schema import FINITE_NUMBERS, validation_problems
from h3eval.policy import SIGNOFF_KINDS, SignoffKind
from h3eval.prompts import MAX_SEED
from h3eval.runner import RunError
from h3eval.store import Seed, check_safe_name, read_json_file

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


def read_sglang_perf_dump(path: Path) -> float:
    """The generation-side latency (seconds) of one request from the JSON SGLang's ``--perf-dump-path`` writes
    (``{"total_duration_ms": ..., "steps": [{"name": "DenoisingStage", "duration_ms": ...}, ...], ...}``)."""
    data = read_json_file(path, "SGLang perf dump", RunError, _unique_keys)
    if not isinstance(data, dict) or "total_duration_ms" not in data:
        raise RunError(f"SGLang perf dump {path} has no total_duration_ms (written by `--perf-dump-path`?)")
    return _finite_latency(data["total_duration_ms"], f"{path}: total_duration_ms") / 1000.0


TIMING_KEY = re.compile(r"^(?P<pid>[A-Za-z0-9][A-Za-z0-9._-]*)-s(?P<seed>[0-9]+)(\.mp4)?$")
LATENCY_KEYS = ("generation_side_latency_s", "request_to_file_latency_s")


def read_timing_file(path: Path) -> dict[tuple[str, int], dict[str, float]]:
    """A timing file: ``{"<prompt_id>-s<seed>": seconds}`` (the generation-side latency) or ``{"<prompt_id>-s<seed>":
    {"generation_side_latency_s": s, "request_to_file_latency_s": s}}``; every number finite and > 0 (RunError)."""
    data = read_json_file(path, "timing file", RunError, _unique_keys)
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
