"""Shared fixtures: the random tiny preset loaded once per session, a fast recipe, and deterministic torch settings."""

from __future__ import annotations

import h3  # noqa: F401  (first: MKL reproducibility before any torch work; h3/determinism.py)

import os
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(scope="session", autouse=True)
def _h3_cache(tmp_path_factory):
    """Build the random tiny preset into a fresh cache per test session, so the build path is exercised every time."""
    cache = tmp_path_factory.mktemp("h3-cache")
    old = os.environ.get("H3_CACHE_DIR")
    os.environ["H3_CACHE_DIR"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("H3_CACHE_DIR", None)
    else:
        os.environ["H3_CACHE_DIR"] = old


FAST_RECIPE = {
    "name": "fast",
    "description": "tests: 2 steps, float32",
    "steps": 2,
    "dtype": "float32",
    "attention": {"backend": "native"},
    "vae": {"tiling": True, "tile_height": 256, "tile_width": 256, "tile_overlap": 64},
}


@pytest.fixture(scope="session")
def fast_recipe():
    from h3.recipe import recipe_from_dict

    return recipe_from_dict(FAST_RECIPE)


@pytest.fixture(scope="session")
def fast_recipe_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("recipes") / "fast.toml"
    path.write_text(toml_dumps(FAST_RECIPE))
    return path


@pytest.fixture(scope="session")
def tiny_random_runtime(fast_recipe):
    """The random-weight tiny preset (``tiny-random``), loaded once: the tests that hold it need its speed, its
    byte-level determinism across machines' checkouts (the trained weights in h3/assets/tiny are replaced by each
    training run) or its properties (a byte-level tokenizer, one DiT built from a seed)."""
    from h3.runtime import H3Runtime

    return H3Runtime.load("tiny-random", fast_recipe, "cpu")


def toml_dumps(data: dict, prefix: str = "") -> str:
    """Enough TOML for recipes: scalars then one level of tables."""
    lines, tables = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables:
        lines.append(f"\n[{key}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def tree_digest(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes: to show a command left a directory untouched."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}
