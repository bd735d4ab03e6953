"""The run store: one directory per run that any later step can read without the process that wrote it.

Layout (DESIGN.md)::

    <run>/run.json                                   RunManifest
    <run>/clips/<recipe>/<prompt_id>-s<seed>.mp4     the clip (video + audio)
    <run>/clips/<recipe>/<prompt_id>-s<seed>.json    its ClipRecord
    <run>/clips/<recipe>/<prompt_id>-s<seed>.error.json   why it could not be made (when it could not)
    <run>/gates/<gate>/...                           per-pair gate results and artifacts
    <run>/verdict.json, report.md, report.html, junit.xml

Every file is written atomically. A clip counts as finished only when its record exists, parses, and the MP4's
sha256 matches the record; anything else is regenerated.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from h3.atomic import atomic_write_json, sha256_file
from h3.record import ClipRecord

RUN_MANIFEST_VERSION = 1

# A prompt id or recipe name becomes a path component: no separators, no leading dot, no "..".
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class StoreError(ValueError):
    """A run directory or one of its inputs is not what it should be."""


def check_safe_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not SAFE_NAME.match(name) or ".." in name:
        raise StoreError(
            f"{kind} {name!r} is not a safe file name: use letters, digits, '.', '_' and '-' only, starting with a "
            "letter or digit, no '..', at most 128 characters (it becomes a path inside the run directory)"
        )
    return name


def clip_stem(prompt_id: str, seed: int) -> str:
    return f"{prompt_id}-s{seed}"


class PromptSuiteRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    sha256: str
    ids: list[str]


class ClipError(BaseModel):
    model_config = ConfigDict(extra="forbid")
    recipe: str
    prompt_id: str
    seed: int
    error: str
    at: str


class RunManifest(BaseModel):
    """What a run was asked to do, and how far it got."""

    model_config = ConfigDict(extra="forbid")

    version: int = RUN_MANIFEST_VERSION
    """Schema version."""
    kind: Literal["generate", "ab", "floor", "import", "parallel-check"] = "generate"
    """Which command made the run."""
    created_at: str
    updated_at: str
    model: str
    """``tiny`` or a checkpoint path."""
    backend: str = "inprocess"
    baseline: str | None = None
    """Recipe name of the baseline side of every pair (None for a single-recipe run)."""
    candidates: list[str] = Field(default_factory=list)
    recipes: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Recipe name -> recipe as resolved."""
    recipe_sha256: dict[str, str] = Field(default_factory=dict)
    prompts: PromptSuiteRef | None = None
    seeds: list[int] = Field(default_factory=list)
    args: dict[str, Any] = Field(default_factory=dict)
    """The command's arguments as passed."""
    versions: dict[str, str] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    git: dict[str, Any] = Field(default_factory=dict)
    status: Literal["running", "complete", "partial", "failed"] = "running"
    """``partial``: finished with some clips missing (see ``errors``)."""
    errors: list[ClipError] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)


def read_finished_record(mp4: str | Path) -> ClipRecord | None:
    """The record next to ``mp4`` when the clip is finished (record parses, MP4 hash matches), else None."""
    mp4 = Path(mp4)
    record_path = mp4.with_suffix(".json")
    if not record_path.exists() or not mp4.exists():
        return None
    try:
        record = ClipRecord.model_validate_json(record_path.read_text())
    except (ValidationError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if sha256_file(mp4) == record.mp4_sha256 else None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunStore:
    """Paths and reads/writes of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- paths -------------------------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "run.json"

    def clip_dir(self, recipe: str) -> Path:
        return self.root / "clips" / check_safe_name("recipe name", recipe)

    def clip_path(self, recipe: str, prompt_id: str, seed: int) -> Path:
        check_safe_name("prompt id", prompt_id)
        return self.clip_dir(recipe) / f"{clip_stem(prompt_id, seed)}.mp4"

    def record_path(self, recipe: str, prompt_id: str, seed: int) -> Path:
        return self.clip_path(recipe, prompt_id, seed).with_suffix(".json")

    def error_path(self, recipe: str, prompt_id: str, seed: int) -> Path:
        return self.clip_path(recipe, prompt_id, seed).with_suffix(".error.json")

    def gate_dir(self, gate: str) -> Path:
        return self.root / "gates" / check_safe_name("gate name", gate)

    # -- manifest ----------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.manifest_path.exists()

    def read_manifest(self) -> RunManifest:
        if not self.manifest_path.exists():
            raise StoreError(f"{self.root} is not a run directory: {self.manifest_path} is missing")
        try:
            return RunManifest.model_validate_json(self.manifest_path.read_text())
        except ValidationError as exc:
            raise StoreError(f"{self.manifest_path} is not a valid run manifest: {exc}") from exc

    def write_manifest(self, manifest: RunManifest) -> None:
        manifest.updated_at = utc_now()
        atomic_write_json(self.manifest_path, manifest.model_dump(mode="json"))

    # -- clips -------------------------------------------------------------------------------------------------
    def read_record(self, recipe: str, prompt_id: str, seed: int) -> ClipRecord | None:
        """The clip's record, or None when the clip is not finished (no record, unreadable, or hash mismatch)."""
        return read_finished_record(self.clip_path(recipe, prompt_id, seed))

    def load_record(self, recipe: str, prompt_id: str, seed: int) -> ClipRecord:
        record_path = self.record_path(recipe, prompt_id, seed)
        if not record_path.exists():
            raise StoreError(f"no record for {recipe}/{clip_stem(prompt_id, seed)} ({record_path} is missing)")
        return ClipRecord.model_validate_json(record_path.read_text())

    def iter_records(self, recipe: str) -> Iterator[tuple[Path, ClipRecord]]:
        directory = self.clip_dir(recipe)
        if not directory.exists():
            return
        for path in sorted(directory.glob("*.json")):
            if path.name.endswith(".error.json"):
                continue
            yield path.with_suffix(".mp4"), ClipRecord.model_validate_json(path.read_text())

    def write_clip_error(self, recipe: str, prompt_id: str, seed: int, message: str) -> ClipError:
        err = ClipError(recipe=recipe, prompt_id=prompt_id, seed=seed, error=message, at=utc_now())
        atomic_write_json(self.error_path(recipe, prompt_id, seed), err.model_dump(mode="json"))
        return err

    def clear_clip_error(self, recipe: str, prompt_id: str, seed: int) -> None:
        self.error_path(recipe, prompt_id, seed).unlink(missing_ok=True)

    def pairs(self) -> list[tuple[str, str, int]]:
        """(candidate recipe, prompt id, seed) of every pair the manifest defines, in a stable order."""
        manifest = self.read_manifest()
        if manifest.baseline is None or manifest.prompts is None:
            return []
        return [
            (cand, pid, seed) for cand in manifest.candidates for pid in manifest.prompts.ids for seed in manifest.seeds
        ]
