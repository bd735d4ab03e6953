"""What every lever shares: a removable handle with telemetry, and the error a lever raises when it cannot run.

Pattern (diffusers' hooks): each lever module has an ``XConfig`` dataclass, ``apply_x(target, config) -> handle`` and
the handle's ``remove()``; applying a lever twice to one module is an error. The handle's ``telemetry()`` is what the
clip record reports under ``executed.levers[<lever>]``: at least ``applied`` plus counts of what actually ran.

A lever documented as exact (AdaLN precompute, bucketing, offload, a step cache's computed steps, sparse attention's
dense steps) gives the baseline's bits on one platform with MKL's reproducibility mode on, which importing ``h3``
switches on (h3/determinism.py); across platforms the product promises no bits, and its byte checks say so.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

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

    def telemetry(self) -> dict[str, Any]:
        return {"applied": not self.removed}

    def remove(self) -> None:
        if self.removed:
            return
        self._remove()
        self.removed = True

    def _remove(self) -> None:
        pass


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
