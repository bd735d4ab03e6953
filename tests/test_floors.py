"""The import floors, the project's layering rule, stated here in full (the design notes that first set it are not
part of this repository):

- the packages stand on floors, ``h3`` (runtime, 0) <- ``gates`` (1) <- ``h3eval`` (suite, 2) <- ``dashboard`` and
  ``bench`` (3); a module imports packages on its own floor or below, never above (a gate receives what it needs in
  its context and never opens the suite's store);
- library code (``h3``, ``gates``, ``h3eval``, ``dashboard``) never imports a command-line module (``h3.cli``,
  ``h3eval.cli``, ``h3eval.commands``): the CLI is a thin layer over library functions, not the other way round.

The checker walks the AST of every module (imports inside functions included, and ``importlib.import_module`` of a
literal name: tests/_imports.py, which tests/test_import_cycles.py shares), so a lazy import cannot hide an upward
dependency. It is itself tested on a planted tree: a checker that cannot fail proves nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._imports import package_imports

REPO = Path(__file__).resolve().parents[1]

FLOORS = {"h3": 0, "gates": 1, "h3eval": 2, "dashboard": 3, "bench": 3}
"""Each top-level package's floor; a module may import packages on its own floor or below."""
CLI_MODULES = ("h3.cli", "h3eval.cli", "h3eval.commands")
"""Command-line modules: thin layers over library functions, which never import them."""
LIBRARY_PACKAGES = ("h3", "gates", "h3eval", "dashboard")


def _is_cli(name: str) -> bool:
    return any(name == cli or name.startswith(cli + ".") for cli in CLI_MODULES)


def _violation(module: str, target: str) -> str | None:
    top, other = module.split(".")[0], target.split(".")[0]
    if other in FLOORS and FLOORS[other] > FLOORS[top]:
        return f"upward: {top} is floor {FLOORS[top]}, {other} is floor {FLOORS[other]}"
    if top in LIBRARY_PACKAGES and not _is_cli(module) and _is_cli(target):
        return "library code imports a CLI module"
    return None


def floor_violations(root: Path, packages=tuple(FLOORS)) -> list[str]:
    """Every upward import and every library module importing a CLI module under ``root``, as
    ``path:line: module imports target (why)``, one per import statement."""
    problems = []
    for package in packages:
        if not (root / package).is_dir():
            continue
        for module, path, imports in package_imports(root, package):
            for line, names in imports:
                for target in names:
                    why = _violation(module, target)
                    if why:
                        problems.append(f"{path.relative_to(root)}:{line}: {module} imports {target} ({why})")
                        break
    return problems


def test_no_module_imports_upward_or_a_cli_module():
    problems = floor_violations(REPO)
    assert problems == [], "import floors broken:\n" + "\n".join(problems)


def test_the_floor_check_covers_every_package():
    """Every package the floors name exists and has modules the check read (a renamed folder would pass vacuously)."""
    for package in FLOORS:
        assert list((REPO / package).rglob("*.py")), f"{package}/ has no module"


PLANTED = {
    "h3/ok.py": "import numpy\nfrom h3 import names\n",
    "h3/lazy.py": "def f():\n    from gates.base import Gate\n    return Gate\n",
    "gates/g.py": "import h3.names\nfrom h3eval.store import RunStore\n",
    "gates/sub/__init__.py": "from ..g import x\nfrom . import y\n",
    "h3eval/lib.py": "from h3eval.commands.ab import run_ab_command\nimport dashboard.data\n",
    "h3eval/dyn.py": "import importlib\nimportlib.import_module('dashboard.app')\n",
    "h3eval/commands/ab.py": "from h3eval.ab import x\nfrom h3eval import commands\n",
    "h3eval/fromcli.py": "from h3eval import commands\n",
    "dashboard/d.py": "from h3eval.store import RunStore\nfrom bench import x\n",
    "bench/b.py": "from h3eval.commands.dashboard import streamlit_argv\n",
}


@pytest.fixture
def planted(tmp_path):
    for rel, text in PLANTED.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_finds_planted_upward_imports(planted):
    problems = floor_violations(planted)
    found = sorted(p.split(" (")[0] for p in problems)
    assert found == sorted([
        "h3/lazy.py:2: h3.lazy imports gates.base",
        "gates/g.py:2: gates.g imports h3eval.store",
        "h3eval/lib.py:1: h3eval.lib imports h3eval.commands.ab",
        "h3eval/lib.py:2: h3eval.lib imports dashboard.data",
        "h3eval/dyn.py:2: h3eval.dyn imports dashboard.app",
        "h3eval/fromcli.py:1: h3eval.fromcli imports h3eval.commands",
    ]), "\n".join(problems)
    assert any("upward: h3 is floor 0, gates is floor 1" in p for p in problems)
    assert any("library code imports a CLI module" in p for p in problems)
    # A relative import stays inside its package; a CLI module importing the library, a package on the same
    # floor and a bench script importing a CLI helper are all allowed.
    assert not [p for p in problems if p.startswith(("gates/sub", "h3eval/commands", "dashboard", "bench", "h3/ok"))]


def test_relative_imports_are_resolved(tmp_path):
    (tmp_path / "gates" / "sub").mkdir(parents=True)
    (tmp_path / "gates" / "sub" / "__init__.py").write_text("")
    (tmp_path / "gates" / "sub" / "m.py").write_text("from ...h3eval import store\n")
    assert floor_violations(tmp_path) == [
        "gates/sub/m.py:1: gates.sub.m imports h3eval (upward: gates is floor 1, h3eval is floor 2)"]
