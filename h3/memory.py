"""Memory accounting of a loaded model: bytes by component and by where they live (a device, the host).

Counted from the tensors themselves (parameters and buffers of each component, each storage once), plus what the
active levers keep outside the model (:meth:`h3.levers.LeverHandle.held_tensors`: the float weights a reversible
quantization replaced). On the ``meta`` device the same code gives the sizes without any memory (the full-size plan
of :func:`plan_shared`, tested on the CPU).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Iterable

import torch

COMPONENTS = ("transformer", "text_encoder", "vae", "audio_vae")
GIB = 2**30


def _key(tensor: torch.Tensor) -> tuple:
    if tensor.device.type == "meta":
        return ("meta", id(tensor))
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def _nbytes(tensor: torch.Tensor) -> int:
    if tensor.device.type == "meta":
        return tensor.numel() * tensor.element_size()
    return tensor.untyped_storage().nbytes()


def _count(tensors: Iterable[torch.Tensor], seen: set) -> dict[str, int]:
    out: dict[str, int] = {}
    for tensor in tensors:
        key = _key(tensor)
        if key in seen:
            continue
        seen.add(key)
        where = tensor.device.type
        out[where] = out.get(where, 0) + _nbytes(tensor)
    return out


def account(pipe: Any, levers: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"components": {name: {device type: bytes}}, "levers_held": {lever: {...}}, "total": {...}}``."""
    seen: set = set()
    components = {}
    for name in COMPONENTS:
        module = getattr(pipe, name, None)
        if module is not None:
            components[name] = _count(itertools.chain(module.parameters(), module.buffers()), seen)
    held = {name: _count(handle.held_tensors(), seen) for name, handle in (levers or {}).items()}
    total: dict[str, int] = {}
    for part in [*components.values(), *held.values()]:
        for where, nbytes in part.items():
            total[where] = total.get(where, 0) + nbytes
    return {"components": components, "levers_held": {k: v for k, v in held.items() if v}, "total": total}


def gib(nbytes: int | float) -> float:
    return nbytes / GIB


# -- the full-size plan ------------------------------------------------------------------------------------------------

H200_CAPACITY_GIB = 143771 / 1024
"""What ``nvidia-smi`` reports for one H200 here (143771 MiB; KINDS.md)."""
H100_CAPACITY_GIB = 81559 / 1024
"""What ``nvidia-smi`` reports for one H100 80GB HBM3 here (81559 MiB; KINDS.md)."""
QUANT_WORKING_BYTES_PER_PARAM = 4 + 1
"""Device bytes per weight element of the one layer being quantized (h3.levers.quantization.quantize_per_channel):
its float32 copy, worked on in place, and the one-byte result."""
HEADROOM_GIB = 2.0
"""Kept free for the CUDA context, cuBLAS workspaces and the caching allocator's fragmentation."""
ACTIVATIONS_GIB = {"5s-544x960": 65.2 - 61.7, "5s-768x1344": 68.3 - 61.7, "15s-768x1344": 80.3 - 61.7}
"""Peak memory of one stock DiT forward above its 61.7 GiB of weights, measured on the H200
(bench/full_size_speed/results/h200_recipes_speed.md, ``stock`` rows: 65.2, 68.3 and 80.3 GiB). The video decode's own peak (6.5 to
10.0 GiB with its 4.9 GiB of weights, bench/full_size_speed/results/h200_speed_stock.json) comes after the denoising, when the DiT's
activations are free."""


def component_bytes(module: torch.nn.Module) -> int:
    return sum(_count(itertools.chain(module.parameters(), module.buffers()), set()).get(t, 0)
               for t in ("meta", "cpu", "cuda"))


@functools.lru_cache(maxsize=1)
def _released_on_meta() -> dict[str, Any]:
    from h3 import random_model

    return random_model.build_components(random_model.released(), "meta", torch.bfloat16)


def full_size_plan(recipes: list, *, text_encoder: str = "offload", shared: bool = True,
                   shape: str = "5s-768x1344", capacity_gib: float = H200_CAPACITY_GIB,
                   last_for_good: bool = False) -> dict[str, Any]:
    """The device memory a process needs at full size (the ``h3-random`` configs, bf16) for ``recipes``: one shared
    model (``shared``), or each recipe on its own runtime; the text encoder ``resident`` or ``offload`` / ``fit``
    (streamed).

    Sizes come from the released configs built on the meta device (no memory); each recipe adds what its levers hold
    beside the model: quantized weights (the quantization lever's own selection of Linears), and on a runtime of its
    own minus the float weights it drops (a shared model keeps them, to switch back). A fused LoRA adds nothing (it is
    restored from the weight source). Activations: the measured peak of a stock forward at ``shape``
    (:data:`ACTIVATIONS_GIB`). The load's own peak counts too (``load_peak_gib``): the model as built, plus what
    quantization holds while it runs (one layer's working copies, or every quantized copy on a shared model);
    ``peak_gib`` is the larger of the load and the request, and the fits are read from it. ``last_for_good``: the
    shared model's last recipe is applied for good (``h3 generate`` with several recipes, ``h3eval ab --by-recipe``),
    so it drops the float weights it replaces as a runtime of its own does. A plan, not a measurement: the H200 run
    (bench/device/h200_ab.sh) measures the peak."""
    from h3.levers.quantization import quantized_bytes, select_linears

    meta = _released_on_meta()
    sizes = {name: component_bytes(meta[name]) / GIB for name in COMPONENTS}
    layers = meta["text_encoder"].model.language_model.layers
    streamed = sum(component_bytes(layer) for layer in layers) / GIB
    # ``fit`` keeps on the device only what is left over once everything else fits: its plan is the streamed one.
    te_device = sizes["text_encoder"] - (streamed if text_encoder in ("offload", "fit") else 0.0)
    base = sizes["transformer"] + sizes["vae"] + sizes["audio_vae"] + te_device
    extras, load_extras = {}, {}
    for index, recipe in enumerate(recipes):
        extra = load_extra = 0.0
        own = not shared or (last_for_good and index == len(recipes) - 1)
        if recipe.quant.mode != "none":
            q = quantized_bytes(meta["transformer"], recipe.quant)
            extra += q["quantized_bytes"] / GIB - (q["replaced_float_bytes"] / GIB if own else 0.0)
            # The load (h3.levers.quantization.apply_quantization, layer by layer): the float model stays whole until
            # each layer's turn, so the peak is the float model plus the largest layer's working copies; a shared
            # model keeps every float layer, so its quantized copies all add.
            chosen, _, _ = select_linears(meta["transformer"], recipe.quant)
            largest = max((c.weight.numel() for c in chosen.values()), default=0)
            load_extra = max(extra, largest * QUANT_WORKING_BYTES_PER_PARAM / GIB)
        extras[recipe.name] = extra
        load_extras[recipe.name] = load_extra
    activations = ACTIVATIONS_GIB[shape]
    if shared:
        processes = {"shared": base + max(extras.values(), default=0.0) + activations}
        load_peaks = {"shared": base + max(load_extras.values(), default=0.0)}
    else:
        processes = {name: base + extra + activations for name, extra in extras.items()}
        load_peaks = {name: base + load_extras[name] for name in extras}
    peaks = {name: max(processes[name], load_peaks[name]) for name in processes}
    worst = max(peaks.values())
    return {
        "components_gib": sizes, "text_encoder": text_encoder, "text_encoder_streamed_gib": streamed,
        "text_encoder_on_device_gib": te_device, "lever_extra_gib": extras, "activations_gib": activations,
        "shape": shape, "shared": shared, "per_process_gib": processes, "load_peak_gib": load_peaks,
        "peak_gib": peaks,
        "all_processes_gib": sum(peaks.values()), "capacity_gib": capacity_gib, "headroom_gib": HEADROOM_GIB,
        "fits_one_gpu_each": worst + HEADROOM_GIB <= capacity_gib,
        "fits_one_gpu_together": sum(peaks.values()) + HEADROOM_GIB <= capacity_gib,
    }


def shared_load_problem(model: str, recipes: list, *, text_encoder: str, capacity_gib: float,
                        last_for_good: bool = True) -> str | None:
    """Why ``recipes`` taking turns on one shared full-size model (``h3-random``; the last applied for good, as
    ``h3 generate`` and ``h3eval ab --by-recipe`` do, unless ``last_for_good`` is False) would not fit a card of
    ``capacity_gib``, by :func:`full_size_plan`'s load peak; None when it fits or the plan does not apply (another
    model, one recipe). On an 80 GB H100 an FP8 recipe that is not the
    last keeps its bf16 layers to switch back: stock4, turbo4-fp8-sage, turbo4-fp8-sage-compile ran out of memory
    there at the second recipe (2026-12-06 call), 4 minutes into the call."""
    if model != "h3-random" or len(recipes) < 2:
        return None
    plan = full_size_plan(recipes, text_encoder=text_encoder, shared=True, capacity_gib=capacity_gib,
                          last_for_good=last_for_good)
    peak = plan["load_peak_gib"]["shared"]
    if peak + HEADROOM_GIB <= capacity_gib:
        return None
    heavy = [r.name for r in (recipes[:-1] if last_for_good else recipes) if plan["lever_extra_gib"][r.name] > 0]
    return (f"these recipes cannot take turns on one {capacity_gib:.1f} GiB card: the shared model would hold "
            f"{peak:.1f} GiB (+{HEADROOM_GIB:g} GiB headroom) while {', '.join(heavy)} keeps its float layers to "
            "switch back (h3.memory.full_size_plan). Put one quantized recipe last (it is applied for good"
            + ("" if last_for_good else "; `h3eval ab --by-recipe` does") + ") and run the others in another call.")


def resident_load_problem(model: str, recipes: list, *, text_encoder: str, capacity_gib: float) -> str | None:
    """Why a full-size model (``h3-random``) with its text encoder ``resident`` would not load on a card of
    ``capacity_gib`` (the conditioner and the bf16 DiT are built whole before any lever: 62 + 62 GiB, more than an
    80 GB H100), naming the residencies that stream it; None when it fits or the plan does not apply."""
    if model != "h3-random" or text_encoder != "resident" or not recipes:
        return None
    plan = full_size_plan(recipes[:1], text_encoder="resident", shared=False, capacity_gib=capacity_gib)
    peak = max(plan["load_peak_gib"].values())
    if peak + HEADROOM_GIB <= capacity_gib:
        return None
    return (f"the text encoder resident beside the DiT needs {peak:.1f} GiB (+{HEADROOM_GIB:g} GiB headroom) to load "
            f"on this {capacity_gib:.1f} GiB card (h3.memory.full_size_plan): stream it with --text-encoder fit "
            "(keeps on the card the layers that fit beside each request) or --text-encoder offload")


def card_load_problem(model: str, recipes: list, device: str, *, text_encoder: str,
                      last_for_good: bool = True) -> str | None:
    """:func:`resident_load_problem`, then :func:`shared_load_problem`, against the card ``device`` names (its total
    memory); None off CUDA."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    capacity = torch.cuda.get_device_properties(torch.device(device)).total_memory / GIB
    return (resident_load_problem(model, recipes, text_encoder=text_encoder, capacity_gib=capacity)
            or shared_load_problem(model, recipes, text_encoder=text_encoder, capacity_gib=capacity,
                                   last_for_good=last_for_good))
