"""Prompt suites: JSONL files, one object per line with a stable ``id``, the ``prompt`` and its provenance.

A line of an fl2va or ref2va suite also carries its images (issue 25), as files relative to the JSONL's folder:
``first_frame`` and/or ``last_frame``, or ``reference``, each a path or ``{"path": ..., "sha256": ...}`` (the hash is
then checked on load); or, as the world's suites write them (``h3.world.suites``), ``keyframes`` ``{"first": path,
"last": path}`` and ``references`` ``[path]`` (one reference image per request here). A suite's sha256 is that of
its JSONL, and for a suite with images, of the JSONL followed by each image's sha256 in order: a changed image is a
different suite.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3.conditioning import ROLES, ConditioningError, ImageInput, image_from_file, workflow_of
from h3eval.store import StoreError, check_safe_name

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"


class SeedsError(ValueError):
    """A ``--seeds`` value that is not a list or range of non-negative integers."""


class PromptSuiteError(ValueError):
    """A prompt file that cannot be used; the message names the file and line."""


@dataclass
class Prompt:
    id: str
    prompt: str
    meta: dict[str, Any] = field(default_factory=dict)
    images: dict[str, ImageInput] = field(default_factory=dict)
    """The line's image inputs by role (h3.conditioning.ROLES): keyframes for fl2va, a reference for ref2va."""

    @property
    def workflow(self) -> str:
        return workflow_of(**self.images)


@dataclass
class PromptSuite:
    path: Path
    sha256: str
    prompts: list[Prompt]

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.prompts]

    def by_id(self, prompt_id: str) -> Prompt:
        for p in self.prompts:
            if p.id == prompt_id:
                return p
        raise KeyError(prompt_id)


def resolve_prompt_path(name_or_path: str | Path) -> Path:
    """A path, or the name of a shipped suite (``smoke``, ``vbench-dev16``, ``mixed-length``)."""
    path = Path(name_or_path)
    if path.exists() or str(name_or_path).endswith(".jsonl") or "/" in str(name_or_path):
        return path
    shipped = PROMPTS_DIR / f"{name_or_path}.jsonl"
    return shipped if shipped.exists() else path


def load_prompts(name_or_path: str | Path) -> PromptSuite:
    path = resolve_prompt_path(name_or_path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PromptSuiteError(f"cannot read prompt file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PromptSuiteError(f"prompt file {path} is not UTF-8 text") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptSuiteError(f"{path}:{lineno}: not a JSON object ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise PromptSuiteError(f"{path}:{lineno}: each line must be a JSON object")
        pid, prompt = obj.get("id"), obj.get("prompt")
        if not isinstance(pid, str):
            raise PromptSuiteError(f"{path}:{lineno}: missing string field 'id'")
        try:
            check_safe_name("prompt id", pid)
        except StoreError as exc:
            raise PromptSuiteError(f"{path}:{lineno}: {exc}") from None
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptSuiteError(f"{path}:{lineno}: missing non-empty string field 'prompt'")
        if pid in seen:
            raise PromptSuiteError(f"{path}:{lineno}: duplicate prompt id {pid!r} (first on line {seen[pid]})")
        seen[pid] = lineno
        images = _line_images(path, lineno, obj)
        try:
            workflow_of(**images)
        except ConditioningError as exc:
            raise PromptSuiteError(f"{path}:{lineno}: {exc}") from None
        meta = {k: v for k, v in obj.items() if k not in ("id", "prompt", *ROLES, *WORLD_KEYS)}
        prompts.append(Prompt(id=pid, prompt=prompt, meta=meta, images=images))
    if not prompts:
        raise PromptSuiteError(f"prompt file {path} has no prompts")
    digest = hashlib.sha256(raw)
    image_hashes = [image.sha256 for p in prompts for image in p.images.values()]
    if image_hashes:
        digest.update("".join(image_hashes).encode())
    return PromptSuite(path=path, sha256=digest.hexdigest(), prompts=prompts)


WORLD_KEYS = ("keyframes", "references")
"""The world suites' spelling of a line's images (h3.world.suites): ``keyframes`` {first, last}, ``references``."""


def _line_images(suite: Path, lineno: int, obj: dict[str, Any]) -> dict[str, ImageInput]:
    entries = {role: obj[role] for role in ROLES if obj.get(role) is not None}
    keyframes, references = obj.get("keyframes"), obj.get("references")
    if keyframes is not None:
        if not isinstance(keyframes, dict) or not keyframes or set(keyframes) - {"first", "last"}:
            raise PromptSuiteError(f'{suite}:{lineno}: keyframes must be {{"first": path, "last": path}} (either or '
                                   "both)")
        for anchor, entry in keyframes.items():
            entries.setdefault(f"{anchor}_frame", entry)
    if references is not None:
        if not isinstance(references, list) or len(references) != 1:
            raise PromptSuiteError(f"{suite}:{lineno}: references must be a list of one image (one reference image "
                                   "per request)")
        entries.setdefault("reference", references[0])
    return {role: _line_image(suite, lineno, role, entries[role]) for role in ROLES if role in entries}


def _line_image(suite: Path, lineno: int, role: str, entry: Any) -> ImageInput:
    """A line's image: a path or ``{"path", "sha256"}``, inside the suite's folder (and matching its hash)."""
    where = f"{suite}:{lineno}: {role}"
    if isinstance(entry, str):
        entry = {"path": entry}
    if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
            and isinstance(entry.get("sha256", ""), str)):
        raise PromptSuiteError(f'{where} must be a path beside the suite or {{"path": ..., "sha256": ...}}')
    folder = suite.resolve().parent
    file = (folder / entry["path"]).resolve()
    if folder not in file.parents:
        raise PromptSuiteError(f"{where}: {entry['path']!r} is outside the suite's folder {folder}")
    try:
        image = image_from_file(file, role)
    except ConditioningError as exc:
        raise PromptSuiteError(f"{suite}:{lineno}: {exc}") from None
    if "sha256" in entry and image.sha256 != entry["sha256"]:
        raise PromptSuiteError(f"{where}: {entry['path']} does not match the sha256 the suite names (the image "
                               f"changed: {image.sha256[:12]} vs {entry['sha256'][:12]})")
    return image


def image_entry(suite_dir: Path, file: Path) -> dict[str, str]:
    """The ``{"path", "sha256"}`` a suite line names ``file`` by (for scripts that write suites)."""
    import hashlib

    return {"path": file.resolve().relative_to(suite_dir.resolve()).as_posix(),
            "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}


MAX_SEEDS = 1000
"""The most seeds one run takes: a run is every prompt x seed x recipe, so a thousand seeds is already far past any
study; a typo such as ``0-1000000000000`` is refused at once instead of filling the memory."""
MAX_SEED = 2**63 - 1
"""The largest seed the runtime takes (h3.runtime.resolve_request)."""

_SEED = re.compile(r"[0-9]+")  # ASCII digits only: int() would also read Arabic-Indic or full-width digits


def _seed(part: str, text: str) -> int:
    text = text if len(text) <= 60 else text[:40] + "..."
    if part.startswith("-") and _SEED.fullmatch(part[1:]):
        raise SeedsError(f"seeds must be non-negative, got {part}")
    if not _SEED.fullmatch(part):
        raise SeedsError(f"seeds must be non-negative integers like '0,1,2' or '0-3' (ASCII digits), got {text!r}")
    digits = part.lstrip("0") or "0"
    if len(digits) > len(str(MAX_SEED)) or int(digits) > MAX_SEED:  # length first: int() refuses 4300+ digits
        shown = part if len(part) <= 40 else part[:20] + "..." + part[-8:]
        raise SeedsError(f"seed {shown} is too large: seeds go from 0 to 2**63-1 = {MAX_SEED}")
    return int(digits)


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-3"`` -> a list of distinct non-negative seeds, in order; every seed is checked (range and
    count, at most :data:`MAX_SEEDS`) before anything runs."""
    seeds: dict[int, None] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo_text, dash, hi_text = part[1:].partition("-")
        if dash:
            lo, hi = _seed((part[0] + lo_text).strip(), text), _seed(hi_text.strip(), text)
            if hi < lo:
                raise SeedsError(f"seed range {part} is empty (its end is below its start)")
            if hi - lo + 1 > MAX_SEEDS:
                raise SeedsError(f"seed range {part} has {hi - lo + 1} seeds; a run takes at most {MAX_SEEDS}")
            values = range(lo, hi + 1)
        else:
            values = (_seed(part, text),)
        for value in values:
            seeds[value] = None
            if len(seeds) > MAX_SEEDS:
                raise SeedsError(f"--seeds names more than {MAX_SEEDS} seeds; a run takes at most {MAX_SEEDS}")
    if not seeds:
        raise SeedsError(f"no seeds in {text!r}")
    return list(seeds)
