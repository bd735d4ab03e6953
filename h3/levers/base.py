"""What every lever shares: its config base class, the context it is applied in, a removable handle with telemetry,
and the error a lever raises when it cannot run.

Pattern (diffusers' hooks, ``hooks/first_block_cache.py``): each lever module has one ``XConfig`` and one
``apply_x(target, config, ...) -> handle``; the handle's ``remove()`` undoes it; applying a lever twice to one
module is an error. Here the config is also the lever's section of a recipe (``[x]`` in the TOML), so its fields and
defaults are written once, in the lever's own file, and the config says:

- ``is_on()``: whether the recipe switches the lever on;
- ``apply(pipe, ctx)``: apply it (calls ``apply_x`` with what the runtime knows: device, model hash, step count);
- ``check_executed(telemetry, executed)``: how a clip record shows that what ran is what was configured.

Optional hooks (defaults do nothing): ``device_problems``, ``composition_problems`` (the recipe's other levers) and
``check_inputs`` (refuse a recipe before any weight loads), ``keeps_on_cpu`` (a component the lever moves itself),
``prepare`` (a setting the recipe makes whether the lever is on or off) and ``telemetry`` (what the record reports
under ``executed.levers[<name>]``). A lever added after recipes were hashed and recorded sets
``omitted_when_default``, so that a recipe leaving it at its defaults keeps its hash (``Recipe.resolved``).

A lever documented as exact (AdaLN precompute, bucketing, offload, a step cache's computed steps, sparse attention's
dense steps) gives the baseline's bits on one platform with MKL's reproducibility mode on, which importing ``h3``
switches on (h3/determinism.py); across platforms the product promises no bits, and its byte checks say so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict

from h3.schema import FINITE_NUMBERS

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

    def begin_request(self) -> None:
        """Reset per-request counters (and any per-request state such as a step cache)."""

    def finish_request(self, clock: Any) -> None:
        """After the pipeline returns, before the frames are prepared (``clock``: the request's stage clock); e.g.
        gather what the other ranks of a parallel runtime measured."""

    @property
    def writes_output(self) -> bool:
        """Whether this process writes the request's files and record; False on a process that only helps (a
        follower rank of the parallel lever, whose rank 0 writes them)."""
        return True

    def telemetry(self) -> dict[str, Any]:
        return {"applied": not self.removed}

    def held_tensors(self) -> list[torch.Tensor]:
        """Tensors this handle keeps outside the model (float weights kept so that ``remove()`` restores them): the
        memory a shared model's accounting adds to the loaded components."""
        return []

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
    keep_on: str | None = "cpu"
    """Where a reversible lever keeps what it would drop: ``"cpu"``, or None to leave it where it is (a shared model on
    a GPU with room for it: no copy at every switch)."""
    weight_source: Any = None
    """Where the loaded weights can be read again (:mod:`h3.weights`): a reversible lever that changes weights in place
    (a fused LoRA) restores them from it instead of keeping a copy."""
    handles: dict[str, LeverHandle] = field(default_factory=dict)
    """The levers applied so far, by name (a lever may build on an earlier one: AdaLN tables keyed by the LoRA)."""

    @property
    def num_inference_steps(self) -> int:
        """diffusers' step count: sigma grid points including the terminal zero (steps + 1)."""
        return self.steps + 1


class LeverConfig(BaseModel):
    """One lever's recipe section and the lever's own description of itself (see the module docstring).

    Subclasses set ``name`` (the recipe section and the ``executed.levers`` key) and implement ``is_on`` and
    ``apply``; unknown keys, wrong types and numbers that are not finite are errors (a typo must not silently run the
    defaults; h3/schema.py).
    """

    model_config = ConfigDict(extra="forbid", strict=True, **FINITE_NUMBERS)

    name: ClassVar[str]
    omitted_when_default: ClassVar[bool] = False
    """Leave this section out of the resolved recipe (and so out of its hash) while it equals the defaults: set by a
    lever added after recipes were hashed and recorded, so that those recipes keep their hash."""
    signoff_kind: ClassVar[Literal["exact", "near", "resample"] | None] = None
    """The judge a change of this lever implies when a recipe is judged against its parent (``exact``: the same
    computation; ``near``: the same sample, a small numerical change; ``resample``: another sample of the prompt). Every
    registered lever declares it (tests/test_lineage.py); :func:`h3.recipe.lever_differences` reads it."""
    signoff_why: ClassVar[str] = ""
    """Why that kind, in a few words (written into the verdict)."""

    def is_on(self) -> bool:
        """Whether the recipe switches this lever on (an off lever is not applied and reports ``applied: false``)."""
        raise NotImplementedError

    def apply(self, pipe: Any, ctx: ApplyContext) -> LeverHandle:
        """Apply the lever to ``pipe`` (called only when :meth:`is_on`)."""
        raise NotImplementedError

    def device_problems(self, device: str) -> list[str]:
        """Why this lever cannot run on ``device`` (checked before any weight loads; no silent fallback)."""
        return []

    def composition_problems(self, recipe: Any) -> list[str]:
        """Why this lever cannot run with the other levers of ``recipe`` (checked before any weight loads)."""
        return []

    def check_inputs(self) -> None:
        """Raise LeverError when a file the lever needs is missing (checked before any weight loads)."""

    def keeps_on_cpu(self, component: str) -> bool:
        """Whether the runtime must leave ``component`` on the CPU at load because this lever moves it itself."""
        return False

    def shared_problems(self) -> list[str]:
        """Why this lever cannot be applied and removed between requests on a model that several recipes share
        (``H3Runtime(shared=True)``); empty when it can."""
        return []

    def prepare(self, pipe: Any, ctx: ApplyContext) -> None:
        """A setting the recipe makes whether the lever is on or off (called for every lever, before ``apply``)."""

    def telemetry(self, handle: LeverHandle | None, executed: "Executed") -> dict[str, Any]:
        """What the clip record reports under ``executed.levers[name]``: the handle's telemetry, or
        ``{"applied": False}`` for a lever the recipe left off. ``executed``: the request's other executed facts."""
        return handle.telemetry() if handle is not None else {"applied": False}

    def check_executed(self, telemetry: dict[str, Any] | None, executed: "Executed") -> list[str]:
        """Every way the record shows something other than this config ran; empty when it matches.

        The default: a lever that is on must report ``applied: true``; a lever that is off must not report that it
        applied. Levers that are on then check what their telemetry must show for their configuration
        (:meth:`check_telemetry`).
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
        if on:
            return [f"{self.name}: {problem}" for problem in self.check_telemetry(telemetry, executed)]
        return []

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """What the telemetry of an applied lever must show for this configuration (each problem without the lever's
        name, which :meth:`check_executed` prefixes). ``executed.forward_passes`` is the request's DiT forwards; 0
        means no request was timed as a whole (a benchmark's bare forwards), so per-request counts are not checked.
        The default: nothing beyond ``applied``."""
        return []


def counts(telemetry: dict[str, Any], *keys: str) -> tuple[list[Any], list[str]]:
    """The telemetry's values for ``keys`` and, for each missing or non-integer one, a problem naming it (a count the
    check needs and the record lacks is a mismatch, never a pass)."""
    values, problems = [], []
    for key in keys:
        value = telemetry.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"reported no integer {key} ({value!r})")
        values.append(value)
    return values, problems


def new_counter(device: str | torch.device) -> torch.Tensor:
    """A call counter that holds under torch.compile: a 0-d int64 tensor on the device the module computes on, bumped
    in place (``counter.add_(1)``) from inside the counted forward.

    Why this kind: inside a compiled region the in-place add is part of the graph (dynamo takes the tensor as a graph
    input and functionalizes the mutation, writing it back after each call), so every call is counted, eager or
    compiled, and the graph is shared by every block (an input, not a constant). A Python int bumped there is either
    frozen (``is_compiling`` guard) or guarded on, which recompiled at every call on the H200. It is held as a plain
    attribute, not a buffer: group offloading swaps a streamed group's buffers back to their pinned CPU copies after
    each block (``offload.release_module_buffers``), which would reset a buffer counter, and ``Module.to`` leaves plain
    attributes where they are. Cost: one scalar add per counted call. A graph that mutates an input is not captured
    by CUDA graphs (compile mode ``reduce-overhead``), which no shipped recipe uses.
    """
    return torch.zeros((), dtype=torch.int64, device=device)


def count_forward(module: torch.nn.Module, counter: torch.Tensor) -> None:
    """Bump ``counter`` at each call of ``module`` by wrapping its forward (an instance attribute over the class's).
    Not a module hook: inside blocks compiled regionally under diffusers' cache hooks, neither a forward hook nor a
    pre-hook on a submodule ran (found on the CPU with torch 2.14), while the wrapped forward is traced like any code.
    :func:`uncount_forward` restores the class's forward."""
    forward = module.forward

    def counted_forward(*args, **kwargs):
        counter.add_(1)
        return forward(*args, **kwargs)

    module.forward = counted_forward


def uncount_forward(module: torch.nn.Module) -> None:
    vars(module).pop("forward", None)


def mark_applied(module: torch.nn.Module, lever: str) -> None:
    """Record on ``module`` that ``lever`` is applied; a second application is an error (diffusers' rule)."""
    applied = module.__dict__.setdefault("_h3_levers", set())
    if lever in applied:
        raise LeverError(f"lever {lever!r} is already applied to this {type(module).__name__}; remove it first")
    applied.add(lever)


def unmark_applied(module: torch.nn.Module, lever: str) -> None:
    applied = module.__dict__.get("_h3_levers")
    if applied is None:
        return
    applied.discard(lever)
    if not applied:  # removing the last lever leaves the module as it was loaded: no empty marker behind
        del module.__dict__["_h3_levers"]


def instance_attributes(module: torch.nn.Module) -> set[str]:
    """The names of ``module``'s own attributes (to tell later what a library added to it)."""
    return set(vars(module))


def drop_added_attributes(module: torch.nn.Module, before: set[str], keep: tuple[str, ...] = ("_h3_levers",)) -> None:
    """Remove the instance attributes added to ``module`` since ``before`` (what diffusers or peft set while a lever
    was applied: ``_cache_config``, ``_hf_peft_config_loaded``...), so that removal leaves the module as it was."""
    for name in set(vars(module)) - before - set(keep):
        delattr(module, name)


def forget_empty_hook_registries(root: torch.nn.Module) -> None:
    """After diffusers' hooks are removed, drop what their registry left on each module: the empty
    ``_diffusers_hook`` registry and the ``forward`` instance attribute it restored (the class's own method, bound)."""
    for module in root.modules():
        registry = vars(module).get("_diffusers_hook")
        if registry is None or registry.hooks:
            continue
        del module.__dict__["_diffusers_hook"]
        forward = vars(module).get("forward")
        if getattr(forward, "__func__", None) is type(module).forward and getattr(forward, "__self__", None) is module:
            del module.__dict__["forward"]


def require_cuda(what: str, device: torch.device) -> None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise LeverError(f"{what} needs a CUDA GPU; this runtime's device is {device}. Refusing to fall back silently.")
