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
    <run>/.h3eval.lock                               while a command writes into the run: who (pid, host, since)

:class:`RunStore` owns every path and listing of that layout; everything else asks it. Clip records are read by one
function, :func:`read_clip_record` (gate results by :func:`read_gate_result`). Every file is written atomically. A
clip counts as finished only when its record exists, parses, and the MP4's sha256 matches the record; anything else
is regenerated.

One process writes into a run at a time: every command that writes (``ab``, ``generate``, ``floor``, ``gate``,
``import``, ``verdict --write``, ``report``) holds :meth:`RunStore.lock` while it does; a second process is refused
with one line naming the holder. The lock is an ``flock`` on ``.h3eval.lock``, so the kernel releases it when its
process dies, even by ``kill -9``; a lock file left by a dead process is taken over, with a warning that says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from gates.base import GateResult
from h3.atomic import atomic_write_bytes, atomic_write_json, sha256_file
from h3.names import clip_stem, is_safe_name
from h3.provenance import utc_now
from h3.record import ClipRecord
from h3.schema import FINITE_NUMBERS, non_finite_keys, validation_problems

logger = logging.getLogger(__name__)

RUN_MANIFEST_VERSION = 1
LOCK_NAME = ".h3eval.lock"
"""The lock file of a run (see :meth:`RunStore.lock`)."""

Seed = Annotated[int, Strict(), Field(ge=0, lt=2**63)]
"""A seed as a run stores it: an integer (never a boolean), 0 to 2**63-1 (the runtime's range)."""


class StoreError(ValueError):
    """A run directory or one of its inputs is not what it should be."""


class RunLockedError(StoreError):
    """Another process is writing into the run; the message names it (pid, host, since, command)."""


def check_safe_name(kind: str, name: str) -> str:
    if not is_safe_name(name):
        raise StoreError(
            f"{kind} {name!r} is not a safe file name: use letters, digits, '.', '_' and '-' only, starting with a "
            "letter or digit, no '..', at most 128 characters (it becomes a path inside the run directory)"
        )
    return name


class PromptSuiteRef(BaseModel):
    model_config = ConfigDict(extra="forbid", **FINITE_NUMBERS)
    path: str
    sha256: str
    ids: list[str]


class ClipError(BaseModel):
    model_config = ConfigDict(extra="forbid", **FINITE_NUMBERS)
    recipe: str
    prompt_id: str
    seed: Seed
    error: str
    at: str


class RunManifest(BaseModel):
    """What a run was asked to do, and how far it got."""

    model_config = ConfigDict(extra="forbid", **FINITE_NUMBERS)

    version: int = RUN_MANIFEST_VERSION
    """Schema version."""
    kind: Literal["generate", "ab", "floor", "import", "parallel-check"] = "generate"
    """Which command made the run."""
    created_at: str
    updated_at: str
    model: str
    """The model as resolved (h3.runtime.canonical_model: ``tiny-trained``, ``tiny-random``, a random preset) or a
    checkpoint path; ``args`` keeps it as passed."""
    backend: str = "inprocess"
    baseline: str | None = None
    """Recipe name of the baseline side of every pair (None for a single-recipe run)."""
    candidates: list[str] = Field(default_factory=list)
    recipes: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Recipe name -> recipe as resolved."""
    recipe_sha256: dict[str, str] = Field(default_factory=dict)
    prompts: PromptSuiteRef | None = None
    seeds: list[Seed] = Field(default_factory=list)
    args: dict[str, Any] = Field(default_factory=dict)
    """The command's arguments as passed."""
    plan: dict[str, Any] = Field(default_factory=dict)
    """Every parameter that decides what the run's clips are, as resolved (request shape, backend, device,
    trajectories, speed protocol...): a rerun into the run that differs in any of them is refused, naming it
    (h3eval.runner). Empty in runs written before it existed."""
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


def read_json_file(path: str | Path, what: str, error_cls: type[Exception] = StoreError,
                   object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """The JSON in the file at ``path``, or ``error_cls`` with one line naming ``what`` and the file: a directory, a
    file that cannot be read (or is not UTF-8), or text that is not JSON (``object_pairs_hook`` may refuse more: its
    ValueError reads as invalid JSON). ``json.loads`` keeps NaN; a caller that refuses it checks."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise error_cls(f"{what} {path} is a directory, not a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error_cls(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except ValueError as exc:
        raise error_cls(f"{what} {path} is not valid JSON ({exc})") from None


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
        raise RecordError(f"{record_path} is not a valid clip record: " + "; ".join(validation_problems(exc)),
                          "invalid", record_path) from exc
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
    # A metric's value is a JSON number or null: the schema's lax mode would read "0.2" as 0.2 and true as 1, and a
    # hand-edited or foreign result must not be scored as if a gate had written it (issue 26's campaign).
    metrics = raw.get("metrics") if isinstance(raw, dict) else None
    if isinstance(metrics, dict):
        for name, metric in metrics.items():
            value = metric.get("value") if isinstance(metric, dict) else None
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise GateResultError(path, f"key 'metrics.{name}.value': a number or null, got {value!r:.40}")
    try:
        return GateResult.model_validate(raw)
    except ValidationError as exc:
        raise GateResultError(path, "; ".join(validation_problems(exc, raw))) from exc


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

    def warmup_files(self, recipe: str) -> dict[str, list[Path]]:
        """Every file under ``warmup/<recipe>/`` (clips, records, error files), by the session that wrote it."""
        directory = self.warmup_dir(recipe)
        by_session: dict[str, list[Path]] = {}
        for path in sorted(directory.iterdir()) if directory.is_dir() else ():
            session, sep, _ = path.name.rpartition("-w")
            if sep and path.is_file() and not path.name.startswith("."):
                by_session.setdefault(session, []).append(path)
        return by_session

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

    # -- the lock ----------------------------------------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    def is_foreign_directory(self) -> bool:
        """Whether ``root`` exists and holds something other than a run: files but no ``run.json`` (a lock file
        alone does not count)."""
        if not self.root.is_dir() or self.manifest_path.exists():
            return False
        return any(p.name != LOCK_NAME for p in self.root.iterdir())

    def check_writable_root(self) -> None:
        """StoreError unless ``root`` is absent, an empty directory or a run directory (``--out FILE``, a folder of
        other files)."""
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{self.root} is a file, not a run directory; choose a new --out directory")
        if self.is_foreign_directory():
            raise StoreError(f"{self.root} exists and is not an h3eval run directory (no run.json); choose a new "
                             "--out")

    @contextlib.contextmanager
    def lock(self, command: str) -> Iterator[dict[str, Any]]:
        """Hold the run for ``command`` (e.g. ``"h3eval ab"``) while the body writes into it; yields the holder's
        line (pid, host, since, command, and ``took_over``: the dead holder whose lock file was left behind).

        A second process is refused with :class:`RunLockedError` naming the holder. Within one process the lock is
        re-entrant (``h3eval floor`` generates, then gates, then writes its floor). Creates ``root`` when absent,
        and removes it again on release when the body wrote nothing into it.
        """
        from h3eval.runlock import hold_run

        with hold_run(self, command) as info:
            yield info

    def weights_notices(self) -> list[str]:
        """What every page and report of this run must say about its weights (``h3.random_model.weights_notice``):
        from the manifest's model, and from any clip record that carries a notice (a server's clips). Empty for
        trained weights."""
        from h3.random_model import weights_notice

        notices: list[str] = []
        try:
            model = self.read_manifest().model
        except StoreError:
            model = None
        if weights_notice(model):
            notices.append(weights_notice(model))
        for recipe in self.clip_recipes():
            for path in self.clip_record_paths(recipe):
                try:
                    notice = (json.loads(path.read_text(encoding="utf-8")).get("extra") or {}).get("weights_notice")
                except (OSError, ValueError, AttributeError):
                    continue
                if isinstance(notice, str) and notice not in notices:
                    notices.append(notice)
        return notices

    # -- manifest ----------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.manifest_path.exists()

    def read_manifest(self) -> RunManifest:
        """The run's manifest; StoreError (one line per problem, naming the key) when it is missing or invalid."""
        path = self.manifest_path
        if not path.exists():
            raise StoreError(f"{self.root} is not a run directory: {path} is missing")
        if path.is_dir():
            raise StoreError(f"{self.root} is not a run directory: {path} is a directory, not a file")
        data = read_json_file(path, "run manifest", StoreError)
        bad = non_finite_keys(data)
        if bad:
            raise StoreError(f"{path} is not a valid run manifest:\n  "
                             + "\n  ".join(f"key '{key}': not a finite number" for key in bad[:10]))
        try:
            return RunManifest.model_validate(data)
        except ValidationError as exc:
            raise StoreError(f"{path} is not a valid run manifest:\n  "
                             + "\n  ".join(validation_problems(exc, data))) from None

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
