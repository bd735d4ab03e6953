"""What ``h3 generate --nproc N`` and ``h3 serve --nproc N`` do before they run: settle the degree, check everything
that can be checked in the launching process (recipe, composition, devices, checkpoint), then either start the ranks
(torchrun, h3/parallel/launch.py) or, inside a rank, join the group.

A bad input fails here, once, with exit 3, before any rank starts: torchrun would report a rank's failure as its
own exit 1, and N copies of the same message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from h3.levers.parallel import at_degree
from h3.recipe import Recipe, RecipeError


def with_nproc(recipe: Recipe, nproc: int | None) -> Recipe:
    """The recipe at ``--nproc`` ranks. Without ``--nproc`` the recipe's own ``parallel.degree``; a recipe that states
    another degree than ``--nproc`` is refused (the degree is part of what the recipe configures)."""
    if nproc is None:
        return recipe
    if nproc < 1:
        raise RecipeError(f"--nproc must be >= 1, got {nproc}")
    if recipe.parallel.degree not in (1, nproc):
        raise RecipeError(f"recipe {recipe.name!r} runs at parallel.degree = {recipe.parallel.degree}; --nproc {nproc} "
                          "contradicts it (leave --nproc out, or use a recipe without a degree)")
    return at_degree(recipe, nproc)


def check_before_launch(recipe: Recipe, model: str, device: str | None) -> None:
    """Everything the launching process can refuse before N ranks start (raises RecipeError/LeverError/
    CheckpointError/ParallelError with the reason)."""
    import torch

    from h3.levers import preflight
    from h3.parallel.world import ParallelError
    from h3.runtime import check_model, default_device

    degree = recipe.parallel.degree
    target = torch.device(device or default_device())
    if target.type == "cuda":
        if target.index is not None:
            raise ParallelError(f"--device {target} names one GPU; at degree {degree} each rank uses its own "
                                "(cuda:<local rank>): give --device cuda or leave it out")
        if torch.cuda.device_count() < degree:
            raise ParallelError(f"degree {degree} needs {degree} GPUs; {torch.cuda.device_count()} are visible")
    preflight(recipe, str(target))
    check_model(model)  # a tiny preset, a random preset (h3.random_model) or a complete checkpoint directory
    from h3.parallel.world import prepare_model

    prepare_model(model)  # once here, not N times at once in the ranks


def must_launch(recipe: Recipe) -> bool:
    """Whether this process must start the recipe's ranks (degree > 1 and not one of them already)."""
    return recipe.parallel.is_on() and not in_rank(recipe)


def join_ranks(recipe: Recipe, model: str, device: str | None) -> str | None:
    """Inside a rank: join the group and return this rank's device. A single-process recipe: ``device`` as given."""
    if not recipe.parallel.is_on():
        return device
    from h3.parallel.world import init_world, prepare_model

    prepare_model(model)
    return str(init_world(device).device)


def recipe_arg(recipe: str) -> str:
    """``--recipe`` for the ranks: a recipe file by its absolute path (the ranks may run elsewhere), a name as is."""
    return str(Path(recipe).resolve()) if recipe.endswith(".toml") or "/" in recipe else recipe


def child_argv(command: str, options: dict[str, Any]) -> list[str]:
    """The rank's command line: the same command with the same options (None values left out)."""
    argv = [command]
    for flag, value in options.items():
        if value is None:
            continue
        argv += [flag, str(value)]
    return argv


def launch_ranks(recipe: Recipe, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Start the recipe's degree of ranks running ``python -m h3.cli <argv>``; ``env`` adds variables. The degree
    reaches the ranks as ``H3_NPROC`` (the option's variable): torchrun's own parser would take a ``--nproc`` after
    the module for an abbreviation of its ``--nproc-per-node``."""
    import os

    from h3.parallel.launch import launch

    extra = {**(env or {}), "H3_NPROC": str(recipe.parallel.degree)}
    return launch(recipe.parallel.degree, "h3.cli", argv, env={**os.environ, **extra})


def in_rank(recipe: Recipe) -> bool:
    """Whether this process is one of the ranks of a launch of this degree (else: launch them)."""
    from h3.parallel.world import ParallelError, launched_world_size

    size = launched_world_size()
    if size is None:
        return False
    if size != recipe.parallel.degree:
        raise ParallelError(f"this process is one of {size} ranks, but the recipe runs at degree "
                            f"{recipe.parallel.degree}")
    return True
