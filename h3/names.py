"""Names that become path components (recipe names, prompt ids, gate names): one rule for the whole product."""

from __future__ import annotations

import re

# A prompt id or recipe name becomes a path component: no separators, no leading dot, no "..".
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def is_safe_name(name: object) -> bool:
    """Whether ``name`` can be a file or folder name inside a run directory."""
    return isinstance(name, str) and bool(SAFE_NAME.match(name)) and ".." not in name


def clip_stem(prompt_id: str, seed: int) -> str:
    """A clip's file stem inside a run (``<prompt_id>-s<seed>``): clips, records and gate results share it."""
    return f"{prompt_id}-s{seed}"
