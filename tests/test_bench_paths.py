"""Every ``bench/...`` path the library or the README cites exists in the tree (issue 52).

A record moved or renamed under ``bench/`` leaves the docstring, policy comment or README line that cited it pointing
at nothing; a newcomer who follows it finds no file. The check reads the library's Python and TOML files
(:data:`LIBRARY`) and ``README.md``, takes every ``bench/...`` mention and looks it up in the tree:

- a brace list is expanded as the shell does (``bench/results/x_{a,b}.md`` cites two files);
- a glob or a placeholder is not a path and is skipped (``bench/results/signoff_*.md``, ``bench/<study>/``,
  ``bench/results/{name}.md``, ``bench/...``);
- trailing sentence punctuation is not part of the path (``see bench/results/x.md.``);
- a mention ending in ``/`` must be a folder; a name without a suffix may name a file by its stem
  (``bench/results/h200_goals``, a recipe ``bench/recipes/turbo4-tiny-sparse85-nocomp``).

Every missing path is reported in one assertion message, as ``file:line: path``. The checker itself is tested on a
planted tree: a checker that cannot fail proves nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LIBRARY = ("h3", "gates", "h3eval", "dashboard")
"""The library packages whose ``*.py`` and ``*.toml`` files are read."""
DOCUMENTS = ("README.md",)
"""Files at the top of the tree that are read whole."""

MENTION = re.compile(r"(?<![A-Za-z0-9_./-])bench/(?:[A-Za-z0-9_./-]|\{[^{}\s]*\})*")
"""``bench/`` and what follows it of a path: letters, digits, ``_ . / -`` and brace groups (``{a,b}``, ``{name}``)."""
PLACEHOLDER_NEXT = set("<*?[")
"""A mention followed by one of these is a placeholder or a glob (``bench/<study>/``, ``bench/results/x_*.md``)."""
TRAILING = ".,:;"
"""Sentence punctuation a path may be followed by."""


def expand_braces(text: str) -> list[str] | None:
    """The paths a brace list stands for (``a{b,c}d`` -> ``abd``, ``acd``; nested and repeated groups too); None when a
    group has no comma: a placeholder (``{name}``), not a list."""
    match = re.search(r"\{([^{}]*)\}", text)
    if match is None:
        return [text]
    if "," not in match.group(1):
        return None
    paths: list[str] = []
    for choice in match.group(1).split(","):
        expanded = expand_braces(text[:match.start()] + choice + text[match.end():])
        if expanded is None:
            return None
        paths.extend(expanded)
    return paths


def bench_paths(line: str) -> list[str]:
    """The ``bench/...`` paths a line of text cites, in order; globs and placeholders left out."""
    paths = []
    for match in MENTION.finditer(line):
        mention = match.group(0)
        following = line[match.end():match.end() + 1]
        if following in PLACEHOLDER_NEXT or following == "{" or mention.endswith(("...", "..")):
            continue
        expanded = expand_braces(mention)
        if expanded is None:
            continue
        for path in expanded:
            path = path.rstrip(TRAILING)
            if path.endswith("/..") or "/../" in path:
                continue  # an ellipsis, not a path
            paths.append(path)
    return paths


def cited_files(root: Path) -> list[Path]:
    """The files whose ``bench/`` citations are checked: the library's Python and TOML files, and the README."""
    files = [root / name for name in DOCUMENTS if (root / name).is_file()]
    for package in LIBRARY:
        for suffix in ("*.py", "*.toml"):
            files.extend(p for p in sorted((root / package).rglob(suffix)) if "__pycache__" not in p.parts)
    return files


def exists(root: Path, cited: str) -> bool:
    """Whether ``cited`` is in the tree: a folder for a path ending in ``/``; a name without a suffix may name a file
    by its stem (``bench/results/h200_goals`` is ``h200_goals.md`` or ``.json``; a recipe by its name)."""
    target = root / cited
    if cited.endswith("/"):
        return target.is_dir()
    if target.exists():
        return True
    return not target.suffix and target.parent.is_dir() and any(
        p.is_file() and p.stem == target.name for p in target.parent.iterdir())


def missing_bench_paths(root: Path) -> list[str]:
    """Every cited ``bench/`` path not in the tree under ``root``, as ``file:line: path``."""
    missing = []
    for path in cited_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for cited in bench_paths(line):
                if not exists(root, cited):
                    missing.append(f"{path.relative_to(root)}:{number}: {cited}")
    return missing


def test_every_bench_path_cited_in_the_library_and_readme_exists():
    missing = missing_bench_paths(REPO)
    assert missing == [], (f"{len(missing)} cited bench/ path(s) missing from the tree (moved or renamed? cite the "
                           "new place):\n" + "\n".join(missing))


def test_the_check_reads_every_library_package_and_the_readme():
    """A renamed folder would make the check pass vacuously."""
    files = cited_files(REPO)
    for package in LIBRARY:
        assert any(f.is_relative_to(REPO / package) for f in files), f"{package}/ has no file the check reads"
    assert REPO / "README.md" in files


def test_mentions_are_parsed_as_paths_globs_and_placeholders():
    assert bench_paths("see bench/results/x.md. Then bench/device/call.sh, and (bench/lib/).") == [
        "bench/results/x.md", "bench/device/call.sh", "bench/lib/"]
    assert bench_paths("`bench/results/gates_{a,b}{,_c}.md`: both") == [
        "bench/results/gates_a.md", "bench/results/gates_a_c.md", "bench/results/gates_b.md",
        "bench/results/gates_b_c.md"]
    assert bench_paths("bench/results/signoff_*.md bench/<study>/README.md bench/results/h200_ab_<shape>.md") == []
    assert bench_paths('f"bench/results/{name}.md" bench/... bench/results/[ab].md') == []
    assert bench_paths("tests/bench/x.py mybench/y.py bench.lib") == []


def test_the_check_finds_planted_missing_paths(tmp_path):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "here.md").write_text("")
    (tmp_path / "bench" / "results" / "x_a.md").write_text("")
    (tmp_path / "bench" / "tool.py").write_text("")
    for package in LIBRARY:
        (tmp_path / package).mkdir()
    (tmp_path / "h3" / "m.py").write_text('"""Measured in bench/results/here.md.\n\nSee bench/results/gone.md;"""\n')
    (tmp_path / "gates" / "p.toml").write_text("# bench/results/x_{a,b}.md\nx = 1  # bench/results/*.md\n")
    (tmp_path / "h3eval" / "r.py").write_text("# bench/tool.py/ is no folder; bench/results/ is\n")
    (tmp_path / "README.md").write_text("Run `python bench/tool.py`, then read bench/moved/README.md.\n"
                                        "Recorded in bench/results/here and bench/results/nowhere.\n")
    assert missing_bench_paths(tmp_path) == [
        "README.md:1: bench/moved/README.md",
        "README.md:2: bench/results/nowhere",
        "h3/m.py:3: bench/results/gone.md",
        "gates/p.toml:1: bench/results/x_b.md",
        "h3eval/r.py:1: bench/tool.py/",
    ]
