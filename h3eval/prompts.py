"""Prompt suites: JSONL files, one object per line with a stable ``id``, the ``prompt`` and its provenance.

A line of an fl2va or ref2va suite also carries its images (issue 25): ``first_frame`` and/or ``last_frame``, or
``reference``, each ``{"path": "<file relative to the JSONL's folder>", "sha256": "<of the file>"}``. The hash is
checked on load, so the suite's own sha256 (of the JSONL) pins its images too.
"""

from __future__ import annotations

import hashlib
import json
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
        images = {role: _line_image(path, lineno, role, obj[role]) for role in ROLES if obj.get(role) is not None}
        try:
            workflow_of(**images)
        except ConditioningError as exc:
            raise PromptSuiteError(f"{path}:{lineno}: {exc}") from None
        meta = {k: v for k, v in obj.items() if k not in ("id", "prompt") and k not in ROLES}
        prompts.append(Prompt(id=pid, prompt=prompt, meta=meta, images=images))
    if not prompts:
        raise PromptSuiteError(f"prompt file {path} has no prompts")
    return PromptSuite(path=path, sha256=hashlib.sha256(raw).hexdigest(), prompts=prompts)


def _line_image(suite: Path, lineno: int, role: str, entry: Any) -> ImageInput:
    """A line's image: ``{"path", "sha256"}``, the path inside the suite's folder, the file matching its hash."""
    where = f"{suite}:{lineno}: {role}"
    if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str)):
        raise PromptSuiteError(f'{where} must be {{"path": "<file beside the suite>", "sha256": "<its sha256>"}}')
    folder = suite.resolve().parent
    file = (folder / entry["path"]).resolve()
    if folder not in file.parents:
        raise PromptSuiteError(f"{where}: {entry['path']!r} is outside the suite's folder {folder}")
    try:
        image = image_from_file(file, role)
    except ConditioningError as exc:
        raise PromptSuiteError(f"{suite}:{lineno}: {exc}") from None
    if image.sha256 != entry["sha256"]:
        raise PromptSuiteError(f"{where}: {entry['path']} does not match the sha256 the suite names (the image "
                               f"changed: {image.sha256[:12]} vs {entry['sha256'][:12]})")
    return image


def image_entry(suite_dir: Path, file: Path) -> dict[str, str]:
    """The ``{"path", "sha256"}`` a suite line names ``file`` by (for scripts that write suites)."""
    import hashlib

    return {"path": file.resolve().relative_to(suite_dir.resolve()).as_posix(),
            "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-3"`` -> a list of distinct non-negative seeds, in order."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else (part, "")
                values = list(range(int(lo), int(hi) + 1))
            else:
                values = [int(part)]
        except ValueError:
            raise SeedsError(f"seeds must be non-negative integers like '0,1,2' or '0-3', got {text!r}") from None
        for value in values:
            if value < 0:
                raise SeedsError(f"seeds must be non-negative, got {value}")
            if value not in seeds:
                seeds.append(value)
    if not seeds:
        raise SeedsError(f"no seeds in {text!r}")
    return seeds
