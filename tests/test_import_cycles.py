"""No import loop inside ``h3`` (issue 52): the modules import one another as a tree, lazy imports included.

A loop hidden by lazy imports (``runtime -> random_model -> runtime`` through a function-level import) works until
someone moves an import to the top of a file, and then fails at import time depending on which module was imported
first. The check reads every module's AST (imports inside functions included, as tests/test_floors.py does) and
finds the strongly connected parts of the module graph; it is tested on a planted tree. A few modules are also
imported alone, each in a fresh interpreter, as a user's first import would.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _modules(root: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every name an import statement of ``tree`` may load (``from X import y``: X and X.y), relative ones resolved."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names += [target] + [f"{target}.{a.name}" for a in node.names if a.name != "*"]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and (
                  (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                  or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            names.append(node.args[0].value)
    return names


def import_graph(root: Path, package: str = "h3") -> dict[str, set[str]]:
    """``package``'s modules, each with the modules of ``package`` it imports (at any depth of its code)."""
    modules = _modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in _imported(tree, name, path.name == "__init__.py"):
            while target and target not in modules:  # ``from h3.levers.lora import X``: the module h3.levers.lora
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    cycles.append(sorted(part))
    return sorted(cycles)


def test_h3_has_no_import_cycle():
    graph = import_graph(REPO)
    assert len(graph) > 50 and "h3.runtime" in graph and "h3.random_model" in graph["h3.memory"]
    cycles = import_cycles(graph)
    assert cycles == [], "import loops in h3 (lazy imports included):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_planted_lazy_loop(tmp_path):
    """The loop issue 52 found (runtime <-> random_model <-> memory <-> tiny_trained, all but one edge lazy), planted,
    with a relative import and a two-module loop beside it (the lever reaching into both is no part of a loop: nothing
    imports it back); once the loops are broken, the tree passes."""
    planted = {
        "h3/__init__.py": "",
        "h3/runtime.py": "from h3 import memory\ndef f():\n    from h3.random_model import x\n    from h3.tiny_trained import d\n",
        "h3/random_model.py": "def f():\n    from h3.runtime import SIZE\n",
        "h3/memory.py": "def f():\n    from h3 import random_model\n",
        "h3/tiny_trained.py": "def f():\n    from h3.runtime import save\n",
        "h3/levers/__init__.py": "from .lora import x\n",
        "h3/levers/lora.py": "def f():\n    from h3.tiny_trained import y\n    import h3.runtime\n",
        "h3/train/__init__.py": "",
        "h3/train/a.py": "from .b import x\n",
        "h3/train/b.py": "import importlib\nimportlib.import_module('h3.train.a')\n",
        "h3/leaf.py": "import os\nfrom h3.levers import lora\n",
    }
    for rel, text in planted.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert import_cycles(import_graph(tmp_path)) == [
        ["h3.memory", "h3.random_model", "h3.runtime", "h3.tiny_trained"],
        ["h3.train.a", "h3.train.b"],
    ]
    (tmp_path / "h3/random_model.py").write_text("SIZE = 1\n")
    (tmp_path / "h3/tiny_trained.py").write_text("from h3.checkpoint import save\n")
    (tmp_path / "h3/train/b.py").write_text("x = 1\n")
    assert import_cycles(import_graph(tmp_path)) == []


ALONE = ("h3.random_model", "h3.tiny_trained", "h3.train.dmd")
"""Modules at the far end of the loops issue 52 broke (each once reached back, lazily, into the module that imports
it): a few, as each costs an interpreter and torch's import; the static check above covers every module."""


@pytest.mark.parametrize("module", ALONE)
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    """Imported first, each module loads and leaves none of h3's modules half-initialized."""
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            "bad = [n for n, m in sys.modules.items() if n.startswith('h3') and m is None]; "
            "assert not bad, bad; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
