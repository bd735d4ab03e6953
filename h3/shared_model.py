"""Several recipes taking turns on one loaded model: which recipes can share it (:func:`shared_recipes_problems`),
and the runtime's recipe switching (:class:`SharedModel`, which :class:`h3.runtime.H3Runtime` is): remove one
recipe's levers, put the components' settings back as loaded, apply the next recipe's."""

from __future__ import annotations

import time
from typing import Any

from h3.anatomy import StageHooks, synchronize
from h3.recipe import Recipe


class SharedModelError(ValueError):
    """A recipe cannot run on a model that other recipes share in this process (its dtype, or a lever that cannot be
    removed between requests); the message says why and what to do instead."""


def shared_recipes_problems(recipes: list[Recipe]) -> list[str]:
    """Why ``recipes`` cannot take turns on one shared model (checked before any weight loads): one dtype for all,
    every lever removable between requests."""
    from h3.levers import shared_problems

    problems = []
    for recipe in recipes:
        if recipe.dtype != recipes[0].dtype:
            problems.append(f"{recipe.name}: its dtype is {recipe.dtype}, {recipes[0].name}'s is {recipes[0].dtype} "
                            "(one shared model has one dtype)")
        problems += [f"{recipe.name}: {p}" for p in shared_problems(recipe)]
    return problems


def component_settings(pipe: Any) -> dict[str, dict[str, Any]]:
    """The plain attributes of each component module (what a recipe's ``prepare`` sets, e.g. the VAE's tiling), so
    that removing a shared model's levers can put them back as loaded."""
    plain = (bool, int, float, str, type(None))
    out = {}
    for name in ("transformer", "vae", "audio_vae", "text_encoder"):
        module = getattr(pipe, name, None)
        if module is not None:
            out[name] = {k: v for k, v in vars(module).items()
                         if not k.startswith("_") and (isinstance(v, plain) or (isinstance(v, tuple) and all(
                             isinstance(x, plain) for x in v)))}
    return out


def restore_component_settings(pipe: Any, settings: dict[str, dict[str, Any]]) -> None:
    plain = (bool, int, float, str, type(None), tuple)
    for name, values in settings.items():
        module = getattr(pipe, name)
        for key in [k for k, v in vars(module).items() if not k.startswith("_") and isinstance(v, plain)]:
            if key not in values:
                delattr(module, key)
        for key, value in values.items():
            setattr(module, key, value)


class SharedModel:
    """The recipe switching of :class:`h3.runtime.H3Runtime` (a runtime loaded with ``shared=True``)."""

    def check_shareable(self, recipe: Recipe) -> None:
        """Raise :class:`SharedModelError` when ``recipe`` cannot take its turn on this shared model."""
        from h3.levers import shared_problems

        problems = []
        if recipe.dtype != self.loaded_dtype:
            problems.append(f"its dtype is {recipe.dtype}, the shared model was loaded in {self.loaded_dtype} (the "
                            "text encoder, VAEs and DiT weights are shared, so one dtype for every recipe)")
        problems += shared_problems(recipe)
        if problems:
            raise SharedModelError(
                f"recipe {recipe.name!r} cannot share this process's model: " + "; ".join(problems)
                + ". Give it its own process (`h3 serve --recipe ...` and `h3eval ab --backend http --url "
                f"{recipe.name}=URL`), or change the recipe.")

    def switch_recipe(self, recipe: Recipe, final: bool = False) -> dict[str, Any]:
        """Make ``recipe`` the active one of a shared model: remove the levers the two recipes do not share (in reverse
        order), then apply the new recipe's. Returns what it did (kept, removed and applied levers, seconds).

        ``final``: the last recipe this model runs; its levers apply for good (quantization drops the float weights
        it replaces, layer by layer), which is what lets an FP8 recipe follow bf16 ones on an 80 GB card. No switch
        follows it."""
        from h3.levers import lever_configs

        if not self.shared:
            raise SharedModelError("switch_recipe needs a runtime loaded with shared=True")
        if self.final:
            raise SharedModelError(f"recipe {self.recipe.name!r} was applied for good (final): no switch follows it")
        self.check_shareable(recipe)
        t0 = time.perf_counter()
        previous = self.recipe.name
        old, new = lever_configs(self.recipe), lever_configs(recipe)
        keep = 0
        # Levers stay only as an unbroken prefix in the order they apply: a later lever may depend on an earlier one.
        for a, b in zip(old, new):
            if a.name != b.name or a.model_dump() != b.model_dump() or self.recipe.steps != recipe.steps:
                break
            keep += 1
        prefix = {c.name for c in old[:keep]}
        removed = [name for name in reversed(list(self.levers)) if name not in prefix]
        # The stage timers wrap the components' methods on top of the levers' own wrappers (a VAE lever wraps
        # ``vae.decode``): off before any lever comes off, so that a lever's removal cannot drop the timer with it
        # (a shared model loaded with turbo4 first lost its video_decode timing at the first switch, and every
        # decode was counted as denoising: 2026-12-01 H200 call), and back on, outermost, once the new levers are on.
        self.hooks.remove()
        for name in removed:
            self.levers.pop(name).remove()
        kept_names = list(self.levers)
        # Settings a recipe makes whether its levers are on or off (the VAE's tiling) back as loaded; every lever's
        # ``prepare`` then sets them for the new recipe, kept levers included.
        restore_component_settings(self.pipe, self._loaded_settings)
        self.recipe = recipe
        try:
            self._apply_recipe(applied=dict(self.levers), reversible=False if final else None)
            self.final = final
        except BaseException:
            # The new recipe's levers rolled back; leave the model as loaded so the next switch starts clean and no
            # request runs a half-applied recipe.
            self.remove_levers()  # (puts the stage timers back on, outermost)
            self.levers_applied = False
            raise
        self.hooks = StageHooks(self.pipe)
        self.levers_applied = True
        synchronize(self.device)
        info = {"from": previous, "to": recipe.name, "kept": kept_names, "removed": removed,
                "applied": [n for n in self.levers if n not in kept_names], "seconds": time.perf_counter() - t0,
                "final": final}
        self.switches.append(info)
        return info

    def remove_levers(self) -> None:
        """Remove every lever of the active recipe (reverse order) and put the components' settings back: the model
        as loaded. A shared model only (a single-recipe runtime may have dropped what removal needs)."""
        if not self.shared:
            raise SharedModelError("remove_levers needs a runtime loaded with shared=True")
        self.hooks.remove()  # the timers sit on top of the levers' wrappers (see switch_recipe)
        for name in reversed(list(self.levers)):
            self.levers.pop(name).remove()
        restore_component_settings(self.pipe, self._loaded_settings)
        self.hooks = StageHooks(self.pipe)
        self.levers_applied = False

    def memory_accounting(self) -> dict[str, Any]:
        """Bytes this process holds, by component and where (device / host), plus what the active levers keep
        outside the model: a shared model shows one set of components whatever the number of recipes."""
        from h3.memory import account

        return account(self.pipe, self.levers)
