"""The ``inprocess`` backend: the h3 runtime in this process, one loaded runtime per recipe."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from h3.record import ClipRecord
from h3.recipe import Recipe
from h3.runtime import GenerateRequest, H3Runtime

logger = logging.getLogger(__name__)

RuntimeFactory = Callable[[str, Recipe, "str | None"], Any]


def default_runtime_factory(model: str, recipe: Recipe, device: str | None) -> H3Runtime:
    return H3Runtime.load(model, recipe, device)


class InProcessBackend:
    """Generates with :class:`h3.runtime.H3Runtime`; each recipe gets its own runtime, loaded on first use."""

    name = "inprocess"
    concurrency = 1

    def __init__(self, model: str, device: str | None = None, runtime_factory: RuntimeFactory | None = None):
        self.model = model
        self.device = device
        self.runtime_factory = runtime_factory or default_runtime_factory
        self._runtimes: dict[str, Any] = {}

    def runtime(self, recipe: Recipe) -> Any:
        if recipe.name not in self._runtimes:
            logger.info("loading %s with recipe %s", self.model, recipe.name)
            self._runtimes[recipe.name] = self.runtime_factory(self.model, recipe, self.device)
        return self._runtimes[recipe.name]

    def generate(self, recipe: Recipe, request: GenerateRequest, out: Path, extra: dict | None = None,
                 trajectory: bool = False) -> ClipRecord:
        """With ``trajectory``, the runtime also writes the latent trajectory next to the clip (trajectory gate)."""
        if trajectory:
            return self.runtime(recipe).generate(request, out, extra, trajectory=True)
        return self.runtime(recipe).generate(request, out, extra)

    def close(self) -> None:
        self._runtimes.clear()
