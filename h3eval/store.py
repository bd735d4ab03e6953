"""The run store: one directory per run that any later step can read without the process that wrote it.

Layout (DESIGN.md)::

    <run>/run.json                                   RunManifest
    <run>/clips/<recipe>/<prompt_id>-s<seed>.mp4     the clip (video + audio)
    <run>/clips/<recipe>/<prompt_id>-s<seed>.json    its ClipRecord
    <run>/clips/<recipe>/<prompt_id>-s<seed>.error.json   why it could not be made (when it could not)
    <run>/warmup/<recipe>/<session>-w<i>.{mp4,json}  warm-up requests of ``h3eval ab`` (excluded from every number)
    <run>/speed/<protocol>/<recipe>/<name>.{mp4,json}  timing requests of ``h3eval ab``'s speed protocol
    <run>/gates/<gate>/<candidate>/<prompt_id>-s<seed>.json   per-pair gate results (artifacts beside them)
    <run>/inputs/<sha256>.png                        the keyframes and reference images requests were conditioned
                                                     on (fl2va, ref2va), by the sha256 each clip record names
    <run>/speed.json, speed.md, floor.json, verdict.json, report.md, report.html, junit.xml

:class:`RunStore` owns every path and listing of that layout; everything else asks it. Clip records are read by one
function, :func:`read_clip_record` (gate results by :func:`read_gate_result`). Every file is written atomically. A
clip counts as finished only when its record exists, parses, and the MP4's sha256 matches the record; anything else
is regenerated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gates.base import GateResult
from h3.atomic import atomic_write_bytes, atomic_write_json, sha256_file
from h3.names import clip_stem, is_safe_name
from h3.provenance import utc_now
from h3.record import ClipRecord

RUN_MANIFEST_VERSION = 1



class StoreError(ValueError):
    """A run directory or one of its inputs is not what it should be."""


def check_safe_name(kind: str, name: str) -> str:
    if not is_safe_name(name):
        raise StoreError(
            f"{kind} {name!r} is not a safe file name: use letters, digits, '.', '_' and '-' only, starting with a "
            "letter or digit, no '..', at most 128 characters (it becomes a path inside the run directory)"
        )
    return name


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
    kind: Literal["generate", "ab", "floor", "import"] = "generate"
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


RecordProblem = Literal["missing", "unreadable", "invalid", "mp4_missing", "mp4_mismatch"]


class RecordError(StoreError):
    """A clip record that cannot be used; ``problem`` says how, ``path`` names the file at fault."""

    def __init__(self, message: str, problem: RecordProblem, path: Path):
        super().__init__(message)
        self.problem, self.path = problem, path


def read_clip_record(record_path: str | Path, *, mp4: str | Path | None = None,
                     sha256: Callable[[Path], str] = sha256_file) -> ClipRecord:
    """The one reader of clip records: ``record_path`` parsed and validated (:class:`h3.record.ClipRecord`) and, with
    ``mp4``, checked against the MP4's sha256 (``sha256`` may be a caching hasher). Raises :class:`RecordError`."""
    record_path = Path(record_path)
    if not record_path.is_file():
        raise RecordError(f"{record_path} is missing", "missing", record_path)
    try:
        text = record_path.read_text(encoding="utf-8")
        record = ClipRecord.model_validate_json(text)
    except UnicodeDecodeError as exc:
        raise RecordError(f"{record_path} is not valid JSON ({exc})", "unreadable", record_path) from exc
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            try:
                json.loads(text)
            except json.JSONDecodeError as json_exc:
                raise RecordError(f"{record_path} is not valid JSON ({json_exc})", "unreadable", record_path) from exc
        first = str(exc).splitlines()[0]
        raise RecordError(f"{record_path} is not a valid clip record: {first}", "invalid", record_path) from exc
    if mp4 is not None:
        mp4 = Path(mp4)
        if not mp4.is_file():
            raise RecordError(f"{mp4} is missing", "mp4_missing", mp4)
        if sha256(mp4) != record.mp4_sha256:
            raise RecordError(f"{mp4} does not match the mp4_sha256 of its record {record_path.name} (truncated or "
                              "modified after it was written)", "mp4_mismatch", mp4)
    return record


def read_finished_record(mp4: str | Path) -> ClipRecord | None:
    """The record next to ``mp4`` when the clip is finished (record parses, MP4 hash matches), else None."""
    mp4 = Path(mp4)
    try:
        return read_clip_record(mp4.with_suffix(".json"), mp4=mp4)
    except RecordError:
        return None


class GateResultError(StoreError):
    """A gate result file that cannot be read; ``detail`` is the parser's first line, ``unreadable`` whether the file
    is not JSON at all (rather than JSON that is not a gate result)."""

    def __init__(self, path: Path, detail: str, unreadable: bool = False):
        super().__init__(f"{path} is not a valid gate result: {detail}")
        self.path, self.detail, self.unreadable = path, detail, unreadable


def read_gate_result(path: str | Path) -> GateResult:
    """The one reader of per-pair gate result files. ``json.loads`` accepts NaN and the result keeps it, so that the
    verdict can name it (never dropped). Raises :class:`GateResultError`."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise GateResultError(path, str(exc).splitlines()[0], unreadable=True) from exc
    try:
        return GateResult.model_validate(raw)
    except ValidationError as exc:
        raise GateResultError(path, str(exc).splitlines()[0]) from exc


class RunStore:
    """Paths and reads/writes of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- paths -------------------------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "run.json"

    @property
    def speed_json_path(self) -> Path:
        return self.root / "speed.json"

    @property
    def speed_md_path(self) -> Path:
        return self.root / "speed.md"

    @property
    def floor_path(self) -> Path:
        return self.root / "floor.json"

    @property
    def verdict_path(self) -> Path:
        return self.root / "verdict.json"

    REPORT_FILES = {"markdown": "report.md", "html": "report.html", "junit": "junit.xml"}

    def report_path(self, kind: str) -> Path:
        """``markdown``, ``html`` or ``junit``."""
        return self.root / self.REPORT_FILES[kind]

    def relative(self, path: str | Path) -> str:
        """``path`` relative to the run directory, with forward slashes (how results and verdicts name files)."""
        return Path(path).relative_to(self.root).as_posix()

    def clip_dir(self, recipe: str) -> Path:
        return self.root / "clips" / check_safe_name("recipe name", recipe)

    def clip_path(self, recipe: str, prompt_id: str, seed: int) -> Path:
        check_safe_name("prompt id", prompt_id)
        return self.clip_dir(recipe) / f"{clip_stem(prompt_id, seed)}.mp4"

    def record_path(self, recipe: str, prompt_id: str, seed: int) -> Path:
        return self.clip_path(recipe, prompt_id, seed).with_suffix(".json")

    def error_path(self, recipe: str, prompt_id: str, seed: int) -> Path:
        return self.clip_path(recipe, prompt_id, seed).with_suffix(".error.json")

    def warmup_dir(self, recipe: str) -> Path:
        return self.root / "warmup" / check_safe_name("recipe name", recipe)

    def warmup_path(self, recipe: str, session: str, index: int) -> Path:
        return self.warmup_dir(recipe) / f"{session}-w{index}.mp4"

    def speed_dir(self, protocol: str, recipe: str) -> Path:
        return self.root / "speed" / check_safe_name("speed protocol", protocol) / check_safe_name("recipe name",
                                                                                                    recipe)

    def speed_path(self, protocol: str, recipe: str, name: str) -> Path:
        return self.speed_dir(protocol, recipe) / f"{check_safe_name('request name', name)}.mp4"

    def gate_dir(self, gate: str) -> Path:
        return self.root / "gates" / check_safe_name("gate name", gate)

    def input_path(self, sha256: str) -> Path:
        """Where the image input of that sha256 (the hash of its bytes, as a clip record names it) is kept."""
        if not (isinstance(sha256, str) and len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256)):
            raise StoreError(f"an image input is named by its sha256 (64 lowercase hex digits), got {sha256!r}")
        return self.root / "inputs" / f"{sha256}.png"

    def save_input(self, image: Any) -> Path:
        """Keep an image input (h3.conditioning.ImageInput) under its sha256; already kept is left as it is."""
        path = self.input_path(image.sha256)
        if not (path.is_file() and sha256_file(path) == image.sha256):
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, image.data)
        return path

    def read_input(self, sha256: str) -> Any:
        """The image input a clip record names, decoded (h3.conditioning.ImageInput); a missing or altered file is a
        StoreError naming it."""
        from h3.conditioning import ConditioningError, image_from_bytes

        path = self.input_path(sha256)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise StoreError(f"image input {self.relative(path)} is missing ({exc.strerror or exc})") from None
        import hashlib

        if hashlib.sha256(data).hexdigest() != sha256:
            raise StoreError(f"image input {self.relative(path)} does not match its sha256 (altered or truncated)")
        try:
            return image_from_bytes(data, self.relative(path))
        except ConditioningError as exc:
            raise StoreError(str(exc)) from None

    def gate_result_dir(self, gate: str, candidate: str) -> Path:
        return self.gate_dir(gate) / check_safe_name("recipe name", candidate)

    def gate_result_path(self, gate: str, candidate: str, prompt_id: str, seed: int) -> Path:
        check_safe_name("prompt id", prompt_id)
        return self.gate_result_dir(gate, candidate) / f"{clip_stem(prompt_id, seed)}.json"

    # -- listings ----------------------------------------------------------------------------------------------
    def clip_recipes(self) -> list[str]:
        """Recipe folders under ``clips/`` (what is on disk, whatever the manifest says), sorted."""
        root = self.root / "clips"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def clip_record_paths(self, recipe: str) -> list[Path]:
        """Record files under ``clips/<recipe>/`` (error files left out), sorted."""
        directory = self.clip_dir(recipe)
        if not directory.is_dir():
            return []
        return [p for p in sorted(directory.glob("*.json")) if not p.name.endswith(".error.json")]

    def finished_records(self, directory: Path) -> list[ClipRecord]:
        """The finished clips' records of one clip folder (``clips/``, ``speed/`` or ``warmup/`` of one recipe),
        in file-name order."""
        return [r for r in (read_finished_record(p) for p in sorted(Path(directory).glob("*.mp4"))) if r is not None]

    def gates_present(self) -> list[str]:
        """Gate folders under ``gates/``, sorted."""
        root = self.root / "gates"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def gate_result_files(self, gate: str, candidate: str) -> list[Path]:
        """Every ``*.json`` in ``gates/<gate>/<candidate>/``, sorted (stray files included: the caller judges)."""
        directory = self.gate_result_dir(gate, candidate)
        return sorted(directory.glob("*.json")) if directory.is_dir() else []

    def gate_candidates(self, gate: str) -> list[str]:
        """Candidate folders under ``gates/<gate>/``, sorted."""
        directory = self.gate_dir(gate)
        return sorted(p.name for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else []

    def sweep_partial_files(self) -> list[Path]:
        """Remove the temporary files of atomic writes a killed process left behind (``.<name>.<random>.tmp``) under
        ``clips/``, ``speed/`` and ``warmup/``. Only for the one process that fills the run: a finished file is never
        a ``.tmp``, so nothing complete is touched."""
        removed = []
        for sub in ("clips", "speed", "warmup"):
            for path in (self.root / sub).rglob(".*.tmp") if (self.root / sub).exists() else ():
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed

    def fingerprint(self) -> tuple:
        """A cheap key that changes whenever a JSON file of the run (manifest, verdict, clip records, gate results) is
        added, removed or rewritten: names and mtimes, no parsing."""
        entries: list[tuple[str, int]] = []
        for name in ("run.json", "verdict.json"):
            p = self.root / name
            if p.exists():
                entries.append((name, p.stat().st_mtime_ns))
        for sub in ("clips", "gates"):
            base = self.root / sub
            if not base.exists():
                continue
            for dirpath, _dirs, files in os.walk(base):
                for name in files:
                    if name.endswith(".json"):
                        p = os.path.join(dirpath, name)
                        try:
                            entries.append((p, os.stat(p).st_mtime_ns))
                        except FileNotFoundError:  # replaced between walk and stat: the next call sees it
                            continue
        return tuple(sorted(entries))

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
        """The clip's record whether or not its MP4 still matches (timings, shapes); RecordError when there is none or
        it does not parse."""
        return read_clip_record(self.record_path(recipe, prompt_id, seed))

    def unfinished_reason(self, recipe: str, prompt_id: str, seed: int) -> str:
        """Why a clip has no finished record: its generation error when one was written, else that it is missing or
        unfinished."""
        why = "clip missing or unfinished (no record, or its MP4 does not match the record's sha256)"
        error_path = self.error_path(recipe, prompt_id, seed)
        if error_path.exists():
            try:
                why = "generation failed: " + json.loads(error_path.read_text())["error"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                why = f"generation failed (unreadable {error_path.name})"
        return why

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
