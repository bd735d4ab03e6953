"""What every lever shares: its config base class, the context it is applied in, a removable handle with telemetry,
and the error a lever raises when it cannot run.

Pattern (diffusers' hooks, ``hooks/first_block_cache.py``): each lever module has one ``XConfig`` and one
``apply_x(target, config, ...) -> handle``; the handle's ``remove()`` undoes it; applying a lever twice to one
module is an error. Here the config is also the lever's section of a recipe (``[x]`` in the TOML), so its fields and
defaults are written once, in the lever's own file, and the config says:

- ``is_on()``: whether the recipe switches the lever on;
- ``apply(pipe, ctx)``: apply it (calls ``apply_x`` with what the runtime knows: device, model hash, step count);
- ``check_executed(telemetry, executed)``: how a clip record shows that what ran is what was configured.

Optional hooks (defaults do nothing): ``device_problems`` and ``check_inputs`` (refuse a recipe before any weight
loads), ``keeps_on_cpu`` (a component the lever moves itself), ``prepare`` (a setting the recipe makes whether the
lever is on or off) and ``telemetry`` (what the record reports under ``executed.levers[<name>]``).

A lever documented as exact (AdaLN precompute, bucketing, offload, a step cache's computed steps, sparse attention's
dense steps) gives the baseline's bits on one platform with MKL's reproducibility mode on, which importing ``h3``
switches on (h3/determinism.py); across platforms the product promises no bits, and its byte checks say so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)


class LeverError(RuntimeError):
    """A lever cannot run with this model, device or configuration; the message says why and what to change."""


class LeverHandle:
    """A lever applied to a pipeline or module. Subclasses fill ``_remove`` and ``telemetry``."""

    name: str = "lever"

    def __init__(self) -> None:
        self.removed = False
        self.compiled = False
        """Set by the compile lever when it traces the modules this lever changed: call counters inside compiled
        code stay frozen (see QuantizedLinear.forward), so a handle that counts calls reports None, not 0."""

    def begin_request(self) -> None:
        """Reset per-request counters (and any per-request state such as a step cache)."""

    def telemetry(self) -> dict[str, Any]:
        return {"applied": not self.removed}

    def remove(self) -> None:
        if self.removed:
            return
        self._remove()
        self.removed = True

    def _remove(self) -> None:
        pass


@dataclass
class ApplyContext:
    """What the runtime knows when it applies a recipe's levers (none of it is part of a recipe)."""

    device: str
    """Where the model computes (parameters may sit on the CPU under offloading)."""
    model_sha256: str
    """Identity of the checkpoint (the AdaLN tables' disk-cache key)."""
    is_tiny: bool
    """The tiny preset (its seeded demo LoRA is refused on a real checkpoint)."""
    steps: int
    """DiT forward passes per request (the recipe's ``steps``)."""
    reversible: bool = False
    """Keep what a lever would drop (float weights), so that removing the handles restores the model."""
    handles: dict[str, LeverHandle] = field(default_factory=dict)
    """The levers applied so far, by name (a lever may build on an earlier one: AdaLN tables keyed by the LoRA)."""

    @property
    def num_inference_steps(self) -> int:
        """diffusers' step count: sigma grid points including the terminal zero (steps + 1)."""
        return self.steps + 1


class LeverConfig(BaseModel):
    """One lever's recipe section and the lever's own description of itself (see the module docstring).

    Subclasses set ``name`` (the recipe section and the ``executed.levers`` key) and implement ``is_on`` and
    ``apply``; unknown keys and wrong types are errors (a typo must not silently run the defaults).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    name: ClassVar[str]

    def is_on(self) -> bool:
        """Whether the recipe switches this lever on (an off lever is not applied and reports ``applied: false``)."""
        raise NotImplementedError

    def apply(self, pipe: Any, ctx: ApplyContext) -> LeverHandle:
        """Apply the lever to ``pipe`` (called only when :meth:`is_on`)."""
        raise NotImplementedError

    def device_problems(self, device: str) -> list[str]:
        """Why this lever cannot run on ``device`` (checked before any weight loads; no silent fallback)."""
        return []

    def check_inputs(self) -> None:
        """Raise LeverError when a file the lever needs is missing (checked before any weight loads)."""

    def keeps_on_cpu(self, component: str) -> bool:
        """Whether the runtime must leave ``component`` on the CPU at load because this lever moves it itself."""
        return False

    def prepare(self, pipe: Any, ctx: ApplyContext) -> None:
        """A setting the recipe makes whether the lever is on or off (called for every lever, before ``apply``)."""

    def telemetry(self, handle: LeverHandle | None, executed: "Executed") -> dict[str, Any]:
        """What the clip record reports under ``executed.levers[name]``: the handle's telemetry, or
        ``{"applied": False}`` for a lever the recipe left off. ``executed``: the request's other executed facts."""
        return handle.telemetry() if handle is not None else {"applied": False}

    def check_executed(self, telemetry: dict[str, Any] | None, executed: "Executed") -> list[str]:
        """Every way the record shows something other than this config ran; empty when it matches.

        The default: a lever that is on must report ``applied: true``; a lever that is off must not report that it
        applied. Levers add their own checks by overriding (calling this one first).
        """
        on = self.is_on()
        applied = isinstance(telemetry, dict) and telemetry.get("applied") is True
        if on and telemetry is None:
            return [f"{self.name}: is enabled in the recipe but reported no telemetry (did it run?)"]
        if on and not applied:
            return [f"{self.name}: is enabled in the recipe but reported applied={telemetry.get('applied')!r}: "
                    f"{telemetry}"]
        if not on and applied:
            return [f"{self.name}: is off in the recipe but reported that it applied: {telemetry}"]
        return []


def mark_applied(module: torch.nn.Module, lever: str) -> None:
    """Record on ``module`` that ``lever`` is applied; a second application is an error (diffusers' rule)."""
    applied = module.__dict__.setdefault("_h3_levers", set())
    if lever in applied:
        raise LeverError(f"lever {lever!r} is already applied to this {type(module).__name__}; remove it first")
    applied.add(lever)


def unmark_applied(module: torch.nn.Module, lever: str) -> None:
    module.__dict__.get("_h3_levers", set()).discard(lever)


def require_cuda(what: str, device: torch.device) -> None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise LeverError(f"{what} needs a CUDA GPU; this runtime's device is {device}. Refusing to fall back silently.")
