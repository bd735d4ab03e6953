"""Offload: diffusers' group offloading of the transformer at block level, with the next group prefetched on a side
CUDA stream from pinned host memory while the current one runs; optionally the text encoder too.

Seed 002: on one consumer GPU "weights live in main memory and are copied to the GPU layer by layer on every single
pass"; that copying is the cost centre the other levers (INT8 weights, AdaLN precompute) shrink.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, require_cuda

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)


class OffloadConfig(LeverConfig):
    """diffusers' group offloading of the transformer at block level, for GPUs that cannot hold the model (recipe
    section ``[offload]``)."""

    name = "offload"
    signoff_kind = "exact"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "weights streamed from host memory: the same computation"

    enabled: bool = False
    num_blocks_per_group: int = Field(default=1, ge=1)
    use_stream: bool = True
    """Prefetch the next group on a side CUDA stream while the current one runs (pinned host memory)."""
    record_stream: bool = False
    text_encoder: bool = False
    """Also keep the text encoder on the CPU, onloaded only while it encodes."""
    resident_top_level: bool = True
    """Keep the transformer's modules outside its DiT blocks (token refiner, embedders, output norm: 0.84 B of 33 B
    parameters) on the device; only the blocks stream. diffusers moves that group synchronously through pageable
    memory at every forward (5.9 s of a 7.3 s transfer-bound request on the H200)."""

    def is_on(self) -> bool:
        return self.enabled

    def device_problems(self, device: str) -> list[str]:
        if self.enabled and self.use_stream and not str(device).startswith("cuda"):
            return ["offload.use_stream (prefetch on a side CUDA stream) needs a CUDA GPU"]
        return []

    def shared_problems(self) -> list[str]:
        return ["offload: diffusers' group offloading cannot be removed in place, so the recipe cannot take turns on a "
                "shared model"]

    def keeps_on_cpu(self, component: str) -> bool:
        """The offloaded modules stay on the CPU at load; the lever streams them to the device group by group."""
        return self.enabled and (component == "transformer" or (component == "text_encoder" and self.text_encoder))

    def apply(self, pipe, ctx: ApplyContext) -> "OffloadHandle":
        return apply_offload(pipe, self, onload_device=ctx.device)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """The configured modules offloaded in groups (streamed on a side stream exactly when ``use_stream``), the
        top-level group resident as configured, and groups onloaded during the request."""
        problems = []
        modules = ["text_encoder", "transformer"] if self.text_encoder else ["transformer"]
        if telemetry.get("modules") != modules:
            problems.append(f"recipe offloads {modules}, the lever offloaded {telemetry.get('modules')!r}")
        groups = telemetry.get("groups")
        if not isinstance(groups, dict) or any(not isinstance(groups.get(m), int) or groups[m] < 1 for m in modules):
            problems.append(f"reported groups {groups!r}: every offloaded module needs at least one group")
        (streamed, resident), missing = counts(telemetry, "streamed_groups", "resident_groups")
        problems += missing
        if not missing:
            if bool(streamed) != self.use_stream:
                problems.append(f"{streamed} groups streamed, recipe asks for use_stream={self.use_stream}")
            if resident != (1 if self.resident_top_level else 0):
                problems.append(f"{resident} resident top-level groups, recipe asks for "
                                f"resident_top_level={self.resident_top_level}")
        if executed.forward_passes > 0:
            (onloads,), missing = counts(telemetry, "group_onloads")
            problems += missing
            if not missing and onloads < 1:
                problems.append(f"no group was onloaded in {executed.forward_passes} forwards")
        return problems


def _groups(module: torch.nn.Module) -> list[Any]:
    from diffusers.hooks import HookRegistry

    groups = []
    for sub in module.modules():
        registry = getattr(sub, "_diffusers_hook", None)
        if registry is None:
            continue
        for hook in registry.hooks.values():
            group = getattr(hook, "group", None)
            if group is not None and all(group is not g for g in groups):
                groups.append(group)
    return groups


def release_module_buffers(group: Any) -> int:
    """Put a streamed group's module buffers back on their pinned CPU copies; returns how many were still elsewhere.

    diffusers 0.42.1's stream path of ``ModuleGroup._offload_to_memory`` swaps the group modules' *parameters* back to
    their pinned CPU copies but not their *buffers*, although ``onload_`` copies both to the device. Weights held in
    buffers — the INT8/FP8 ``QuantizedLinear`` of the quantization lever, the AdaLN tables — then stay on the device
    after their block ran: on the H200 the offloaded ``offload-int8-adaln`` forward peaked at 20 GiB, the whole INT8
    model, which defeats offloading. Called after diffusers' own ``offload_``.
    """
    released = 0
    for module in group.modules:
        for buffer in module.buffers():
            pinned = group.cpu_param_dict.get(buffer)
            if pinned is not None and buffer.data_ptr() != pinned.data_ptr():
                buffer.data = pinned
                released += 1
    return released


def is_top_level_group(group: Any, module: torch.nn.Module) -> bool:
    """Whether ``group`` is diffusers' group of ``module``'s own parameters and its children outside the ModuleLists
    (block-level offloading; the one whose offload leader is the module itself): never streamed, moved with blocking
    ``.to()`` through pageable host memory at every forward."""
    return group.offload_leader is module


class OffloadHandle(LeverHandle):
    name = "offload"

    def __init__(self, modules: dict[str, torch.nn.Module], config: OffloadConfig):
        super().__init__()
        self.modules, self.config = modules, config
        self.onloads = 0
        self.buffers_released = 0
        self.groups = {name: _groups(m) for name, m in modules.items()}
        self.resident: list[Any] = []
        if config.resident_top_level:
            # Onloaded at the first forward as usual, then never offloaded again: later onloads find the tensors
            # on the device already and copy nothing.
            transformer = modules["transformer"]
            self.resident = [g for g in self.groups["transformer"] if is_top_level_group(g, transformer)]
            for group in self.resident:
                group.offload_ = lambda *args, **kwargs: None
        # A group lists the top-level module's own parameters beside its child modules, which hold them too.
        kept = {id(p): p for g in self.resident
                for p in [*g.parameters, *(q for m in g.modules for q in m.parameters())]}
        self.resident_params = sum(p.numel() for p in kept.values())
        for groups in self.groups.values():
            for group in groups:
                original = group.onload_

                def counted(*args, _original=original, **kwargs):
                    self.onloads += 1
                    return _original(*args, **kwargs)

                group.onload_ = counted
                if group.stream is not None:
                    offload = group.offload_

                    def offload_with_buffers(*args, _offload=offload, _group=group, **kwargs):
                        result = _offload(*args, **kwargs)
                        self.buffers_released += release_module_buffers(_group)
                        return result

                    group.offload_ = offload_with_buffers

    def begin_request(self) -> None:
        self.onloads = 0
        self.buffers_released = 0

    def telemetry(self) -> dict[str, Any]:
        groups = [g for gs in self.groups.values() for g in gs]
        return {
            "applied": not self.removed,
            "modules": sorted(self.modules),
            "groups": {name: len(g) for name, g in self.groups.items()},
            "use_stream": self.config.use_stream,
            # diffusers pins the CPU copy of every group that streams (unless low_cpu_mem_usage).
            "streamed_groups": sum(1 for g in groups if g.stream is not None),
            "pinned_memory": any(g.stream is not None and not g.low_cpu_mem_usage for g in groups),
            "group_onloads": self.onloads,
            # The transformer's top-level group kept on the device (resident_top_level) and its parameter count.
            "resident_groups": len(self.resident),
            "resident_params": self.resident_params,
            # Buffers diffusers left on the device that this lever moved back (see release_module_buffers).
            "buffers_released": self.buffers_released,
        }

    def _remove(self) -> None:
        raise LeverError("group offloading cannot be removed in place; reload the model")


def apply_offload(pipe, config: OffloadConfig, *, onload_device: str) -> OffloadHandle:
    """Group-offload ``pipe.transformer`` (and ``pipe.text_encoder`` when asked) to the CPU; ``onload_device`` is
    where the groups compute."""
    from diffusers.hooks import apply_group_offloading

    onload = torch.device(onload_device)
    if config.use_stream:
        require_cuda("offload.use_stream (prefetch on a side CUDA stream)", onload)
    modules = {"transformer": pipe.transformer}
    if config.text_encoder:
        modules["text_encoder"] = pipe.text_encoder
    for name, module in modules.items():
        mark_applied(module, "offload")
        apply_group_offloading(
            module, onload_device=onload, offload_device=torch.device("cpu"), offload_type="block_level",
            num_blocks_per_group=config.num_blocks_per_group, use_stream=config.use_stream,
            record_stream=config.record_stream, non_blocking=config.use_stream,
        )
    logger.info("group offloading on %s (stream=%s)", ", ".join(modules), config.use_stream)
    return OffloadHandle(modules, config)
