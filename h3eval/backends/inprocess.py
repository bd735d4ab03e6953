"""The ``inprocess`` backend: the h3 runtime in this process.

By default every recipe takes its turn on **one shared model** (``H3Runtime(shared=True)``): one DiT, one text encoder
and one pair of VAEs are loaded once, and before each request the runtime removes the previous recipe's levers and
applies this one's (reversibly: see :meth:`h3.runtime.H3Runtime.switch_recipe`), so an interleaved A/B (baseline,
candidate 1, candidate 2, baseline, ...) holds one full-size model, not one per recipe. A recipe that cannot share it
(another dtype, group offloading) is refused before anything runs, with what to do instead (a server per recipe).

With a ``runtime_factory`` (tests, or ``shared=False``) each recipe gets its own runtime, loaded on first use.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from h3.record import ClipRecord
from h3.recipe import Recipe
from h3.runtime import GenerateRequest, H3Runtime, SharedModelError
from h3eval.backends import BackendError

logger = logging.getLogger(__name__)

RuntimeFactory = Callable[[str, Recipe, "str | None"], Any]


def default_runtime_factory(model: str, recipe: Recipe, device: str | None) -> H3Runtime:
    return H3Runtime.load(model, recipe, device)


class InProcessBackend:
    """Generates with :class:`h3.runtime.H3Runtime`: one shared model for every recipe (default), or one runtime per
    recipe (``shared=False`` or a ``runtime_factory``)."""

    name = "inprocess"
    concurrency = 1

    def __init__(self, model: str, device: str | None = None, runtime_factory: RuntimeFactory | None = None,
                 shared: bool | None = None, text_encoder: str = "resident"):
        self.model = model
        self.device = device
        self.shared = runtime_factory is None if shared is None else shared
        if self.shared and runtime_factory is not None:
            raise ValueError("a runtime_factory makes one runtime per recipe; it cannot be combined with shared=True")
        self.runtime_factory = runtime_factory or default_runtime_factory
        self.text_encoder = text_encoder
        self._runtimes: dict[str, Any] = {}
        self._shared: H3Runtime | None = None
        self.final_recipe: str | None = None
        """The recipe whose levers apply for good once the shared model runs it (``h3eval ab --by-recipe``: no other
        recipe follows it), so that quantization drops the float weights instead of holding both copies."""
        self.last_load_s = 0.0
        """Seconds the last :meth:`generate` spent loading a model (the first request of a shared model, or of each
        recipe's own runtime): a one-time cost that the time box must not expect of the recipe's next request."""

    def check_recipes(self, recipes: Sequence[Recipe], last_for_good: bool = False) -> None:
        """Refuse, before any weight loads, recipes that cannot share one model (different dtypes, levers that cannot
        be removed) or whose shared full-size model would not fit the card (``last_for_good``: the last recipe is
        applied for good, ``--by-recipe``): raises SharedModelError naming each and what to do instead."""
        if not self.shared or not recipes:
            return
        from h3.memory import card_load_problem
        from h3.request import default_device

        # the runtime's own default device: the GPU when there is one
        problem = card_load_problem(self.model, list(recipes), self.device or default_device(),
                                    text_encoder=self.text_encoder, last_for_good=last_for_good)
        if problem:
            raise SharedModelError(problem)
        from h3.runtime import shared_recipes_problems

        problems = shared_recipes_problems(list(recipes))
        if problems:
            raise SharedModelError(
                "these recipes cannot share one in-process model: " + "; ".join(problems) + ". Run each on its own "
                "server (`h3 serve --recipe NAME --port P`, then `h3eval ab --backend http --url NAME=http://...`), "
                "or `h3eval ab --no-share-model` where memory allows one runtime per recipe.")

    def runtime(self, recipe: Recipe) -> Any:
        if not self.shared:
            if recipe.name not in self._runtimes:
                logger.info("loading %s with recipe %s", self.model, recipe.name)
                t0 = time.monotonic()
                self._runtimes[recipe.name] = self.runtime_factory(self.model, recipe, self.device)
                self.last_load_s = time.monotonic() - t0
            return self._runtimes[recipe.name]
        if self._shared is None:
            logger.info("loading %s once, shared by every recipe (first: %s)", self.model, recipe.name)
            t0 = time.monotonic()
            # A run's only recipe left (a resumed --by-recipe run) loads as a runtime of one recipe: for good.
            self._shared = H3Runtime.load(self.model, recipe, self.device, shared=recipe.name != self.final_recipe,
                                          text_encoder=self.text_encoder)
            self.last_load_s = time.monotonic() - t0
            logger.info("loaded %s in %.1f s", self.model, self.last_load_s)
        elif self._shared.recipe is not recipe or not self._shared.levers_applied:
            try:
                info = self._shared.switch_recipe(recipe, final=recipe.name == self.final_recipe)
            except torch.OutOfMemoryError as exc:
                raise BackendError(
                    f"the shared model ran out of device memory applying {recipe.name!r} next to the weights it keeps "
                    f"to switch back ({exc}). `h3eval ab --by-recipe` runs each recipe's requests together and applies "
                    "the last for good (one FP8 or INT8 candidate after a bf16 baseline fits an 80 GB card).") from exc
            logger.info("switched the shared model %s -> %s in %.2f s (kept %s, removed %s, applied %s)",
                        info["from"], info["to"], info["seconds"], info["kept"], info["removed"], info["applied"])
        return self._shared

    @property
    def runtimes_held(self) -> int:
        """How many loaded models this backend holds (1 when shared, whatever the number of recipes)."""
        return (self._shared is not None) + len(self._runtimes)

    def generate(self, recipe: Recipe, request: GenerateRequest, out: Path, extra: dict | None = None,
                 trajectory: bool = False) -> ClipRecord:
        """With ``trajectory``, the runtime also writes the latent trajectory next to the clip (trajectory gate)."""
        self.last_load_s = 0.0
        if trajectory:
            return self.runtime(recipe).generate(request, out, extra, trajectory=True)
        return self.runtime(recipe).generate(request, out, extra)

    def close(self) -> None:
        self._runtimes.clear()
        self._shared = None
