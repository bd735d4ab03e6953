"""What every schema read from a file shares: finite numbers, and one line per problem naming the key.

Every pydantic model that reads a recipe, a policy, an import manifest, a run manifest or a clip record sets
``allow_inf_nan=False`` in its ``model_config`` (:data:`FINITE_NUMBERS`), so that every current and future float
field refuses ``nan``, ``inf`` and numbers that overflow to them (TOML's ``nan``/``inf``, JSON's ``NaN``,
``Infinity``, ``1e400``) at load, with the key named: a NaN threshold compares false against everything and would
turn a FAIL into a PASS (issue 26). ``tests/test_schema_fuzz.py`` checks that every model reachable from those
schemas keeps the setting.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

FINITE_NUMBERS: dict[str, Any] = {"allow_inf_nan": False}
"""``model_config`` entries of every schema read from a file (spread into its ``ConfigDict``)."""

_INPUT_SHOWN = 80
"""Characters of an offending value shown in a message (a 1 MB string must not become a 1 MB error)."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _INPUT_SHOWN else text[: _INPUT_SHOWN - 3] + "..."


def _document_path(loc: tuple, data: Any) -> list[str]:
    """The keys of ``loc`` that are keys of the document: a union adds its branch to the location (``float``,
    ``FloorFraction``, ``function-after[...]``), which is pydantic's bookkeeping, not a key. Without the document,
    branch-like parts are dropped by their form."""
    parts: list[str] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            parts.append(str(part))
            node = node[part]
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and 0 <= part < len(node):
            parts.append(str(part))
            node = node[part]
        elif data is None and _is_branch(part):
            continue
        elif data is None:
            parts.append(str(part))
        else:
            # Not a key of the document here: a union branch, or a key the document lacks (missing, at the end).
            if part == loc[-1] and not isinstance(node, (list, tuple)) and not _is_branch(part):
                parts.append(str(part))
    return parts


def _is_branch(part: Any) -> bool:
    return isinstance(part, str) and (part in ("float", "int", "str", "bool", "list", "dict", "none") or "[" in part
                                      or part[:1].isupper())


def validation_issues(exc: ValidationError, data: Any = None) -> list[tuple[str, str, str]]:
    """``(key, kind, why)`` per problem: ``kind`` is ``unknown``, ``missing`` or ``invalid``; ``key`` is dotted
    (empty for the document itself). ``data`` (the document validated) lets a union's branch names be told from keys.
    A union reports every branch: one issue is kept per key, and none for a key whose own sub-key has an issue."""
    found: list[tuple[str, str, str]] = []
    for err in exc.errors():
        key = ".".join(_document_path(tuple(err["loc"]), data))
        kind = {"extra_forbidden": "unknown", "missing": "missing"}.get(err["type"], "invalid")
        why = err["msg"].removeprefix("Value error, ")
        if kind == "invalid" and "input" in err and not isinstance(err["input"], (dict, list)):
            why += f" (got {_show(err['input'])})"
        found.append((key, kind, why))
    keys = {key for key, _, _ in found}
    issues: dict[tuple[str, str], tuple[str, str, str]] = {}
    for key, kind, why in found:
        if kind == "invalid" and key and any(k.startswith(key + ".") for k in keys):
            continue  # the branch that did not match; the sub-key's own issue says what is wrong
        issues.setdefault((key, kind) if kind == "invalid" else (key, why), (key, kind, why))
    return list(issues.values())


def validation_problems(exc: ValidationError, data: Any = None) -> list[str]:
    """One line per problem, each naming the key: ``unknown key 'a.b'``, ``missing key 'a.b'`` or
    ``key 'a.b': <why> (got <value>)`` (see :func:`validation_issues`)."""
    lines = []
    for key, kind, why in validation_issues(exc, data):
        if kind in ("unknown", "missing"):
            lines.append(f"{kind} key '{key}'")
        else:
            lines.append(f"key '{key}': {why}" if key else why)
    return lines


def non_finite_keys(data: Any, prefix: str = "") -> list[str]:
    """The dotted keys of every NaN or infinite float in a parsed document (JSON's ``NaN``, ``Infinity``, ``1e400``),
    for the free-form parts of a file that no typed field checks (a run manifest's ``extra``)."""
    if isinstance(data, float):
        return [] if math.isfinite(data) else [prefix or "(top level)"]
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    return [bad for key, value in items for bad in non_finite_keys(value, f"{prefix}.{key}" if prefix else str(key))]
