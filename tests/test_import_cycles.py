"""No import loop inside ``h3`` (issue 52): the modules import one another as a tree, lazy imports included.

A loop hidden by lazy imports (``runtime -> random_model -> runtime`` through a function-level import) works until
someone moves an import to the top of a file, and then fails at import time depending on which module was imported
first. The check reads every module's AST (imports inside functions included: tests/_imports.py, which
tests/test_floors.py shares) and finds the strongly connected parts of the module graph; it is tested on a planted
tree. A few modules are also imported alone, each in a fresh interpreter, as a user's first import would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._imports import package_imports

REPO = Path(__file__).resolve().parents[1]


def import_graph(root: Path, package: str = "h3") -> dict[str, set[str]]:
    """``package``'s modules, each with the modules of ``package`` it imports (at any depth of its code)."""
    imports = {name: names for name, _, names in package_imports(root, package)}
    graph: dict[str, set[str]] = {name: set() for name in imports}
    for name, found in imports.items():
        for target in (target for _, names in found for target in names):
            while target and target not in graph:  # ``from h3.levers.lora import X``: the module h3.levers.lora
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
