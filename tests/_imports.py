"""Test helper: the imports a package's modules make, read from their AST (tests/test_floors.py checks them against the
floors, tests/test_import_cycles.py for loops).

Every import counts, the ones inside functions included, and so does ``importlib.import_module`` (or ``__import__``)
of a literal name: a lazy import must not hide a dependency from either check.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the module at ``path`` under ``root`` (a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, list[str]]]:
    """Every import in ``tree`` as (line, names it may load): the module, then for ``from X import y`` also ``X.y``
    (``from h3eval import commands`` loads the module h3eval.commands). Relative imports are resolved."""
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, [alias.name]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, [target] + [f"{target}.{a.name}" for a in node.names if a.name != "*"]))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append((node.lineno, [node.args[0].value]))
    return found


def package_imports(root: Path, package: str) -> Iterator[tuple[str, Path, list[tuple[int, list[str]]]]]:
    """Each module of ``package`` under ``root``, in path order: (dotted name, path, :func:`imported_names`)."""
    for path in sorted((root / package).rglob("*.py")):
        module = module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        yield module, path, imported_names(tree, module, path.name == "__init__.py")
