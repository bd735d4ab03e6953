"""The ladder of an ``h3eval ab`` run: a candidate naming a parent (``parent = "turbo4-tiny"``) brings the parent
into the run, so that every rung is judged against the rung below it (:mod:`h3eval.verdict.lineage`)."""

from __future__ import annotations

import logging

from h3.recipe import Recipe

logger = logging.getLogger(__name__)


def ladder_recipes(baseline: Recipe, candidates: list[Recipe], load=None) -> list[Recipe]:
    """The candidates with the parents they name (``parent = "turbo4-tiny"``) that are not in the run added before
    them, so that every rung is generated in the same run with the same prompts and seeds as the rung below it and
    judged against it (:mod:`h3eval.verdict.lineage`). A parent named like the baseline is the baseline. ``load``: how
    a parent's name is read (default :func:`h3.recipe.load_recipe`: a shipped name or a path)."""
    from h3.recipe import RecipeError, load_recipe
    from h3eval.runner import RunError

    load = load or load_recipe
    out: list[Recipe] = []
    names = {baseline.name}

    listed: set[int] = set()  # candidates already placed (as a parent of an earlier one)

    def add(recipe: Recipe, chain: tuple[str, ...]) -> None:
        if id(recipe) in listed or (chain and recipe.name in names):
            return  # a name given twice on the command line goes through, for the plan's own check to refuse
        parent = recipe.parent
        if parent is not None and parent not in names and parent in (*chain, recipe.name):
            raise RunError(f"recipe {recipe.name!r}: its parents form a loop "
                           f"({' -> '.join((*chain, recipe.name, parent))})")
        if parent is not None and parent not in names and parent not in {c.name for c in candidates}:
            try:
                above = load(parent)
            except RecipeError as exc:
                raise RunError(f"recipe {recipe.name!r} names parent {parent!r}, which cannot be read: {exc}") from None
            logger.info("ladder: %s is judged against its parent %s, which joins the run", recipe.name, parent)
            add(above, (*chain, recipe.name))
        elif parent is not None and parent not in names:
            add(next(c for c in candidates if c.name == parent), (*chain, recipe.name))
        names.add(recipe.name)
        listed.add(id(recipe))
        out.append(recipe)

    for candidate in candidates:
        add(candidate, ())
    return out

