"""Configured versus executed: does a clip record show that what ran is what its recipe asked for?

The runtime reports what it ran in every clip record (``executed``: DiT forwards, the attention backends diffusers
dispatched, dtype, VAE tiling, and each lever's telemetry). :func:`check_executed` compares that with the recipe:
the settings that are not levers here (name, steps, dtype), every lever through its own config's
``check_executed`` (``h3/levers/<lever>.py``). Every backend's clips go through it (``h3eval ab``, ``generate``,
``floor``): a mismatch removes the clip and stops the recipe.
"""

from __future__ import annotations

from h3.levers import lever_configs
from h3.record import ClipRecord
from h3.recipe import Recipe

UNVERIFIED = "the backend did not report what executed (foreign server): configured-versus-executed unverified"


def check_executed(recipe: Recipe, record: ClipRecord) -> list[str]:
    """Every way ``record`` ran something other than ``recipe``; empty when what ran is what was configured.

    Checks the recipe name, forward passes == ``recipe.steps``, the transformer dtype, then each lever of the recipe
    against ``executed`` (the attention lever: the backend the dispatcher ran during denoising, one and the one asked
    for; the VAE: tiling and tile; every other lever: applied exactly when the recipe switches it on), and lever
    telemetry the recipe does not configure. A record whose producer did not report what ran (a foreign server)
    gives one problem saying so (:data:`UNVERIFIED`): it is unverified, not verified.
    """
    if "executed" in (record.extra or {}).get("unreported", []):
        return [UNVERIFIED]
    ex = record.executed
    problems = []
    if record.recipe_name != recipe.name:
        problems.append(f"record is of recipe {record.recipe_name!r}, not {recipe.name!r}")
    if ex.forward_passes != recipe.steps:
        problems.append(f"steps: recipe asks for {recipe.steps} DiT forward passes, {ex.forward_passes} ran")
    if ex.torch_dtype != recipe.dtype:
        problems.append(f"dtype: recipe asks for {recipe.dtype}, the transformer ran in {ex.torch_dtype}")
    configured = lever_configs(recipe)
    for config in configured:
        problems.extend(config.check_executed(ex.levers.get(config.name), ex))
    for name in ex.levers:
        if name not in {config.name for config in configured}:
            problems.append(f"{name}: the runtime reported lever telemetry the recipe does not configure: "
                            f"{ex.levers[name]}")
    return problems


def is_unverified(problems: list[str]) -> bool:
    """Whether the only problem is that nobody reported what ran (kept, and the speed summary says unverified)."""
    return bool(problems) and all(p == UNVERIFIED for p in problems)
