"""Prompt suites: JSONL files, one object per line with a stable ``id``, the ``prompt`` and its provenance."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        prompts.append(Prompt(id=pid, prompt=prompt, meta={k: v for k, v in obj.items() if k not in ("id", "prompt")}))
    if not prompts:
        raise PromptSuiteError(f"prompt file {path} has no prompts")
    return PromptSuite(path=path, sha256=hashlib.sha256(raw).hexdigest(), prompts=prompts)


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
